"""Op cases of bitwise, integer and extra elementwise ops (and, or, xor,
shifts, abs, sign, is_finite, ...): merged into test_ops.CASES. References
work element by element on Python ints and floats (math module), not with
the numpy functions the registry uses."""

from __future__ import annotations

import math

import numpy as np
from op_cases import F32, I32, Case, f64, ints, nonzero_ints, scaled, t

U32 = np.uint32
F16 = np.float16


def elementwise(fn, dtype):
    """A reference applying a Python function to each element (of one or more operands)."""
    def ref(*xs):
        flat = [np.asarray(x).ravel().tolist() for x in xs]
        return np.array([fn(*vals) for vals in zip(*flat)], dtype).reshape(np.shape(xs[0]))
    return ref


def u32s(rng, ty):
    return rng.integers(0, 2**32, ty.shape, dtype=np.uint64).astype(U32)


def shifts(rng, ty):
    """Shift amounts 0..40: some past the width of 32."""
    return rng.integers(0, 41, ty.shape).astype(np.uint32 if ty.dtype == "u32" else I32)


def bools(rng, ty):
    return rng.random(ty.shape) < 0.5


def away_from_integers(rng, ty):
    """Floats with fractional parts away from 0 and 1/2, so rounding and its
    (zero) derivative are unambiguous."""
    whole = rng.integers(-4, 5, ty.shape)
    frac = rng.choice([0.15, 0.3, 0.7, 0.85], ty.shape)
    return (whole + frac).astype(F32)


def away_from_zero(rng, ty):
    x = rng.uniform(0.3, 3.0, ty.shape) * rng.choice([-1.0, 1.0], ty.shape)
    return x.astype(F32)


def in_unit(rng, ty):
    return rng.uniform(-0.9, 0.9, ty.shape).astype(F32)


def with_specials(rng, ty):
    x = rng.standard_normal(ty.shape).astype(F32)
    x.ravel()[:4] = [np.inf, -np.inf, np.nan, 0.0]
    return x


def _srl(a, n):
    return (a >> n) if n < 32 else 0


def _sra(a, n):
    signed = a - 2**32 if a >= 2**31 else a
    return (signed >> min(n, 31)) % 2**32


def _c_rem(a, b):
    return math.fmod(a, b)


def _int_rem(a, b):
    return (abs(a) % abs(b)) * (1 if a >= 0 else -1)


def _clip(lo, x, hi):
    return min(max(x, lo), hi)


CASES: list[Case] = [
    Case("and", "bool", (t(6, 5, dtype="bool"),) * 2, {}, elementwise(lambda a, b: a and b, bool), (bools, bools)),
    Case("or", "bool", (t(6, 5, dtype="bool"),) * 2, {}, elementwise(lambda a, b: a or b, bool), (bools, bools)),
    Case("xor", "bool", (t(6, 5, dtype="bool"),) * 2, {}, elementwise(lambda a, b: a != b, bool), (bools, bools)),
    Case("and", "u32", (t(6, 5, dtype="u32"),) * 2, {}, elementwise(lambda a, b: a & b, U32), (u32s, u32s)),
    Case("or", "i32", (t(5, 6, dtype="i32"),) * 2, {}, elementwise(lambda a, b: a | b, I32)),
    Case("xor", "u32", (t(6, 5, dtype="u32"),) * 2, {}, elementwise(lambda a, b: a ^ b, U32), (u32s, u32s)),
    Case("shift_left", "u32_past_width", (t(6, 5, dtype="u32"),) * 2, {},
         elementwise(lambda a, n: (a << n) % 2**32 if n < 32 else 0, U32), (u32s, shifts)),
    Case("shift_right_logical", "u32_past_width", (t(6, 5, dtype="u32"),) * 2, {}, elementwise(_srl, U32),
         (u32s, shifts)),
    Case("shift_right_arithmetic", "u32_sign_fill", (t(6, 5, dtype="u32"),) * 2, {}, elementwise(_sra, U32),
         (u32s, shifts)),
    Case("shift_right_arithmetic", "i32_negative", (t(6, 5, dtype="i32"),) * 2, {},
         elementwise(lambda a, n: a >> min(n, 31), I32), (ints(-1000, 1000), shifts)),
    Case("rem", "f32_signs", (t(6, 5), t(6, 5)), {}, f64(elementwise(_c_rem, np.float64)),
         (scaled(5.0), away_from_zero)),
    Case("rem", "i32_signs", (t(6, 5, dtype="i32"),) * 2, {}, elementwise(_int_rem, I32),
         (ints(-20, 21), nonzero_ints(-6, 7))),
    Case("atan2", "f32", (t(6, 5), t(6, 5)), {}, f64(elementwise(math.atan2, np.float64)),
         (away_from_zero, away_from_zero)),
    Case("not", "bool", (t(6, 5, dtype="bool"),), {}, elementwise(lambda a: not a, bool), (bools,)),
    Case("not", "u32", (t(6, 5, dtype="u32"),), {}, elementwise(lambda a: 2**32 - 1 - a, U32), (u32s,)),
    Case("abs", "f32", (t(6, 5),), {}, f64(elementwise(abs, np.float64)), (away_from_zero,)),
    Case("abs", "i32", (t(6, 5, dtype="i32"),), {}, elementwise(abs, I32)),
    Case("sign", "f32", (t(6, 5),), {}, f64(elementwise(lambda a: (a > 0) - (a < 0), np.float64)),
         (away_from_zero,)),
    Case("sign", "i32", (t(6, 5, dtype="i32"),), {}, elementwise(lambda a: (a > 0) - (a < 0), I32)),
    Case("floor", "f32", (t(6, 5),), {}, f64(elementwise(math.floor, np.float64)), (away_from_integers,)),
    Case("ceil", "f32", (t(6, 5),), {}, f64(elementwise(math.ceil, np.float64)), (away_from_integers,)),
    # ties, in f16 (exact halves; and the central-difference VJP check, f32 only, would straddle the jumps)
    Case("round_even", "halves", (t(8, dtype="f16"),), {}, lambda x: np.array([-2, -2, -0, 0, 2, 2, 2, 4], F16),
         (lambda rng, ty: np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.4, 2.5, 3.5], F16),)),
    Case("round_away", "halves", (t(8, dtype="f16"),), {}, lambda x: np.array([-3, -2, -1, 1, 2, 2, 3, 4], F16),
         (lambda rng, ty: np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.4, 2.5, 3.5], F16),)),
    Case("round_even", "f32", (t(6, 5),), {}, f64(elementwise(round, np.float64)), (away_from_integers,)),
    Case("is_finite", "specials", (t(6, 5),), {}, elementwise(math.isfinite, bool), (with_specials,)),
    Case("popcnt", "u32", (t(6, 5, dtype="u32"),), {}, elementwise(lambda a: bin(a).count("1"), U32), (u32s,)),
    Case("popcnt", "i32_negative", (t(6, 5, dtype="i32"),), {},
         elementwise(lambda a: bin(a % 2**32).count("1"), I32)),
    Case("expm1", "f32", (t(6, 5),), {}, f64(elementwise(math.expm1, np.float64))),
    Case("log1p", "f32", (t(6, 5),), {}, f64(elementwise(math.log1p, np.float64)), (in_unit,)),
    Case("sin", "f32", (t(6, 5),), {}, f64(elementwise(math.sin, np.float64)), (scaled(3.0),)),
    Case("cos", "f32", (t(6, 5),), {}, f64(elementwise(math.cos, np.float64)), (scaled(3.0),)),
    Case("erf", "f32", (t(6, 5),), {}, f64(elementwise(math.erf, np.float64)), (scaled(1.5),)),
    # erf_inv checked by erf of its result (the reference inverts math.erf by bisection)
    Case("erf_inv", "f32", (t(6, 5),), {},
         f64(elementwise(lambda y: _bisect(lambda x: math.erf(x) - y, -6.0, 6.0), np.float64)), (in_unit,)),
    Case("bitcast_convert", "u32_to_f32", (t(6, 5, dtype="u32"),), {"dtype": "f32"},
         elementwise(lambda a: np.frombuffer(int(a).to_bytes(4, "little"), "<f4")[0], F32),
         (lambda rng, ty: (rng.integers(0, 2**23, ty.shape) | 0x3F800000).astype(U32),)),
    Case("bitcast_convert", "f32_to_i32", (t(6, 5),), {"dtype": "i32"},
         elementwise(lambda a: int.from_bytes(np.float32(a).tobytes(), "little", signed=True), I32)),
    Case("clamp", "f32", (t(6, 5),) * 3, {}, f64(elementwise(_clip, np.float64)),
         (lambda rng, ty: np.full(ty.shape, -0.5, F32), scaled(1.0), lambda rng, ty: np.full(ty.shape, 0.7, F32))),
    Case("clamp", "i32", (t(6, 5, dtype="i32"),) * 3, {}, elementwise(_clip, I32),
         (lambda rng, ty: np.full(ty.shape, -3, I32), ints(-10, 10), lambda rng, ty: np.full(ty.shape, 4, I32))),
]


def _bisect(f, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
