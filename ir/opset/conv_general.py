"""conv_general: StableHLO's convolution, any layout, groups and dilations.

  conv_general(lhs, rhs) {lhs_dims, rhs_dims, out_dims, window_strides, padding,
                          lhs_dilation, rhs_dilation, window_reversal,
                          feature_group_count, batch_group_count}

Dimension numbers are index lists, role first: `lhs_dims` = (batch,
feature, spatial...), `rhs_dims` = (input feature, output feature,
spatial...), `out_dims` = (batch, feature, spatial...). jax's
`[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]` is lhs_dims [0, 3, 1, 2],
rhs_dims [2, 3, 0, 1], out_dims [0, 3, 1, 2]. The geometry lists have one
entry per spatial dim, in dimension-number order, and may be empty (strides
and dilations 1, padding 0, no reversal). Padding may be negative (it
crops): the VJPs' paddings are, when a stride leaves input rows unread.

Semantics: the lhs is dilated by `lhs_dilation` (zeros between elements)
and padded; the kernel, dilated by `rhs_dilation` and reversed along the
spatial dims `window_reversal` marks, slides every `window_strides`. With
`feature_group_count` G the lhs features and the output features split
into G groups, group g of the output reading group g of the lhs (rhs input
feature = C / G). With `batch_group_count` B the lhs batch splits into B
groups and so do the output features (rhs input feature = C, output batch
N / B); this is what a grouped convolution's kernel gradient is. One of G
and B is 1, as in StableHLO. The existing NHWC kinds (`convolution` and its
transposes) stay for the model builders; this kind is what imported
programs use.

Factor rule, from the dimension numbers: batch n parallel (lhs, out),
output feature o parallel (rhs, out), input feature c a sum shared by lhs
and rhs. Spatial dims are opaque (a spatial shard needs halo rows), except
where the kernel is 1 wide with stride 1, no padding and no lhs dilation
(a 1x1 convolution's spatial dims): there the lhs and output dims share a
parallel factor, and the kernel's size-1 dim carries an opaque unit factor.
Groups split dims as reshape does, group count major: G gives lhs feature
(g, c), rhs output feature (g, o), output feature (g, o), with g parallel
(each shard holds whole groups) and c still a sum; B gives lhs batch
(b, n), rhs output feature (b, o) and output feature (b, o), b parallel.
Sharding a group factor changes the group count on a shard, hence
`localize`.

VJPs (jax's transpose rules, with window_reversal instead of a reverse op
where it can): the input gradient is a conv_general of the cotangent by the
kernel with the reversal flipped, lhs_dilation = the strides, strides =
lhs_dilation, padding (k' - lo - 1, ...) with k' the dilated kernel; with
groups the kernel's group factor moves from its output to its input feature
(reshape, transpose, reshape), and batch groups move back from the result's
feature to its batch. The kernel gradient is a conv_general of the lhs by
the cotangent with batch and feature roles swapped (the batch is
contracted), strides = rhs_dilation, rhs_dilation = the strides, feature
and batch group counts exchanged, and the result reversed back where the
forward reversed the kernel. Both are bilinear, so second derivatives come
from the same rules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ir.core import Attrs, Mesh, TensorType
from ir.opdef import AttrSpec, FactorRule, OpCost, OpDef, Types, attr_int, attr_ints, io_bytes, register, require
from ir.opset.windows import (
    attr_bools,
    attr_pairs,
    attr_positive_ints,
    dilate_pad,
    dilated,
    spelled,
    strided,
    window_count,
)

GEOMETRY_KEYS = ("window_strides", "padding", "lhs_dilation", "rhs_dilation", "window_reversal")
DEFAULTS = {"window_strides": 1, "padding": (0, 0), "lhs_dilation": 1, "rhs_dilation": 1, "window_reversal": False}


def attr_group_count(v) -> int:
    count = attr_int(v)
    if count < 1:
        raise ValueError(f"expected a positive count, got {v!r}")
    return count


ATTRS = (
    AttrSpec("lhs_dims", attr_ints), AttrSpec("rhs_dims", attr_ints), AttrSpec("out_dims", attr_ints),
    AttrSpec("window_strides", attr_positive_ints, ()), AttrSpec("padding", attr_pairs, ()),
    AttrSpec("lhs_dilation", attr_positive_ints, ()), AttrSpec("rhs_dilation", attr_positive_ints, ()),
    AttrSpec("window_reversal", attr_bools, ()),
    AttrSpec("feature_group_count", attr_group_count, 1), AttrSpec("batch_group_count", attr_group_count, 1),
)


def geometry(attrs: Attrs, spatial: int) -> dict[str, tuple]:
    """Each geometry attribute spelled out, one entry per spatial dim."""
    out = {k: spelled(attrs, k, spatial, DEFAULTS[k]) for k in GEOMETRY_KEYS}
    for k, values in out.items():
        require(len(values) == spatial, f"conv_general: {k} needs {spatial} entries, got {len(values)}")
    return out


# ---------------------------------------------------------------- shape rule


def _check_dims(a: TensorType, b: TensorType, attrs: Attrs) -> None:
    require(a.rank == b.rank and a.rank >= 2, f"conv_general: operands need one rank >= 2, got {a}, {b}")
    require(a.dtype == b.dtype and a.dtype != "bool", f"conv_general: operands need one numeric dtype: {a}, {b}")
    for key in ("lhs_dims", "rhs_dims", "out_dims"):
        require(sorted(attrs[key]) == list(range(a.rank)),
                f"conv_general: {key} {list(attrs[key])} is not a permutation of 0..{a.rank - 1}")


def _infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    lhs, rhs = types
    _check_dims(lhs, rhs, attrs)
    ld, rd, od = attrs["lhs_dims"], attrs["rhs_dims"], attrs["out_dims"]
    g, bg = attrs["feature_group_count"], attrs["batch_group_count"]
    n, c = lhs.shape[ld[0]], lhs.shape[ld[1]]
    i, o = rhs.shape[rd[0]], rhs.shape[rd[1]]
    require(g == 1 or bg == 1, "conv_general: feature_group_count and batch_group_count cannot both exceed 1")
    require(c == i * g, f"conv_general: lhs features {c} != rhs input features {i} x feature_group_count {g}")
    require(o % (g * bg) == 0, f"conv_general: rhs output features {o} not divisible by the group count {g * bg}")
    require(n % bg == 0, f"conv_general: lhs batch {n} not divisible by batch_group_count {bg}")
    geo = geometry(attrs, lhs.rank - 2)
    shape = [0] * lhs.rank
    shape[od[0]], shape[od[1]] = n // bg, o
    for k, (a, w, s, (lo, hi), dl, dr) in enumerate(zip(ld[2:], rd[2:], *(geo[key] for key in GEOMETRY_KEYS[:4]))):
        shape[od[2 + k]] = window_count(max(0, dilated(lhs.shape[a], dl) + lo + hi), dilated(rhs.shape[w], dr), s)
    return (TensorType(tuple(shape), lhs.dtype),)


# ---------------------------------------------------------------- factor rule, cost, localize


def pointwise_spatial(attrs: Attrs, rhs: TensorType) -> list[bool]:
    """Spatial dims that a 1-wide kernel reads one to one: parallel, not opaque."""
    geo = geometry(attrs, rhs.rank - 2)
    return [rhs.shape[w] == 1 and geo["window_strides"][k] == geo["lhs_dilation"][k] == 1
            and geo["padding"][k] == (0, 0) for k, w in enumerate(attrs["rhs_dims"][2:])]


def _factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    lhs, rhs = operand_types
    g, bg = attrs["feature_group_count"], attrs["batch_group_count"]
    lhs_roles: list = ["n", "c"] if g == 1 else ["n", ("g", "c")]
    rhs_roles: list = ["c", "o"] if g == 1 else ["c", ("g", "o")]
    out_roles: list = ["n", "o"] if g == 1 else ["n", ("g", "o")]
    if bg > 1:
        lhs_roles[0], rhs_roles[1], out_roles[1] = ("b", "n"), ("b", "o"), ("b", "o")
    opaque = []
    for k, pointwise in enumerate(pointwise_spatial(attrs, rhs)):
        shared = f"s{k}" if pointwise else f"h{k}"
        lhs_roles.append(shared)
        rhs_roles.append(f"k{k}")
        out_roles.append(shared if pointwise else f"q{k}")
        opaque += [f"k{k}"] + ([] if pointwise else [f"h{k}", f"q{k}"])
    sizes = {"g": g, "b": bg, "c": rhs.shape[attrs["rhs_dims"][0]],
             "o": rhs.shape[attrs["rhs_dims"][1]] // (g * bg), "n": result_types[0].shape[attrs["out_dims"][0]]}

    def laid_out(roles: list, dims: Sequence[int]) -> list:
        layout = [None] * len(dims)
        for role, d in zip(roles, dims):
            layout[d] = role
        return layout

    return FactorRule.build(operand_types, result_types,
                            [laid_out(lhs_roles, attrs["lhs_dims"]), laid_out(rhs_roles, attrs["rhs_dims"])],
                            [laid_out(out_roles, attrs["out_dims"])],
                            combiners={"c": "sum"}, opaque=opaque, sizes=sizes)


def _cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # 2 flops per multiply-add: every output element over the input features of its group and the kernel taps.
    rhs = operand_types[1]
    taps = math.prod(rhs.shape[d] for d in attrs["rhs_dims"][2:])
    return OpCost(2 * result_types[0].num_elements * rhs.shape[attrs["rhs_dims"][0]] * taps,
                  io_bytes(operand_types, result_types))


def _localize(attrs: Attrs, local_operands: Types, local_results: Types) -> Attrs:
    """A shard holds whole groups: the group counts are the local group factors."""
    lhs, rhs = local_operands
    ld = attrs["lhs_dims"]
    return attrs.replace(
        feature_group_count=lhs.shape[ld[1]] // rhs.shape[attrs["rhs_dims"][0]],
        batch_group_count=lhs.shape[ld[0]] // local_results[0].shape[attrs["out_dims"][0]])


# ---------------------------------------------------------------- numpy


def _impl(args, attrs: Attrs):
    lhs, rhs = args
    spatial = lhs.ndim - 2
    geo = geometry(attrs, spatial)
    g, bg = attrs["feature_group_count"], attrs["batch_group_count"]
    x = np.moveaxis(lhs, attrs["lhs_dims"], range(lhs.ndim))  # [n, c, spatial...]
    w = np.moveaxis(rhs, attrs["rhs_dims"], range(rhs.ndim))  # [i, o, kernel...]
    w = np.flip(w, tuple(2 + k for k, r in enumerate(geo["window_reversal"]) if r))
    x = dilate_pad(x, range(2, x.ndim), geo["lhs_dilation"], geo["padding"], 0)
    kernel = w.shape[2:]
    out = [window_count(n, dilated(k, d), s)
           for n, k, d, s in zip(x.shape[2:], kernel, geo["rhs_dilation"], geo["window_strides"])]
    (n, c), (i, o) = x.shape[:2], w.shape[:2]
    groups = g * bg
    acc = np.zeros((n // bg, groups, o // groups, *out), np.result_type(lhs, rhs))
    # Batch groups split the batch (b major), feature groups the features (g major).
    xg = x.reshape(bg, n // bg, c, *x.shape[2:]) if bg > 1 else x.reshape(n, g, c // g, *x.shape[2:])
    spec = "bnc...,cbo->nbo..." if bg > 1 else "ngc...,cgo->ngo..."
    for tap in itertools.product(*(range(k) for k in kernel)):
        where = tuple(strided(t * d, q, s) for t, d, q, s in zip(tap, geo["rhs_dilation"], out, geo["window_strides"]))
        patch = xg[(slice(None),) * 3 + where]
        acc += np.einsum(spec, patch, w[(slice(None), slice(None)) + tap].reshape(i, groups, o // groups))
    result = acc.reshape(n // bg, o, *out)
    return (np.moveaxis(result, range(result.ndim), attrs["out_dims"]),)


# ---------------------------------------------------------------- VJPs


def move_group(b, x, src: int, dst: int, groups: int):
    """x with the major `groups` factor of dim src moved to be the major factor of dim dst."""
    shape = list(x.type.shape)
    split = b.reshape(x, shape[:src] + [groups, shape[src] // groups] + shape[src + 1:])
    # In `split` the group axis is src; dim d of x is d (d < src) or d + 1.
    axes = [a for a in range(len(shape) + 1) if a != src]
    axes.insert(axes.index(dst if dst < src else dst + 1), src)
    shape[src] //= groups
    shape[dst] *= groups
    return b.reshape(b.transpose(split, axes), shape)


def _input_grad(b, op, g_out):
    """d lhs: the cotangent convolved with the kernel, reversal flipped, lhs_dilation <-> strides."""
    lhs, rhs = op.operands
    a = op.attrs
    geo = geometry(a, lhs.type.rank - 2)
    fg, bg = a["feature_group_count"], a["batch_group_count"]
    ld, rd, od = a["lhs_dims"], a["rhs_dims"], a["out_dims"]
    kernel = move_group(b, rhs, rd[1], rd[0], fg * bg) if fg * bg > 1 else rhs
    padding = []
    for k in range(lhs.type.rank - 2):
        k_eff = dilated(rhs.type.shape[rd[2 + k]], geo["rhs_dilation"][k])
        before = k_eff - geo["padding"][k][0] - 1
        after = (dilated(lhs.type.shape[ld[2 + k]], geo["lhs_dilation"][k]) + k_eff - 1
                 - dilated(g_out.type.shape[od[2 + k]], geo["window_strides"][k]) - before)
        padding.append([before, after])
    dx = b.op("conv_general", [g_out, kernel], lhs_dims=list(od), rhs_dims=[rd[1], rd[0], *rd[2:]],
              out_dims=list(ld), window_strides=list(geo["lhs_dilation"]), padding=padding,
              lhs_dilation=list(geo["window_strides"]), rhs_dilation=list(geo["rhs_dilation"]),
              window_reversal=[not r for r in geo["window_reversal"]], feature_group_count=fg * bg)
    return move_group(b, dx, ld[1], ld[0], bg) if bg > 1 else dx


def _kernel_grad(b, op, g_out):
    """d rhs: the lhs convolved with the cotangent, batch contracted, strides <-> rhs_dilation."""
    lhs, rhs = op.operands
    a = op.attrs
    geo = geometry(a, lhs.type.rank - 2)
    ld, rd, od = a["lhs_dims"], a["rhs_dims"], a["out_dims"]
    padding = []
    for k in range(lhs.type.rank - 2):
        lo = geo["padding"][k][0]
        padding.append([lo, dilated(g_out.type.shape[od[2 + k]], geo["window_strides"][k])
                        - dilated(lhs.type.shape[ld[2 + k]], geo["lhs_dilation"][k])
                        + dilated(rhs.type.shape[rd[2 + k]], geo["rhs_dilation"][k]) - lo - 1])
    dw = b.op("conv_general", [lhs, g_out], lhs_dims=[ld[1], ld[0], *ld[2:]], rhs_dims=[od[0], od[1], *od[2:]],
              out_dims=list(rd), window_strides=list(geo["rhs_dilation"]), padding=padding,
              lhs_dilation=list(geo["lhs_dilation"]), rhs_dilation=list(geo["window_strides"]),
              feature_group_count=a["batch_group_count"], batch_group_count=a["feature_group_count"])
    reversed_dims = [rd[2 + k] for k, r in enumerate(geo["window_reversal"]) if r]
    return b.op("reverse", [dw], dims=reversed_dims) if reversed_dims else dw


def _vjp(b, op, g, wanted):
    return (_input_grad(b, op, g) if wanted[0] else None, _kernel_grad(b, op, g) if wanted[1] else None)


register(OpDef(
    "conv_general", "convolution", 2, ATTRS,
    _infer, _factors, _cost, impl=_impl, localize=_localize, vjp=_vjp,
    doc="StableHLO convolution: dimension numbers, strides, padding, dilations, reversal, feature/batch groups; "
        "batch and output features parallel, input features a sum, spatial dims opaque",
))
