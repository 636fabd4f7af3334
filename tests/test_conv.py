"""2-D convolution (ir/opset/convolution.py): the three op kinds against
naive loops, the builder's padding modes, VJPs (first and second order)
against central differences, the factor rules by execution on shards, costs,
the text form, and a conv net's training step lowered under batch and
output-channel sharding, executed on the simulated mesh.

The registry-wide table in tests/test_ops.py also holds cases for the three
kinds (shape rule, interpreter, factor splits, per-op VJPs); the loop
references live there and are shared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from test_lower import MESH, check_lowering, plan
from test_ops import conv_output, ref_conv, ref_conv_input_grad, ref_conv_kernel_grad

from ir import ops
from ir.autodiff import grad, training_step
from ir.builder import Builder
from ir.core import Function, Mesh, TensorType, Value
from ir.interpret import run
from ir.models import Model
from ir.models.losses import mean_squared_error
from ir.ops import FactorKind, OpError
from ir.text import parse, print_function

F64 = np.float64

# (x shape, w shape, stride, padding): strides 1 and 2, even and odd padding,
# windows that leave padded rows unread, output rows that read only padding,
# 1x1 and non-square kernels.
GEOMETRIES = [
    pytest.param((2, 5, 5, 3), (3, 3, 3, 4), (1, 1), ((1, 1), (1, 1)), id="same3x3"),
    pytest.param((1, 6, 7, 2), (3, 3, 2, 3), (2, 2), ((0, 1), (1, 1)), id="stride2-odd-pad"),
    pytest.param((2, 8, 8, 2), (3, 3, 2, 2), (2, 2), ((1, 1), (1, 1)), id="stride2-even-pad-unread-row"),
    pytest.param((3, 4, 6, 5), (1, 1, 5, 2), (1, 1), ((0, 0), (0, 0)), id="1x1"),
    pytest.param((2, 7, 5, 2), (2, 4, 2, 3), (2, 1), ((2, 0), (0, 3)), id="rect-asymmetric"),
    pytest.param((1, 5, 5, 1), (5, 5, 1, 1), (1, 1), ((0, 0), (0, 0)), id="window-is-input"),
    pytest.param((2, 4, 4, 2), (2, 2, 2, 3), (1, 2), ((3, 1), (0, 3)), id="rows-of-padding-only"),
]


def one_op(kind: str, shapes: Sequence[Sequence[int]], **attrs) -> Function:
    b = Builder(kind)
    params = [b.param(f"x{i}", s) for i, s in enumerate(shapes)]
    return b.build([b.op(kind, params, **attrs)])


def normal(rng: np.random.Generator, *shapes: Sequence[int]) -> list[np.ndarray]:
    return [rng.standard_normal(s) for s in shapes]


# ------------------------------------------------------------ semantics


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", GEOMETRIES)
def test_the_three_kinds_match_naive_loops(x_shape, w_shape, stride, padding):
    geometry = dict(stride=list(stride), padding=[list(p) for p in padding])
    y_shape = (x_shape[0], *conv_output(x_shape[1:3], w_shape[:2], stride, padding), w_shape[3])
    x, w, g = normal(np.random.default_rng(0), x_shape, w_shape, y_shape)
    (y,) = run(one_op("convolution", [x_shape, w_shape], **geometry), [x, w], float_dtype=F64)
    np.testing.assert_allclose(y, ref_conv(stride, padding)(x, w), rtol=1e-12, atol=1e-12)
    (dx,) = run(one_op("conv_input_grad", [y_shape, w_shape], input_spatial=list(x_shape[1:3]), **geometry),
                [g, w], float_dtype=F64)
    np.testing.assert_allclose(dx, ref_conv_input_grad(stride, padding, x_shape[1:3])(g, w), rtol=1e-12, atol=1e-12)
    (dw,) = run(one_op("conv_kernel_grad", [x_shape, y_shape], kernel_spatial=list(w_shape[:2]), **geometry),
                [x, g], float_dtype=F64)
    np.testing.assert_allclose(dw, ref_conv_kernel_grad(stride, padding, w_shape[:2])(x, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", GEOMETRIES)
def test_the_transposes_are_adjoints_of_the_convolution(x_shape, w_shape, stride, padding):
    """<conv(x, w), g> = <x, input_grad(g, w)> = <w, kernel_grad(x, g)>."""
    geometry = dict(stride=list(stride), padding=[list(p) for p in padding])
    y_shape = (x_shape[0], *conv_output(x_shape[1:3], w_shape[:2], stride, padding), w_shape[3])
    x, w, g = normal(np.random.default_rng(1), x_shape, w_shape, y_shape)
    (y,) = ops.get("convolution").impl([x, w], ops.normalize_attrs("convolution", geometry))
    (dx,) = ops.get("conv_input_grad").impl(
        [g, w], ops.normalize_attrs("conv_input_grad", {**geometry, "input_spatial": x_shape[1:3]}))
    (dw,) = ops.get("conv_kernel_grad").impl(
        [x, g], ops.normalize_attrs("conv_kernel_grad", {**geometry, "kernel_spatial": w_shape[:2]}))
    inner = float(np.sum(y * g))
    assert float(np.sum(x * dx)) == pytest.approx(inner, rel=1e-12)
    assert float(np.sum(w * dw)) == pytest.approx(inner, rel=1e-12)


@pytest.mark.parametrize("size,kernel,stride,same,valid", [
    (8, 3, 1, ((1, 1), 8), ((0, 0), 6)),
    (8, 3, 2, ((0, 1), 4), ((0, 0), 3)),
    (7, 3, 2, ((1, 1), 4), ((0, 0), 3)),
    (6, 4, 1, ((1, 2), 6), ((0, 0), 3)),
    (5, 1, 2, ((0, 0), 3), ((0, 0), 3)),
])
def test_builder_padding_modes(size, kernel, stride, same, valid):
    """SAME: output ceil(size / stride), the odd pixel of padding after; VALID: none."""
    for mode, (pads, out) in (("SAME", same), ("VALID", valid)):
        b = Builder("pad")
        y = b.conv2d(b.param("x", [1, size, size, 2]), b.param("w", [kernel, kernel, 2, 3]), (stride, stride), mode)
        assert b.body[-1].attrs["padding"] == (pads, pads), mode
        assert y.type.shape == (1, out, out, 3), mode
    b = Builder("explicit")
    y = b.conv2d(b.param("x", [1, 6, 6, 2]), b.param("w", [3, 3, 2, 3]), padding=[[2, 0], [0, 1]])
    assert y.type.shape == (1, 6, 5, 3)


@pytest.mark.parametrize("kind,shapes,attrs,pattern", [
    ("convolution", [(1, 5, 5, 3), (3, 3, 2, 4)], {}, "input channels"),
    ("convolution", [(1, 5, 5), (3, 3, 5, 4)], {}, "4-D"),
    ("convolution", [(1, 2, 5, 3), (3, 3, 3, 4)], {}, "does not fit"),
    ("convolution", [(1, 5, 5, 3), (3, 3, 3, 4)], {"stride": [0, 1]}, "attribute 'stride'"),
    ("convolution", [(1, 5, 5, 3), (3, 3, 3, 4)], {"padding": [[1, -1], [0, 0]]}, "attribute 'padding'"),
    ("convolution", [(1, 5, 5, 3), (3, 3, 3, 4)], {"padding": [1, 1]}, "attribute 'padding'"),
    ("conv_input_grad", [(1, 3, 3, 4), (3, 3, 2, 4)], {"input_spatial": [6, 5]}, "output spatial sizes"),
    ("conv_input_grad", [(1, 3, 3, 4), (3, 3, 2, 5)], {"input_spatial": [5, 5]}, "output channels"),
    ("conv_input_grad", [(1, 3, 3, 4), (3, 3, 2, 4)], {}, "missing required attribute 'input_spatial'"),
    ("conv_kernel_grad", [(2, 5, 5, 2), (1, 3, 3, 4)], {"kernel_spatial": [3, 3]}, "batch sizes"),
    ("conv_kernel_grad", [(1, 5, 5, 2), (1, 3, 3, 4)], {"kernel_spatial": [2, 3]}, "output spatial sizes"),
])
def test_misuse_raises_op_error(kind, shapes, attrs, pattern):
    with pytest.raises(OpError, match=pattern):
        ops.make_op(kind, [Value(f"x{i}", TensorType(tuple(s), "f32")) for i, s in enumerate(shapes)], attrs,
                    ["y"])


def test_unknown_padding_mode_is_an_error():
    b = Builder("bad")
    with pytest.raises(OpError, match="padding must be 'SAME', 'VALID'"):
        b.conv2d(b.param("x", [1, 5, 5, 2]), b.param("w", [3, 3, 2, 2]), padding="FULL")


# ---------------------------------------------------------------- VJPs


def conv_net(stride: Sequence[int], padding) -> Function:
    """loss = sum(conv(relu(conv(x, w1)), w2, stride) * u): x's and both weights' gradients cross every kind."""
    b = Builder("conv_net")
    x, w1, w2 = b.param("x", [2, 6, 5, 2]), b.param("w1", [3, 3, 2, 4]), b.param("w2", [3, 2, 4, 3])
    y = b.conv2d(b.relu(b.conv2d(x, w1)), w2, stride, padding)
    return b.build([b.sum(b.mul(y, b.param("u", y.type.shape)), [0, 1, 2, 3])])


def assert_gradients_match_differences(fn: Function, wrt: Sequence[str], inputs: dict, seed: int = 0) -> None:
    """Each gradient's directional derivative along random directions equals a central difference."""
    grads = run(grad(fn, wrt), inputs, float_dtype=F64)[1:]
    rng = np.random.default_rng(seed)

    def loss(changed: dict) -> float:
        return float(run(fn, {**inputs, **changed}, float_dtype=F64)[0])

    eps = 1e-6
    for name, g in zip(wrt, grads):
        for _ in range(2):
            d = rng.standard_normal(inputs[name].shape)
            numeric = (loss({name: inputs[name] + eps * d}) - loss({name: inputs[name] - eps * d})) / (2 * eps)
            assert float(np.sum(g * d)) == pytest.approx(numeric, rel=1e-6, abs=1e-7), name


@pytest.mark.parametrize("stride,padding", [((1, 1), "SAME"), ((2, 2), "SAME"), ((2, 1), ((1, 0), (0, 2)))],
                         ids=["s1-same", "s2-same", "s21-explicit"])
def test_vjp_of_a_conv_net_matches_central_differences(stride, padding):
    fn = conv_net(stride, padding)
    rng = np.random.default_rng(3)
    inputs = {p.name: rng.standard_normal(p.type.shape) for p in fn.params}
    assert_gradients_match_differences(fn, ["x", "w1", "w2"], inputs)


def test_second_derivatives_match_central_differences():
    """d/dx and d/dw of <dL/dw, v> for L = |conv(x, w)|^2 / 2, stride 2: the
    transposes' own VJPs (conv_kernel_grad's in both operands)."""
    b = Builder("first")
    x, w = b.param("x", [2, 5, 6, 2]), b.param("w", [3, 3, 2, 3])
    y = b.conv2d(x, w, (2, 2), "SAME")
    first = grad(b.build([b.mul(b.sum(b.mul(y, y), [0, 1, 2, 3]), 0.5)]), ["w"])
    b = Builder("second")
    b.adopt(first)
    dw = first.results[1]
    v = b.param("v", dw.type.shape)
    second = b.build([b.sum(b.mul(dw, v), [0, 1, 2, 3])])
    assert {op.kind for op in grad(second, ["x", "w"]).ops} >= {"convolution", "conv_input_grad", "conv_kernel_grad"}
    rng = np.random.default_rng(5)
    inputs = {p.name: rng.standard_normal(p.type.shape) for p in second.params}
    assert_gradients_match_differences(second, ["x", "w"], inputs)


# --------------------------------------------------- factor rules, costs


KINDS = {
    # kind: (operand shapes, result shape, attrs) of one stride-2 geometry
    "convolution": ([(4, 7, 6, 2), (3, 3, 2, 6)], (4, 4, 3, 6), {}),
    "conv_input_grad": ([(4, 4, 3, 6), (3, 3, 2, 6)], (4, 7, 6, 2), {"input_spatial": [7, 6]}),
    "conv_kernel_grad": ([(4, 7, 6, 2), (4, 4, 3, 6)], (3, 3, 2, 6), {"kernel_spatial": [3, 3]}),
}
GEOMETRY = {"stride": [2, 2], "padding": [[1, 1], [1, 0]]}
RULES = {
    "convolution": "(n,h,w,c),(kh,kw,c,o)->(n,ho,wo,o) "
                   "{h:opaque, w:opaque, c:sum, kh:opaque, kw:opaque, ho:opaque, wo:opaque}",
    "conv_input_grad": "(n,ho,wo,o),(kh,kw,c,o)->(n,h,w,c) "
                       "{ho:opaque, wo:opaque, o:sum, kh:opaque, kw:opaque, h:opaque, w:opaque}",
    "conv_kernel_grad": "(n,h,w,c),(n,ho,wo,o)->(kh,kw,c,o) "
                        "{n:sum, h:opaque, w:opaque, ho:opaque, wo:opaque, kh:opaque, kw:opaque}",
}


def make(kind: str):
    shapes, _, attrs = KINDS[kind]
    operands = [Value(f"x{i}", TensorType(tuple(s), "f32")) for i, s in enumerate(shapes)]
    return ops.make_op(kind, operands, {**GEOMETRY, **attrs}, ["y"])


@pytest.mark.parametrize("kind", KINDS)
def test_factor_rule_and_cost(kind):
    op = make(kind)
    assert op.result.type.shape == KINDS[kind][1]
    rule = ops.factor_rule(op)
    assert str(rule) == RULES[kind]
    cost = ops.op_cost(op)
    assert cost.flops == 2 * 4 * 4 * 3 * 6 * 3 * 3 * 2  # 2 n ho wo o kh kw c, for all three
    assert cost.bytes == 4 * (4 * 7 * 6 * 2 + 3 * 3 * 2 * 6 + 4 * 4 * 3 * 6)


def halves(x: np.ndarray, dim: int) -> list[np.ndarray]:
    return np.split(x, 2, axis=dim)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("factor", ["n", "c", "o"])
def test_sharding_a_factor_in_two_on_the_numpy_impl(kind, factor):
    """Each operand split along the factor's dim: a parallel factor gives the
    result's halves, the reduction factor partial results that sum to it."""
    op = make(kind)
    rule = ops.factor_rule(op)
    f = next(i for i, x in enumerate(rule.factors) if x.name == factor)
    impl = ops.get(kind).impl
    inputs = normal(np.random.default_rng(2), *KINDS[kind][0])
    (whole,) = impl(inputs, op.attrs)
    dims = [[d for d, fs in enumerate(t) if f in fs] for t in rule.operands]
    parts = [[halves(x, d[0])[k] if d else x for x, d in zip(inputs, dims)] for k in range(2)]
    local = [impl(p, op.attrs)[0] for p in parts]
    (result_dims,) = [[d for d, fs in enumerate(t) if f in fs] for t in rule.results]
    if rule.factors[f].kind is FactorKind.REDUCTION:
        assert not result_dims
        np.testing.assert_allclose(local[0] + local[1], whole, rtol=1e-12, atol=1e-12)
    else:
        for k in range(2):
            np.testing.assert_allclose(local[k], halves(whole, result_dims[0])[k], rtol=1e-12, atol=1e-12)


def test_text_form_round_trips_a_conv_training_step():
    fn = conv_model().function
    step = training_step(conv_model()).function
    for f in (fn, step):
        assert parse(print_function(f)) == f
    assert {"convolution", "conv_input_grad", "conv_kernel_grad"} <= {op.kind for op in step.ops}


# ------------------------------------------------------------- lowering


def conv_model(batch: int = 4) -> Model:
    """conv 3x3 -> relu -> conv 3x3 stride 2 -> MSE against target."""
    b = Builder("conv_net")
    x = b.param("x", [batch, 6, 6, 2])
    target = b.param("target", [batch, 3, 3, 2])
    w1, w2 = b.param("w1", [3, 3, 2, 4]), b.param("w2", [3, 3, 4, 2])
    h = b.relu(b.conv2d(x, w1, name="conv1"), name="h")
    y = b.conv2d(h, w2, (2, 2), name="y")
    return Model(b.build([mean_squared_error(b, y, target)]), ("w1", "w2"), ("x", "target"))


STEP = training_step(conv_model())


def test_batch_parallel_training_step_lowers_with_one_all_reduce_per_gradient():
    checked = check_lowering(STEP, MESH, plan([("x", 0, "batch")]))
    # conv_kernel_grad's batch factor is a sum: each weight gradient is partial
    # over the batch axis and reduced once (its Adam moments share it), plus the loss.
    assert checked.counts == Counter(all_reduce=len(STEP.params) + 1)


def test_batch_and_output_channel_training_step_lowers_correctly():
    checked = check_lowering(STEP, MESH, plan([("x", 0, "batch")], [("w1", 3, "model")]))
    fn = checked.nda.function
    assert checked.sharding.def_dims(checked.nda, fn.param("w1")) == ((), (), (), ("model",))
    # Megatron for convolutions: conv1's output channels are conv2's input
    # channels, a sum: one all_reduce over `model` in the forward pass. The
    # backward pass needs none on `model` (h's gradient comes out channel
    # sharded); the batch axis reduces both weight gradients and the loss.
    by_axes = Counter((op.kind, op.attrs["axes"]) for op in checked.function.ops if "axes" in op.attrs)
    assert by_axes == Counter({("all_reduce", ("batch",)): 3, ("all_reduce", ("model",)): 1})


def test_spatial_sharding_is_refused_at_the_convolution():
    """A decision on x's height keeps the conv's spatial dims whole: the
    lowering stays correct (x is gathered where it is sharded at all)."""
    checked = check_lowering(STEP, Mesh.of(space=2), plan([("x", 1, "space")]))
    fn = checked.nda.function
    assert checked.sharding.def_dims(checked.nda, fn.param("x"))[1] == ("space",)
    uses = [(i, k) for i, op in enumerate(fn.ops) for k, v in enumerate(op.operands) if v is fn.param("x")]
    assert [fn.ops[i].kind for i, _ in uses] == ["convolution", "conv_kernel_grad"]
    for i, k in uses:
        assert checked.sharding.use_dims(checked.nda, i, k)[1] == ()
    # x is gathered for each of its two uses; nothing else is sharded.
    assert checked.counts == Counter(all_gather=2)
