"""Elementwise ops: unary math, binary arithmetic, compare, select, convert.

Operands of one elementwise op have identical shapes (broadcasting is an
explicit `broadcast_in_dim`, as in StableHLO), so the factor rule is one
parallel factor per dimension, shared by every operand and the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ir.core import FLOAT_DTYPES, Attrs, Mesh, TensorType
from ir.ops import (
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


# name -> (numpy function, float-only?, flops per element, doc)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool, int, str]] = {
    "neg": (np.negative, False, 1, "-x"),
    "exp": (np.exp, True, 1, "e**x"),
    "log": (np.log, True, 1, "natural logarithm"),
    "tanh": (np.tanh, True, 1, "hyperbolic tangent"),
    "sqrt": (np.sqrt, True, 1, "square root"),
    "rsqrt": (_rsqrt, True, 1, "1 / sqrt(x)"),
    "relu": (_relu, False, 1, "max(x, 0)"),
    # gelu's tanh approximation is a handful of multiply-adds and one tanh.
    "gelu": (_gelu, True, 8, "tanh-approximated GELU"),
    "logistic": (_logistic, True, 1, "1 / (1 + e**-x)"),
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


for _name, (_fn, _float_only, _flops, _doc) in UNARY.items():
    _infer, _impl = _unary(_name, _fn, _float_only)
    register(OpDef(_name, "elementwise", 1, (), _infer, elementwise_factors, elementwise_cost(_flops),
                   impl=_impl, doc=_doc))


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        # Integer division truncates toward zero, as in StableHLO (not numpy's floor).
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, np.trunc(a / safe)).astype(a.dtype)
    return a / b


BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], str]] = {
    "add": (np.add, "a + b"),
    "sub": (np.subtract, "a - b"),
    "mul": (np.multiply, "a * b"),
    "div": (_divide, "a / b (integers truncate toward zero)"),
    "max": (np.maximum, "elementwise maximum"),
    "min": (np.minimum, "elementwise minimum"),
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


for _name, (_fn, _doc) in BINARY.items():
    _infer, _impl = _binary(_name, _fn)
    register(OpDef(_name, "elementwise", 2, (), _infer, elementwise_factors, elementwise_cost(1),
                   impl=_impl, doc=_doc))


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
    doc="change the element type",
))
