"""dot_general: batched tensor contraction (StableHLO's dot_general).

Attributes `batch = [[lhs dims], [rhs dims]]` and `contract = [[lhs dims],
[rhs dims]]`. The result dimensions are, in order: the batch dimensions, the
remaining lhs dimensions, the remaining rhs dimensions (XLA's convention).

Factor rule: batch factors and free factors are parallel; each contracting
pair is a reduction factor with combiner `sum`. For a matmul that is
`(i,k),(k,j)->(i,j) {k:sum}`: sharding k leaves partial sums.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ir.core import Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_int_pair,
    check_dim,
    io_bytes,
    register,
    require,
)


def _free_dims(rank: int, *used: tuple[int, ...]) -> list[int]:
    taken = {d for dims in used for d in dims}
    return [d for d in range(rank) if d not in taken]


def _infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    lhs, rhs = types
    (lb, rb), (lc, rc) = attrs["batch"], attrs["contract"]
    require(lhs.dtype == rhs.dtype, f"dot_general: operand dtypes differ: {lhs}, {rhs}")
    require(lhs.dtype != "bool", f"dot_general: expects numeric tensors, got {lhs}")
    require(len(lb) == len(rb), f"dot_general: batch lists differ in length: {list(lb)} vs {list(rb)}")
    require(len(lc) == len(rc), f"dot_general: contract lists differ in length: {list(lc)} vs {list(rc)}")
    for side, ty, dims in (("lhs", lhs, lb + lc), ("rhs", rhs, rb + rc)):
        for d in dims:
            check_dim("dot_general", d, ty.rank, f"{side} dimension")
        require(len(set(dims)) == len(dims), f"dot_general: {side} dimension used twice in {list(dims)}")
    for kind, ld, rd in (("batch", lb, rb), ("contracting", lc, rc)):
        for a, b in zip(ld, rd):
            require(
                lhs.shape[a] == rhs.shape[b],
                f"dot_general: {kind} dimension sizes differ: lhs dim {a} is {lhs.shape[a]}, "
                f"rhs dim {b} is {rhs.shape[b]}",
            )
    shape = (
        [lhs.shape[d] for d in lb]
        + [lhs.shape[d] for d in _free_dims(lhs.rank, lb, lc)]
        + [rhs.shape[d] for d in _free_dims(rhs.rank, rb, rc)]
    )
    return (TensorType(tuple(shape), lhs.dtype),)


def _factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    lhs, rhs = operand_types
    (lb, rb), (lc, rc) = attrs["batch"], attrs["contract"]
    lhs_dims: list[str] = [""] * lhs.rank
    rhs_dims: list[str] = [""] * rhs.rank
    result_dims: list[str] = []
    for i, (a, b) in enumerate(zip(lb, rb)):
        lhs_dims[a] = rhs_dims[b] = f"b{i}"
        result_dims.append(f"b{i}")
    for i, (a, b) in enumerate(zip(lc, rc)):
        lhs_dims[a] = rhs_dims[b] = f"k{i}"
    for i, d in enumerate(_free_dims(lhs.rank, lb, lc)):
        lhs_dims[d] = f"m{i}"
        result_dims.append(f"m{i}")
    for i, d in enumerate(_free_dims(rhs.rank, rb, rc)):
        rhs_dims[d] = f"n{i}"
        result_dims.append(f"n{i}")
    combiners = {f"k{i}": "sum" for i in range(len(lc))}
    return FactorRule.build(operand_types, result_types, [lhs_dims, rhs_dims], [result_dims], combiners=combiners)


def _cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    lhs = operand_types[0]
    contracted = math.prod(lhs.shape[d] for d in attrs["contract"][0])
    return OpCost(2 * result_types[0].num_elements * contracted, io_bytes(operand_types, result_types))


def _impl(args, attrs: Attrs):
    lhs, rhs = args
    (lb, rb), (lc, rc) = attrs["batch"], attrs["contract"]
    letters = iter(string.ascii_letters)
    lhs_sub = [next(letters) for _ in range(lhs.ndim)]
    rhs_sub = [next(letters) for _ in range(rhs.ndim)]
    for a, b in zip(lb + lc, rb + rc):
        rhs_sub[b] = lhs_sub[a]
    out = (
        [lhs_sub[d] for d in lb]
        + [lhs_sub[d] for d in _free_dims(lhs.ndim, lb, lc)]
        + [rhs_sub[d] for d in _free_dims(rhs.ndim, rb, rc)]
    )
    spec = f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(out)}"
    return (np.einsum(spec, lhs, rhs),)


def _laid_out(b, d, slots: list[int]):
    """Transpose `d` so that its dim i is the one `slots` says holds operand dim i."""
    perm = [slots.index(i) for i in range(len(slots))]
    return d if perm == sorted(perm) else b.transpose(d, perm)


def _vjp(b, op, g, wanted):
    """d lhs = g . rhs over the rhs free dims; d rhs = lhs . g over the lhs free dims.

    The operand orders are chosen so that a plain matmul's cotangents come out
    in the operands' layouts without a transpose.
    """
    lhs, rhs = op.operands
    (lb, rb), (lc, rc) = op.attrs["batch"], op.attrs["contract"]
    lf, rf = _free_dims(lhs.type.rank, lb, lc), _free_dims(rhs.type.rank, rb, rc)
    nb = len(lb)
    g_batch = list(range(nb))
    g_lhs = list(range(nb, nb + len(lf)))  # g's dims that came from lhs
    g_rhs = list(range(nb + len(lf), nb + len(lf) + len(rf)))
    out = [None, None]
    if wanted[0]:
        # dims: batch, lhs free, then rhs's contracting dims in ascending order
        d = b.dot_general(g, rhs, [g_rhs, rf], [g_batch, list(rb)])
        out[0] = _laid_out(b, d, list(lb) + lf + [lc[rc.index(k)] for k in sorted(rc)])
    if wanted[1]:
        # dims: batch, lhs's contracting dims (as rhs dims) in ascending lhs order, rhs free
        d = b.dot_general(lhs, g, [lf, g_lhs], [list(lb), g_batch])
        out[1] = _laid_out(b, d, list(rb) + [rc[lc.index(k)] for k in sorted(lc)] + rf)
    return tuple(out)


register(OpDef(
    "dot_general", "contraction", 2,
    (AttrSpec("batch", attr_int_pair, ((), ())), AttrSpec("contract", attr_int_pair)),
    _infer, _factors, _cost, impl=_impl, vjp=_vjp,
    doc="batched contraction; result dims = batch, lhs free, rhs free",
))
