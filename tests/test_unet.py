"""The U-Net builder (ir/models/unet.py): its parameters and structure, its
forward pass against an independent numpy U-Net, and its Adam training step
lowered under batch and batch + channel sharding, executed on the simulated
2x2 mesh and compared with the unpartitioned program."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from test_lower import MESH, check_lowering, plan
from test_ops import ref_conv

from ir.autodiff import training_step
from ir.builder import Builder
from ir.interpret import run
from ir.models import build
from ir.models.unet import _upsample
from ir.opset.convolution import explicit_padding

SMALL = {
    "default": {},
    "one_level_no_norm": dict(levels=1, norm="none", base_channels=4),
    "deep_multihead": dict(levels=3, blocks=2, heads=2, base_channels=4, channels_in=2, batch=4),
}


# ------------------------------------------------------------ structure


def test_default_parameters_and_shapes():
    model = build("unet")
    shapes = {n: model.function.param(n).type.shape for n in model.params}
    assert model.inputs == ("x", "target")
    assert shapes["stem.w"] == (3, 3, 3, 8)
    assert shapes["down.0.block.0.norm.scale"] == (8,)
    assert shapes["down.0.block.0.conv1.w"] == (3, 3, 8, 8)
    assert shapes["down.0.downsample.w"] == (3, 3, 8, 8)
    # level 1 doubles the channels in its first block, whose skip is a 1x1 conv
    assert shapes["down.1.block.0.conv1.w"] == (3, 3, 8, 16)
    assert shapes["down.1.block.0.skip.w"] == (1, 1, 8, 16)
    assert "down.0.block.0.skip.w" not in shapes
    assert shapes["mid.attn.wq"] == shapes["mid.attn.wo"] == (16, 16)
    assert shapes["up.1.upconv.w"] == (3, 3, 16, 16)
    assert shapes["up.0.upconv.w"] == (3, 3, 16, 8)
    assert shapes["head.w"] == (3, 3, 8, 3)
    assert len(model.params) == 30
    kinds = Counter(op.kind for op in model.function.ops)
    # one convolution per conv weight: stem, 2 blocks x 2 + 1 skip, 2 downsamples,
    # 2 mid blocks x 2, 2 upconvs, 2 up blocks x 2, head
    assert kinds["convolution"] == sum(len(s) == 4 for s in shapes.values()) == 19
    assert "concatenate" not in kinds  # skips join by addition
    assert model.function.results[0].type.shape == ()


def test_multi_head_attention_weights_have_a_heads_dim():
    model = build("unet", **SMALL["deep_multihead"])
    fn = model.function
    assert fn.param("mid.attn.wq").type.shape == (16, 2, 8)
    assert fn.param("mid.attn.wo").type.shape == (2, 8, 16)
    assert fn.param("x").type.shape == (4, 8, 8, 2)
    assert sum(n.startswith("up.2.block.") and n.endswith("conv1.w") for n in model.params) == 2


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(size=12, levels=3), "size 12 must be divisible by 2\\*\\*levels = 8"),
    (dict(size=6), "size 6 must be divisible"),
    (dict(heads=3), "divisible by heads = 3"),
    (dict(norm="layer"), "unknown norm 'layer'"),
])
def test_bad_arguments_raise_value_error(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        build("unet", **kwargs)


def test_upsampling_is_nearest_neighbour():
    b = Builder("up")
    y = _upsample(b, b.param("h", [2, 2, 3, 2]))
    x = np.arange(24.0).reshape(2, 2, 3, 2)
    (got,) = run(b.build([y]), [x], float_dtype=np.float64)
    np.testing.assert_array_equal(got, x.repeat(2, axis=1).repeat(2, axis=2))


# -------------------------------------------------------------- forward


def numpy_unet(p: dict[str, np.ndarray], x: np.ndarray, levels: int, heads: int, norm: str) -> np.ndarray:
    """The U-Net of the builder's docstring, in numpy: which blocks exist is read
    off the parameter names, everything else is written out again here."""
    def conv(h, name, stride=1):
        w = p[f"{name}.w"]
        pads = explicit_padding("SAME", h.shape[1:3], w.shape[:2], (stride, stride))
        return ref_conv((stride, stride), pads)(h, w)

    def normed(h, name):
        if norm == "none":
            return h
        return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6) * p[f"{name}.scale"]

    def block(h, prefix):
        relu = lambda v: np.maximum(v, 0)  # noqa: E731
        r = conv(relu(conv(relu(normed(h, f"{prefix}.norm")), f"{prefix}.conv1")), f"{prefix}.conv2")
        return (conv(h, f"{prefix}.skip") if f"{prefix}.skip.w" in p else h) + r

    def blocks(h, prefix):
        i = 0
        while f"{prefix}.block.{i}.conv1.w" in p:
            h, i = block(h, f"{prefix}.block.{i}"), i + 1
        return h

    def attention(h):
        n, hh, ww, c = h.shape
        s = normed(h, "mid.attn.norm").reshape(n, hh * ww, c)
        q, k, v = (np.einsum("bsd,d...->bs...", s, p[f"mid.attn.w{m}"]).reshape(n, hh * ww, heads, -1)
                   for m in "qkv")
        scores = np.einsum("bsnh,btnh->bnst", q, k) / math.sqrt(q.shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("bnst,btnh->bsnh", probs, v)
        out = np.einsum("bsnh,nhd->bsd", context, p["mid.attn.wo"].reshape(heads, -1, c))
        return h + out.reshape(h.shape)

    h, skips = conv(x, "stem"), []
    for level in range(levels):
        skips.append(blocks(h, f"down.{level}"))
        h = conv(skips[-1], f"down.{level}.downsample", stride=2)
    h = block(attention(block(h, "mid.block.0")), "mid.block.1")
    for level in reversed(range(levels)):
        h = conv(h.repeat(2, axis=1).repeat(2, axis=2), f"up.{level}.upconv") + skips[level]
        h = blocks(h, f"up.{level}")
    return conv(h, "head")


@pytest.mark.parametrize("name", SMALL)
def test_forward_matches_numpy(name):
    kwargs = {"levels": 2, "heads": 1, "norm": "rms", **SMALL[name]}
    model = build("unet", **SMALL[name])
    rng = np.random.default_rng(0)
    # weights scaled like a fan-in initialization, so activations stay O(1)
    inputs = {p.name: rng.standard_normal(p.type.shape) / math.sqrt(math.prod(p.type.shape[:-1]))
              for p in model.function.params}
    (loss,) = run(model.function, inputs, float_dtype=np.float64)
    y = numpy_unet(inputs, inputs["x"], kwargs["levels"], kwargs["heads"], kwargs["norm"])
    expected = np.mean((y - inputs["target"]) ** 2)
    assert np.isfinite(loss) and loss == pytest.approx(expected, rel=1e-10)


# ------------------------------------------------------------- lowering


STEPS = {name: training_step(build("unet", **kwargs)) for name, kwargs in SMALL.items()}
BATCH = [("x", 0, "batch")]


@pytest.mark.parametrize("name", SMALL)
def test_batch_parallel_step_needs_one_all_reduce_per_gradient_and_the_loss(name):
    step = STEPS[name]
    checked = check_lowering(step, MESH, plan(BATCH))
    # Every weight gradient sums over the batch (conv_kernel_grad's n factor,
    # the norm scales' and attention weights' batch reductions) and is reduced
    # once, its Adam moments sharing it; the loss's mean is the last one.
    assert checked.counts == Counter(all_reduce=len(step.params) + 1)


def conv1_output_channels(step) -> list[tuple[str, int, str]]:
    return [(n, 3, "model") for n in step.params if n.endswith(".conv1.w")]


@pytest.mark.parametrize("name", SMALL)
def test_batch_and_conv_output_channel_sharding_lowers_correctly(name):
    """Megatron for residual blocks: conv1's output channels on `model` make
    conv2's input channels a sharded sum, one all_reduce forward; conv1's
    input gradient sums over them, one all_reduce backward."""
    step = STEPS[name]
    picks = conv1_output_channels(step)
    checked = check_lowering(step, MESH, plan(BATCH, picks))
    fn = checked.nda.function
    for weight, _, _ in picks:
        assert checked.sharding.def_dims(checked.nda, fn.param(weight))[3] == ("model",)
    by_axes = Counter((op.kind, op.attrs["axes"]) for op in checked.function.ops if "axes" in op.attrs)
    assert by_axes == Counter({("all_reduce", ("batch",)): len(step.params) + 1,
                               ("all_reduce", ("model",)): 2 * len(picks)})


def test_stream_channel_and_attention_head_sharding_lowers_correctly():
    """Sharding the stem's output channels shards the whole level-0 stream
    (skip included, since it joins by addition); heads on `model` too."""
    step = STEPS["deep_multihead"]
    checked = check_lowering(step, MESH, plan(BATCH, [("stem.w", 3, "model"), ("mid.attn.wq", 1, "model")]))
    fn = checked.nda.function
    for name in ("stem.w", "up.0.upconv.w"):
        assert checked.sharding.def_dims(checked.nda, fn.param(name))[3] == ("model",)
    assert checked.sharding.def_dims(checked.nda, fn.param("head.w"))[2] == ("model",)
