"""Sorting along one dimension: what routers (top-k experts), samplers and
argsort need.

  sort(x)     {dim, order, zeros}          x's values in order along `dim`
  argsort(x)  {dim, order, zeros, dtype}   the positions in x of sort's values

Both are stable (equal values keep their order) and order floats totally
as jax does: NaN after every number ascending (before, in descending
order); -0.0 equal to 0.0 (`zeros: equal`, jnp.sort's comparator, which
canonicalizes zeros) or before it (`zeros: ordered`, XLA's TopK).
Descending is the stable order of the values from the largest, equal
values from the lowest position, which is what `lax.top_k` returns
(`chlo.top_k` imports as a slice of each, zeros ordered).

Factor rule: the sorted dimension is opaque (a sharded sort would need a
merge across devices); every other dimension is parallel, so a router's
top-k over experts runs locally wherever the tokens are sharded.

Cost: a comparison per element per halving of the sorted dimension (a
merge sort's n log n); the bytes are the operand read and the result
written. sort's VJP scatters the cotangent back to the positions argsort
gives (the transpose of the `take_along_axis` that sort is); argsort's
integers carry none.
"""

from __future__ import annotations

import math

import numpy as np

from ir.core import INT_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    OpCost,
    OpDef,
    Types,
    attr_choice,
    attr_dtype,
    attr_int,
    io_bytes,
    register,
    require,
)
from ir.opset.reduction import along_dim_factors, check_along_dim

ORDERS = ("ascending", "descending")
ZEROS = ("equal", "ordered")  # -0.0 and 0.0: equal (jnp.sort's comparator), or -0.0 first (XLA's TopK)


def _sort_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    check_along_dim("sort", types[0], attrs, "order")
    return (types[0],)


def _argsort_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    check_along_dim("argsort", x, attrs, "order")
    require(attrs["dtype"] in INT_DTYPES, f"argsort: the index dtype must be an integer type, got {attrs['dtype']}")
    return (TensorType(x.shape, attrs["dtype"]),)


def _cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    (x,) = operand_types
    halvings = math.ceil(math.log2(max(x.shape[attrs["dim"]], 2)))
    return OpCost(x.num_elements * halvings, io_bytes(operand_types, result_types))


def positions(x: np.ndarray, dim: int, order: str, zeros: str = "equal") -> np.ndarray:
    """The stable order of `x` along `dim` (module docstring): descending
    is the ascending order of x reversed, read back to front (so equal
    values keep the lowest position first)."""
    if order == "ascending":
        return _ascending(x, dim, zeros)
    n = x.shape[dim]
    return np.flip(n - 1 - _ascending(np.flip(x, axis=dim), dim, zeros), axis=dim)


def _ascending(x: np.ndarray, dim: int, zeros: str) -> np.ndarray:
    """numpy's stable argsort already puts NaN last and ties -0.0 with 0.0;
    with `zeros: ordered`, a sign bit breaks that tie (-0.0 first)."""
    if zeros == "equal" or not np.issubdtype(x.dtype, np.floating):
        return np.argsort(x, axis=dim, kind="stable")
    rows = np.moveaxis(x, dim, -1)
    return np.moveaxis(np.lexsort((~np.signbit(rows), rows), axis=-1), -1, dim)


def _sort_impl(args, attrs: Attrs):
    (x,) = args
    where = positions(x, attrs["dim"], attrs["order"], attrs["zeros"])
    return (np.take_along_axis(x, where, axis=attrs["dim"]),)


def _argsort_impl(args, attrs: Attrs):
    (x,) = args
    return (positions(x, attrs["dim"], attrs["order"], attrs["zeros"]),)


def _sort_vjp(b, op, g, wanted):
    """Each sorted value's cotangent goes back to the position it came from."""
    x = op.operands[0]
    dim, rank = op.attrs["dim"], x.type.rank
    where = b.op("argsort", [x], dim=dim, order=op.attrs["order"], zeros=op.attrs["zeros"])
    where = b.reshape(where, (*x.type.shape, 1))
    others = [d for d in range(rank) if d != dim]
    return (b.op("general_scatter", [where, g], update_window_dims=[], inserted_window_dims=[dim],
                 input_batching_dims=others, scatter_indices_batching_dims=others,
                 scatter_dims_to_operand_dims=[dim], index_vector_dim=rank, shape=list(x.type.shape)),)


ORDER_ATTRS = (AttrSpec("dim", attr_int), AttrSpec("order", attr_choice(*ORDERS), "ascending"),
               AttrSpec("zeros", attr_choice(*ZEROS), "equal"))

register(OpDef(
    "sort", "sorting", 1, ORDER_ATTRS, _sort_infer, along_dim_factors, _cost, impl=_sort_impl, vjp=_sort_vjp,
    doc="x's values in `order` along `dim` (stable; NaN after every number ascending; -0.0 equal to 0.0, or "
        "before it with `zeros: ordered`)",
))
register(OpDef(
    "argsort", "sorting", 1, ORDER_ATTRS + (AttrSpec("dtype", attr_dtype, "i32"),),
    _argsort_infer, along_dim_factors, _cost, impl=_argsort_impl, vjp=lambda b, op, g, wanted: (None,),
    doc="the positions along `dim` of sort's values (stable: equal values from the lowest position)",
))
