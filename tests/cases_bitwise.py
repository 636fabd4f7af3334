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


def u64s(rng, ty):
    return rng.integers(0, 2**64, ty.shape, dtype=np.uint64)


def shifts(rng, ty):
    """Shift amounts 0..40: some past the width of 32."""
    return rng.integers(0, 41, ty.shape).astype(np.uint32 if ty.dtype == "u32" else I32)


def long_shifts(rng, ty):
    """Shift amounts 0..70 for 64-bit operands: some past the width."""
    return rng.integers(0, 71, ty.shape).astype(np.uint64)


def i8s(rng, ty):
    return rng.integers(-128, 128, ty.shape).astype(np.int8)


def small_shifts_i8(rng, ty):
    return rng.integers(0, 11, ty.shape).astype(np.int8)


def leading_zeros(rng, ty):
    """u32 values of every bit length 0..32, so each count of leading zeros appears."""
    lengths = rng.integers(0, 33, ty.shape)
    return np.array([0 if n == 0 else (1 << (n - 1)) | int(rng.integers(0, 1 << (n - 1))) for n in lengths.ravel()],
                    np.uint64).reshape(ty.shape).astype(U32)


def round_traps(rng, ty):
    """f16 values where floor(|x| + 0.5) rounds wrongly because the sum itself rounds (the largest f16
    below 1/2; 2^10 + 1), ties, and signed zeros. In f16: the VJP check (f32 only) would straddle jumps."""
    traps = [0.49975586, -0.49975586, 1025.0, -1025.0, 2.5, -2.5, 0.5, -0.5, 0.0, -0.0, 1.5, 7.25]
    return np.resize(np.array(traps, F16), ty.shape)


def uniform(lo: float, hi: float):
    return lambda rng, ty: rng.uniform(lo, hi, ty.shape).astype(F32)


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


def _round_half_away(x):
    return math.copysign(math.floor(abs(x) + 0.5), x)  # exact in float64 for float16 and float32 inputs


def _signum(x):
    return x if x == 0 or x != x else math.copysign(1.0, x)  # keeps -0.0 and nan


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
    Case("shift_right_logical", "u64_past_width", (t(6, 5, dtype="u64"),) * 2, {},
         elementwise(lambda a, n: a >> n if n < 64 else 0, np.uint64), (u64s, long_shifts)),
    Case("shift_left", "u64_past_width", (t(6, 5, dtype="u64"),) * 2, {},
         elementwise(lambda a, n: (a << n) % 2**64 if n < 64 else 0, np.uint64), (u64s, long_shifts)),
    Case("shift_left", "i8_wraps", (t(6, 5, dtype="i8"),) * 2, {},
         elementwise(lambda a, n: ((a << n) + 128) % 256 - 128 if n < 8 else 0, np.int8), (i8s, small_shifts_i8)),
    Case("shift_right_arithmetic", "i8_past_width", (t(6, 5, dtype="i8"),) * 2, {},
         elementwise(lambda a, n: a >> min(n, 7), np.int8), (i8s, small_shifts_i8)),
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
    Case("round_even", "traps", (t(3, 4, dtype="f16"),), {}, elementwise(round, F16), (round_traps,)),
    Case("round_away", "traps", (t(3, 4, dtype="f16"),), {}, elementwise(_round_half_away, F16), (round_traps,)),
    Case("sign", "zeros", (t(3, 4, dtype="f16"),), {}, elementwise(_signum, F16), (round_traps,)),
    Case("is_finite", "specials", (t(6, 5),), {}, elementwise(math.isfinite, bool), (with_specials,)),
    Case("popcnt", "u32", (t(6, 5, dtype="u32"),), {}, elementwise(lambda a: bin(a).count("1"), U32), (u32s,)),
    Case("clz", "u32", (t(6, 5, dtype="u32"),), {}, elementwise(lambda a: 32 - int(a).bit_length(), U32),
         (leading_zeros,)),
    Case("clz", "i32_negative", (t(6, 5, dtype="i32"),), {},
         elementwise(lambda a: 32 - (a % 2**32).bit_length(), I32), (ints(-5, 1000),)),
    Case("clz", "u64", (t(6, 5, dtype="u64"),), {}, elementwise(lambda a: 64 - int(a).bit_length(), np.uint64),
         (lambda rng, ty: u64s(rng, ty) >> rng.integers(0, 65, ty.shape).astype(np.uint64),)),
    Case("popcnt", "i32_negative", (t(6, 5, dtype="i32"),), {},
         elementwise(lambda a: bin(a % 2**32).count("1"), I32)),
    Case("expm1", "f32", (t(6, 5),), {}, f64(elementwise(math.expm1, np.float64))),
    Case("log1p", "f32", (t(6, 5),), {}, f64(elementwise(math.log1p, np.float64)), (in_unit,)),
    Case("sin", "f32", (t(6, 5),), {}, f64(elementwise(math.sin, np.float64)), (scaled(3.0),)),
    Case("cos", "f32", (t(6, 5),), {}, f64(elementwise(math.cos, np.float64)), (scaled(3.0),)),
    Case("erf", "f32", (t(6, 5),), {}, f64(elementwise(math.erf, np.float64)), (scaled(1.5),)),
    Case("erfc", "f32", (t(6, 5),), {}, f64(elementwise(math.erfc, np.float64)), (scaled(1.5),)),
    # the tail, where 1 - erf(x) would have no correct digits left
    Case("erfc", "tail", (t(2, 3),), {}, f64(elementwise(math.erfc, np.float64)),
         (lambda rng, ty: np.array([[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], F32),)),
    Case("tan", "f32", (t(6, 5),), {}, f64(elementwise(math.tan, np.float64)), (uniform(-1.2, 1.2),)),
    Case("sinh", "f32", (t(6, 5),), {}, f64(elementwise(math.sinh, np.float64)), (scaled(2.0),)),
    Case("cosh", "f32", (t(6, 5),), {}, f64(elementwise(math.cosh, np.float64)), (scaled(2.0),)),
    Case("asin", "f32", (t(6, 5),), {}, f64(elementwise(math.asin, np.float64)), (in_unit,)),
    Case("acos", "f32", (t(6, 5),), {}, f64(elementwise(math.acos, np.float64)), (in_unit,)),
    Case("atan", "f32", (t(6, 5),), {}, f64(elementwise(math.atan, np.float64)), (scaled(3.0),)),
    Case("asinh", "f32", (t(6, 5),), {}, f64(elementwise(math.asinh, np.float64)), (scaled(3.0),)),
    Case("acosh", "f32", (t(6, 5),), {}, f64(elementwise(math.acosh, np.float64)), (uniform(1.2, 5.0),)),
    Case("atanh", "f32", (t(6, 5),), {}, f64(elementwise(math.atanh, np.float64)), (in_unit,)),
    Case("cbrt", "f32", (t(6, 5),), {}, f64(elementwise(lambda a: math.copysign(abs(a) ** (1 / 3), a), np.float64)),
         (away_from_zero,)),
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
    # lo > hi: StableHLO's min(max(x, lo), hi) is hi everywhere, and so is the gradient
    Case("clamp", "bounds_crossed", (t(6, 5),) * 3, {}, f64(elementwise(_clip, np.float64)),
         (lambda rng, ty: np.full(ty.shape, 0.7, F32), scaled(1.0), lambda rng, ty: np.full(ty.shape, -0.5, F32))),
    Case("clamp", "i32", (t(6, 5, dtype="i32"),) * 3, {}, elementwise(_clip, I32),
         (lambda rng, ty: np.full(ty.shape, -3, I32), ints(-10, 10), lambda rng, ty: np.full(ty.shape, 4, I32))),
]


def _bisect(f, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
