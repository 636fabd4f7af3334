"""Op cases of the sorting family (sort, argsort): merged into
test_ops.CASES. The references compare elements one pair at a time, as a
comparator does, rather than calling numpy's sort: ties (the integer
cases draw from a few values) must keep their positions, NaN and -0.0
follow jax's total order (-0.0 before 0.0 only with `zeros: ordered`)."""

from __future__ import annotations

import functools

import numpy as np
from op_cases import F32, I32, Case, ints, t


def _before(a, b, descending: bool, zeros: bool) -> bool:
    """Whether a is strictly before b: NaN is the largest float; -0.0 == 0.0,
    or -0.0 < 0.0 with `zeros` (ordered)."""
    if descending:
        a, b = b, a
    if np.isnan(a) or np.isnan(b):
        return not np.isnan(a)
    if zeros and a == b == 0:
        return bool(np.signbit(a)) and not np.signbit(b)
    return a < b


def _order(row: np.ndarray, descending: bool, zeros: bool) -> list[int]:
    # Python's sort is stable; a comparator that says "not before" for equal values keeps positions.
    def compare(i: int, j: int) -> int:
        return (-1 if _before(row[i], row[j], descending, zeros) else
                1 if _before(row[j], row[i], descending, zeros) else 0)
    return sorted(range(len(row)), key=functools.cmp_to_key(compare))


def ref_argsort(dim: int, descending: bool = False, dtype=I32, zeros: bool = False):
    def ref(x):
        moved = np.moveaxis(x, dim, -1)
        out = np.empty(moved.shape, dtype)
        for index in np.ndindex(moved.shape[:-1]):
            out[index] = _order(moved[index].astype(np.float64), descending, zeros)
        return np.moveaxis(out, -1, dim)
    return ref


def ref_sort(dim: int, descending: bool = False, zeros: bool = False):
    def ref(x):
        return np.take_along_axis(x, ref_argsort(dim, descending, zeros=zeros)(x).astype(np.int64), axis=dim)
    return ref


def with_nan_and_zeros(rng: np.random.Generator, ty) -> np.ndarray:
    """Floats with NaNs, -0.0 and 0.0 (equal under the order) and repeats."""
    x = rng.integers(-3, 3, ty.shape).astype(F32)
    x[rng.random(ty.shape) < 0.15] = np.nan
    x[(x == 0) & (rng.random(ty.shape) < 0.5)] = -0.0
    return x


CASES = [
    Case("sort", "rows", (t(6, 7),), {"dim": 1}, ref_sort(1)),
    Case("sort", "descending", (t(6, 5, 4),), {"dim": 0, "order": "descending"}, ref_sort(0, True)),
    Case("sort", "ints-ties", (t(4, 9, dtype="i32"),), {"dim": 1, "order": "descending"}, ref_sort(1, True),
         (ints(0, 3),)),
    Case("sort", "nan-and-zeros", (t(5, 8),), {"dim": 1}, ref_sort(1), (with_nan_and_zeros,)),
    Case("argsort", "rows", (t(6, 7),), {"dim": 1}, ref_argsort(1)),
    Case("argsort", "descending-ties", (t(4, 6, 5, dtype="i32"),), {"dim": 1, "order": "descending"},
         ref_argsort(1, True), (ints(0, 3),)),
    Case("argsort", "nan-and-zeros", (t(8, 5),), {"dim": 0, "order": "descending"}, ref_argsort(0, True),
         (with_nan_and_zeros,)),
    Case("sort", "zeros-ordered", (t(5, 8),), {"dim": 1, "order": "descending", "zeros": "ordered"},
         ref_sort(1, True, zeros=True), (with_nan_and_zeros,)),
    Case("argsort", "zeros-ordered", (t(6, 7),), {"dim": 0, "zeros": "ordered"},
         ref_argsort(0, zeros=True), (with_nan_and_zeros,)),
    Case("argsort", "i64-ascending-ties", (t(3, 10, dtype="i32"),), {"dim": 1, "dtype": "i64"},
         ref_argsort(1, False, np.int64), (ints(0, 2),)),
]

# Dims holding an opaque factor, per operand and per result (see test_ops.OPAQUE_DIMS): the sorted one.
OPAQUE_DIMS = {
    "sort-rows": ([{1}], [{1}]),
    "sort-descending": ([{0}], [{0}]),
    "sort-ints-ties": ([{1}], [{1}]),
    "sort-nan-and-zeros": ([{1}], [{1}]),
    "argsort-rows": ([{1}], [{1}]),
    "argsort-descending-ties": ([{1}], [{1}]),
    "argsort-nan-and-zeros": ([{0}], [{0}]),
    "argsort-i64-ascending-ties": ([{1}], [{1}]),
    "sort-zeros-ordered": ([{1}], [{1}]),
    "argsort-zeros-ordered": ([{0}], [{0}]),
}
