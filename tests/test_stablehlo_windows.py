"""The importer's convolution and window handlers (ir/stablehlo/windows.py) on
small texts in exactly the forms jax 0.10 prints (lines copied from
tests/fixtures/real/cnn_train.mlir, shapes made small), run against numpy
loops written here or shared with test_ops."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import ROOT
from test_ops import ref_conv, ref_conv_input_grad, ref_conv_kernel_grad

from ir.autodiff import grad
from ir.builder import Builder
from ir.interpret import run
from ir.stablehlo import StableHLOError, import_stablehlo
from ir.stablehlo.importer import unsupported
from ir.stablehlo.reader import Reader
from ir.text import parse, print_function

PRECISION = "precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]"
WINDOW = ("window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], "
          "reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, " + PRECISION + "}")
NEG_INF = "%cst = stablehlo.constant dense<0xFF800000> : tensor<f32>"
ZERO = "%cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>"


def module(args: list[str], result: str, body: list[str]) -> str:
    params = ", ".join(f"%arg{i}: tensor<{a}>" for i, a in enumerate(args))
    lines = "\n".join("    " + line for line in body)
    return (f"module @jit_f {{\n  func.func public @main({params}) -> (tensor<{result}>) {{\n{lines}\n"
            f"    return %r : tensor<{result}>\n  }}\n}}\n")


def run_text(text: str, *inputs: np.ndarray) -> np.ndarray:
    (out,) = run(import_stablehlo(text, "windows.mlir"), list(inputs))
    return out


def normal(*shapes: tuple, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def region(op: str, result_type: str = "f32") -> list[str]:
    return ["^bb0(%arg43: tensor<f32>, %arg44: tensor<f32>):",
            f"  %607 = {op} : (tensor<f32>, tensor<f32>) -> tensor<{result_type}>"
            if "compare" in op else f"  %607 = {op} : tensor<f32>",
            f"  stablehlo.return %607 : tensor<{result_type}>"]


# ---------------------------------------------------------------- convolution: the three forms of a conv layer


PAD1 = ((1, 1), (1, 1))


def test_forward_convolution():
    text = module(["2x5x6x3xf32", "3x3x3x4xf32"], "2x5x6x4xf32", [
        f"%r = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], {WINDOW}"
        " : (tensor<2x5x6x3xf32>, tensor<3x3x3x4xf32>) -> tensor<2x5x6x4xf32>"])
    x, w = normal((2, 5, 6, 3), (3, 3, 3, 4))
    fn = import_stablehlo(text)
    assert [op.kind for op in fn.ops] == ["conv_general"]
    np.testing.assert_allclose(run(fn, [x, w])[0], ref_conv((1, 1), PAD1)(x, w), rtol=1e-5, atol=1e-5)


def test_input_gradient_form_reverses_the_kernel():
    """jax's d x: the cotangent convolved with the spatially reversed kernel, o and i swapped."""
    text = module(["2x5x6x4xf32", "3x3x3x4xf32"], "2x5x6x3xf32", [
        "%0 = stablehlo.reverse %arg1, dims = [0, 1] : tensor<3x3x3x4xf32>",
        f"%r = stablehlo.convolution(%arg0, %0) dim_numbers = [b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f], {WINDOW}"
        " : (tensor<2x5x6x4xf32>, tensor<3x3x3x4xf32>) -> tensor<2x5x6x3xf32>"])
    g, w = normal((2, 5, 6, 4), (3, 3, 3, 4))
    want = ref_conv_input_grad((1, 1), PAD1, (5, 6))(g, w)
    np.testing.assert_allclose(run_text(text, g, w), want, rtol=1e-5, atol=1e-5)


def test_kernel_gradient_form_contracts_the_batch():
    """jax's d w: batch and feature roles swapped, the result laid out HWIO."""
    text = module(["2x5x6x3xf32", "2x5x6x4xf32"], "3x3x3x4xf32", [
        f"%r = stablehlo.convolution(%arg0, %arg1) dim_numbers = [f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f], {WINDOW}"
        " : (tensor<2x5x6x3xf32>, tensor<2x5x6x4xf32>) -> tensor<3x3x3x4xf32>"])
    x, g = normal((2, 5, 6, 3), (2, 5, 6, 4))
    want = ref_conv_kernel_grad((1, 1), PAD1, (3, 3))(x, g)
    np.testing.assert_allclose(run_text(text, x, g), want, rtol=1e-5, atol=1e-5)


def test_generic_spelling_with_strides_and_dense_padding():
    text = module(["2x7x6x3xf32", "3x2x3x4xf32"], "2x3x3x4xf32", [
        '%r = "stablehlo.convolution"(%arg0, %arg1) <{batch_group_count = 1 : i64, dimension_numbers = '
        "#stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, feature_group_count = 1 : i64, "
        "lhs_dilation = array<i64: 1, 1>, padding = dense<[[0, 1], [2, 0]]> : tensor<2x2xi64>, "
        "rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 2, 3>}> "
        ": (tensor<2x7x6x3xf32>, tensor<3x2x3x4xf32>) -> tensor<2x3x3x4xf32>"])
    x, w = normal((2, 7, 6, 3), (3, 2, 3, 4))
    want = ref_conv((2, 3), ((0, 1), (2, 0)))(x, w)
    np.testing.assert_allclose(run_text(text, x, w), want, rtol=1e-5, atol=1e-5)


def test_depthwise_convolution_reads_the_feature_group_count():
    """Each of 4 channels convolved with its own 2 filters (flax feature_group_count=4)."""
    window = WINDOW.replace("pad = [[1, 1], [1, 1]]", "pad = [[0, 0], [0, 0]]").replace(
        "feature_group_count = 1", "feature_group_count = 4")
    text = module(["1x4x5x4xf32", "2x2x1x8xf32"], "1x3x4x8xf32", [
        f"%r = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], {window}"
        " : (tensor<1x4x5x4xf32>, tensor<2x2x1x8xf32>) -> tensor<1x3x4x8xf32>"])
    x, w = normal((1, 4, 5, 4), (2, 2, 1, 8))
    want = np.concatenate([ref_conv((1, 1), ((0, 0), (0, 0)))(x[..., c:c + 1], w[..., 2 * c:2 * c + 2])
                           for c in range(4)], axis=-1)
    np.testing.assert_allclose(run_text(text, x, w), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- pooling


def pool_ref(x: np.ndarray, window: tuple, strides: tuple, padding: tuple, combine, fill: float) -> np.ndarray:
    """Loops over output positions; padding reads `fill`."""
    padded = np.pad(x.astype(np.float64), padding, constant_values=fill)
    shape = [(n - k) // s + 1 for n, k, s in zip(padded.shape, window, strides)]
    out = np.empty(shape)
    for r in np.ndindex(*shape):
        out[r] = combine(padded[tuple(slice(q * s, q * s + k) for q, s, k in zip(r, strides, window))])
    return out


def reduce_window_line(x: str, out: str, combine: str, strides: str = "1, 2, 2, 1",
                       padding: str = "dense<0> : tensor<4x2xi64>") -> list[str]:
    return [f'%r = "stablehlo.reduce_window"(%arg0, %0) <{{base_dilations = array<i64: 1, 1, 1, 1>, '
            f"padding = {padding}, window_dilations = array<i64: 1, 1, 1, 1>, "
            f"window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: {strides}>}}> ({{",
            *region(f"stablehlo.{combine} %arg43, %arg44"),
            f"}}) : (tensor<{x}>, tensor<f32>) -> tensor<{out}>"]


def test_max_pool():
    text = module(["2x6x4x3xf32"], "2x3x2x3xf32", [
        NEG_INF, "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x6x4x3xf32", "2x3x2x3xf32", "maximum")])
    (x,) = normal((2, 6, 4, 3))
    fn = import_stablehlo(text)
    assert [op.kind for op in fn.ops] == ["reduce_window"]  # the -inf init is the identity: no extra op
    want = pool_ref(x, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4, np.max, -np.inf)
    np.testing.assert_allclose(run(fn, [x])[0], want)


def test_avg_pool_with_dense_padding_pairs():
    padding = "dense<[[0, 0], [1, 0], [0, 1], [0, 0]]> : tensor<4x2xi64>"
    text = module(["2x5x3x3xf32"], "2x3x2x3xf32", [
        ZERO, "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x5x3x3xf32", "2x3x2x3xf32", "add", padding=padding)])
    (x,) = normal((2, 5, 3, 3))
    want = pool_ref(x, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0), (1, 0), (0, 1), (0, 0)), np.sum, 0.0)
    np.testing.assert_allclose(run_text(text, x), want, rtol=1e-5, atol=1e-6)


def test_avg_pool_gradient_form():
    """jax's d x of a 2x2 average pool: the cotangent padded with holes, then a stride-1 window sum."""
    text = module(["2x2x2x3xf32"], "2x4x4x3xf32", [
        ZERO,
        "%1 = stablehlo.pad %arg0, %cst, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 1, 1, 0] "
        ": (tensor<2x2x2x3xf32>, tensor<f32>) -> tensor<2x5x5x3xf32>",
        "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x5x5x3xf32", "2x4x4x3xf32", "add", strides="1, 1, 1, 1")])
    text = text.replace('"stablehlo.reduce_window"(%arg0', '"stablehlo.reduce_window"(%1')
    (g,) = normal((2, 2, 2, 3))
    want = np.repeat(np.repeat(g, 2, axis=1), 2, axis=2)  # each window's cotangent back to its 4 inputs
    np.testing.assert_allclose(run_text(text, g), want, rtol=1e-6)


def test_a_non_identity_init_is_combined_once():
    text = module(["2x6x4x3xf32"], "2x3x2x3xf32", [
        ZERO, "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x6x4x3xf32", "2x3x2x3xf32", "maximum")])
    (x,) = normal((2, 6, 4, 3))
    want = np.maximum(pool_ref(x, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4, np.max, -np.inf), 0)
    np.testing.assert_allclose(run_text(text, x), want)


def test_a_padded_sum_with_another_init_is_refused():
    text = module(["2x5x3x3xf32"], "2x3x2x3xf32", [
        "%cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>",
        "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x5x3x3xf32", "2x3x2x3xf32", "add",
                            padding="dense<[[0, 0], [1, 0], [0, 1], [0, 0]]> : tensor<4x2xi64>")])
    with pytest.raises(StableHLOError, match="windows.mlir:5: stablehlo.reduce_window: a sum whose init"):
        import_stablehlo(text, "windows.mlir")


# ---------------------------------------------------------------- select_and_scatter: max pool's gradient


def select_and_scatter_lines(x: str, source: str, compare: str = "GE, %arg43, %arg44", scatter: str = "add",
                             strides: str = "1, 2, 2, 1") -> list[str]:
    return [f'%r = "stablehlo.select_and_scatter"(%arg0, %arg1, %cst) <{{padding = dense<0> : tensor<4x2xi64>, '
            f"window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: {strides}>}}> ({{",
            *region(f"stablehlo.compare {compare}, FLOAT", "i1"), "}, {",
            *region(f"stablehlo.{scatter} %arg43, %arg44"),
            f"}}) : (tensor<{x}>, tensor<{source}>, tensor<f32>) -> tensor<{x}>"]


def scatter_ref(x: np.ndarray, source: np.ndarray, strides: tuple, pick) -> np.ndarray:
    """Each 2x2 window's source element added at its first max (pick=argmax) or min."""
    out = np.zeros(x.shape)
    for n, i, j, c in np.ndindex(*source.shape):
        cells = [(i * strides[1] + a, j * strides[2] + b) for a, b in itertools.product(range(2), range(2))]
        cells = [(r, s) for r, s in cells if r < x.shape[1] and s < x.shape[2]]
        r, s = cells[pick([x[n, r, s, c] for r, s in cells])]
        out[n, r, s, c] += source[n, i, j, c]
    return out


def test_the_reader_splits_the_two_regions():
    text = module(["2x4x6x3xf32", "2x2x3x3xf32"], "2x4x6x3xf32",
                  [ZERO, *select_and_scatter_lines("2x4x6x3xf32", "2x2x3x3xf32")])
    (stmt,) = [s for s in Reader(text, "windows.mlir").functions()["main"].body if s.regions]
    assert [[s.op for s in r.body] for r in stmt.regions] == [["stablehlo.compare", "stablehlo.return"],
                                                              ["stablehlo.add", "stablehlo.return"]]
    assert [r.args for r in stmt.regions] == [["%arg43", "%arg44"]] * 2
    assert stmt.rest.endswith("-> tensor<2x4x6x3xf32>")


@pytest.mark.parametrize("compare,pick", [("GE, %arg43, %arg44", np.argmax), ("GE, %arg44, %arg43", np.argmin)],
                         ids=["ge", "swapped-is-le"])
def test_select_and_scatter(compare, pick):
    text = module(["2x4x6x3xf32", "2x2x3x3xf32"], "2x4x6x3xf32",
                  [ZERO, *select_and_scatter_lines("2x4x6x3xf32", "2x2x3x3xf32", compare)])
    x, source = normal((2, 4, 6, 3), (2, 2, 3, 3))
    fn = import_stablehlo(text)
    assert [op.kind for op in fn.ops] == ["select_and_scatter_add"]
    np.testing.assert_allclose(run(fn, [x, source])[0], scatter_ref(x, source, (1, 2, 2, 1), pick), rtol=1e-6)


def test_select_and_scatter_overlapping_windows_accumulate():
    text = module(["1x4x5x2xf32", "1x3x4x2xf32"], "1x4x5x2xf32",
                  [ZERO, *select_and_scatter_lines("1x4x5x2xf32", "1x3x4x2xf32", strides="1, 1, 1, 1")])
    x, source = normal((1, 4, 5, 2), (1, 3, 4, 2), seed=3)
    np.testing.assert_allclose(run_text(text, x, source), scatter_ref(x, source, (1, 1, 1, 1), np.argmax),
                               rtol=1e-6)


def test_select_and_scatter_with_a_multiply_scatter_is_refused():
    text = module(["2x4x6x3xf32", "2x2x3x3xf32"], "2x4x6x3xf32",
                  [ZERO, *select_and_scatter_lines("2x4x6x3xf32", "2x2x3x3xf32", scatter="multiply")])
    with pytest.raises(StableHLOError, match="windows.mlir:4: .*only a scatter region of one stablehlo.add"):
        import_stablehlo(text, "windows.mlir")


def test_select_and_scatter_with_an_equality_select_is_refused():
    text = module(["2x4x6x3xf32", "2x2x3x3xf32"], "2x4x6x3xf32",
                  [ZERO, *select_and_scatter_lines("2x4x6x3xf32", "2x2x3x3xf32", compare="EQ, %arg43, %arg44")])
    with pytest.raises(StableHLOError, match="the select region must be one stablehlo.compare"):
        import_stablehlo(text, "windows.mlir")


# ---------------------------------------------------------------- the real fixture


def test_cnn_fixture_has_no_unsupported_window_op():
    reader = Reader((ROOT / "tests" / "fixtures" / "real" / "cnn_train.mlir").read_text(), "cnn_train.mlir")
    missing = unsupported(reader.functions())
    assert not {"stablehlo.convolution", "stablehlo.reduce_window", "stablehlo.select_and_scatter",
                "stablehlo.reverse"} & set(missing)


def test_an_imported_conv_and_pool_differentiates_and_prints_back():
    """The VJPs emit conv_general, select_and_scatter_add and reverse; the text
    form reaches a fixed point with their list-of-bool and pair attributes."""
    text = module(["2x6x4x3xf32", "3x3x3x4xf32"], "2x3x2x4xf32", [
        f"%1 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], "
        f"{WINDOW.replace('reverse = [false, false]', 'reverse = [true, false]')}"
        " : (tensor<2x6x4x3xf32>, tensor<3x3x3x4xf32>) -> tensor<2x6x4x4xf32>",
        NEG_INF, "%0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>",
        *reduce_window_line("2x6x4x4xf32", "2x3x2x4xf32", "maximum")])
    text = text.replace('"stablehlo.reduce_window"(%arg0', '"stablehlo.reduce_window"(%1')
    fn = import_stablehlo(text)
    b = Builder("loss")
    x, w = b.param("x", (2, 6, 4, 3)), b.param("w", (3, 3, 3, 4))
    y = b.op("conv_general", [x, w], **fn.ops[0].attrs.as_dict())
    pooled = b.op("reduce_window", [y], **fn.ops[-1].attrs.as_dict())
    g = grad(b.build([b.sum(b.mul(pooled, pooled), [0, 1, 2, 3])]), ["x", "w"])
    assert {"select_and_scatter_add", "reverse"} <= {op.kind for op in g.ops}
    assert parse(print_function(g)) == g


def test_a_window_dilated_max_pool_has_no_vjp():
    b = Builder("f")
    x = b.param("x", (5, 6))
    y = b.op("reduce_window", [x], window_dimensions=[2, 2], window_dilations=[2, 1], combiner="max")
    with pytest.raises(NotImplementedError, match="reduce_window max/min: no VJP with window dilation"):
        grad(b.build([b.sum(y, [0, 1])]), ["x"])
