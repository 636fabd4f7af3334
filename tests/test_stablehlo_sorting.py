"""Sorts, top_k and conditionals as jax printed them (one construct each,
written with jax's inputs and outputs by tools/export_real_fixtures.py
under tests/fixtures/stablehlo/): each imports to the registry's
sort/argsort or to a select of its branches and executes to jax's values;
a comparator the registry's order cannot follow is refused at its line;
a run-time conditional is noted; and a plan that shards around a top_k
executes like the global program."""

import numpy as np
import pytest
from conftest import ROOT
from spmd_check import assert_lowering_matches

from ir.autodiff import grad
from ir.builder import Builder
from ir.interpret import run
from ir.stablehlo import StableHLOError, import_module, load_stablehlo
from solver.planning.planner import plan_spec
from solver.planning.spec import load_spec

SMALL = ROOT / "tests" / "fixtures" / "stablehlo"


def jax_values(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = np.load(SMALL / f"{name}.npz")
    count = {side: sum(k.startswith(side + ".") for k in data) for side in ("in", "out")}
    return [data[f"in.{i}"] for i in range(count["in"])], [data[f"out.{i}"] for i in range(count["out"])]


@pytest.mark.parametrize("name, kinds", [
    ("top_k", {"sort", "argsort", "slice"}),
    ("top_k_grad", {"argsort", "general_scatter"}),  # jax's own backward: a scatter at top_k's positions
    ("sort_descending", {"sort", "argsort", "general_gather"}),
    ("sort_payload", {"sort", "argsort", "general_gather"}),
    ("cond", {"select"}),
    ("switch", {"select"}),
])
def test_construct_imports_and_executes_to_jaxs_values(name, kinds):
    fn = load_stablehlo(SMALL / f"{name}.mlir")
    assert kinds <= {op.kind for op in fn.ops}
    inputs, outputs = jax_values(name)
    got = run(fn, inputs)
    assert len(got) == len(outputs)
    for value, want in zip(got, outputs):
        assert value.dtype == want.dtype
        # Sorting moves values exactly (NaN, -0.0 and ties included); a branch's tanh may differ in an ulp.
        np.testing.assert_allclose(value, want, rtol=1e-6, atol=0, equal_nan=True)


def test_top_k_keeps_the_lowest_position_first_among_equal_values_and_nan_is_largest():
    (x,), (values, indices) = jax_values("top_k")
    assert np.isnan(x[0, 1]) and indices[0, 0] == 1 and np.isnan(values[0, 0])
    # XLA's TopK orders 0.0 before -0.0 (jnp.sort's comparator would call them equal and keep x's order).
    assert (x[0, 2], x[0, 3]) == (0.0, 0.0) and np.signbit(x[0, 2]) and list(indices[0]) == [1, 0, 3]
    row = x[1]
    top = row.max()
    assert list(indices[1][values[1] == top]) == sorted(np.flatnonzero(row == top))[:3]


def test_the_vjp_of_top_k_values_is_jaxs_gradient():
    (x, w), (want,) = jax_values("top_k_grad")
    b = Builder("top2")
    px, pw = b.param("x", x.shape, "f32"), b.param("w", w.shape, "f32")
    values = b.slice(b.op("sort", [px], dim=1, order="descending"), [0, 0], [x.shape[0], 2])
    loss = b.sum(b.mul(values, pw), [0, 1])
    gradient = grad(b.build([loss]), ["x"])
    np.testing.assert_allclose(run(gradient, [x, w])[1], want, rtol=1e-6)


def test_a_comparator_on_two_keys_is_refused_at_its_line():
    with pytest.raises(StableHLOError, match=r"sort_two_keys.mlir:3: stablehlo.sort: the comparator must return "
                                             r"one LT or GT compare of one operand's two values"):
        load_stablehlo(SMALL / "sort_two_keys.mlir")


def test_a_comparator_on_a_function_of_the_key_is_refused():
    text = (SMALL / "sort_payload.mlir").read_text()
    # Order by -key: the registry's sort cannot follow a transformed key.
    negated = text.replace("%4 = stablehlo.select %3, %cst_1, %2 : tensor<i1>, tensor<f32>",
                           "%4 = stablehlo.negate %2 : tensor<f32>")
    assert negated != text
    with pytest.raises(StableHLOError, match="the comparator must return one LT or GT compare of one operand's"):
        import_module(negated, "neg.mlir")


def test_a_run_time_conditional_computes_every_branch_and_says_so():
    module = import_module((SMALL / "switch.mlir").read_text(), "switch.mlir")
    (note,) = module.notes
    assert note.startswith("line ") and "stablehlo.case" in note and "3 branches" in note
    fn = module.function
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    for index, want in [(0, x * 2), (1, x + 1), (2, np.tanh(x)), (-4, x * 2), (9, np.tanh(x))]:  # jax clamps
        np.testing.assert_allclose(run(fn, [np.int32(index), x])[0], want, rtol=1e-6)


CASE = """\
module @jit_f {{
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<i1>) -> (tensor<4xf32>) {{
    %c = stablehlo.constant dense<{index}> : tensor<i32>
    %0 = "stablehlo.case"(%c) ({{
      %1 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
      stablehlo.return %1 : tensor<4xf32>
    }}, {{
      %1 = stablehlo.multiply %arg0, %arg0 : tensor<4xf32>
      stablehlo.return %1 : tensor<4xf32>
    }}) : (tensor<i32>) -> tensor<4xf32>
    %2 = "stablehlo.if"(%arg1) ({{
      stablehlo.return %0 : tensor<4xf32>
    }}, {{
      %3 = stablehlo.negate %0 : tensor<4xf32>
      stablehlo.return %3 : tensor<4xf32>
    }}) : (tensor<i1>) -> tensor<4xf32>
    return %2 : tensor<4xf32>
  }}
}}
"""


@pytest.mark.parametrize("index, kind", [(0, "add"), (1, "mul"), (7, "mul"), (-1, "mul")])
def test_a_known_index_takes_its_branch_alone_and_if_selects_on_its_predicate(index, kind):
    module = import_module(CASE.format(index=index), "case.mlir")
    fn = module.function
    assert kind in {op.kind for op in fn.ops} and {"add", "mul"} - {kind} & {op.kind for op in fn.ops} == set()
    (note,) = module.notes  # the `if` on a run-time predicate, not the case
    assert note.startswith("line 11: stablehlo.if")
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    branch = x + x if kind == "add" else x * x
    np.testing.assert_allclose(run(fn, [x, np.bool_(True)])[0], branch)
    np.testing.assert_allclose(run(fn, [x, np.bool_(False)])[0], -branch)


def test_a_branch_that_returns_another_type_is_refused_at_its_line():
    text = CASE.format(index=0).replace("stablehlo.return %3 : tensor<4xf32>", "stablehlo.return %arg1 : tensor<i1>")
    with pytest.raises(StableHLOError, match=r"case.mlir:11: stablehlo.if: branch 1 returns tensor<bool>, the op "):
        import_module(text, "case.mlir")


ROUTER = """\
module @jit_route {
  func.func public @main(%arg0: tensor<8x6xf32>, %arg1: tensor<6x4xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x6xf32>, tensor<6x4xf32>) -> tensor<8x4xf32>
    %values, %indices = chlo.top_k(%0, k = 2) : tensor<8x4xf32> -> (tensor<8x2xf32>, tensor<8x2xi32>)
    return %values, %indices : tensor<8x2xf32>, tensor<8x2xi32>
  }
}
"""  # noqa: E501 (jax's lines)

SPEC = """\
model:
  stablehlo: route.mlir
  param_names: [tokens, router]
  inputs: [tokens]
mesh: {batch: 2, model: 2}
hardware: A100-80GB
schedules:
  BP:
    tactics:
      - manual: {axis: batch, values: {tokens: 0}}
  EXPERTS:
    tactics:
      - manual: {axis: model, values: {router: 1}}
"""


@pytest.mark.parametrize("schedule", ["BP", "EXPERTS"])
def test_a_router_top_k_lowers_and_executes_like_the_global_program(tmp_path, schedule):
    """Tokens sharded: the top_k runs where they are. Router columns (the
    experts) sharded: the sorted dimension is opaque, so the logits are
    gathered whole before the top_k."""
    (tmp_path / "route.mlir").write_text(ROUTER)
    (tmp_path / "route.yaml").write_text(SPEC)
    planned = plan_spec(load_spec(tmp_path / "route.yaml"), schedule=schedule)
    local_kinds = [op.kind for op in planned.lowered.function.ops]
    assert ("all_gather" in local_kinds) == (schedule == "EXPERTS")
    assert_lowering_matches(planned.model, planned.lowered)
