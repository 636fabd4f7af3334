"""Op cases of general convolution, reduce_window, select_and_scatter_add,
select_and_gather and reverse: merged into test_ops.CASES.

The references are loops over output elements that compute each input
coordinate from the StableHLO definitions (dilate, pad, window, groups),
written without the registry's helpers."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
from op_cases import F32, I32, Case, f64, ints, t

# ---------------------------------------------------------------- references


def source_index(q: int, tap: int, stride: int, wdil: int, low: int, ldil: int, size: int) -> int | None:
    """The input coordinate that window tap `tap` of output `q` reads, or None
    where it falls on padding or on a dilation hole."""
    u = q * stride + tap * wdil - low
    if u < 0 or u % ldil or u // ldil >= size:
        return None
    return u // ldil


def ref_conv_general(lhs_dims, rhs_dims, out_dims, out_shape, strides, padding, lhs_dil, rhs_dil, reversal,
                     groups=1, batch_groups=1) -> Callable:
    def ref(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        out = np.zeros(out_shape)
        cin, o_all = rhs.shape[rhs_dims[0]], rhs.shape[rhs_dims[1]]
        per_group = o_all // (groups * batch_groups)
        kernel = [rhs.shape[d] for d in rhs_dims[2:]]
        for r in np.ndindex(*out_shape):
            n, o, qs = r[out_dims[0]], r[out_dims[1]], [r[d] for d in out_dims[2:]]
            group = o // per_group
            batch = group * out_shape[out_dims[0]] + n if batch_groups > 1 else n
            total = 0.0
            for c, tap in itertools.product(range(cin), itertools.product(*map(range, kernel))):
                src = [source_index(q, k, s, rd, lo, ld, lhs.shape[d]) for q, k, s, rd, (lo, _), ld, d
                       in zip(qs, tap, strides, rhs_dil, padding, lhs_dil, lhs_dims[2:])]
                if None in src:
                    continue
                li = [0] * lhs.ndim
                li[lhs_dims[0]], li[lhs_dims[1]] = batch, c + (group * cin if groups > 1 else 0)
                for d, v in zip(lhs_dims[2:], src):
                    li[d] = v
                ri = [0] * rhs.ndim
                ri[rhs_dims[0]], ri[rhs_dims[1]] = c, o
                for d, k, size, rev in zip(rhs_dims[2:], tap, kernel, reversal):
                    ri[d] = size - 1 - k if rev else k
                total += lhs[tuple(li)] * rhs[tuple(ri)]
            out[r] = total
        return out
    return ref


def conv_case(name: str, lhs: tuple, rhs: tuple, out: tuple, dims: tuple, *, strides=None, padding=None,
              lhs_dil=None, rhs_dil=None, reversal=None, groups=1, batch_groups=1) -> Case:
    spatial = len(lhs) - 2
    geo = dict(strides=strides or [1] * spatial, padding=padding or [[0, 0]] * spatial,
               lhs_dil=lhs_dil or [1] * spatial, rhs_dil=rhs_dil or [1] * spatial,
               reversal=reversal or [False] * spatial)
    attrs = {"lhs_dims": dims[0], "rhs_dims": dims[1], "out_dims": dims[2], "window_strides": geo["strides"],
             "padding": geo["padding"], "lhs_dilation": geo["lhs_dil"], "rhs_dilation": geo["rhs_dil"],
             "window_reversal": geo["reversal"], "feature_group_count": groups, "batch_group_count": batch_groups}
    ref = ref_conv_general(*dims, out, geo["strides"], geo["padding"], geo["lhs_dil"], geo["rhs_dil"],
                           geo["reversal"], groups, batch_groups)
    return Case("conv_general", name, (t(*lhs), t(*rhs)), attrs, f64(ref))


NHWC = ([0, 3, 1, 2], [2, 3, 0, 1], [0, 3, 1, 2])  # jax: [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]
NCHW = ([0, 1, 2, 3], [1, 0, 2, 3], [0, 1, 2, 3])  # lhs NCHW, rhs OIHW, out NCHW
KERNEL_GRAD = ([3, 0, 1, 2], [0, 3, 1, 2], [2, 3, 0, 1])  # jax: [f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]

CONV_CASES = [
    conv_case("nhwc_pad", (2, 5, 6, 3), (3, 2, 3, 4), (2, 5, 6, 4), NHWC, padding=[[1, 1], [0, 1]]),
    conv_case("nchw_stride_asym", (2, 3, 7, 6), (4, 3, 3, 2), (2, 4, 3, 3), NCHW, strides=[2, 3],
              padding=[[0, 1], [2, 0]]),
    conv_case("dilations_reversal", (2, 4, 5, 2), (2, 3, 2, 6), (2, 7, 4, 6), NHWC, padding=[[1, 0], [2, 1]],
              lhs_dil=[2, 1], rhs_dil=[1, 2], reversal=[True, False]),
    conv_case("feature_groups", (2, 5, 4, 6), (2, 3, 3, 4), (2, 4, 2, 4), NHWC, strides=[1, 2],
              padding=[[0, 0], [1, 1]], groups=2),
    conv_case("batch_groups", (4, 5, 3, 3), (2, 2, 3, 6), (2, 4, 2, 6), NHWC, batch_groups=2),
    conv_case("kernel_grad_layout", (3, 6, 4, 2), (3, 3, 2, 5), (4, 3, 2, 5), KERNEL_GRAD),
    conv_case("1d_ncw", (2, 3, 7), (5, 3, 3), (2, 5, 4), ([0, 1, 2], [1, 0, 2], [0, 1, 2]), strides=[2],
              padding=[[1, 2]]),
    conv_case("1x1_pointwise", (2, 3, 4, 6), (1, 1, 6, 5), (2, 3, 4, 5), NHWC),
]


IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}
PICK = {"sum": lambda a, b: a + b, "max": max, "min": min}


def ref_reduce_window(combiner: str, window, strides, padding, base=None, wdil=None) -> Callable:
    def ref(x: np.ndarray) -> np.ndarray:
        rank = x.ndim
        bd, wd = base or [1] * rank, wdil or [1] * rank
        shape = [((n - 1) * b + 1 + lo + hi - ((k - 1) * w + 1)) // s + 1
                 for n, b, (lo, hi), k, w, s in zip(x.shape, bd, padding, window, wd, strides)]
        is_int = x.dtype == I32
        out = np.zeros(shape, np.float64)
        for r in np.ndindex(*shape):
            acc = IDENTITY[combiner]
            for tap in np.ndindex(*window):
                src = [source_index(q, k, s, w, lo, b, n)
                       for q, k, s, w, (lo, _), b, n in zip(r, tap, strides, wd, padding, bd, x.shape)]
                if None not in src:
                    acc = PICK[combiner](acc, float(x[tuple(src)]))
            out[r] = acc
        return out.astype(I32) if is_int else out.astype(F32)
    return ref


def rw_case(name: str, shape: tuple, combiner: str, window, strides, padding, base=None, wdil=None,
            gens=()) -> Case:
    attrs = {"window_dimensions": window, "window_strides": strides, "padding": padding, "combiner": combiner}
    if base:
        attrs["base_dilations"] = base
    if wdil:
        attrs["window_dilations"] = wdil
    dtype = "i32" if gens else "f32"
    return Case("reduce_window", name, (t(*shape, dtype=dtype),), attrs,
                ref_reduce_window(combiner, window, strides, padding, base, wdil), tuple(gens))


RW_CASES = [
    rw_case("max_pool_nhwc", (2, 6, 9, 3), "max", [1, 2, 3, 1], [1, 2, 2, 1], [[0, 0]] * 4),
    rw_case("max_padded_overlap", (2, 5, 6), "max", [1, 3, 2], [1, 1, 2], [[0, 0], [1, 1], [1, 0]]),
    rw_case("sum_avg_pool_padded", (4, 5, 7, 2), "sum", [1, 2, 2, 1], [1, 2, 2, 1], [[0, 0], [1, 0], [0, 1], [0, 0]]),
    rw_case("sum_dilations", (4, 5), "sum", [2, 3], [1, 2], [[1, 0], [0, 2]], base=[1, 2], wdil=[2, 1]),
    rw_case("max_base_dilated", (4, 5, 3), "max", [1, 3, 2], [1, 2, 1], [[0, 0], [1, 1], [0, 1]], base=[1, 2, 2]),
    rw_case("min_i32_padded", (4, 8), "min", [1, 3], [1, 2], [[0, 0], [1, 1]], gens=(ints(-5, 5),)),
]


def windows_of(x_shape, window, strides, padding):
    out = [(n + lo + hi - k) // s + 1 for n, (lo, hi), k, s in zip(x_shape, padding, window, strides)]
    return out


def selected(x: np.ndarray, r: tuple, window, strides, padding, select: str) -> tuple | None:
    """The position window r selects: the first (ge, le) or last (gt, lt) extreme in row-major window order."""
    best, at = None, None
    for tap in np.ndindex(*window):
        src = [q * s + k - lo for q, s, k, (lo, _) in zip(r, strides, tap, padding)]
        if any(v < 0 or v >= n for v, n in zip(src, x.shape)):
            continue
        v = x[tuple(src)]
        better = {"ge": best is None or v > best, "gt": best is None or v >= best,
                  "le": best is None or v < best, "lt": best is None or v <= best}[select]
        if better:
            best, at = v, tuple(src)
    return at


def ref_select_scatter(window, strides, padding, select="ge") -> Callable:
    def ref(x: np.ndarray, source: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape)
        for r in np.ndindex(*source.shape):
            at = selected(x, r, window, strides, padding, select)
            if at is not None:
                out[at] += source[r]
        return out.astype(F32)
    return ref


def ref_select_gather(window, strides, padding, select="ge") -> Callable:
    def ref(x: np.ndarray, cotangent: np.ndarray) -> np.ndarray:
        shape = windows_of(x.shape, window, strides, padding)
        out = np.zeros(shape)
        for r in np.ndindex(*shape):
            at = selected(x, r, window, strides, padding, select)
            out[r] = 0.0 if at is None else cotangent[at]
        return out.astype(F32)
    return ref


def select_case(kind: str, name: str, x: tuple, window, strides, padding, select="ge", x_dtype="f32",
                gens=()) -> Case:
    attrs = {"window_dimensions": window, "window_strides": strides, "padding": padding, "select": select}
    other = tuple(windows_of(x, window, strides, padding)) if kind == "select_and_scatter_add" else x
    ref = (ref_select_scatter if kind == "select_and_scatter_add" else ref_select_gather)(window, strides, padding,
                                                                                          select)
    return Case(kind, name, (t(*x, dtype=x_dtype), t(*other)), attrs, ref, tuple(gens))


SELECT_CASES = [
    select_case("select_and_scatter_add", "overlap_padded", (2, 6, 5), [1, 3, 2], [1, 2, 1], [[0, 0], [1, 0], [0, 1]]),
    select_case("select_and_scatter_add", "pool_nhwc", (2, 4, 6, 3), [1, 2, 2, 1], [1, 2, 2, 1], [[0, 0]] * 4),
    # Small integers tie often: ge takes the first maximum, gt the last; an i32 x is not differentiated.
    select_case("select_and_scatter_add", "ties_ge_i32", (4, 7), [2, 3], [1, 2], [[0, 1], [1, 1]],
                x_dtype="i32", gens=(ints(-1, 2),)),
    select_case("select_and_scatter_add", "ties_gt_i32", (4, 7), [2, 3], [1, 2], [[0, 1], [1, 1]], select="gt",
                x_dtype="i32", gens=(ints(-1, 2),)),
    select_case("select_and_scatter_add", "min_le", (6, 5), [2, 2], [2, 1], [[0, 0], [1, 0]], select="le"),
    select_case("select_and_gather", "pool_nhwc", (2, 4, 6, 3), [1, 2, 2, 1], [1, 2, 2, 1], [[0, 0]] * 4),
    select_case("select_and_gather", "overlap_padded", (2, 6, 5), [1, 3, 2], [1, 2, 1], [[0, 0], [1, 0], [0, 1]]),
    select_case("select_and_gather", "ties_ge_i32", (4, 7), [2, 3], [1, 2], [[0, 1], [1, 1]],
                x_dtype="i32", gens=(ints(-1, 2),)),
]


def ref_reverse(dims: Sequence[int]) -> Callable:
    def ref(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for r in np.ndindex(*x.shape):
            out[tuple(n - 1 - i if d in dims else i for d, (i, n) in enumerate(zip(r, x.shape)))] = x[r]
        return out
    return ref


REVERSE_CASES = [
    Case("reverse", "middle", (t(6, 5, 4),), {"dims": [1]}, ref_reverse([1])),
    Case("reverse", "two_dims", (t(6, 4, 5),), {"dims": [0, 2]}, ref_reverse([0, 2])),
]

CASES: list[Case] = CONV_CASES + RW_CASES + SELECT_CASES + REVERSE_CASES

# Dims holding an opaque factor, per operand and per result (test_ops.OPAQUE_DIMS):
# spatial dims and kernel windows of convolutions, windowed dims of window ops.
OPAQUE_DIMS: dict[str, tuple[list[set[int]], list[set[int]]]] = {
    **{f"conv_general-{n}": ([{1, 2}, {0, 1}], [{1, 2}])
       for n in ("nhwc_pad", "dilations_reversal", "feature_groups", "batch_groups")},
    "conv_general-nchw_stride_asym": ([{2, 3}, {2, 3}], [{2, 3}]),
    "conv_general-kernel_grad_layout": ([{1, 2}, {1, 2}], [{0, 1}]),
    "conv_general-1d_ncw": ([{2}, {2}], [{2}]),
    "conv_general-1x1_pointwise": ([set(), {0, 1}], [set()]),  # a 1x1 kernel reads spatial dims one to one
    "reduce_window-max_pool_nhwc": ([{1, 2}], [{1, 2}]),
    "reduce_window-max_padded_overlap": ([{1, 2}], [{1, 2}]),
    "reduce_window-sum_avg_pool_padded": ([{1, 2}], [{1, 2}]),
    "reduce_window-sum_dilations": ([{0, 1}], [{0, 1}]),
    "reduce_window-max_base_dilated": ([{1, 2}], [{1, 2}]),
    "reduce_window-min_i32_padded": ([{1}], [{1}]),
    "select_and_scatter_add-overlap_padded": ([{1, 2}, {1, 2}], [{1, 2}]),
    "select_and_scatter_add-pool_nhwc": ([{1, 2}, {1, 2}], [{1, 2}]),
    "select_and_scatter_add-ties_ge_i32": ([{0, 1}, {0, 1}], [{0, 1}]),
    "select_and_scatter_add-ties_gt_i32": ([{0, 1}, {0, 1}], [{0, 1}]),
    "select_and_scatter_add-min_le": ([{0, 1}, {0, 1}], [{0, 1}]),
    "select_and_gather-pool_nhwc": ([{1, 2}, {1, 2}], [{1, 2}]),
    "select_and_gather-overlap_padded": ([{1, 2}, {1, 2}], [{1, 2}]),
    "select_and_gather-ties_ge_i32": ([{0, 1}, {0, 1}], [{0, 1}]),
    "reverse-middle": ([{1}], [{1}]),
    "reverse-two_dims": ([{0, 2}], [{0, 2}]),
}
