"""The importer's bitwise and extra elementwise handlers (ir/stablehlo/bitwise.py)
on small texts in the forms jax 0.10 prints (lines as in
tests/fixtures/real/*.mlir, shapes made small), run against numpy or Python
ints computed here; and a sharded and-reduction lowered to an all_reduce
with combiner and."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import ROOT

from ir import ops
from ir.builder import Builder
from ir.core import Mesh, TensorType, Value
from ir.interpret import run, run_spmd, shard, unshard
from ir.lower import lower
from ir.nda import analyze
from ir.sharding import Decision, materialize
from ir.stablehlo import StableHLOError, import_stablehlo, load_stablehlo
from ir.stablehlo.bitwise import ONE_TO_ONE
from ir.stablehlo.importer import unsupported
from ir.stablehlo.reader import Reader

U32 = np.uint32
MASK = 2**32 - 1


def module(args: list[str], results: list[str], body: list[str]) -> str:
    params = ", ".join(f"%arg{i}: tensor<{a}>" for i, a in enumerate(args))
    types = ", ".join(f"tensor<{r}>" for r in results)
    names = ", ".join(f"%r{i}" if len(results) > 1 else "%r" for i in range(len(results)))
    lines = "\n".join("    " + line for line in body)
    return (f"module @jit_f {{\n  func.func public @main({params}) -> ({types}) {{\n{lines}\n"
            f"    return {names} : {types}\n  }}\n}}\n")


def run_text(text: str, *inputs: np.ndarray) -> list[np.ndarray]:
    return run(import_stablehlo(text, "bitwise.mlir"), list(inputs))


def u32s(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint64).astype(U32)


def per_element(fn, *arrays: np.ndarray, dtype=U32) -> np.ndarray:
    flat = [a.ravel().tolist() for a in arrays]
    return np.array([fn(*vals) for vals in zip(*flat)], dtype).reshape(arrays[0].shape)


def splat(name: str, value: str, ty: str, shape: str) -> list[str]:
    """A scalar constant broadcast to `shape`, as jax prints it."""
    return [f"%c_{name} = stablehlo.constant dense<{value}> : tensor<{ty}>",
            f"%{name} = stablehlo.broadcast_in_dim %c_{name}, dims = [] : (tensor<{ty}>) -> tensor<{shape}x{ty}>"]


# ---------------------------------------------------------------- jax's PRNG: threefry rounds and uniform floats


def test_threefry_round_and_uniform_bits():
    """One threefry mix (x0 += x1; x1 = rotl(x1, 13) ^ x0) on u32 with wraparound, then jax's
    uniform: (bits >> 9) | 0x3F800000 read as f32, minus 1, in [0, 1)."""
    shape = "6x5"
    body = [
        *splat("s13", "13", "ui32", shape), *splat("s19", "19", "ui32", shape),
        *splat("s9", "9", "ui32", shape), *splat("one_bits", "1065353216", "ui32", shape),
        "%0 = stablehlo.add %arg0, %arg1 : tensor<6x5xui32>",
        "%1 = stablehlo.shift_left %arg1, %s13 : tensor<6x5xui32>",
        "%2 = stablehlo.shift_right_logical %arg1, %s19 : tensor<6x5xui32>",
        "%3 = stablehlo.or %1, %2 : tensor<6x5xui32>",
        "%4 = stablehlo.xor %3, %0 : tensor<6x5xui32>",
        "%5 = stablehlo.shift_right_logical %4, %s9 : tensor<6x5xui32>",
        "%6 = stablehlo.or %5, %one_bits : tensor<6x5xui32>",
        "%7 = stablehlo.bitcast_convert %6 : (tensor<6x5xui32>) -> tensor<6x5xf32>",
        "%cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>",
        "%8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<6x5xf32>",
        "%r0 = stablehlo.subtract %7, %8 : tensor<6x5xf32>",
        "%r1 = stablehlo.add %0, %4 : tensor<6x5xui32>",
    ]
    x0, x1 = u32s((6, 5), 1), u32s((6, 5), 2)
    uniform, mixed = run_text(module(["6x5xui32", "6x5xui32"], ["6x5xf32", "6x5xui32"], body), x0, x1)

    def mix(a: int, b: int) -> int:
        total = (a + b) & MASK
        return ((((b << 13) & MASK) | (b >> 19)) ^ total) & MASK

    want_bits = per_element(mix, x0, x1)
    want = per_element(lambda v: (v >> 9) / 2**23, want_bits, dtype=np.float32)  # the mantissa's 23 bits
    np.testing.assert_array_equal(mixed, per_element(lambda a, b, m: (a + b + m) & MASK, x0, x1, want_bits))
    np.testing.assert_array_equal(uniform, want)
    assert uniform.min() >= 0.0 and uniform.max() < 1.0


def test_shifts_past_the_width_and_arithmetic_sign_fill():
    """StableHLO: a shift by the width or more gives 0 (logical) or the sign (arithmetic)."""
    body = ["%0 = stablehlo.shift_left %arg0, %arg1 : tensor<8xui32>",
            "%1 = stablehlo.shift_right_logical %arg0, %arg1 : tensor<8xui32>",
            "%r0 = stablehlo.xor %0, %1 : tensor<8xui32>",
            "%r1 = stablehlo.shift_right_arithmetic %arg2, %arg3 : tensor<8xi32>"]
    a = np.array([1, 2**31, MASK, 12345, 7, 2**31 + 5, 99, 3], U32)
    n = np.array([0, 1, 31, 32, 33, 40, 5, 64], U32)
    s = np.array([-1, -2**31, 1000, -1000, 5, -7, -100, 2**31 - 1], np.int32)
    k = np.array([0, 31, 32, 33, 1, 100, 3, 40], np.int32)
    out, arith = run_text(module(["8xui32", "8xui32", "8xi32", "8xi32"], ["8xui32", "8xi32"], body), a, n, s, k)
    want = per_element(lambda v, m: ((v << m) & MASK if m < 32 else 0) ^ (v >> m if m < 32 else 0), a, n)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(arith, per_element(lambda v, m: v >> min(m, 31), s, k, dtype=np.int32))


# ---------------------------------------------------------------- masks: is_finite, and-reduce, not, select


def test_is_finite_and_reduce_masks_a_cross_entropy_row():
    """jax's integer-label cross-entropy keeps a row only where every entry is finite."""
    body = ["%0 = stablehlo.is_finite %arg0 : (tensor<4x5xf32>) -> tensor<4x5xi1>",
            "%c = stablehlo.constant dense<true> : tensor<i1>",
            "%1 = stablehlo.reduce(%0 init: %c) applies stablehlo.and across dimensions = [1] "
            ": (tensor<4x5xi1>, tensor<i1>) -> tensor<4xi1>",
            "%c_0 = stablehlo.constant dense<false> : tensor<i1>",
            "%2 = stablehlo.not %0 : tensor<4x5xi1>",
            "%r1 = stablehlo.reduce(%2 init: %c_0) applies stablehlo.or across dimensions = [1] "
            ": (tensor<4x5xi1>, tensor<i1>) -> tensor<4xi1>",
            "%3 = stablehlo.abs %arg1 : tensor<4xf32>",
            "%cst = stablehlo.constant dense<0x7FC00000> : tensor<f32>",
            "%4 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4xf32>",
            "%r0 = stablehlo.select %1, %3, %4 : tensor<4xi1>, tensor<4xf32>"]
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    x[1, 2], x[3, 0] = np.inf, np.nan
    v = np.array([-1.5, 2.0, -3.0, 4.0], np.float32)
    kept, any_bad = run_text(module(["4x5xf32", "4xf32"], ["4xf32", "4xi1"], body), x, v)
    finite_rows = [all(math.isfinite(e) for e in row) for row in x.tolist()]
    np.testing.assert_array_equal(any_bad, [not f for f in finite_rows])
    np.testing.assert_array_equal(kept, [abs(e) if f else np.nan for e, f in zip(v.tolist(), finite_rows)])


def test_sharded_and_reduction_lowers_to_an_all_reduce_with_combiner_and():
    b = Builder("all_finite")
    x = b.param("x", [6, 4])
    y = b.reduce(b.op("is_finite", [x]), [1], "and")
    fn = b.build([y])
    mesh = Mesh.of(model=2)
    nda = analyze(fn)
    lowered = lower(fn, nda, materialize(nda, mesh, [Decision("model", nda.def_color(fn.param("x"), 1))]))
    reduces = [op for op in lowered.function.ops if op.kind in ("all_reduce", "reduce_scatter")]
    assert [op.attrs["combiner"] for op in reduces] == ["and"]
    inputs = np.arange(24, dtype=np.float32).reshape(6, 4)
    inputs[2, 3], inputs[4, 0] = np.inf, np.nan  # one in each device's half
    (blocks,) = run_spmd(lowered.function, {"x": shard(inputs, lowered.param_dims[0], mesh)})
    got = unshard(blocks, lowered.result_dims[0], mesh)
    np.testing.assert_array_equal(got, run(fn, [inputs])[0])
    np.testing.assert_array_equal(got, [True, True, False, True, False, True])


# ---------------------------------------------------------------- float ops: chlo, rounding, rem, clamp


def test_chlo_square_erf_and_erf_inv():
    """chlo.square becomes mul(x, x); erf(erf_inv(y)) == y (jax.random.normal's inverse CDF)."""
    body = ["%0 = chlo.square %arg0 : tensor<3x4xf32> -> tensor<3x4xf32>",
            "%1 = chlo.erf_inv %arg1 : tensor<3x4xf32> -> tensor<3x4xf32>",
            "%r1 = chlo.erf %1 : tensor<3x4xf32> -> tensor<3x4xf32>",
            "%2 = chlo.erfc %arg0 : tensor<3x4xf32> -> tensor<3x4xf32>",
            "%r0 = stablehlo.add %0, %2 : tensor<3x4xf32>"]
    text = module(["3x4xf32", "3x4xf32"], ["3x4xf32", "3x4xf32"], body)
    fn = import_stablehlo(text)
    assert "mul" in [op.kind for op in fn.ops] and "square" not in [op.kind for op in fn.ops]
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    y = np.linspace(-0.999, 0.999, 12, dtype=np.float32).reshape(3, 4)
    out, back = run(fn, [x, y])
    np.testing.assert_allclose(out, [[v * v + math.erfc(v) for v in row] for row in x.tolist()], rtol=1e-6)
    np.testing.assert_allclose(back, y, rtol=1e-6, atol=1e-7)


def test_rounding_sign_and_remainder():
    body = ["%0 = stablehlo.round_nearest_afz %arg0 : tensor<8xf32>",
            "%1 = stablehlo.round_nearest_even %arg0 : tensor<8xf32>",
            "%2 = stablehlo.floor %arg0 : tensor<8xf32>",
            "%3 = stablehlo.ceil %arg0 : tensor<8xf32>",
            "%4 = stablehlo.sign %arg0 : tensor<8xf32>",
            "%5 = stablehlo.remainder %arg0, %arg1 : tensor<8xf32>",
            "%r = stablehlo.concatenate %0, %1, %2, %3, %4, %5, dim = 0 : "
            "(tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) "
            "-> tensor<48xf32>"]
    x = np.array([2.5, -2.5, 0.49999997, -0.0, 8388609.0, -7.25, 3.5, 1.5], np.float32)
    d = np.array([2.0, 2.0, 0.3, 1.0, 10.0, 2.0, -2.0, -0.5], np.float32)
    (out,) = run_text(module(["8xf32", "8xf32"], ["48xf32"], body), x, d)
    vals = x.tolist()
    want = ([math.copysign(math.floor(abs(v) + 0.5), v) for v in vals] + [round(v) for v in vals]
            + [math.floor(v) for v in vals] + [math.ceil(v) for v in vals]
            + [v if v == 0 else math.copysign(1.0, v) for v in vals]
            + [math.fmod(a, b) for a, b in zip(vals, d.tolist())])
    np.testing.assert_allclose(out, np.array(want, np.float32), rtol=1e-6)
    assert np.signbit(out[3]) and np.signbit(out[8 * 4 + 3]), "round and sign keep -0.0"


def test_integer_remainder_takes_the_dividends_sign():
    body = ["%r = stablehlo.remainder %arg0, %arg1 : tensor<6xi32>"]
    a, b = np.array([7, -7, 7, -7, -2**31, 5], np.int32), np.array([3, 3, -3, -3, -1, 0], np.int32)
    (out,) = run_text(module(["6xi32", "6xi32"], ["6xi32"], body), a, b)
    np.testing.assert_array_equal(out, [1, -1, 1, -1, 0, 5])  # x % 0 == x, as XLA


def test_clamp_broadcasts_scalar_bounds():
    body = ["%r = stablehlo.clamp %arg1, %arg0, %arg2 : (tensor<f32>, tensor<3x5xf32>, tensor<f32>) -> tensor<3x5xf32>"]
    x = np.linspace(-3, 3, 15, dtype=np.float32).reshape(3, 5)
    (out,) = run_text(module(["3x5xf32", "f32", "f32"], ["3x5xf32"], body), x, np.float32(-1), np.float32(2))
    np.testing.assert_array_equal(out, [[min(max(v, -1.0), 2.0) for v in row] for row in x.tolist()])


def test_trigonometry_from_chlo_and_stablehlo():
    names = {"stablehlo.sine": math.sin, "stablehlo.cosine": math.cos, "chlo.tan": math.tan,
             "stablehlo.atan2": None, "chlo.sinh": math.sinh, "chlo.atan": math.atan, "chlo.asin": math.asin}
    body, wants = [], []
    x = np.linspace(-0.9, 0.9, 7, dtype=np.float32)
    for i, (name, fn) in enumerate(names.items()):
        if fn is None:
            body.append(f"%{i} = {name} %arg0, %arg1 : tensor<7xf32>")
            wants.append([math.atan2(a, 0.5) for a in x.tolist()])
        else:
            form = ": tensor<7xf32> -> tensor<7xf32>" if name.startswith("chlo") else ": tensor<7xf32>"
            body.append(f"%{i} = {name} %arg0 {form}")
            wants.append([fn(a) for a in x.tolist()])
    operands = ", ".join(f"%{i}" for i in range(len(names)))
    body.append(f"%r = stablehlo.concatenate {operands}, dim = 0 : ({', '.join(['tensor<7xf32>'] * len(names))}) "
                f"-> tensor<{7 * len(names)}xf32>")
    (out,) = run_text(module(["7xf32", "7xf32"], [f"{7 * len(names)}xf32"], body), x, np.full(7, 0.5, np.float32))
    np.testing.assert_allclose(out, np.concatenate(wants).astype(np.float32), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- integers: popcnt, clz, not, bitcast widths


def test_popcnt_clz_and_not_of_a_transposed_value():
    """A transpose's result is a strided view in the executor: popcnt must not need contiguous memory."""
    body = ["%0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<3x5xui32>) -> tensor<5x3xui32>",
            "%1 = stablehlo.popcnt %0 : tensor<5x3xui32>",
            "%2 = stablehlo.count_leading_zeros %0 : tensor<5x3xui32>",
            "%3 = stablehlo.not %0 : tensor<5x3xui32>",
            "%4 = stablehlo.add %1, %2 : tensor<5x3xui32>",
            "%r = stablehlo.xor %4, %3 : tensor<5x3xui32>"]
    x = u32s((3, 5), 4) >> np.arange(15, dtype=U32).reshape(3, 5)
    (out,) = run_text(module(["3x5xui32"], ["5x3xui32"], body), x)
    xt = np.ascontiguousarray(x.T)
    want = per_element(lambda v: (bin(v).count("1") + 32 - v.bit_length()) ^ (MASK - v), xt)
    np.testing.assert_array_equal(out, want)


def test_bitcast_between_widths_is_refused_at_its_line():
    body = ["%r = stablehlo.bitcast_convert %arg0 : (tensor<4xui32>) -> tensor<4xf64>"]
    with pytest.raises(StableHLOError, match=r"<stablehlo>:3: .*u32 \(4 bytes\) and f64 \(8 bytes\) differ in width"):
        import_stablehlo(module(["4xui32"], ["4xf64"], body))


def test_bitcast_f32_to_i32_and_back():
    body = ["%0 = stablehlo.bitcast_convert %arg0 : (tensor<5xf32>) -> tensor<5xi32>",
            "%r1 = stablehlo.bitcast_convert %0 : (tensor<5xi32>) -> tensor<5xf32>",
            "%r0 = stablehlo.and %0, %arg1 : tensor<5xi32>"]
    x = np.array([1.0, -2.0, np.inf, 0.0, -0.0], np.float32)
    sign_bit = np.full(5, -2**31, np.int32)
    bits, back = run_text(module(["5xf32", "5xi32"], ["5xi32", "5xf32"], body), x, sign_bit)
    np.testing.assert_array_equal(bits != 0, [False, True, False, False, True])  # the sign bits
    np.testing.assert_array_equal(back.view(np.int32), x.view(np.int32))


# ---------------------------------------------------------------- the registry's refusals


def t(*shape: int, dtype: str = "f32") -> TensorType:
    return TensorType(shape, dtype)


@pytest.mark.parametrize("kind, operands, attrs, pattern", [
    ("and", [t(3, 5), t(3, 5)], {}, r"and: expects .*bool.*got tensor<3x5xf32>"),
    ("xor", [t(3, 5, dtype="u32"), t(3, 5, dtype="i32")], {}, "dtypes differ"),
    ("shift_left", [t(3, 5, dtype="bool")] * 2, {}, "shift_left: expects"),
    ("add", [t(3, 5, dtype="bool")] * 2, {}, "add: expects numeric"),
    ("rem", [t(3, 5), t(5, 3)], {}, "shapes differ"),
    ("atan2", [t(3, 5, dtype="i32")] * 2, {}, "atan2: expects"),
    ("is_finite", [t(3, 5, dtype="i32")], {}, "is_finite: expects"),
    ("popcnt", [t(3, 5)], {}, "popcnt: expects"),
    ("bitcast_convert", [t(3, 5, dtype="bool")], {"dtype": "u8"}, "bool has no bit pattern"),
    ("bitcast_convert", [t(3, 5, dtype="f16")], {"dtype": "i32"}, r"f16 \(2 bytes\) and i32 \(4 bytes\)"),
    ("clamp", [t(1), t(3, 5), t(1)], {}, "clamp: operand shapes differ"),
    ("reduce", [t(3, 5)], {"dims": [1], "combiner": "and"}, "and combines bool or integer"),
])
def test_misuse_raises_op_error(kind: str, operands: list, attrs: dict, pattern: str):
    with pytest.raises(ops.OpError, match=pattern):
        ops.make_op(kind, [Value(f"x{i}", ty) for i, ty in enumerate(operands)], attrs, ["y"])


def test_all_reduce_refuses_or_of_floats():
    with pytest.raises(ops.OpError, match="all_reduce: or combines bool or integer tensors"):
        ops.make_op("all_reduce", [Value("x", t(4))], {"axes": ["model"], "combiner": "or"}, ["y"],
                    Mesh.of(model=2))


# ---------------------------------------------------------------- coverage of the real programs


def test_every_handled_name_maps_to_a_registered_kind():
    assert sorted(k for k in set(ONE_TO_ONE.values()) if k not in ops.REGISTRY) == []


def test_the_dropout_fixture_needs_no_bitwise_op_the_importer_lacks():
    path = ROOT / "tests" / "fixtures" / "real" / "gpt2_dropout_train.mlir"
    text = path.read_text()
    reader = Reader(text, str(path))
    missing = unsupported(reader.functions())
    ours = set(ONE_TO_ONE) | {"stablehlo.bitcast_convert", "stablehlo.clamp", "chlo.square"}
    assert not ours & set(missing), missing
    assert "stablehlo.shift_right_logical" in text and "stablehlo.bitcast_convert" in text
    if not missing:
        load_stablehlo(str(path))
