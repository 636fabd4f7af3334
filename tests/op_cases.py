"""What the op tests share: the `Case` record (one sample use of an op kind
with its numpy reference), input generators and the comparison. The base
table is in test_ops.py; each op family added later keeps its cases in a
module of its own (`cases_*.py`, a list `CASES`), merged into that table, so
every registry-driven check (shape rule, interpreter, factor splits, VJP)
covers it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ir import ops
from ir.core import NUMPY_DTYPES, Op, TensorType, Value

F32 = np.float32
I32 = np.int32

# --------------------------------------------------------------------------
# Inputs and comparison

Gen = Callable[[np.random.Generator, TensorType], np.ndarray]


def t(*shape: int, dtype: str = "f32") -> TensorType:
    return TensorType(tuple(shape), dtype)


def default_gen(rng: np.random.Generator, ty: TensorType) -> np.ndarray:
    """Floats ~ N(0, 1), integers in [-10, 10), bools fair coin flips."""
    if ty.dtype == "bool":
        return rng.random(ty.shape) < 0.5
    if ty.dtype == "i32":
        return rng.integers(-10, 10, ty.shape).astype(I32)
    return rng.standard_normal(ty.shape).astype(NUMPY_DTYPES[ty.dtype])


def scaled(scale: float) -> Gen:
    """Floats ~ N(0, scale**2): both signs, magnitudes well past 1."""
    return lambda rng, ty: (scale * rng.standard_normal(ty.shape)).astype(F32)


def positive(rng: np.random.Generator, ty: TensorType) -> np.ndarray:
    """Floats in [0.1, 4): valid for log, sqrt, rsqrt."""
    return rng.uniform(0.1, 4.0, ty.shape).astype(F32)


def ints(lo: int, hi: int) -> Gen:
    """Integers in [lo, hi): for gather indices, choose the table's range."""
    return lambda rng, ty: rng.integers(lo, hi, ty.shape).astype(I32)


def nonzero_ints(lo: int, hi: int) -> Gen:
    """Integers in [lo, hi) except 0, both signs: integer divisors."""
    def gen(rng: np.random.Generator, ty: TensorType) -> np.ndarray:
        x = rng.integers(lo, hi, ty.shape)
        return np.where(x == 0, 1, x).astype(I32)
    return gen


def assert_same(actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Equal shape and dtype; floats to a tight tolerance, the rest exactly."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(actual, expected)


# --------------------------------------------------------------------------
# The case table


@dataclass(frozen=True)
class Case:
    """One sample use of an op kind, with its numpy reference."""

    kind: str
    name: str
    operands: tuple[TensorType, ...]
    attrs: Mapping[str, Any]
    ref: Callable[..., np.ndarray]
    gens: tuple[Gen | None, ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.name}"

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded inputs, each from its operand's generator (default_gen if none)."""
        rng = np.random.default_rng(seed)
        gens = list(self.gens) + [None] * (len(self.operands) - len(self.gens))
        return [(g or default_gen)(rng, ty) for g, ty in zip(gens, self.operands)]

    def op(self) -> Op:
        values = [Value(f"x{i}", ty) for i, ty in enumerate(self.operands)]
        return ops.make_op(self.kind, values, dict(self.attrs), ["y"])

    def expected(self, seed: int = 0) -> np.ndarray:
        return np.asarray(self.ref(*self.inputs(seed)))


def f64(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Compute a float reference in float64, return float32."""
    return lambda *xs: np.asarray(fn(*(x.astype(np.float64) for x in xs))).astype(F32)
