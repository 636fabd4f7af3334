"""Elementwise ops: unary math, binary arithmetic, compare, select, convert.

Operands of one elementwise op have identical shapes (broadcasting is an
explicit `broadcast_in_dim`, as in StableHLO), so the factor rule is one
parallel factor per dimension, shared by every operand and the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ir.core import FLOAT_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_choice,
    attr_dtype,
    dim_names,
    io_bytes,
    register,
    require,
)


def elementwise_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    dims = dim_names("d", result_types[0].rank)
    return FactorRule.build(operand_types, result_types, [dims] * len(operand_types), [dims])


def elementwise_cost(flops_per_element: int) -> Callable[[Types, Types, Attrs], OpCost]:
    def cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
        return OpCost(flops_per_element * result_types[0].num_elements, io_bytes(operand_types, result_types))

    return cost


def same_shapes(kind: str, types: Types) -> None:
    shapes = {t.shape for t in types}
    require(len(shapes) == 1, f"{kind}: operand shapes differ: {', '.join(str(t) for t in types)}")


def _gelu(x: np.ndarray) -> np.ndarray:
    # The tanh approximation used by GPT-2, BERT and Gemma.
    c = np.sqrt(2.0 / np.pi).astype(x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


# Reverse-mode rules. Each gets the builder emitting the backward program, the
# op, the cotangent g of its result and which operands need a cotangent; it
# returns one cotangent (or None) per operand. They may use the op's result.


def _vjp_exp(b, op, g, wanted):
    return (b.mul(g, op.result),)


def _vjp_log(b, op, g, wanted):
    return (b.div(g, op.operands[0]),)


def _vjp_tanh(b, op, g, wanted):
    y = op.result
    return (b.mul(g, b.sub(1.0, b.mul(y, y))),)


def _vjp_sqrt(b, op, g, wanted):
    return (b.div(b.mul(g, 0.5), op.result),)


def _vjp_rsqrt(b, op, g, wanted):
    # d/dx x**-1/2 = -1/2 * x**-1/2 / x
    return (b.mul(b.mul(g, -0.5), b.div(op.result, op.operands[0])),)


def _vjp_relu(b, op, g, wanted):
    return (b.select(b.compare(op.operands[0], 0.0, "gt"), g, 0.0),)


def _vjp_gelu(b, op, g, wanted):
    # y = x/2 (1 + t), t = tanh(u), u = c (x + 0.044715 x^3):
    # dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 * 0.044715 x^2)
    x = op.operands[0]
    c = float(np.sqrt(2.0 / np.pi))
    x2 = b.mul(x, x)
    t = b.tanh(b.mul(b.add(x, b.mul(b.mul(x2, x), 0.044715)), c))
    du = b.mul(b.add(b.mul(x2, 3 * 0.044715), 1.0), c)
    dy = b.add(b.mul(b.add(t, 1.0), 0.5), b.mul(b.mul(b.mul(x, 0.5), b.sub(1.0, b.mul(t, t))), du))
    return (b.mul(g, dy),)


def _vjp_logistic(b, op, g, wanted):
    y = op.result
    return (b.mul(g, b.mul(y, b.sub(1.0, y))),)


# name -> (numpy function, float-only?, flops per element, VJP, doc)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool, int, Callable, str]] = {
    "neg": (np.negative, False, 1, lambda b, op, g, wanted: (b.neg(g),), "-x"),
    "exp": (np.exp, True, 1, _vjp_exp, "e**x"),
    "log": (np.log, True, 1, _vjp_log, "natural logarithm"),
    "tanh": (np.tanh, True, 1, _vjp_tanh, "hyperbolic tangent"),
    "sqrt": (np.sqrt, True, 1, _vjp_sqrt, "square root"),
    "rsqrt": (_rsqrt, True, 1, _vjp_rsqrt, "1 / sqrt(x)"),
    "relu": (_relu, False, 1, _vjp_relu, "max(x, 0)"),
    # gelu's tanh approximation is a handful of multiply-adds and one tanh.
    "gelu": (_gelu, True, 8, _vjp_gelu, "tanh-approximated GELU"),
    "logistic": (_logistic, True, 1, _vjp_logistic, "1 / (1 + e**-x)"),
}


def _unary(name: str, fn: Callable[[np.ndarray], np.ndarray], float_only: bool) -> Callable:
    def infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
        (x,) = types
        if float_only:
            require(x.dtype in FLOAT_DTYPES, f"{name}: expects a float tensor, got {x}")
        else:
            require(x.dtype != "bool", f"{name}: expects a numeric tensor, got {x}")
        return (x,)

    def impl(args, attrs: Attrs):
        with np.errstate(all="ignore"):  # log(0), rsqrt(0): IEEE results, as on devices
            return (fn(args[0]),)

    return infer, impl


for _name, (_fn, _float_only, _flops, _vjp, _doc) in UNARY.items():
    _infer, _impl = _unary(_name, _fn, _float_only)
    register(OpDef(_name, "elementwise", 1, (), _infer, elementwise_factors, elementwise_cost(_flops),
                   impl=_impl, vjp=_vjp, doc=_doc))


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        # Integer division truncates toward zero, as in StableHLO (not numpy's floor). Done in integers:
        # a float quotient rounds 64-bit operands. x / 0 gives 0 here (XLA gives -1; StableHLO leaves it open).
        safe = np.where(b == 0, 1, b).astype(a.dtype)
        floor = np.floor_divide(a, safe)
        inexact = (floor * safe != a) & ((a < 0) != (safe < 0))
        return np.where(b == 0, 0, floor + inexact).astype(a.dtype)
    return a / b


def _vjp_mul(b, op, g, wanted):
    lhs, rhs = op.operands
    return (b.mul(g, rhs) if wanted[0] else None, b.mul(g, lhs) if wanted[1] else None)


def _vjp_div(b, op, g, wanted):
    # d(a/c)/dc = -(a/c)/c: reuse the result
    ga = b.div(g, op.operands[1])
    return (ga if wanted[0] else None, b.neg(b.mul(ga, op.result)) if wanted[1] else None)


def _vjp_pick(direction: str) -> Callable:
    """max/min: the cotangent goes to the operand that was picked (lhs on ties)."""

    def vjp(b, op, g, wanted):
        picked = b.compare(op.operands[0], op.operands[1], direction)
        return (b.select(picked, g, 0.0) if wanted[0] else None, b.select(picked, 0.0, g) if wanted[1] else None)

    return vjp


def _vjp_pow(b, op, g, wanted):
    # d(a^c)/da = c a^(c-1); d(a^c)/dc = a^c ln a (the result reused)
    base, exponent = op.operands
    ga = b.mul(g, b.mul(exponent, b.op("pow", [base, b.sub(exponent, 1.0)]))) if wanted[0] else None
    return (ga, b.mul(g, b.mul(op.result, b.log(base))) if wanted[1] else None)


BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], Callable, str]] = {
    "add": (np.add, lambda b, op, g, wanted: (g, g), "a + b"),
    "sub": (np.subtract, lambda b, op, g, wanted: (g, b.neg(g) if wanted[1] else None), "a - b"),
    "mul": (np.multiply, _vjp_mul, "a * b"),
    "div": (_divide, _vjp_div, "a / b (integers truncate toward zero)"),
    "max": (np.maximum, _vjp_pick("ge"), "elementwise maximum"),
    "min": (np.minimum, _vjp_pick("le"), "elementwise minimum"),
    # StableHLO's power, which jax emits for `x ** t` with a traced t (Adam's bias correction).
    "pow": (np.power, _vjp_pow, "a ** b"),
}


def _binary(name: str, fn: Callable) -> tuple[Callable, Callable]:
    def infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
        a, b = types
        same_shapes(name, types)
        require(a.dtype == b.dtype, f"{name}: operand dtypes differ: {a}, {b}")
        require(a.dtype != "bool" or name in ("max", "min"), f"{name}: expects numeric tensors, got {a}")
        return (a,)

    def impl(args, attrs: Attrs):
        with np.errstate(all="ignore"):  # x/0 gives inf as on devices
            return (fn(args[0], args[1]),)

    return infer, impl


for _name, (_fn, _vjp, _doc) in BINARY.items():
    _infer, _impl = _binary(_name, _fn)
    register(OpDef(_name, "elementwise", 2, (), _infer, elementwise_factors, elementwise_cost(1),
                   impl=_impl, vjp=_vjp, doc=_doc))


COMPARISONS: dict[str, Callable] = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


def _compare_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    a, b = types
    same_shapes("compare", types)
    require(a.dtype == b.dtype, f"compare: operand dtypes differ: {a}, {b}")
    return (TensorType(a.shape, "bool"),)


register(OpDef(
    "compare", "elementwise", 2,
    (AttrSpec("direction", attr_choice(*COMPARISONS)),),
    _compare_infer, elementwise_factors, elementwise_cost(1),
    impl=lambda args, attrs: (COMPARISONS[attrs["direction"]](args[0], args[1]),),
    vjp=lambda b, op, g, wanted: (None, None),  # a bool result carries no gradient
    doc="a <direction> b -> bool",
))


def _select_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    pred, on_true, on_false = types
    same_shapes("select", types)
    require(pred.dtype == "bool", f"select: predicate must be bool, got {pred}")
    require(on_true.dtype == on_false.dtype, f"select: branch dtypes differ: {on_true}, {on_false}")
    return (on_true,)


register(OpDef(
    "select", "elementwise", 3, (), _select_infer, elementwise_factors, elementwise_cost(1),
    impl=lambda args, attrs: (np.where(args[0], args[1], args[2]),),
    vjp=lambda b, op, g, wanted: (
        None,
        b.select(op.operands[0], g, 0.0) if wanted[1] else None,
        b.select(op.operands[0], 0.0, g) if wanted[2] else None,
    ),
    doc="pred ? on_true : on_false",
))


def _convert(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in FLOAT_DTYPES:
        return x.astype(np.float64)  # the executor rounds to the execution dtype
    if dtype == "bool":
        return x != 0
    return np.trunc(x).astype(np.int64)  # float -> int truncates toward zero, as in StableHLO


def _convert_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    return (TensorType(types[0].shape, attrs["dtype"]),)


register(OpDef(
    "convert", "elementwise", 1, (AttrSpec("dtype", attr_dtype),),
    _convert_infer, elementwise_factors, elementwise_cost(0),
    impl=lambda args, attrs: (_convert(args[0], attrs["dtype"]),),
    # Only float -> float converts are differentiable; autodiff never asks for
    # a cotangent of an integer operand.
    vjp=lambda b, op, g, wanted: (b.convert(g, op.operands[0].type.dtype),),
    doc="change the element type",
))
