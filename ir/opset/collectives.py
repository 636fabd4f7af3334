"""Collectives over named mesh axes; they appear only in device-local programs.

Their numpy semantics are defined across the simulated mesh: `spmd_impl`
receives every device's operands (device ids row-major over the mesh) and
returns every device's results. A group is the set of devices that agree on
all mesh axes but the collective's `axes`; members are ordered by their
coordinates along `axes`, the first listed axis major (see `Mesh.groups`).
With k = the group size:

  all_reduce<axes, combiner>   every member gets the combination of all
  all_gather<dim, axes>        concatenation of the members' blocks along dim
                               (local size x k)
  all_slice<dim, axes>         member r keeps block r of its own value along
                               dim (local size / k); no communication
  reduce_scatter<dim, axes>    == all_slice(all_reduce(x)) on the same dim/axes
  all_to_all<src_dim, dst_dim, axes>
                               == all_slice<dst_dim>(all_gather<src_dim>(x)):
                               moves the axes' sharding from src_dim to dst_dim
  collective_permute<axes, shift, cyclic>
                               member r gets member r - shift's value, zeros
                               where r - shift is outside [0, k); with
                               `cyclic` (a ring: ring attention's K/V
                               blocks), member (r - shift) mod k's

Over several axes, all_gather<(a, b)> == all_gather<a>(all_gather<b>(x)).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ir.core import INT_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_axes,
    attr_bool,
    attr_choice,
    attr_int,
    check_dim,
    io_bytes,
    register,
    require,
)
from ir.opset.elementwise import elementwise_factors
from ir.opset.layout import untouched_dims_rule
from ir.opset.reduction import BITWISE_COMBINERS, COMBINERS


def group_size(kind: str, attrs: Attrs, mesh: Mesh) -> int:
    require(bool(mesh), f"{kind}: collectives need a device mesh (this function has none)")
    for a in attrs["axes"]:
        require(a in mesh.names, f"{kind}: unknown mesh axis {a!r}; mesh axes are {list(mesh.names)}")
    return mesh.group_size(attrs["axes"])


def _resized(kind: str, x: TensorType, dim: int, k: int, grow: bool) -> TensorType:
    check_dim(kind, dim, x.rank)
    shape = list(x.shape)
    if grow:
        shape[dim] *= k
    else:
        require(shape[dim] % k == 0, f"{kind}: dimension {dim} of {x} is not divisible by the group size {k}")
        shape[dim] //= k
    return TensorType(tuple(shape), x.dtype)


def _one_dim_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    # The collective's own dims change size, so they are opaque; others are parallel.
    resized = {attrs.get(k) for k in ("dim", "src_dim", "dst_dim")}
    return untouched_dims_rule(operand_types, result_types,
                               [d not in resized for d in range(operand_types[0].rank)])


def _combine_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # One combine per element; the link time is the cost model's business.
    return OpCost(operand_types[0].num_elements, io_bytes(operand_types, result_types))


def _move_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    return OpCost(0, io_bytes(operand_types, result_types))


def _per_group(fn: Callable[[list[np.ndarray], Attrs], list[np.ndarray]]) -> Callable:
    """Lift a function of one group's arrays (in group order) to the whole mesh."""

    def spmd(per_device: list[tuple[np.ndarray, ...]], attrs: Attrs, mesh: Mesh) -> list[tuple[np.ndarray, ...]]:
        out: list[tuple[np.ndarray, ...] | None] = [None] * len(per_device)
        for group in mesh.groups(attrs["axes"]):
            results = fn([per_device[d][0] for d in group], attrs)
            for d, r in zip(group, results):
                out[d] = (r,)
        return out  # type: ignore[return-value]

    return spmd


def _combine(arrays: list[np.ndarray], combiner: str) -> np.ndarray:
    return COMBINERS[combiner](np.stack(arrays), axis=0)


def _all_reduce(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    total = _combine(arrays, attrs["combiner"])
    return [total.copy() for _ in arrays]


def _all_gather(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    whole = np.concatenate(arrays, axis=attrs["dim"])
    return [whole.copy() for _ in arrays]


def _all_slice(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    k = len(arrays)
    return [np.split(a, k, axis=attrs["dim"])[r] for r, a in enumerate(arrays)]


def _reduce_scatter(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    total = _combine(arrays, attrs["combiner"])
    return np.split(total, len(arrays), axis=attrs["dim"])


def _all_to_all(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    k = len(arrays)
    # Member r sends block j of its dst_dim split to member j, which
    # concatenates what it receives along src_dim in sender order.
    blocks = [np.split(a, k, axis=attrs["dst_dim"]) for a in arrays]
    return [np.concatenate([blocks[r][j] for r in range(k)], axis=attrs["src_dim"]) for j in range(k)]


def _collective_permute(arrays: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    # XLA's collective-permute with the pairs (i, i + shift): a chain, not a
    # ring, so the members nobody sends to get zeros (a pipeline's first stage).
    k, shift = len(arrays), attrs["shift"]
    if attrs["cyclic"]:
        return [arrays[(r - shift) % k].copy() for r in range(k)]
    return [arrays[r - shift].copy() if 0 <= r - shift < k else np.zeros_like(arrays[r]) for r in range(k)]


def _check_combiner(kind: str, x: TensorType, combiner: str) -> None:
    """The dtypes `reduce` accepts for the combiner: what a sharded reduction lowers to must type-check too."""
    require(x.dtype != "bool" or combiner != "sum", f"{kind}: cannot sum a bool tensor {x}")
    require(combiner not in BITWISE_COMBINERS or x.dtype == "bool" or x.dtype in INT_DTYPES,
            f"{kind}: {combiner} combines bool or integer tensors, got {x}")


def _all_reduce_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    group_size("all_reduce", attrs, mesh)
    _check_combiner("all_reduce", types[0], attrs["combiner"])
    return types


def _all_gather_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    return (_resized("all_gather", types[0], attrs["dim"], group_size("all_gather", attrs, mesh), grow=True),)


def _all_slice_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    return (_resized("all_slice", types[0], attrs["dim"], group_size("all_slice", attrs, mesh), grow=False),)


def _reduce_scatter_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    k = group_size("reduce_scatter", attrs, mesh)
    _check_combiner("reduce_scatter", types[0], attrs["combiner"])
    return (_resized("reduce_scatter", types[0], attrs["dim"], k, grow=False),)


def _all_to_all_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    k = group_size("all_to_all", attrs, mesh)
    src, dst = attrs["src_dim"], attrs["dst_dim"]
    require(src != dst, f"all_to_all: src_dim and dst_dim must differ, both are {src}")
    grown = _resized("all_to_all", types[0], src, k, grow=True)
    return (_resized("all_to_all", grown, dst, k, grow=False),)


def _collective_permute_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    group_size("collective_permute", attrs, mesh)
    require(attrs["shift"] != 0, "collective_permute: shift must be nonzero (shift 0 would send every member "
                                 "its own value)")
    return types


AXES = AttrSpec("axes", attr_axes)
COMBINER = AttrSpec("combiner", attr_choice(*COMBINERS), "sum")
DIM = AttrSpec("dim", attr_int)

register(OpDef(
    "all_reduce", "collective", 1, (AXES, COMBINER), _all_reduce_infer, elementwise_factors, _combine_cost,
    spmd_impl=_per_group(_all_reduce), doc="combine over the group; every member gets the total",
))
register(OpDef(
    "all_gather", "collective", 1, (AXES, DIM), _all_gather_infer, _one_dim_factors, _move_cost,
    spmd_impl=_per_group(_all_gather), doc="concatenate the group's blocks along dim",
))
register(OpDef(
    "all_slice", "collective", 1, (AXES, DIM), _all_slice_infer, _one_dim_factors,
    lambda operand_types, result_types, attrs: OpCost(0, result_types[0].num_bytes),
    spmd_impl=_per_group(_all_slice), doc="keep this member's block along dim (local, no communication)",
))
register(OpDef(
    "reduce_scatter", "collective", 1, (AXES, DIM, COMBINER), _reduce_scatter_infer, _one_dim_factors,
    _combine_cost, spmd_impl=_per_group(_reduce_scatter), doc="all_slice(all_reduce(x))",
))
register(OpDef(
    "all_to_all", "collective", 1, (AXES, AttrSpec("src_dim", attr_int), AttrSpec("dst_dim", attr_int)),
    _all_to_all_infer, _one_dim_factors, _move_cost,
    spmd_impl=_per_group(_all_to_all), doc="move the axes' sharding from src_dim to dst_dim",
))
register(OpDef(
    "collective_permute", "collective", 1,
    (AXES, AttrSpec("shift", attr_int), AttrSpec("cyclic", attr_bool, False)),
    _collective_permute_infer, elementwise_factors, _move_cost, spmd_impl=_per_group(_collective_permute),
    doc="member r gets member r - shift's value along the axes (zeros where there is none; mod k if cyclic)",
))
