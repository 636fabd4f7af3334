"""reduce: combine a tensor over some dimensions with sum, max or min;
cumsum: running sums along one dimension.

Factor rule: reduced dimensions are reduction factors carrying the
combiner; the others are parallel. `reduce(x) {dims=[1], combiner="sum"}` on
a matrix is `(i,j)->(i) {j:sum}`: sharding j leaves partial sums.
"""

from __future__ import annotations

import numpy as np

from ir.core import INT_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_choice,
    attr_int,
    attr_ints,
    check_dim,
    io_bytes,
    register,
    require,
)

# and / or combine booleans (masks, `jnp.all`) and integers bitwise.
COMBINERS = {"sum": np.sum, "max": np.max, "min": np.min, "and": np.bitwise_and.reduce, "or": np.bitwise_or.reduce}
BITWISE_COMBINERS = ("and", "or")


def _infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    dims = attrs["dims"]
    for d in dims:
        check_dim("reduce", d, x.rank)
    require(len(set(dims)) == len(dims), f"reduce: dimension listed twice in {list(dims)}")
    require(x.dtype != "bool" or attrs["combiner"] != "sum", f"reduce: cannot sum a bool tensor {x}")
    require(attrs["combiner"] not in BITWISE_COMBINERS or x.dtype == "bool" or x.dtype in INT_DTYPES,
            f"reduce: {attrs['combiner']} combines bool or integer tensors, got {x}")
    return (TensorType(tuple(s for d, s in enumerate(x.shape) if d not in dims), x.dtype),)


def _factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    (x,) = operand_types
    names = [f"r{d}" if d in attrs["dims"] else f"d{d}" for d in range(x.rank)]
    kept = [n for d, n in enumerate(names) if d not in attrs["dims"]]
    combiners = {f"r{d}": attrs["combiner"] for d in attrs["dims"]}
    return FactorRule.build(operand_types, result_types, [names], [kept], combiners=combiners)


def _cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # One combine per input element.
    return OpCost(operand_types[0].num_elements, io_bytes(operand_types, result_types))


def identity(combiner: str, dtype: np.dtype) -> int | float | bool:
    """The combiner's identity: what a reduction over an empty dimension gives."""
    if combiner == "sum":
        return 0
    if combiner in BITWISE_COMBINERS:
        everything = True if dtype == np.bool_ else np.array(-1).astype(dtype).item()  # all bits set
        return everything if combiner == "and" else (False if dtype == np.bool_ else 0)
    biggest = combiner == "min"
    if np.issubdtype(dtype, np.floating):
        return np.inf if biggest else -np.inf
    if dtype == np.bool_:
        return biggest
    info = np.iinfo(dtype)
    return info.max if biggest else info.min


def _impl(args, attrs: Attrs):
    (x,) = args
    combiner = attrs["combiner"]
    total = COMBINERS[combiner](x, axis=tuple(attrs["dims"]), initial=identity(combiner, x.dtype))
    return (np.asarray(total),)


def _vjp(b, op, g, wanted):
    x = op.operands[0]
    kept = [d for d in range(x.type.rank) if d not in op.attrs["dims"]]
    spread = b.broadcast_in_dim(g, x.type.shape, kept)
    if op.attrs["combiner"] == "sum":
        return (spread,)
    if op.attrs["combiner"] in BITWISE_COMBINERS:  # bools and integers carry no gradient
        return (None,)
    # max/min: the elements equal to the result get the cotangent (all of them on ties).
    hit = b.compare(x, b.broadcast_in_dim(op.result, x.type.shape, kept), "eq")
    return (b.select(hit, spread, 0.0),)


register(OpDef(
    "reduce", "reduction", 1,
    (AttrSpec("dims", attr_ints), AttrSpec("combiner", attr_choice(*COMBINERS), "sum")),
    _infer, _factors, _cost, impl=_impl, vjp=_vjp,
    doc="combine over `dims` with `combiner` (sum, max, min; and, or for bool and integers)",
))


# ---------------------------------------------------------------- cumsum
# Running sums along one dimension (a router's slot of each token in its
# expert's capacity): the summed dimension is opaque (a sharded prefix sum
# would need each device's offset from the devices before it), the others
# parallel. One add per element; the transpose of a forward sum is the
# reverse sum of the cotangent.

DIRECTIONS = ("forward", "reverse")


def check_along_dim(kind: str, x: TensorType, attrs: Attrs, verb: str) -> None:
    """An op along `attrs["dim"]` of `x` (a running sum, a sort): the
    dimension exists, and the values are numbers to `verb`, not bools."""
    check_dim(kind, attrs["dim"], x.rank)
    require(x.dtype != "bool", f"{kind}: cannot {verb} a bool tensor {x}")


def _cumsum_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    check_along_dim("cumsum", types[0], attrs, "sum")
    return (types[0],)


def along_dim_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    """An op along `attrs["dim"]` (a running sum, a sort): that dimension
    opaque, every other parallel, the result shaped as the operand."""
    (x,) = operand_types
    names = ["s" if d == attrs["dim"] else f"d{d}" for d in range(x.rank)]
    return FactorRule.build(operand_types, result_types, [names], [names], opaque=["s"])


def _cumsum_impl(args, attrs: Attrs):
    (x,) = args
    dim = attrs["dim"]
    if attrs["direction"] == "forward":
        return (np.cumsum(x, axis=dim, dtype=x.dtype),)
    return (np.flip(np.cumsum(np.flip(x, axis=dim), axis=dim, dtype=x.dtype), axis=dim),)


def _cumsum_vjp(b, op, g, wanted):
    other = "reverse" if op.attrs["direction"] == "forward" else "forward"
    return (b.op("cumsum", [g], dim=op.attrs["dim"], direction=other),)


register(OpDef(
    "cumsum", "reduction", 1, (AttrSpec("dim", attr_int), AttrSpec("direction", attr_choice(*DIRECTIONS), "forward")),
    _cumsum_infer, along_dim_factors,
    lambda operand_types, result_types, attrs: OpCost(operand_types[0].num_elements,
                                                      io_bytes(operand_types, result_types)),
    impl=_cumsum_impl, vjp=_cumsum_vjp,
    doc="running sums along `dim`, from its start (forward) or from its end (reverse)",
))
