"""Handlers of the bitwise, integer and remaining elementwise ops, and of
the chlo ops jax prints for elementwise math (`chlo.square`, `chlo.erf`,
`chlo.erf_inv`, `chlo.erfc`, trigonometric and hyperbolic functions).
chlo.lgamma, chlo.digamma and the Bessel functions stay unsupported: they
would need numerics of their own."""

from __future__ import annotations

from ir.core import Value
from ir.stablehlo.basic import elementwise
from ir.stablehlo.importer import Importer, Scope, handles
from ir.stablehlo.reader import Stmt

# StableHLO (or chlo) op -> registry kind, operands as they are.
ONE_TO_ONE = {
    "stablehlo.and": "and", "stablehlo.or": "or", "stablehlo.xor": "xor", "stablehlo.not": "not",
    "stablehlo.shift_left": "shift_left", "stablehlo.shift_right_logical": "shift_right_logical",
    "stablehlo.shift_right_arithmetic": "shift_right_arithmetic", "stablehlo.remainder": "rem",
    "stablehlo.atan2": "atan2", "stablehlo.abs": "abs", "stablehlo.sign": "sign", "stablehlo.floor": "floor",
    "stablehlo.ceil": "ceil", "stablehlo.round_nearest_even": "round_even", "stablehlo.round_nearest_afz": "round_away",
    "stablehlo.is_finite": "is_finite", "stablehlo.popcnt": "popcnt", "stablehlo.exponential_minus_one": "expm1",
    "stablehlo.log_plus_one": "log1p", "stablehlo.sine": "sin", "stablehlo.cosine": "cos", "chlo.erf": "erf",
    "chlo.erf_inv": "erf_inv", "chlo.erfc": "erfc", "stablehlo.count_leading_zeros": "clz", "stablehlo.cbrt": "cbrt",
    # jax prints chlo.tan; newer StableHLO has tan of its own.
    "stablehlo.tan": "tan", "chlo.tan": "tan", "chlo.sinh": "sinh", "chlo.cosh": "cosh", "chlo.asin": "asin",
    "chlo.acos": "acos", "chlo.atan": "atan", "chlo.asinh": "asinh", "chlo.acosh": "acosh", "chlo.atanh": "atanh",
}

for _name, _kind in ONE_TO_ONE.items():
    handles(_name)(elementwise(_kind))


@handles("chlo.square")
def square(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """x * x: no kind of its own (its rules would be mul's)."""
    (x,) = imp.args(stmt, scope)
    return [imp.checked(stmt, scope, "mul", [x, x])]


@handles("stablehlo.bitcast_convert")
def bitcast_convert(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    return [imp.checked(stmt, scope, "bitcast_convert", imp.args(stmt, scope), dtype=want.dtype)]


@handles("stablehlo.clamp")
def clamp(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """StableHLO lets the bounds be scalars; ours are broadcast to x's shape."""
    args = imp.args(stmt, scope)
    if len(args) != 3:
        raise imp.error(stmt, f"stablehlo.clamp: expected 3 operands (min, x, max), found {len(args)}")
    lo, x, hi = args
    shape = list(x.type.shape)
    lo, hi = (imp.op("broadcast_in_dim", [v], shape=shape, dims=[]) if v.type.rank == 0 and x.type.rank else v
              for v in (lo, hi))
    return [imp.checked(stmt, scope, "clamp", [lo, x, hi])]
