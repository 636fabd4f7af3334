"""The collectives of the registry (kinds with `spmd_impl`), checked with
`run_spmd` on a 1-D and a 2-D mesh against numpy and against the algebra in
`ir/opset/collectives.py` (split from test_ops.py, which checks the local
kinds)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from op_cases import F32, assert_same, t

from ir import ops
from ir.builder import Builder
from ir.core import Function, Mesh, TensorType, Value
from ir.interpret import run_spmd, shard
from ir.ops import OpError


@dataclass(frozen=True)
class CollectiveCase:
    """A collective over some mesh axes; `ref(group_inputs, rank)` is member
    `rank`'s result from the group's inputs, in group order."""

    kind: str
    name: str
    shape: tuple[int, ...]
    attrs: Mapping[str, Any]
    ref: Callable[[list[np.ndarray], int], np.ndarray]


def make(kind: str, operands: Sequence[TensorType], **attrs) -> ops.Op:
    return ops.make_op(kind, [Value(f"x{i}", ty) for i, ty in enumerate(operands)], attrs, ["y"])


def received(xs: list[np.ndarray], r: int, shift: int) -> np.ndarray:
    """collective_permute by hand: member r gets member r - shift's input; a
    member with no sender gets zeros (a chain, not a ring)."""
    sender = r - shift
    return xs[sender] if sender in range(len(xs)) else np.zeros(xs[r].shape, xs[r].dtype)


def nth_block(x: np.ndarray, dim: int, parts: int, r: int) -> np.ndarray:
    """Block r of `parts` equal blocks of x along dim."""
    step = x.shape[dim] // parts
    return np.take(x, range(r * step, (r + 1) * step), axis=dim)


COLLECTIVE_CASES = [
    CollectiveCase("all_reduce", "sum", (3, 5), {}, lambda xs, r: sum(x.astype(np.float64) for x in xs).astype(F32)),
    CollectiveCase("all_reduce", "max", (3, 5), {"combiner": "max"}, lambda xs, r: np.maximum.reduce(xs)),
    CollectiveCase("all_reduce", "min", (3, 5), {"combiner": "min"}, lambda xs, r: np.minimum.reduce(xs)),
    CollectiveCase("all_gather", "dim0", (3, 5), {"dim": 0}, lambda xs, r: np.vstack(xs)),
    CollectiveCase("all_gather", "dim1", (3, 5), {"dim": 1}, lambda xs, r: np.hstack(xs)),
    CollectiveCase("all_slice", "dim0", (12, 5), {"dim": 0}, lambda xs, r: nth_block(xs[r], 0, len(xs), r)),
    CollectiveCase("all_slice", "dim1", (5, 12), {"dim": 1}, lambda xs, r: nth_block(xs[r], 1, len(xs), r)),
    CollectiveCase("reduce_scatter", "sum_dim0", (12, 5), {"dim": 0},
                   lambda xs, r: nth_block(sum(x.astype(np.float64) for x in xs).astype(F32), 0, len(xs), r)),
    CollectiveCase("reduce_scatter", "max_dim1", (5, 12), {"dim": 1, "combiner": "max"},
                   lambda xs, r: nth_block(np.maximum.reduce(xs), 1, len(xs), r)),
    CollectiveCase("all_to_all", "1_to_0", (12, 5), {"src_dim": 1, "dst_dim": 0},
                   lambda xs, r: nth_block(np.hstack(xs), 0, len(xs), r)),
    CollectiveCase("all_to_all", "0_to_1", (5, 12), {"src_dim": 0, "dst_dim": 1},
                   lambda xs, r: nth_block(np.vstack(xs), 1, len(xs), r)),
    # Over every grouping below: one axis of 2 or 3 of a 2-axis mesh, an axis
    # of 4 (shift 2 leaves two members without a sender), two axes at once.
    CollectiveCase("collective_permute", "next", (3, 5), {"shift": 1}, lambda xs, r: received(xs, r, 1)),
    CollectiveCase("collective_permute", "previous", (3, 5), {"shift": -1}, lambda xs, r: received(xs, r, -1)),
    CollectiveCase("collective_permute", "skip_one", (3, 5), {"shift": 2}, lambda xs, r: received(xs, r, 2)),
    # A ring (ring attention's K/V blocks): the first member gets the last's.
    CollectiveCase("collective_permute", "ring", (3, 5), {"shift": 1, "cyclic": True},
                   lambda xs, r: xs[(r - 1) % len(xs)]),
]

MESHES = {"x4": Mesh.of(x=4), "b2m3": Mesh.of(batch=2, model=3)}
GROUPINGS = [
    pytest.param("x4", ("x",), id="x4-x"),
    pytest.param("b2m3", ("model",), id="b2m3-model"),
    pytest.param("b2m3", ("batch",), id="b2m3-batch"),
    pytest.param("b2m3", ("batch", "model"), id="b2m3-batch,model"),
    pytest.param("b2m3", ("model", "batch"), id="b2m3-model,batch"),
]


def group_of(mesh: Mesh, axes: tuple[str, ...], device: int) -> tuple[list[int], int]:
    """(members, rank of `device`), computed without Mesh.groups: members agree
    with `device` on every other axis and are ordered by their coordinates
    along `axes`, the first listed axis major. Device ids are row-major."""
    coords = list(itertools.product(*(range(size) for _, size in mesh.axes)))
    others = [i for i, name in enumerate(mesh.names) if name not in axes]
    members = [e for e, c in enumerate(coords) if all(c[i] == coords[device][i] for i in others)]
    members.sort(key=lambda e: tuple(coords[e][mesh.names.index(a)] for a in axes))
    return members, members.index(device)


def spmd_program(mesh: Mesh, shape: Sequence[int], steps: Sequence[tuple[str, dict]]) -> Function:
    """A device-local chain of collectives applied to one parameter."""
    b = Builder("spmd", mesh=mesh)
    y = b.param("x", shape)
    for kind, attrs in steps:
        y = b.op(kind, [y], **attrs)
    return b.build([y])


def per_device_inputs(mesh: Mesh, shape: Sequence[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(F32) for _ in range(mesh.num_devices)]


def test_mesh_groups_by_hand():
    mesh = Mesh.of(batch=2, model=3)  # device id = 3 * batch + model
    assert mesh.groups(("model",)) == [[0, 1, 2], [3, 4, 5]]
    assert mesh.groups(("batch",)) == [[0, 3], [1, 4], [2, 5]]
    assert mesh.groups(("batch", "model")) == [[0, 1, 2, 3, 4, 5]]
    assert mesh.groups(("model", "batch")) == [[0, 3, 1, 4, 2, 5]]
    for axes in [("model",), ("batch",), ("batch", "model"), ("model", "batch")]:
        for group in mesh.groups(axes):
            for rank, device in enumerate(group):
                assert group_of(mesh, axes, device) == (group, rank)


@pytest.mark.parametrize("mesh_name,axes", GROUPINGS)
@pytest.mark.parametrize("case", COLLECTIVE_CASES, ids=lambda c: f"{c.kind}-{c.name}")
def test_collective_matches_numpy(case: CollectiveCase, mesh_name: str, axes: tuple[str, ...]):
    mesh = MESHES[mesh_name]
    fn = spmd_program(mesh, case.shape, [(case.kind, {**case.attrs, "axes": list(axes)})])
    xs = per_device_inputs(mesh, case.shape)
    (got,) = run_spmd(fn, [xs])
    for device in range(mesh.num_devices):
        members, rank = group_of(mesh, axes, device)
        assert len(members) == mesh.group_size(axes)
        assert_same(got[device], case.ref([xs[m] for m in members], rank))


def assert_same_programs(mesh: Mesh, shape: Sequence[int], lhs: list, rhs: list) -> None:
    """Two collective chains give every device the same result."""
    xs = per_device_inputs(mesh, shape)
    (a,), (b,) = run_spmd(spmd_program(mesh, shape, lhs), [xs]), run_spmd(spmd_program(mesh, shape, rhs), [xs])
    for device in range(mesh.num_devices):
        assert_same(a[device], b[device])


@pytest.mark.parametrize("mesh_name,axes", GROUPINGS)
def test_collective_algebra(mesh_name: str, axes: tuple[str, ...]):
    mesh, axes = MESHES[mesh_name], list(axes)
    for combiner in ("sum", "max"):
        assert_same_programs(mesh, (12, 5), [("reduce_scatter", {"axes": axes, "dim": 0, "combiner": combiner})],
                             [("all_reduce", {"axes": axes, "combiner": combiner}),
                              ("all_slice", {"axes": axes, "dim": 0})])
    assert_same_programs(mesh, (12, 5), [("all_to_all", {"axes": axes, "src_dim": 1, "dst_dim": 0})],
                         [("all_gather", {"axes": axes, "dim": 1}), ("all_slice", {"axes": axes, "dim": 0})])
    if len(axes) == 2:
        a, b = axes
        assert_same_programs(mesh, (3, 5), [("all_gather", {"axes": axes, "dim": 0})],
                             [("all_gather", {"axes": [b], "dim": 0}), ("all_gather", {"axes": [a], "dim": 0})])


@pytest.mark.parametrize("mesh_name,axes", GROUPINGS)
def test_gather_and_slice_agree_with_shard(mesh_name: str, axes: tuple[str, ...]):
    """all_gather undoes `shard` along the gathered dim; all_slice of a
    replicated value is `shard`."""
    mesh = MESHES[mesh_name]
    whole = np.arange(12 * 5, dtype=F32).reshape(12, 5)
    blocks = shard(whole, [axes, ()], mesh)
    (gathered,) = run_spmd(spmd_program(mesh, blocks[0].shape, [("all_gather", {"axes": list(axes), "dim": 0})]),
                           [blocks])
    (sliced,) = run_spmd(spmd_program(mesh, whole.shape, [("all_slice", {"axes": list(axes), "dim": 0})]),
                         [[whole] * mesh.num_devices])
    for device in range(mesh.num_devices):
        assert_same(gathered[device], whole)
        assert_same(sliced[device], blocks[device])


@pytest.mark.parametrize("kind,attrs,pattern", [
    ("all_reduce", {"axes": ["nope"]}, "unknown mesh axis 'nope'"),
    ("all_gather", {"axes": ["batch", "nope"], "dim": 0}, "unknown mesh axis 'nope'"),
    ("all_slice", {"axes": ["model"], "dim": 1}, "not divisible"),
    ("reduce_scatter", {"axes": ["batch", "model"], "dim": 1}, "not divisible"),
    ("all_to_all", {"axes": ["model"], "src_dim": 0, "dst_dim": 1}, "not divisible"),
    ("all_to_all", {"axes": ["model"], "src_dim": 0, "dst_dim": 0}, "must differ"),
    ("all_gather", {"axes": ["model"], "dim": 2}, "out of range"),
    ("all_reduce", {"axes": []}, "attribute 'axes'"),
    ("collective_permute", {"axes": ["model"], "shift": 0}, "shift must be nonzero"),
    ("collective_permute", {"axes": ["nope"], "shift": 1}, "unknown mesh axis 'nope'"),
    ("collective_permute", {"axes": ["model"]}, "attribute 'shift'"),
    ("all_reduce", {"axes": ["model", "model"]}, "attribute 'axes'"),
])
def test_collective_infer_errors(kind: str, attrs: dict, pattern: str):
    mesh = Mesh.of(batch=2, model=3)
    with pytest.raises(OpError, match=pattern):
        ops.make_op(kind, [Value("x", t(12, 5))], attrs, ["y"], mesh)


def test_collectives_need_a_mesh():
    with pytest.raises(OpError, match="mesh"):
        make("all_reduce", [t(12, 5)], axes=["model"])


def test_collective_result_types():
    mesh = Mesh.of(batch=2, model=3)
    x = [Value("x", t(12, 5))]
    assert ops.make_op("all_gather", x, {"axes": ["batch", "model"], "dim": 1}, ["y"], mesh).result.type == t(12, 30)
    assert ops.make_op("all_slice", x, {"axes": ["model"], "dim": 0}, ["y"], mesh).result.type == t(4, 5)
    assert ops.make_op("reduce_scatter", x, {"axes": ["batch"], "dim": 0}, ["y"], mesh).result.type == t(6, 5)
    a2a = ops.make_op("all_to_all", x, {"axes": ["model"], "src_dim": 1, "dst_dim": 0}, ["y"], mesh)
    assert a2a.result.type == t(4, 15)
    permute = ops.make_op("collective_permute", x, {"axes": ["batch", "model"], "shift": -1}, ["y"], mesh)
    assert permute.result.type == t(12, 5)


