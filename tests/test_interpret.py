"""Executors: the numpy reference and the SPMD executor on a simulated mesh.

The central check: hand-partitioned device-local programs, run on the
simulated mesh, reproduce the unpartitioned program's results.
"""

import numpy as np
import pytest
from conftest import EXAMPLES

from ir import interpret
from ir.builder import Builder
from ir.core import Mesh
from ir.interpret import InterpretError, random_inputs, run, run_spmd, shard, unshard
from ir.text import parse_file


def numpy_mlp_sgd_step(x, target, w1, w2, lr=0.1):
    """The SGD step of examples/mlp.ir, written directly in numpy."""
    h = x @ w1
    a = np.maximum(h, 0)
    err = a @ w2 - target
    loss = np.mean(err**2)
    dy = 2 * err / err.size
    dw2 = a.T @ dy
    dh = (dy @ w2.T) * (h > 0)
    dw1 = x.T @ dh
    return loss, w1 - lr * dw1, w2 - lr * dw2


def test_reference_executor_runs_the_mlp_example_like_numpy():
    fn = parse_file(str(EXAMPLES / "mlp.ir"))
    inputs = random_inputs(fn, seed=1)
    got = run(fn, inputs)
    want = numpy_mlp_sgd_step(inputs["x"], inputs["target"], inputs["w1"], inputs["w2"])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# Shardings of the hand-partitioned example (PartIR's BP + Megatron MLP):
# one tuple of mesh axes per dim.
BP_MP_INPUTS = {
    "x": (("batch",), ()),
    "target": (("batch",), ()),
    "w1": ((), ("model",)),
    "w2": (("model",), ()),
}
BP_MP_RESULTS = [(), ((), ("model",)), (("model",), ())]


def test_hand_partitioned_mlp_reproduces_the_unpartitioned_step():
    global_fn = parse_file(str(EXAMPLES / "mlp.ir"))
    local_fn = parse_file(str(EXAMPLES / "mlp_bp_mp.ir"))
    mesh = local_fn.mesh
    assert mesh == Mesh.of(batch=2, model=2)
    inputs = random_inputs(global_fn, seed=3)
    want = run(global_fn, inputs)
    local_inputs = {name: shard(inputs[name], dims, mesh) for name, dims in BP_MP_INPUTS.items()}
    got = run_spmd(local_fn, local_inputs)
    for blocks, dims, expected in zip(got, BP_MP_RESULTS, want):
        np.testing.assert_allclose(unshard(blocks, dims, mesh), expected, rtol=1e-5, atol=1e-5)
    # Batch parallel: one all_reduce per weight gradient and one for the loss;
    # Megatron: one in the forward pass.
    reduced = [op.attrs["axes"] for op in local_fn.ops if op.kind == "all_reduce"]
    assert sorted(reduced) == [("batch",), ("batch",), ("batch",), ("model",)]


def test_wrong_partitioning_is_caught_by_execution():
    # Dropping the forward all_reduce over `model` leaves partial sums: the
    # replicas along `model` then disagree, or the result is wrong.
    global_fn = parse_file(str(EXAMPLES / "mlp.ir"))
    local_fn = parse_file(str(EXAMPLES / "mlp_bp_mp.ir"))
    text = (EXAMPLES / "mlp_bp_mp.ir").read_text()
    broken_text = text.replace('%y = all_reduce(%y.partial) {axes = ["model"]}', '%y = neg(%y.partial)')
    broken_text = broken_text.replace("%err = sub(%y, %target)", "%err = add(%y, %target)")
    from ir.text import parse

    broken = parse(broken_text)
    assert len(broken.ops) == len(local_fn.ops)
    inputs = random_inputs(global_fn, seed=3)
    want = run(global_fn, inputs)
    got = run_spmd(broken, {name: shard(inputs[name], dims, broken.mesh) for name, dims in BP_MP_INPUTS.items()})
    with pytest.raises((InterpretError, AssertionError)):
        np.testing.assert_allclose(unshard(got[0], (), broken.mesh), want[0], rtol=1e-5)


def zero3_mlp(mesh: Mesh):
    """A 1-D mesh program using all five collectives: ZeRO-3 style weight
    all_gathers, a reduce_scatter of the weight gradient, an all_to_all that
    moves the activations' sharding from batch to features, and an
    all_slice of a replicated value."""
    n = mesh.num_devices
    b = Builder("zero3_mlp", mesh)
    x = b.param("x", [8 // n, 6])  # batch-sharded
    w1 = b.param("w1", [6 // n, 10])  # dim 0 sharded
    w2 = b.param("w2", [10, 4])  # replicated
    w1_full = b.op("all_gather", [w1], "w1.full", axes=["data"], dim=0)
    h = b.relu(b.matmul(x, w1_full), name="h")
    y = b.matmul(h, w2, name="y")
    y_by_feature = b.op("all_to_all", [y], "y.by_feature", axes=["data"], src_dim=0, dst_dim=1)
    dh = b.mul(h, 2.0)
    dw1_partial = b.dot_general(x, dh, [[0], [0]], name="dw1.partial")
    dw1 = b.op("reduce_scatter", [dw1_partial], "dw1", axes=["data"], dim=0)
    w2_shard = b.op("all_slice", [w2], "w2.shard", axes=["data"], dim=1)
    total = b.op("all_reduce", [b.sum(y, [0, 1])], "total", axes=["data"])
    return b.build([y, y_by_feature, dw1, w2_shard, total])


def test_spmd_executor_runs_all_five_collectives_in_a_program():
    mesh = Mesh.of(data=2)
    fn = zero3_mlp(mesh)
    assert {op.kind for op in fn.ops} >= {"all_gather", "all_to_all", "reduce_scatter", "all_slice", "all_reduce"}
    rng = np.random.default_rng(0)
    x, w1, w2 = rng.standard_normal((8, 6)), rng.standard_normal((6, 10)), rng.standard_normal((10, 4))
    h = np.maximum(x @ w1, 0)
    y = h @ w2
    dw1 = x.T @ (2 * h)
    got = run_spmd(fn, {"x": shard(x, [("data",), ()], mesh), "w1": shard(w1, [("data",), ()], mesh),
                        "w2": shard(w2, [(), ()], mesh)}, float_dtype=np.float64)
    np.testing.assert_allclose(unshard(got[0], [("data",), ()], mesh), y, rtol=1e-12)
    np.testing.assert_allclose(unshard(got[1], [(), ("data",)], mesh), y, rtol=1e-12)
    np.testing.assert_allclose(unshard(got[2], [("data",), ()], mesh), dw1, rtol=1e-12)
    np.testing.assert_allclose(unshard(got[3], [(), ("data",)], mesh), w2, rtol=1e-12)
    np.testing.assert_allclose(unshard(got[4], [], mesh), y.sum(), rtol=1e-12)


def test_shard_unshard_round_trip_on_a_2d_mesh():
    mesh = Mesh.of(a=2, b=3)
    x = np.arange(12 * 6, dtype=np.float32).reshape(12, 6)
    for dims in [[("a",), ("b",)], [("b", "a"), ()], [(), ("b",)], [("a", "b"), ()]]:
        blocks = shard(x, dims, mesh)
        assert len(blocks) == 6
        np.testing.assert_array_equal(unshard(blocks, dims, mesh), x)
    # Device 4 sits at (a=1, b=1): with dim 0 over (b, a) it holds block 1*2+1 = 3.
    np.testing.assert_array_equal(shard(x, [("b", "a"), ()], mesh)[4], x[6:8])


def test_unshard_rejects_disagreeing_replicas_and_bad_shardings():
    mesh = Mesh.of(a=2, b=2)
    blocks = shard(np.ones((4, 2)), [("a",), ()], mesh)
    blocks[1] = blocks[1] + 1.0  # device 1 is a replica of device 0 along b
    with pytest.raises(InterpretError, match="replicas disagree: device 1 differs from device 0"):
        unshard(blocks, [("a",), ()], mesh)
    with pytest.raises(InterpretError, match="uses a mesh axis twice"):
        shard(np.ones((4, 4)), [("a",), ("a",)], mesh)
    with pytest.raises(InterpretError, match="not divisible"):
        shard(np.ones((3, 4)), [("a",), ()], mesh)


def test_executor_input_errors():
    fn = parse_file(str(EXAMPLES / "mlp.ir"))
    inputs = random_inputs(fn)
    with pytest.raises(InterpretError, match=r"missing inputs \['w2'\]"):
        run(fn, {k: v for k, v in inputs.items() if k != "w2"})
    with pytest.raises(InterpretError, match=r"input %x: expected shape \[16, 8\]"):
        run(fn, {**inputs, "x": np.zeros((8, 16))})
    local = parse_file(str(EXAMPLES / "mlp_bp_mp.ir"))
    with pytest.raises(InterpretError, match="is a collective: run the program with run_spmd"):
        run(local, random_inputs(local))
    with pytest.raises(InterpretError, match="has no mesh"):
        run_spmd(fn, {})


def test_float64_override_tightens_results():
    fn = parse_file(str(EXAMPLES / "mlp.ir"))
    inputs = {k: v.astype(np.float64) for k, v in random_inputs(fn, seed=5).items()}
    got = run(fn, inputs, float_dtype=np.float64)
    assert got[0].dtype == np.float64
    want = numpy_mlp_sgd_step(inputs["x"], inputs["target"], inputs["w1"], inputs["w2"])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_random_inputs_are_seeded_and_valid_gather_indices():
    b = Builder("embed")
    table, tokens = b.param("table", [7, 3]), b.param("tokens", [50], "i32")
    fn = b.build([b.gather(table, tokens)])
    first, again, other = random_inputs(fn, 4), random_inputs(fn, 4), random_inputs(fn, 5)
    np.testing.assert_array_equal(first["tokens"], again["tokens"])
    assert not np.array_equal(first["tokens"], other["tokens"])
    assert first["tokens"].min() >= 0 and first["tokens"].max() < 7


def test_walk_is_the_shared_evaluation_loop():
    # Shape inference as an abstract interpretation: the same walk, other semantics.
    fn = parse_file(str(EXAMPLES / "mlp.ir"))
    from ir import ops

    env = interpret.walk(fn, {p: p.type for p in fn.params},
                         lambda op, types: ops.infer_results(op.kind, tuple(types), op.attrs, fn.mesh))
    assert [env[r] for r in fn.results] == [r.type for r in fn.results]
