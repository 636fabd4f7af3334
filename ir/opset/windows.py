"""Window ops: reduce_window (pooling), its max/min transposes, and reverse.

  reduce_window(x)              {window_dimensions, window_strides, padding,
                                 base_dilations, window_dilations, combiner}
  select_and_scatter_add(x, s)  {window_dimensions, window_strides, padding, select}
  select_and_gather(x, c)       {window_dimensions, window_strides, padding, select}
  reverse(x)                    {dims}

Semantics are StableHLO's. `reduce_window` dilates x by `base_dilations`
(holes between elements), pads it by `padding` (low, high per dim; negative
crops), and combines each window (dilated by `window_dilations`) placed
every `window_strides`. Holes and padding hold the combiner's identity, so
the op needs no init operand: the importer adds a non-identity init
afterwards, as it does for `reduce`.

`select_and_scatter_add` is XLA's select_and_scatter with an add scatter
and a zero init (max pooling's gradient): each window of the padded x
selects one position, the first where `select(current, candidate)` keeps
winning (`ge`: the first maximum, as XLA's GE; `gt`: the last), and the
window's element of `s` is added there; padding is never selected.
`select_and_gather` is its transpose: each window reads `c` at the position
it selects. It exists because the transpose of a scatter is a gather, and
no other kind says "read at each window's argmax": without it
select_and_scatter_add would have no VJP, so neither would a max pool's
second derivative. x only decides positions; it may be of any numeric
dtype (an i32 x makes ties testable without differentiating through them).

Factor rules: a dim whose window is 1, stride 1, with no padding and no
dilation is untouched (each slice along it is computed alone): parallel.
Every other dim is opaque: a window crosses block boundaries, so a shard
would need its neighbours' halo. `reverse`'s reversed dims are opaque
(block k of the result is block n-1-k of x), the others parallel. No
attribute spells out a shape, so no kind needs a `localize`.

VJPs: sum -> the cotangent spread back over each window, one reduce_window
sum over the cotangent dilated by the strides (jax's transpose rule; the
padding is the convolution input gradient's, negative allowed). max/min ->
select_and_scatter_add with `ge`/`le` (the first extremum of each window
gets it, as in jax), on x with its base-dilation holes spelled out; with
window dilation that is NotImplementedError (jax has no such VJP either). The two select kinds are
each other's transpose and constant in x (zero cotangent).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ir.core import Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_choice,
    attr_ints,
    check_dim,
    io_bytes,
    register,
    require,
)
from ir.opset.layout import untouched_dims_rule
from ir.opset.reduction import identity

# ---------------------------------------------------------------- shared geometry


def attr_positive_ints(v: Any) -> tuple[int, ...]:
    ints = attr_ints(v)
    if any(x < 1 for x in ints):
        raise ValueError(f"expected positive ints, got {v!r}")
    return ints


def attr_pairs(v: Any) -> tuple[tuple[int, int], ...]:
    """[[low, high], ...]: one pair per dim, any sign (negative crops)."""
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected [[low, high], ...], got {v!r}")
    pairs = tuple(attr_ints(p) for p in v)
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"expected [[low, high], ...], got {v!r}")
    return pairs


def attr_bools(v: Any) -> tuple[bool, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, bool) for x in v):
        raise ValueError(f"expected a list of true/false, got {v!r}")
    return tuple(v)


def spelled(attrs: Attrs, key: str, n: int, default: Any) -> tuple:
    """An optional per-dim attribute: empty means `default` for every dim."""
    return tuple(attrs[key]) or (default,) * n


def dilated(size: int, dilation: int) -> int:
    return 0 if size == 0 else (size - 1) * dilation + 1


def window_count(size: int, window: int, stride: int) -> int:
    """Positions of a window (already dilated) in a padded, dilated extent."""
    return 0 if size < window else (size - window) // stride + 1


def strided(start: int, count: int, step: int) -> slice:
    return slice(start, start + (count - 1) * step + 1 if count else start, step)


def _placement(n: int, dilation: int, low: int, total: int) -> tuple[slice, slice]:
    """(source slice, target slice) of n elements placed at low + i * dilation
    in an extent of `total`, the ones falling outside dropped."""
    first = max(0, -(low // dilation)) if low < 0 else 0
    last = min(n - 1, (total - 1 - low) // dilation) if total - 1 - low >= 0 else -1
    count = max(0, last - first + 1)
    return slice(first, first + count), strided(low + first * dilation, count, dilation)


def dilate_pad(x: np.ndarray, axes: Sequence[int], dilation: Sequence[int], padding: Sequence[Sequence[int]],
               fill: Any) -> np.ndarray:
    """x with holes of `dilation - 1` between elements and `padding` (low,
    high; negative crops) along `axes`, the new positions holding `fill`."""
    shape, src, dst = list(x.shape), [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for a, d, (lo, hi) in zip(axes, dilation, padding):
        shape[a] = max(0, dilated(x.shape[a], d) + lo + hi)
        src[a], dst[a] = _placement(x.shape[a], d, lo, shape[a])
    out = np.full(shape, fill, x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return out


def undo_pad(padded: np.ndarray, shape: Sequence[int], padding: Sequence[Sequence[int]]) -> np.ndarray:
    """The inverse of an undilated dilate_pad: the original positions, zeros where padding cropped."""
    out = np.zeros(shape, padded.dtype)
    places = [_placement(n, 1, lo, p) for n, (lo, _), p in zip(shape, padding, padded.shape)]
    out[tuple(s for s, _ in places)] = padded[tuple(d for _, d in places)]
    return out


# ---------------------------------------------------------------- window attributes

WINDOW = (
    AttrSpec("window_dimensions", attr_positive_ints),
    AttrSpec("window_strides", attr_positive_ints, ()),
    AttrSpec("padding", attr_pairs, ()),
)
DILATIONS = (AttrSpec("base_dilations", attr_positive_ints, ()), AttrSpec("window_dilations", attr_positive_ints, ()))


def geometry(kind: str, attrs: Attrs, rank: int) -> tuple[tuple, ...]:
    """(window, strides, padding, base dilations, window dilations), each one entry per dim."""
    window = attrs["window_dimensions"]
    require(len(window) == rank, f"{kind}: window_dimensions {list(window)} need {rank} entries")
    # The select kinds have no dilations (nor does XLA's select_and_scatter).
    out = (window, spelled(attrs, "window_strides", rank, 1), spelled(attrs, "padding", rank, (0, 0)),
           spelled(attrs, "base_dilations", rank, 1) if "base_dilations" in attrs else (1,) * rank,
           spelled(attrs, "window_dilations", rank, 1) if "window_dilations" in attrs else (1,) * rank)
    for name, values in zip(("window_strides", "padding", "base_dilations", "window_dilations"), out[1:]):
        require(len(values) == rank, f"{kind}: {name} needs {rank} entries, got {len(values)}")
    return out


def windowed_shape(kind: str, shape: Sequence[int], attrs: Attrs) -> tuple[int, ...]:
    window, strides, padding, base, wdil = geometry(kind, attrs, len(shape))
    return tuple(window_count(max(0, dilated(n, b) + lo + hi), dilated(k, w), s)
                 for n, k, s, (lo, hi), b, w in zip(shape, window, strides, padding, base, wdil))


def untouched(attrs: Attrs, rank: int) -> list[bool]:
    """Dims a window op leaves alone: window 1, stride 1, no padding, no dilation."""
    window, strides, padding, base, wdil = geometry("window", attrs, rank)
    return [window[d] == strides[d] == base[d] == wdil[d] == 1 and padding[d] == (0, 0) for d in range(rank)]


def taps(window: Sequence[int]) -> itertools.product:
    return itertools.product(*(range(k) for k in window))


def tap_slices(tap: Sequence[int], out: Sequence[int], strides: Sequence[int],
               wdil: Sequence[int]) -> tuple[slice, ...]:
    """Where window tap `tap` of every output position lies in the padded input."""
    return tuple(strided(t * w, q, s) for t, q, s, w in zip(tap, out, strides, wdil))


# ---------------------------------------------------------------- reduce_window

COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _rw_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    require(x.dtype != "bool" or attrs["combiner"] != "sum", f"reduce_window: cannot sum a bool tensor {x}")
    return (TensorType(windowed_shape("reduce_window", x.shape, attrs), x.dtype),)


def _rw_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    return untouched_dims_rule(operand_types, result_types, untouched(attrs, operand_types[0].rank))


def _rw_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # One combine per window element of each output.
    return OpCost(result_types[0].num_elements * math.prod(attrs["window_dimensions"]),
                  io_bytes(operand_types, result_types))


def _rw_impl(args, attrs: Attrs):
    (x,) = args
    window, strides, padding, base, wdil = geometry("reduce_window", attrs, x.ndim)
    fill = identity(attrs["combiner"], x.dtype)
    padded = dilate_pad(x, range(x.ndim), base, padding, fill)
    out = windowed_shape("reduce_window", x.shape, attrs)
    acc = np.full(out, fill, x.dtype)
    for tap in taps(window):
        acc = COMBINE[attrs["combiner"]](acc, padded[tap_slices(tap, out, strides, wdil)])
    return (acc,)


def _rw_vjp(b, op, g, wanted):
    x = op.operands[0]
    rank = x.type.rank
    window, strides, padding, base, wdil = geometry("reduce_window", op.attrs, rank)
    if op.attrs["combiner"] != "sum":
        return (_extremum_vjp(b, op, g, base, wdil),)
    # x[i] gets g of every window reading it: a sum over windows of g dilated by the
    # strides, padded as the convolution's input gradient is (the window is all ones, so
    # reversing it changes nothing).
    spread = []
    for n, k, s, (lo, _), bd, wd, q in zip(x.type.shape, window, strides, padding, base, wdil, g.type.shape):
        before = dilated(k, wd) - lo - 1
        spread.append((before, dilated(n, bd) + dilated(k, wd) - 1 - dilated(q, s) - before))
    return (b.op("reduce_window", [g], window_dimensions=list(window), window_strides=list(base),
                 padding=[list(p) for p in spread], base_dilations=list(strides), window_dilations=list(wdil),
                 combiner="sum"),)


def _extremum_vjp(b, op, g, base: tuple, wdil: tuple):
    """max/min: the cotangent to each window's first extremum. Base dilation is
    spelled out (holes holding the identity, which no window prefers to a real
    element) and sliced away after; window dilation has no select_and_scatter form."""
    x, a = op.operands[0], op.attrs
    if any(d != 1 for d in wdil):
        raise NotImplementedError("reduce_window max/min: no VJP with window dilation "
                                  "(select_and_scatter has no window dilation; jax has no such VJP either)")
    holes = [d - 1 for d in base]
    zeros = [0] * x.type.rank
    spread = x
    if any(holes):
        padded = b.pad(x, zeros, zeros, holes)
        fill = b.full(padded.type.shape, -math.inf if a["combiner"] == "max" else math.inf, x.type.dtype)
        inside = b.pad(b.full(x.type.shape, True, "bool"), zeros, zeros, holes)
        spread = b.select(inside, padded, fill)
    dx = b.op("select_and_scatter_add", [spread, g], window_dimensions=list(a["window_dimensions"]),
              window_strides=list(a["window_strides"]), padding=[list(p) for p in a["padding"]],
              select="ge" if a["combiner"] == "max" else "le")
    return b.slice(dx, zeros, dx.type.shape, base) if any(holes) else dx


register(OpDef(
    "reduce_window", "windows", 1, (*WINDOW, *DILATIONS, AttrSpec("combiner", attr_choice(*COMBINE), "sum")),
    _rw_infer, _rw_factors, _rw_cost, impl=_rw_impl, vjp=_rw_vjp,
    doc="combine each window (pooling); holes and padding hold the combiner's identity; windowed dims opaque",
))


# ---------------------------------------------------------------- select_and_scatter_add, select_and_gather

KEEPS = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}
SELECT = AttrSpec("select", attr_choice(*KEEPS), "ge")


def _select_check(kind: str, x: TensorType, y: TensorType, y_windows: bool, attrs: Attrs) -> tuple[int, ...]:
    """The windows' shape; `y` is shaped like them (y_windows) or like x."""
    require(x.dtype != "bool" and y.dtype != "bool", f"{kind}: expects numeric tensors, got {x}, {y}")
    out = windowed_shape(kind, x.shape, attrs)
    want = out if y_windows else x.shape
    require(y.shape == want, f"{kind}: operand 1 must have shape {list(want)}, got {y}")
    return out


def _scatter_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, source = types
    _select_check("select_and_scatter_add", x, source, True, attrs)
    return (TensorType(x.shape, source.dtype),)


def _gather_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, cotangent = types
    out = _select_check("select_and_gather", x, cotangent, False, attrs)
    return (TensorType(out, cotangent.dtype),)


def _select_factors(windows_at: int):
    """x's dims and the x-shaped tensor's share factors; the window-shaped one
    (operand 1 or the result: `windows_at`) has its own on windowed dims."""
    def factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
        keep = untouched(attrs, operand_types[0].rank)
        x_dims = [f"d{d}" if k else f"i{d}" for d, k in enumerate(keep)]
        w_dims = [f"d{d}" if k else f"o{d}" for d, k in enumerate(keep)]
        tensors = [x_dims, x_dims, x_dims]
        tensors[windows_at] = w_dims
        opaque = [n for n in x_dims + w_dims if not n.startswith("d")]
        return FactorRule.build(operand_types, result_types, tensors[:2], tensors[2:], opaque=opaque)
    return factors


def _select_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # A compare per window element (the add or read per window is noise).
    windows = math.prod(windowed_shape("select", operand_types[0].shape, attrs))
    return OpCost(windows * math.prod(attrs["window_dimensions"]), io_bytes(operand_types, result_types))


def selection(x: np.ndarray, attrs: Attrs) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """(has a selection, its coordinates in the padded x) of every window."""
    window, strides, padding, _, _ = geometry("select", attrs, x.ndim)
    out = windowed_shape("select", x.shape, attrs)
    padded = dilate_pad(x, range(x.ndim), (1,) * x.ndim, padding, 0)
    real = dilate_pad(np.ones(x.shape, bool), range(x.ndim), (1,) * x.ndim, padding, False)
    best, pos, have = np.zeros(out, x.dtype), np.zeros(out, np.int64), np.zeros(out, bool)
    keeps = KEEPS[attrs["select"]]
    for t, tap in enumerate(taps(window)):
        where = tap_slices(tap, out, strides, (1,) * x.ndim)
        candidate, valid = padded[where], real[where]
        take = valid & (~have | ~keeps(best, candidate))
        best, pos, have = np.where(take, candidate, best), np.where(take, t, pos), have | valid
    offsets = np.unravel_index(pos, window) if window else ()
    grid = np.indices(out, sparse=True) if out else ()
    return have, tuple(q * s + o for q, s, o in zip(grid, strides, offsets))


def _scatter_impl(args, attrs: Attrs):
    x, source = args
    have, at = selection(x, attrs)
    padding = geometry("select_and_scatter_add", attrs, x.ndim)[2]
    padded = np.zeros(dilate_pad(x, range(x.ndim), (1,) * x.ndim, padding, 0).shape, source.dtype)
    np.add.at(padded, tuple(np.broadcast_to(c, have.shape)[have] for c in at), source[have])
    return (undo_pad(padded, x.shape, padding),)


def _gather_impl(args, attrs: Attrs):
    x, cotangent = args
    have, at = selection(x, attrs)
    padding = geometry("select_and_gather", attrs, x.ndim)[2]
    padded = dilate_pad(cotangent, range(x.ndim), (1,) * x.ndim, padding, 0)
    picked = padded[tuple(np.broadcast_to(c, have.shape) for c in at)] if x.ndim else padded
    return (np.where(have, picked, np.zeros((), cotangent.dtype)),)


def _select_attrs(op) -> dict:
    return {k: op.attrs[k] for k in ("window_dimensions", "window_strides", "padding", "select")}


def _select_vjp(transpose: str):
    """Constant in x (zero cotangent); linear in operand 1, whose transpose is `transpose`."""
    def vjp(b, op, g, wanted):
        x, y = op.operands
        return (b.zeros(x.type.shape, x.type.dtype) if wanted[0] else None,
                b.op(transpose, [x, g], **_select_attrs(op)) if wanted[1] else None)
    return vjp


register(OpDef(
    "select_and_scatter_add", "windows", 2, (*WINDOW, SELECT),
    _scatter_infer, _select_factors(1), _select_cost, impl=_scatter_impl,
    vjp=_select_vjp("select_and_gather"),
    doc="add each window's source element at the window's selected (max for ge) position of x; zeros elsewhere",
))

register(OpDef(
    "select_and_gather", "windows", 2, (*WINDOW, SELECT),
    _gather_infer, _select_factors(2), _select_cost, impl=_gather_impl,
    vjp=_select_vjp("select_and_scatter_add"),
    doc="read the x-shaped operand at each window's selected position of x (select_and_scatter_add's transpose)",
))


# ---------------------------------------------------------------- reverse


def _reverse_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    for d in attrs["dims"]:
        check_dim("reverse", d, x.rank)
    require(len(set(attrs["dims"])) == len(attrs["dims"]), f"reverse: dimension listed twice in {list(attrs['dims'])}")
    return (x,)


register(OpDef(
    "reverse", "windows", 1, (AttrSpec("dims", attr_ints),),
    _reverse_infer,
    lambda operand_types, result_types, attrs: untouched_dims_rule(
        operand_types, result_types, [d not in attrs["dims"] for d in range(operand_types[0].rank)]),
    lambda operand_types, result_types, attrs: OpCost(0, io_bytes(operand_types, result_types)),
    impl=lambda args, attrs: (np.flip(args[0], tuple(attrs["dims"])).copy(),),
    vjp=lambda b, op, g, wanted: (b.op("reverse", [g], dims=list(op.attrs["dims"])),),
    doc="reverse the order of elements along `dims`; reversed dims opaque",
))
