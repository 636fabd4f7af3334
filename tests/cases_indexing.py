"""Op cases of the indexing family (general gather and scatter, dynamic
slices, argmax): merged into test_ops.CASES. References loop over output
(or update) elements, following the StableHLO spec's index arithmetic."""

from __future__ import annotations

import itertools

import numpy as np
from op_cases import I32, Case, ints, t


def scalar(value: int):
    return lambda rng, ty: np.array(value, I32)


def ref_take_along_last(x, idx):
    """y[i, j, 0] = x[i, j, clamp(idx[i, j, 0, 0])]: the batched gather of take_along_axis."""
    y = np.empty(x.shape[:2] + (1,), x.dtype)
    for i, j in itertools.product(range(x.shape[0]), range(x.shape[1])):
        y[i, j, 0] = x[i, j, min(max(idx[i, j, 0, 0], 0), x.shape[2] - 1)]
    return y


def ref_rows(x, idx):
    """Rows of a table at [..., 1] indices, clamped."""
    y = np.empty(idx.shape[:-1] + x.shape[1:], x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        y[pos] = x[min(max(idx[pos][0], 0), x.shape[0] - 1)]
    return y


def ref_blocks(x, idx):
    """y[k] = x[s:s + 2, :] with s = clamp(idx[k, 0], 0, 6)."""
    y = np.empty((idx.shape[0], 2, x.shape[1]), x.dtype)
    for k in range(idx.shape[0]):
        s = min(max(idx[k, 0], 0), x.shape[0] - 2)
        y[k] = x[s:s + 2]
    return y


def ref_fill_blocks(x, idx):
    """ref_blocks, but zeros where the block would not fit."""
    y = ref_blocks(x, idx)
    for k in range(idx.shape[0]):
        if not 0 <= idx[k, 0] <= x.shape[0] - 2:
            y[k] = 0
    return y


def ref_column(x, idx):
    return x[:, :, min(max(idx[0], 0), x.shape[2] - 1)]


def ref_scatter_along_last(idx, updates):
    out = np.zeros(updates.shape[:2] + (7,), updates.dtype)
    for i, j in itertools.product(range(updates.shape[0]), range(updates.shape[1])):
        out[i, j, idx[i, j, 0, 0]] += updates[i, j, 0]
    return out


def ref_scatter_rows(idx, updates):
    out = np.zeros((7,) + updates.shape[2:], updates.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        out[idx[pos][0]] += updates[pos]
    return out


def ref_scatter_blocks(mode: str):
    def ref(idx, updates):
        out = np.zeros((8, updates.shape[2]), updates.dtype)
        for k in range(idx.shape[0]):
            s = idx[k, 0]
            if not 0 <= s <= 6:
                if mode == "skip":
                    continue
                s = min(max(s, 0), 6)
            out[s:s + 2] += updates[k]
        return out
    return ref


def ref_dynamic_slice(x, s0, s1):
    s0, s1 = min(max(int(s0), 0), x.shape[0] - 6), min(max(int(s1), 0), x.shape[1] - 3)
    return x[s0:s0 + 6, s1:s1 + 3]


def ref_dynamic_update(x, u, s0, s1):
    out = x.copy()
    s0, s1 = min(max(int(s0), 0), x.shape[0] - u.shape[0]), min(max(int(s1), 0), x.shape[1] - u.shape[1])
    out[s0:s0 + u.shape[0], s1:s1 + u.shape[1]] = u
    return out


def ref_argmax(x):
    return np.array([max(range(x.shape[1]), key=lambda j: (x[i, j], -j)) for i in range(x.shape[0])], I32)


def ref_argmin(x):
    return np.array([min(range(x.shape[0]), key=lambda i: (x[i, j], i)) for j in range(x.shape[1])], I32)


TAKE_ALONG = {"collapsed_slice_dims": [2], "operand_batching_dims": [0, 1], "start_indices_batching_dims": [0, 1],
              "start_index_map": [2], "index_vector_dim": 3, "slice_sizes": [1, 1, 1]}
ROWS = {"offset_dims": [2], "collapsed_slice_dims": [0], "start_index_map": [0], "index_vector_dim": 2,
        "slice_sizes": [1, 6]}
BLOCKS = {"offset_dims": [1, 2], "start_index_map": [0], "index_vector_dim": 1, "slice_sizes": [2, 6]}
COLUMN = {"offset_dims": [0, 1], "collapsed_slice_dims": [2], "start_index_map": [2], "index_vector_dim": 0,
          "slice_sizes": [6, 4, 1]}
SCATTER_ALONG = {"inserted_window_dims": [2], "input_batching_dims": [0, 1], "scatter_indices_batching_dims": [0, 1],
                 "scatter_dims_to_operand_dims": [2], "index_vector_dim": 3, "shape": [6, 5, 7]}
SCATTER_ROWS = {"update_window_dims": [2], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
                "index_vector_dim": 2, "shape": [7, 6]}
SCATTER_BLOCKS = {"update_window_dims": [1, 2], "scatter_dims_to_operand_dims": [0], "index_vector_dim": 1,
                  "shape": [8, 6]}

CASES: list[Case] = [
    Case("general_gather", "take_along_axis", (t(6, 4, 7), t(6, 4, 1, 1, dtype="i32")), TAKE_ALONG,
         ref_take_along_last, (None, ints(-2, 9))),
    Case("general_gather", "rows", (t(7, 6), t(5, 4, 1, dtype="i32")), ROWS, ref_rows, (None, ints(-1, 8))),
    Case("general_gather", "partial_blocks", (t(8, 6), t(3, 1, dtype="i32")), BLOCKS, ref_blocks,
         (None, ints(-2, 9))),
    Case("general_gather", "one_column", (t(6, 4, 7), t(1, dtype="i32")), COLUMN, ref_column, (None, ints(0, 7))),
    Case("general_scatter", "take_along_axis", (t(6, 4, 1, 1, dtype="i32"), t(6, 4, 1)),
         {**SCATTER_ALONG, "shape": [6, 4, 7]}, ref_scatter_along_last, (ints(0, 7),)),
    Case("general_scatter", "repeated_rows", (t(5, 4, 1, dtype="i32"), t(5, 4, 6)), SCATTER_ROWS,
         ref_scatter_rows, (ints(0, 7),)),
    Case("general_scatter", "skip_out_of_bounds", (t(6, 1, dtype="i32"), t(6, 2, 6)), SCATTER_BLOCKS,
         ref_scatter_blocks("skip"), (ints(-2, 9),)),
    Case("general_gather", "fill_out_of_bounds", (t(8, 6), t(3, 1, dtype="i32")), {**BLOCKS, "out_of_bounds": "fill"},
         ref_fill_blocks, (None, ints(-2, 9))),
    Case("general_scatter", "clamp_out_of_bounds", (t(6, 1, dtype="i32"), t(6, 2, 6)),
         {**SCATTER_BLOCKS, "out_of_bounds": "clamp"}, ref_scatter_blocks("clamp"), (ints(-2, 9),)),
    Case("dynamic_slice", "clamped", (t(6, 7), t(dtype="i32"), t(dtype="i32")), {"sizes": [6, 3]},
         ref_dynamic_slice, (None, scalar(1), scalar(9))),
    Case("dynamic_slice", "inside", (t(6, 7), t(dtype="i32"), t(dtype="i32")), {"sizes": [6, 3]},
         ref_dynamic_slice, (None, scalar(0), scalar(2))),
    Case("dynamic_update_slice", "clamped", (t(6, 7), t(6, 2), t(dtype="i32"), t(dtype="i32")), {},
         ref_dynamic_update, (None, None, scalar(-3), scalar(9))),
    Case("dynamic_update_slice", "inside", (t(6, 7), t(6, 2), t(dtype="i32"), t(dtype="i32")), {},
         ref_dynamic_update, (None, None, scalar(0), scalar(3))),
    Case("argmax", "ties", (t(6, 7, dtype="i32"),), {"dim": 1}, ref_argmax, (ints(0, 3),)),
    Case("argmin", "f32", (t(7, 6),), {"dim": 0}, ref_argmin),
]

# Dims holding an opaque factor, per operand and per result (see test_ops.OPAQUE_DIMS).
OPAQUE_DIMS = {
    # take_along_axis: the looked-up dim and the index vector; the batch dims are parallel
    "general_gather-take_along_axis": ([{2}, {3}], [set()]),
    # rows: the table's looked-up dim and the index vector
    "general_gather-rows": ([{0}, {2}], [set()]),
    # partial 2-row blocks: the sliced dim and its window, the index vector
    "general_gather-partial_blocks": ([{0}, {1}], [{1}]),
    "general_gather-one_column": ([{2}, {0}], [set()]),
    "general_gather-fill_out_of_bounds": ([{0}, {1}], [{1}]),
    # scatter: the index vector, the scattered-into dims (and their size-1 window)
    # its updates' dim 2 lines up with an index dim: a sum, not opaque
    "general_scatter-take_along_axis": ([{3}, set()], [{2}]),
    "general_scatter-repeated_rows": ([{2}, set()], [{0}]),
    "general_scatter-skip_out_of_bounds": ([{1}, {1}], [{0}]),
    "general_scatter-clamp_out_of_bounds": ([{1}, {1}], [{0}]),
    # dynamic slices: the dims not taken whole
    "dynamic_slice-clamped": ([{1}, set(), set()], [{1}]),
    "dynamic_slice-inside": ([{1}, set(), set()], [{1}]),
    "dynamic_update_slice-clamped": ([{1}, {1}, set(), set()], [{1}]),
    "dynamic_update_slice-inside": ([{1}, {1}, set(), set()], [{1}]),
    "argmax-ties": ([{1}], [set()]),
    "argmin-f32": ([{0}], [set()]),
}


