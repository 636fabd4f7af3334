"""A convolutional U-Net denoiser with a mean-squared-error loss.

Function @unet(x [batch, size, size, channels_in], target [like x], params)
-> (loss,). Images are NHWC, conv weights HWIO [kh, kw, c_in, c_out], no
biases. Level l works at size / 2**l with c_l = base_channels * 2**l
channels (the DDPM layout: a level's first residual block changes the
channels, the downsample keeps them). Parameters, in program order:

  stem.w                               [3, 3, channels_in, c_0]
  down.{l}.block.{i}.norm.scale        [c]        (norm="rms" only)
  down.{l}.block.{i}.conv1.w           [3, 3, c_in, c_l]
  down.{l}.block.{i}.conv2.w           [3, 3, c_l, c_l]
  down.{l}.block.{i}.skip.w            [1, 1, c_in, c_l]  (first block of l > 0: c_in = c_{l-1})
  down.{l}.downsample.w                [3, 3, c_l, c_l], stride 2
  mid.block.0.*, mid.block.1.*         residual blocks at c_m = c_{levels-1}
  mid.attn.norm.scale                  [c_m]      (norm="rms" only)
  mid.attn.wq, wk, wv                  [c_m, c_m] (heads=1) or [c_m, heads, c_m / heads]
  mid.attn.wo                          [c_m, c_m] or [heads, c_m / heads, c_m]
  up.{l}.upconv.w                      [3, 3, c_{l+1} or c_m, c_l]   (l from levels-1 down to 0)
  up.{l}.block.{i}.*                   residual blocks at c_l
  head.w                               [3, 3, c_0, channels_in]

A residual block is h + conv2(relu(conv1(relu(norm(h))))), with h passed
through the 1x1 skip conv when the channels change. The middle's attention
flattens the image into a sequence [batch, h * w, c] and reuses the
attention core of `ir.models.attention` (softmax over all positions,
residual add). Upsampling is nearest-neighbour, a broadcast_in_dim that
repeats each pixel 2x2 and a reshape, so no new op kind.

Sharding: batch and channels are shardable everywhere; height and width are
not (the convolutions' spatial factors are opaque).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.builder import Builder
from ir.core import Value
from ir.models.attention import attend
from ir.models.base import Model
from ir.models.losses import mean_squared_error

BATCH_INPUTS = ("x", "target")
NORMS = ("rms", "none")


@dataclass(frozen=True, slots=True)
class _Layout:
    """What every block shares: the norm, the head count and the dtype."""

    norm: str
    heads: int
    dtype: str

    def conv(self, b: Builder, x: Value, name: str, c_out: int, kernel: int = 3, stride: int = 1) -> Value:
        """A SAME-padded conv by a new weight `{name}.w`; the result is named `name`."""
        w = b.param(f"{name}.w", [kernel, kernel, x.type.shape[3], c_out], self.dtype)
        return b.conv2d(x, w, (stride, stride), "SAME", name=name)

    def normed(self, b: Builder, x: Value, name: str) -> Value:
        """RMSNorm over channels with `{name}.scale`, or x itself for norm="none"."""
        if self.norm == "none":
            return x
        return b.rms_norm(x, b.param(f"{name}.scale", [x.type.shape[3]], self.dtype), name=name)


def unet(batch: int = 2, size: int = 8, channels_in: int = 3, base_channels: int = 8, levels: int = 2,
         blocks: int = 1, heads: int = 1, norm: str = "rms", dtype: str = "f32") -> Model:
    """loss = mean((unet(x) - target)**2); see the module docstring for the layout and parameters.

    `size` must be divisible by 2**levels (every level halves it), and the
    middle's channels base_channels * 2**(levels - 1) by `heads`.
    """
    layout = _Layout(_check_norm(norm), heads, dtype)
    channels = [base_channels * 2 ** level for level in range(levels)]
    _check_sizes(size, levels, channels[-1], heads)
    b = Builder("unet")
    x = b.param("x", [batch, size, size, channels_in], dtype)
    target = b.param("target", [batch, size, size, channels_in], dtype)
    h = layout.conv(b, x, "stem", channels[0])
    skips = []
    for level, c in enumerate(channels):
        h = _blocks(b, layout, h, c, blocks, f"down.{level}")
        skips.append(h)
        h = layout.conv(b, h, f"down.{level}.downsample", c, stride=2)
    h = _residual_block(b, layout, h, channels[-1], "mid.block.0")
    h = _attention_block(b, layout, h, "mid.attn")
    h = _residual_block(b, layout, h, channels[-1], "mid.block.1")
    for level in reversed(range(levels)):
        h = layout.conv(b, _upsample(b, h), f"up.{level}.upconv", channels[level])
        # The skip joins by addition, not concatenation: a concatenated channel
        # dimension is opaque (block sharding does not commute with it), so it
        # would keep the channels whole here and block channel sharding.
        h = b.add(h, skips[level], name=f"up.{level}.skip")
        h = _blocks(b, layout, h, channels[level], blocks, f"up.{level}")
    y = layout.conv(b, h, "head", channels_in)
    fn = b.build([mean_squared_error(b, y, target)])
    return Model(fn, tuple(p.name for p in fn.params if p.name not in BATCH_INPUTS), BATCH_INPUTS)


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise ValueError(f"unet: unknown norm {norm!r}; expected one of {', '.join(NORMS)}")
    return norm


def _check_sizes(size: int, levels: int, mid_channels: int, heads: int) -> None:
    if size % 2 ** levels:
        raise ValueError(f"unet: size {size} must be divisible by 2**levels = {2 ** levels} "
                         f"(each of the {levels} levels halves it)")
    if mid_channels % heads:
        raise ValueError(f"unet: the middle's {mid_channels} channels (base_channels * 2**(levels - 1)) "
                         f"must be divisible by heads = {heads}")


def _blocks(b: Builder, layout: _Layout, h: Value, c: int, count: int, prefix: str) -> Value:
    for i in range(count):
        h = _residual_block(b, layout, h, c, f"{prefix}.block.{i}")
    return h


def _residual_block(b: Builder, layout: _Layout, h: Value, c: int, prefix: str) -> Value:
    """h (through a 1x1 conv when its channels are not c) + conv2(relu(conv1(relu(norm(h)))))."""
    r = b.relu(layout.normed(b, h, f"{prefix}.norm"))
    r = layout.conv(b, b.relu(layout.conv(b, r, f"{prefix}.conv1", c)), f"{prefix}.conv2", c)
    if h.type.shape[3] != c:
        h = layout.conv(b, h, f"{prefix}.skip", c, kernel=1)
    return b.add(h, r, name=f"{prefix}.out")


def _attention_block(b: Builder, layout: _Layout, h: Value, prefix: str) -> Value:
    """h + attention over all h*w positions of norm(h), each position a token of c channels."""
    batch, height, width, c = h.type.shape
    seq = b.reshape(layout.normed(b, h, f"{prefix}.norm"), [batch, height * width, c])
    head_shape = [c] if layout.heads == 1 else [layout.heads, c // layout.heads]
    spec = "bsd,dh->bsh" if layout.heads == 1 else "bsd,dnh->bsnh"
    q, k, v = (b.einsum(spec, seq, b.param(f"{prefix}.w{n}", [c, *head_shape], layout.dtype), name=f"{prefix}.{n}")
               for n in "qkv")
    wo = b.param(f"{prefix}.wo", [*head_shape, c], layout.dtype)
    out = attend(b, q, k, v, wo, prefix=f"{prefix}.")
    return b.add(h, b.reshape(out, [batch, height, width, c]), name=f"{prefix}.residual")


def _upsample(b: Builder, h: Value) -> Value:
    """Nearest-neighbour 2x: each pixel repeated over a 2x2 patch."""
    batch, height, width, c = h.type.shape
    patches = b.broadcast_in_dim(h, [batch, height, 2, width, 2, c], [0, 1, 3, 5])
    return b.reshape(patches, [batch, 2 * height, 2 * width, c])
