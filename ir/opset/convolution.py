"""2-D convolution and its two transposes (the convolution's VJP).

  convolution       x [n, h, w, c] (NHWC), w [kh, kw, c, o] (HWIO)
                    -> y [n, ho, wo, o], ho = (h + pt + pb - kh) // sh + 1
  conv_input_grad   g [n, ho, wo, o], w [kh, kw, c, o] -> dx [n, h, w, c]
  conv_kernel_grad  x [n, h, w, c], g [n, ho, wo, o] -> dw [kh, kw, c, o]

All three take `stride = [sh, sw]` and zero `padding = [[pt, pb], [pl, pr]]`;
the two transposes also take the spatial sizes they cannot infer
(`input_spatial = [h, w]`: with a stride, several input sizes give the same
output size; `kernel_spatial = [kh, kw]`). Only spatial sizes are
attributes, so a shard needs no `localize`: n, c and o come from the
operands' local shapes.

Factor rules: one einsum over the factors n, c, o and the spatial ones,
`(n,h,w,c),(kh,kw,c,o)->(n,ho,wo,o) {c:sum}` for the convolution; each
transpose makes a different tensor the result, so its reduction is the
factor missing from that tensor (o for the input gradient, n for the kernel
gradient: batch parallelism leaves partial kernel gradients, which is the
all_reduce it must pay). The spatial factors h, w, ho, wo and the window
kh, kw are opaque: a spatial shard needs its neighbours' halo rows, which
block sharding cannot express, so spatial sharding is not supported.

Second derivatives come from bilinearity: conv_input_grad(g, w) is the
transpose of x -> convolution(x, w), so its VJP is a convolution (for g)
and a conv_kernel_grad (for w); conv_kernel_grad's is symmetric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ir.core import Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    OpError,
    Types,
    attr_ints,
    io_bytes,
    register,
    require,
)

Pair = tuple[int, int]
Padding = tuple[Pair, Pair]
NO_PADDING: Padding = ((0, 0), (0, 0))

# ---- attributes


def attr_positive_pair(v: Any) -> Pair:
    """Two positive ints: a stride or a spatial size [height, width]."""
    pair = attr_ints(v)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"expected two positive ints [height, width], got {v!r}")
    return pair


def attr_padding(v: Any) -> Padding:
    """[[top, bottom], [left, right]], non-negative ints."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ValueError(f"expected [[top, bottom], [left, right]], got {v!r}")
    pairs = tuple(attr_ints(p) for p in v)
    if any(len(p) != 2 or min(p) < 0 for p in pairs):
        raise ValueError(f"expected [[top, bottom], [left, right]] of non-negative ints, got {v!r}")
    return pairs


GEOMETRY = (AttrSpec("stride", attr_positive_pair, (1, 1)), AttrSpec("padding", attr_padding, NO_PADDING))


def explicit_padding(padding: str | Sequence[Sequence[int]], spatial: Sequence[int], kernel: Sequence[int],
                     stride: Sequence[int]) -> Padding:
    """Resolve "VALID" (none) and "SAME" (output size ceil(size / stride), the
    odd pixel of padding after, as TensorFlow and JAX do) to explicit pairs;
    explicit pairs pass through to the attribute check."""
    if padding == "VALID":
        return NO_PADDING
    if padding == "SAME":
        pairs = []
        for size, k, s in zip(spatial, kernel, stride):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pairs.append((total // 2, total - total // 2))
        return tuple(pairs)
    if isinstance(padding, str):
        raise OpError(f"conv2d: padding must be 'SAME', 'VALID' or [[top, bottom], [left, right]], got {padding!r}")
    return tuple(tuple(p) for p in padding)


# ---- shape rules


def output_spatial(spatial: Sequence[int], kernel: Sequence[int], attrs: Attrs) -> Pair:
    """(ho, wo) of a convolution over `spatial` with window `kernel`; < 1 when the window does not fit."""
    return tuple((size + lo + hi - k) // s + 1
                 for size, k, s, (lo, hi) in zip(spatial, kernel, attrs["stride"], attrs["padding"]))


def _check_operands(kind: str, a: TensorType, b: TensorType) -> None:
    require(a.rank == 4 and b.rank == 4, f"{kind}: operands must be 4-D, got {a}, {b}")
    require(a.dtype == b.dtype, f"{kind}: operand dtypes differ: {a}, {b}")
    require(a.dtype != "bool", f"{kind}: expects numeric tensors, got {a}")


def _check_match(kind: str, what: str, a: int, b: int) -> None:
    require(a == b, f"{kind}: {what} differ: {a} vs {b}")


def _check_window(kind: str, spatial: Sequence[int], kernel: Sequence[int], attrs: Attrs) -> Pair:
    out = output_spatial(spatial, kernel, attrs)
    require(min(out) >= 1, f"{kind}: window {list(kernel)} does not fit input {list(spatial)} "
                           f"padded by {[list(p) for p in attrs['padding']]}")
    return out


def _conv_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, w = types
    _check_operands("convolution", x, w)
    _check_match("convolution", "input channels (x dim 3, w dim 2)", x.shape[3], w.shape[2])
    ho, wo = _check_window("convolution", x.shape[1:3], w.shape[:2], attrs)
    return (TensorType((x.shape[0], ho, wo, w.shape[3]), x.dtype),)


def _input_grad_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    g, w = types
    kind, spatial = "conv_input_grad", attrs["input_spatial"]
    _check_operands(kind, g, w)
    _check_match(kind, "output channels (g dim 3, w dim 3)", g.shape[3], w.shape[3])
    out = _check_window(kind, spatial, w.shape[:2], attrs)
    _check_match(kind, f"output spatial sizes (g dims 1, 2; from input_spatial {list(spatial)})",
                 list(g.shape[1:3]), list(out))
    return (TensorType((g.shape[0], *spatial, w.shape[2]), g.dtype),)


def _kernel_grad_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, g = types
    kind, kernel = "conv_kernel_grad", attrs["kernel_spatial"]
    _check_operands(kind, x, g)
    _check_match(kind, "batch sizes (x dim 0, g dim 0)", x.shape[0], g.shape[0])
    out = _check_window(kind, x.shape[1:3], kernel, attrs)
    _check_match(kind, f"output spatial sizes (g dims 1, 2; from kernel_spatial {list(kernel)})",
                 list(g.shape[1:3]), list(out))
    return (TensorType((*kernel, x.shape[3], g.shape[3]), x.dtype),)


# ---- factor rules and costs

# Factor names per tensor role; the spatial ones are opaque (see the module docstring).
X_DIMS = ("n", "h", "w", "c")
W_DIMS = ("kh", "kw", "c", "o")
Y_DIMS = ("n", "ho", "wo", "o")
SPATIAL = ("h", "w", "kh", "kw", "ho", "wo")


def _rule(operands: tuple, result: tuple, reduced: str):
    def factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
        return FactorRule.build(operand_types, result_types, list(operands), [result],
                                combiners={reduced: "sum"}, opaque=SPATIAL)
    return factors


def _cost(y_at: int, w_at: int):
    """2 flops per multiply-add: n*ho*wo*o outputs, each over kh*kw*c. `y_at` and
    `w_at` index the y- and w-shaped tensors among the operands, then the result."""
    def cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
        types = operand_types + result_types
        y, w = types[y_at], types[w_at]
        return OpCost(2 * y.num_elements * w.shape[0] * w.shape[1] * w.shape[2], io_bytes(operand_types, result_types))
    return cost


# ---- numpy


def _windows(x: np.ndarray, kernel: Sequence[int], out: Sequence[int], attrs: Attrs) -> np.ndarray:
    """im2col as a view: [n, ho, wo, c, kh, kw], the window of each output
    position in the zero-padded input."""
    (pt, pb), (pl, pr) = attrs["padding"]
    padded = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    view = sliding_window_view(padded, tuple(kernel), axis=(1, 2))
    sh, sw = attrs["stride"]
    return view[:, ::sh, ::sw][:, :out[0], :out[1]]


def _conv_impl(args, attrs: Attrs):
    x, w = args
    windows = _windows(x, w.shape[:2], output_spatial(x.shape[1:3], w.shape[:2], attrs), attrs)
    return (np.tensordot(windows, w, axes=([4, 5, 3], [0, 1, 2])),)


def _kernel_grad_impl(args, attrs: Attrs):
    x, g = args
    windows = _windows(x, attrs["kernel_spatial"], g.shape[1:3], attrs)
    # [c, kh, kw, o] -> [kh, kw, c, o]
    return (np.tensordot(windows, g, axes=([0, 1, 2], [0, 1, 2])).transpose(1, 2, 0, 3),)


def _input_grad_impl(args, attrs: Attrs):
    g, w = args
    (pt, pb), (pl, pr) = attrs["padding"]
    (h, wd), (sh, sw) = attrs["input_spatial"], attrs["stride"]
    n, ho, wo, _ = g.shape
    kh, kw, c, _ = w.shape
    padded = np.zeros((n, h + pt + pb, wd + pl + pr, c), np.result_type(g, w))
    # Each kernel tap (i, j) sends every output position's cotangent back to
    # the input pixel it read: a strided block of the padded input.
    for i in range(kh):
        for j in range(kw):
            padded[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += np.tensordot(g, w[i, j], ([3], [1]))
    return (padded[:, pt:pt + h, pl:pl + wd],)


# ---- VJPs


def _geometry(op) -> dict:
    return {"stride": op.attrs["stride"], "padding": op.attrs["padding"]}


def _conv_vjp(b, op, g, wanted):
    x, w = op.operands
    return (b.conv_input_grad(g, w, x.type.shape[1:3], **_geometry(op)) if wanted[0] else None,
            b.conv_kernel_grad(x, g, w.type.shape[:2], **_geometry(op)) if wanted[1] else None)


def _input_grad_vjp(b, op, u, wanted):
    """<u, conv_input_grad(g, w)> = <convolution(u, w), g>: differentiate that."""
    g, w = op.operands
    return (b.conv2d(u, w, **_geometry(op)) if wanted[0] else None,
            b.conv_kernel_grad(u, g, w.type.shape[:2], **_geometry(op)) if wanted[1] else None)


def _kernel_grad_vjp(b, op, v, wanted):
    """<v, conv_kernel_grad(x, g)> = <convolution(x, v), g>: differentiate that."""
    x, g = op.operands
    return (b.conv_input_grad(g, v, x.type.shape[1:3], **_geometry(op)) if wanted[0] else None,
            b.conv2d(x, v, **_geometry(op)) if wanted[1] else None)


register(OpDef(
    "convolution", "convolution", 2, GEOMETRY,
    _conv_infer, _rule((X_DIMS, W_DIMS), Y_DIMS, "c"), _cost(2, 1),
    impl=_conv_impl, vjp=_conv_vjp,
    doc="2-D convolution, x NHWC, w HWIO, zero padding; spatial dims opaque (not shardable), c a sum",
))

register(OpDef(
    "conv_input_grad", "convolution", 2, (*GEOMETRY, AttrSpec("input_spatial", attr_positive_pair)),
    _input_grad_infer, _rule((Y_DIMS, W_DIMS), X_DIMS, "o"), _cost(0, 1),
    impl=_input_grad_impl, vjp=_input_grad_vjp,
    doc="the convolution's transpose in x: g [n,ho,wo,o], w -> dx [n,h,w,c]; o a sum, spatial dims opaque",
))

register(OpDef(
    "conv_kernel_grad", "convolution", 2, (*GEOMETRY, AttrSpec("kernel_spatial", attr_positive_pair)),
    _kernel_grad_infer, _rule((X_DIMS, Y_DIMS), W_DIMS, "n"), _cost(1, 2),
    impl=_kernel_grad_impl, vjp=_kernel_grad_vjp,
    doc="the convolution's transpose in w: x, g [n,ho,wo,o] -> dw [kh,kw,c,o]; n a sum, spatial dims opaque",
))
