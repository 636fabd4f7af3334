"""Bitwise, integer and the remaining elementwise ops that real programs
use: jax's PRNG (threefry on u32: shifts, xor, or, add), masks (and, or,
not), the integer-label cross-entropy (is_finite, abs, sign), rounding,
trigonometry for rotary embeddings, erf for exact GELU, erf_inv for
jax.random.normal, clamp, bitcast_convert (random bits to floats), and the
cheap chlo math jax prints (erfc, tan, the hyperbolic and inverse
trigonometric functions, cbrt) and count_leading_zeros (clz).

All are elementwise: one parallel factor per dimension, shared by every
operand and the result (`elementwise_factors`). Integer arithmetic wraps
modulo the width, as on devices; a shift by the width or more gives 0
(logical) or the sign (arithmetic), as StableHLO specifies. Ops that are
piecewise constant (bitwise, rounding, sign, is_finite, popcnt, clz,
bitcast_convert) have no gradient: their VJP contributes nothing, like
`compare`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ir.core import DTYPE_BYTES, FLOAT_DTYPES, INT_DTYPES, NUMPY_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import AttrSpec, OpDef, Types, attr_dtype, register, require
from ir.opset.elementwise import elementwise_cost, elementwise_factors, same_shapes

BITWISE_DTYPES = INT_DTYPES | {"bool"}


def _no_gradient(b, op, g, wanted):
    return (None,) * len(op.operands)


def _bits(x: np.ndarray) -> int:
    return x.dtype.itemsize * 8


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _signed(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"i{x.dtype.itemsize}"))


def _shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = b.astype(np.int64)
    inside = (n >= 0) & (n < _bits(a))
    shifted = np.left_shift(_unsigned(a), np.where(inside, n, 0).astype(_unsigned(a).dtype))
    return np.where(inside, shifted, 0).astype(_unsigned(a).dtype).view(a.dtype)


def _shift_right_logical(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = b.astype(np.int64)
    inside = (n >= 0) & (n < _bits(a))
    shifted = np.right_shift(_unsigned(a), np.where(inside, n, 0).astype(_unsigned(a).dtype))
    return np.where(inside, shifted, 0).astype(_unsigned(a).dtype).view(a.dtype)


def _shift_right_arithmetic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = b.astype(np.int64)
    inside = (n >= 0) & (n < _bits(a))
    s = _signed(a)
    shifted = np.right_shift(s, np.where(inside, n, _bits(a) - 1).astype(s.dtype))
    return shifted.astype(s.dtype).view(a.dtype)


def _rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The remainder with the dividend's sign (C's fmod), as StableHLO."""
    if np.issubdtype(a.dtype, np.integer):
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, a, np.fmod(a, safe)).astype(a.dtype)
    return np.fmod(a, b)


def _trunc_div(b, x, y):
    """trunc(x / y) as IR ops: sign(q) * floor(|q|)."""
    q = b.div(x, y)
    return b.mul(b.op("sign", [q]), b.op("floor", [b.op("abs", [q])]))


def _vjp_rem(b, op, g, wanted):
    # rem(a, c) = a - trunc(a / c) c: d/da = 1, d/dc = -trunc(a / c)
    a, c = op.operands
    return (g if wanted[0] else None, b.neg(b.mul(g, _trunc_div(b, a, c))) if wanted[1] else None)


def _vjp_atan2(b, op, g, wanted):
    # atan2(a, c): d/da = c / (a^2 + c^2), d/dc = -a / (a^2 + c^2)
    a, c = op.operands
    scale = b.div(g, b.add(b.mul(a, a), b.mul(c, c)))
    return (b.mul(scale, c) if wanted[0] else None, b.neg(b.mul(scale, a)) if wanted[1] else None)


# name -> (numpy function, operand dtypes allowed, VJP, doc)
BINARY: dict[str, tuple[Callable, frozenset[str], Callable, str]] = {
    "and": (np.bitwise_and, BITWISE_DTYPES, _no_gradient, "bitwise (logical for bool) and"),
    "or": (np.bitwise_or, BITWISE_DTYPES, _no_gradient, "bitwise (logical for bool) or"),
    "xor": (np.bitwise_xor, BITWISE_DTYPES, _no_gradient, "bitwise (logical for bool) exclusive or"),
    "shift_left": (_shift_left, INT_DTYPES, _no_gradient, "a << b; 0 when b is at least the width"),
    "shift_right_logical": (_shift_right_logical, INT_DTYPES, _no_gradient,
                            "a >> b filling with zeros; 0 when b is at least the width"),
    "shift_right_arithmetic": (_shift_right_arithmetic, INT_DTYPES, _no_gradient,
                               "a >> b filling with the sign bit"),
    "rem": (_rem, INT_DTYPES | FLOAT_DTYPES, _vjp_rem, "remainder with the sign of a (C fmod)"),
    "atan2": (np.arctan2, FLOAT_DTYPES, _vjp_atan2, "the angle of (b, a)"),
}


def _binary(name: str, fn: Callable, dtypes: frozenset[str]) -> tuple[Callable, Callable]:
    def infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
        a, b = types
        same_shapes(name, types)
        require(a.dtype == b.dtype, f"{name}: operand dtypes differ: {a}, {b}")
        require(a.dtype in dtypes, f"{name}: expects {', '.join(sorted(dtypes))} tensors, got {a}")
        return (a,)

    def impl(args, attrs: Attrs):
        with np.errstate(all="ignore"):
            return (fn(args[0], args[1]),)

    return infer, impl


for _name, (_fn, _dtypes, _vjp, _doc) in BINARY.items():
    _infer, _impl = _binary(_name, _fn, _dtypes)
    register(OpDef(_name, "elementwise", 2, (), _infer, elementwise_factors, elementwise_cost(1),
                   impl=_impl, vjp=_vjp, doc=_doc))


_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)  # not 1 - erf: that loses the tail (erfc(5) ~ 1.5e-12) to cancellation


def _erf_f(x: np.ndarray) -> np.ndarray:
    return _erf(x.astype(np.float64)).astype(np.float64)


def _erfc_f(x: np.ndarray) -> np.ndarray:
    return _erfc(x.astype(np.float64)).astype(np.float64)


def _erf_inv(y: np.ndarray) -> np.ndarray:
    """Newton's method on erf from a logarithmic first guess; exact to float64 rounding in a few steps."""
    y = y.astype(np.float64)
    with np.errstate(all="ignore"):
        w = -np.log((1.0 - y) * (1.0 + y))
        x = np.sign(y) * np.sqrt(np.maximum(w, 0.0) * 0.5) * 0.9
        for _ in range(60):
            step = (_erf_f(x) - y) / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
            step = np.where(np.isfinite(step), step, 0.0)
            x = x - step
            if not np.any(np.abs(step) > 1e-12 * np.maximum(np.abs(x), 1e-300)):
                break
    return np.where(np.abs(y) == 1.0, np.sign(y) * np.inf, np.where(np.abs(y) > 1.0, np.nan, x))


def _popcnt(x: np.ndarray) -> np.ndarray:
    u = _unsigned(np.ascontiguousarray(x))  # a transposed view cannot be read as bytes along its last axis
    counts = np.unpackbits(u.view(np.uint8).reshape(*u.shape, u.dtype.itemsize), axis=-1).sum(axis=-1)
    return counts.astype(x.dtype)


def _round_away(x: np.ndarray) -> np.ndarray:
    # Not floor(|x| + 0.5): that sum rounds in the float's own precision (0.49999997 + 0.5 == 1 in f32).
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)


def _sign(x: np.ndarray) -> np.ndarray:
    # StableHLO keeps the zero's sign: sign(-0.0) == -0.0 (numpy's gives +0.0).
    return np.where(x == 0, x, np.sign(x)) if np.issubdtype(x.dtype, np.floating) else np.sign(x)


def _clz(x: np.ndarray) -> np.ndarray:
    """Leading zero bits, by halving: n starts at the width; each step that
    finds bits in the upper half drops it."""
    u = _unsigned(x).astype(np.uint64)
    n = np.full(x.shape, _bits(x), np.int64)
    shift = _bits(x) // 2
    while shift:
        upper = u >> np.uint64(shift)
        n = np.where(upper != 0, n - shift, n)
        u = np.where(upper != 0, upper, u)
        shift //= 2
    return (n - u.astype(np.int64)).astype(x.dtype)  # u is now 0 or 1: its bit


def _not(x: np.ndarray) -> np.ndarray:
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def _vjp_abs(b, op, g, wanted):
    return (b.mul(g, b.op("sign", [op.operands[0]])),)


def _vjp_sin(b, op, g, wanted):
    return (b.mul(g, b.op("cos", [op.operands[0]])),)


def _vjp_cos(b, op, g, wanted):
    return (b.neg(b.mul(g, b.op("sin", [op.operands[0]]))),)


def _vjp_expm1(b, op, g, wanted):
    return (b.mul(g, b.add(op.result, 1.0)),)


def _vjp_log1p(b, op, g, wanted):
    return (b.div(g, b.add(op.operands[0], 1.0)),)


def _vjp_erf(b, op, g, wanted):
    x = op.operands[0]
    return (b.mul(g, b.mul(b.exp(b.neg(b.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


def _vjp_erfc(b, op, g, wanted):
    x = op.operands[0]
    return (b.mul(g, b.mul(b.exp(b.neg(b.mul(x, x))), -2.0 / math.sqrt(math.pi))),)


def _vjp_tan(b, op, g, wanted):
    y = op.result
    return (b.mul(g, b.add(b.mul(y, y), 1.0)),)


def _vjp_sinh(b, op, g, wanted):
    return (b.mul(g, b.op("cosh", [op.operands[0]])),)


def _vjp_cosh(b, op, g, wanted):
    return (b.mul(g, b.op("sinh", [op.operands[0]])),)


def _vjp_over_root(sign: float, offset: float, square_sign: float) -> Callable:
    """d/dx = sign / sqrt(offset + square_sign x^2): asin (1, 1, -1), acos (-1, 1, -1),
    asinh (1, 1, 1), acosh (1, -1, 1)."""

    def vjp(b, op, g, wanted):
        x = op.operands[0]
        return (b.mul(g, b.mul(b.rsqrt(b.add(b.mul(b.mul(x, x), square_sign), offset)), sign)),)

    return vjp


def _vjp_over_square(square_sign: float) -> Callable:
    """d/dx = 1 / (1 + square_sign x^2): atan (1), atanh (-1)."""

    def vjp(b, op, g, wanted):
        x = op.operands[0]
        return (b.div(g, b.add(b.mul(b.mul(x, x), square_sign), 1.0)),)

    return vjp


def _vjp_cbrt(b, op, g, wanted):
    y = op.result
    return (b.div(g, b.mul(b.mul(y, y), 3.0)),)


def _vjp_erf_inv(b, op, g, wanted):
    y = op.result
    return (b.mul(g, b.mul(b.exp(b.mul(y, y)), math.sqrt(math.pi) / 2.0)),)


NUMERIC = INT_DTYPES | FLOAT_DTYPES
# name -> (numpy function, operand dtypes, result dtype (None: the operand's), VJP, doc)
UNARY: dict[str, tuple[Callable, frozenset[str], str | None, Callable, str]] = {
    "not": (_not, BITWISE_DTYPES, None, _no_gradient, "bitwise (logical for bool) not"),
    "abs": (np.abs, NUMERIC, None, _vjp_abs, "|x|"),
    "sign": (_sign, NUMERIC, None, _no_gradient, "-1, 0 or 1 (nan for nan, -0.0 for -0.0)"),
    "floor": (np.floor, FLOAT_DTYPES, None, _no_gradient, "round toward -inf"),
    "ceil": (np.ceil, FLOAT_DTYPES, None, _no_gradient, "round toward +inf"),
    "round_even": (np.round, FLOAT_DTYPES, None, _no_gradient, "round half to even"),
    "round_away": (_round_away, FLOAT_DTYPES, None, _no_gradient, "round half away from zero"),
    "is_finite": (np.isfinite, FLOAT_DTYPES, "bool", _no_gradient, "neither inf nor nan -> bool"),
    "popcnt": (_popcnt, INT_DTYPES, None, _no_gradient, "number of set bits"),
    "clz": (_clz, INT_DTYPES, None, _no_gradient, "number of leading zero bits"),
    "expm1": (np.expm1, FLOAT_DTYPES, None, _vjp_expm1, "e**x - 1"),
    "log1p": (np.log1p, FLOAT_DTYPES, None, _vjp_log1p, "log(1 + x)"),
    "sin": (np.sin, FLOAT_DTYPES, None, _vjp_sin, "sine"),
    "cos": (np.cos, FLOAT_DTYPES, None, _vjp_cos, "cosine"),
    "erf": (_erf_f, FLOAT_DTYPES, None, _vjp_erf, "the error function"),
    "erf_inv": (_erf_inv, FLOAT_DTYPES, None, _vjp_erf_inv, "the inverse error function"),
    "erfc": (_erfc_f, FLOAT_DTYPES, None, _vjp_erfc, "1 - erf(x), accurate in the tail"),
    "tan": (np.tan, FLOAT_DTYPES, None, _vjp_tan, "tangent"),
    "sinh": (np.sinh, FLOAT_DTYPES, None, _vjp_sinh, "hyperbolic sine"),
    "cosh": (np.cosh, FLOAT_DTYPES, None, _vjp_cosh, "hyperbolic cosine"),
    "asin": (np.arcsin, FLOAT_DTYPES, None, _vjp_over_root(1.0, 1.0, -1.0), "inverse sine"),
    "acos": (np.arccos, FLOAT_DTYPES, None, _vjp_over_root(-1.0, 1.0, -1.0), "inverse cosine"),
    "atan": (np.arctan, FLOAT_DTYPES, None, _vjp_over_square(1.0), "inverse tangent"),
    "asinh": (np.arcsinh, FLOAT_DTYPES, None, _vjp_over_root(1.0, 1.0, 1.0), "inverse hyperbolic sine"),
    "acosh": (np.arccosh, FLOAT_DTYPES, None, _vjp_over_root(1.0, -1.0, 1.0), "inverse hyperbolic cosine"),
    "atanh": (np.arctanh, FLOAT_DTYPES, None, _vjp_over_square(-1.0), "inverse hyperbolic tangent"),
    "cbrt": (np.cbrt, FLOAT_DTYPES, None, _vjp_cbrt, "cube root"),
}


def _unary(name: str, fn: Callable, dtypes: frozenset[str], result: str | None) -> tuple[Callable, Callable]:
    def infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
        (x,) = types
        require(x.dtype in dtypes, f"{name}: expects {', '.join(sorted(dtypes))} tensors, got {x}")
        return (TensorType(x.shape, result or x.dtype),)

    def impl(args, attrs: Attrs):
        with np.errstate(all="ignore"):
            return (np.asarray(fn(args[0])),)

    return infer, impl


for _name, (_fn, _dtypes, _result, _vjp, _doc) in UNARY.items():
    _infer, _impl = _unary(_name, _fn, _dtypes, _result)
    register(OpDef(_name, "elementwise", 1, (), _infer, elementwise_factors, elementwise_cost(1),
                   impl=_impl, vjp=_vjp, doc=_doc))


# ---- bitcast_convert: the same bits read as another type of the same width


def _bitcast_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    dtype = attrs["dtype"]
    require("bool" not in (x.dtype, dtype), f"bitcast_convert: bool has no bit pattern to reinterpret ({x} -> {dtype})")
    require(DTYPE_BYTES[x.dtype] == DTYPE_BYTES[dtype],
            f"bitcast_convert: {x.dtype} ({DTYPE_BYTES[x.dtype]} bytes) and {dtype} ({DTYPE_BYTES[dtype]} bytes) "
            "differ in width; only same-width casts, which keep the shape, are supported")
    require("bf16" not in (x.dtype, dtype), "bitcast_convert: bf16 executes as f32 here, so its bits are not kept")
    return (TensorType(x.shape, dtype),)


def _bitcast_impl(args, attrs: Attrs):
    (x,) = args
    target = np.dtype(NUMPY_DTYPES[attrs["dtype"]])
    if x.dtype.itemsize != target.itemsize and np.issubdtype(x.dtype, np.floating):
        # Floats run wider under the executor's float_dtype override (f64 for finite differences);
        # the bits are those of the declared float of the target's width.
        x = x.astype(np.dtype(f"f{target.itemsize}"))
    return (np.ascontiguousarray(x).view(target),)


register(OpDef(
    "bitcast_convert", "elementwise", 1, (AttrSpec("dtype", attr_dtype),),
    _bitcast_infer, elementwise_factors, elementwise_cost(0), impl=_bitcast_impl, vjp=_no_gradient,
    doc="reinterpret the bits as `dtype` (same width)",
))


# ---- clamp


def _clamp_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    lo, x, hi = types
    same_shapes("clamp", types)
    require(lo.dtype == x.dtype == hi.dtype, f"clamp: operand dtypes differ: {lo}, {x}, {hi}")
    require(x.dtype in NUMERIC, f"clamp: expects numeric tensors, got {x}")
    return (x,)


def _vjp_clamp(b, op, g, wanted):
    # clamp = min(max(x, lo), hi): hi wins where max(x, lo) > hi (also when lo > hi), else lo where x < lo.
    lo, x, hi = op.operands
    above = b.compare(b.maximum(x, lo), hi, "gt")
    below = b.op("and", [b.compare(x, lo, "lt"), b.op("not", [above])])
    inside = b.op("not", [b.op("or", [below, above])])
    return (b.select(below, g, 0.0) if wanted[0] else None, b.select(inside, g, 0.0) if wanted[1] else None,
            b.select(above, g, 0.0) if wanted[2] else None)


register(OpDef(
    "clamp", "elementwise", 3, (), _clamp_infer, elementwise_factors, elementwise_cost(2),
    impl=lambda args, attrs: (np.minimum(np.maximum(args[1], args[0]), args[2]),),
    vjp=_vjp_clamp, doc="min(max(x, lo), hi), operands (lo, x, hi)",
))

