"""Indexing ops with StableHLO's semantics: general gather and scatter (with
batching dimensions, as `take_along_axis` and the integer-label
cross-entropy print them), dynamic slices (a KV cache at a run-time
position), and argmax / argmin.

  general_gather(operand, indices)  {offset_dims, collapsed_slice_dims, operand_batching_dims,
                                     start_indices_batching_dims, start_index_map, index_vector_dim,
                                     slice_sizes}
  general_scatter(indices, updates) {update_window_dims, inserted_window_dims, input_batching_dims,
                                     scatter_indices_batching_dims, scatter_dims_to_operand_dims,
                                     index_vector_dim, shape, out_of_bounds}
  dynamic_slice(x, *starts)         {sizes}
  dynamic_update_slice(x, update, *starts)
  argmax(x), argmin(x)              {dim, dtype}

`general_scatter` adds its updates into zeros of `shape` (the importer adds
a scattered-into operand that is not zero): that keeps its factor rule
clean, since sharding the updates' index dimensions then leaves partial
sums, exactly what an embedding or loss gradient costs under batch
parallelism. `out_of_bounds` says what happens to a window whose start
index would put it out of bounds: a gather `clamp`s the start (StableHLO's
gather) or reads zeros (`fill`), a scatter `skip`s the update (StableHLO's
scatter) or `clamp`s it. Each mode's transpose is the other kind's
matching mode (clamp with clamp, fill with skip), so the VJPs are exact.

Factor rules (real rules, not a rewrite to one-hot matmuls, which would
misprice these ops): a batching dimension is one parallel factor shared by
the operand (or result), the indices and the result (or updates); the
indices' other dimensions are parallel with the gather's result batch
dimensions, and a *reduction* (sum) of the scatter's updates; an operand
dimension the slice takes whole and no index addresses is parallel with
its offset (window) dimension; indexed dimensions, partial slices and the
index vector are opaque. A dynamic slice's dimensions are parallel where
it takes them whole, opaque elsewhere. argmax's reduced dimension is opaque
(a sharded argmax would need (value, index) pairs combined).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ir.core import INT_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_choice,
    attr_dtype,
    attr_int,
    attr_ints,
    check_dim,
    io_bytes,
    local_shape_attrs,
    register,
    require,
)
from ir.opset.elementwise import elementwise_cost

GATHER_ATTRS = ("offset_dims", "collapsed_slice_dims", "operand_batching_dims", "start_indices_batching_dims",
                "start_index_map")
SCATTER_ATTRS = ("update_window_dims", "inserted_window_dims", "input_batching_dims",
                 "scatter_indices_batching_dims", "scatter_dims_to_operand_dims")


def _index_dims(idx: TensorType, ivd: int) -> list[int]:
    """The indices' dimensions other than the index vector (an `ivd` equal to
    the rank is an implicit trailing vector of size 1)."""
    return [d for d in range(idx.rank) if d != ivd]


def _vector_size(idx: TensorType, ivd: int) -> int:
    return 1 if ivd == idx.rank else idx.shape[ivd]


def _window_dims(rank: int, *excluded: tuple[int, ...]) -> list[int]:
    """Operand dims in a slice's window: the ones no excluded list names."""
    gone = {d for dims in excluded for d in dims}
    return [d for d in range(rank) if d not in gone]


# ---------------------------------------------------------------- general_gather


def _gather_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, idx = types
    ivd, sizes = attrs["index_vector_dim"], attrs["slice_sizes"]
    offset, collapsed, batching = attrs["offset_dims"], attrs["collapsed_slice_dims"], attrs["operand_batching_dims"]
    require(idx.dtype in INT_DTYPES, f"general_gather: indices must be integers, got {idx}")
    require(0 <= ivd <= idx.rank, f"general_gather: index_vector_dim {ivd} out of range for {idx}")
    require(len(sizes) == x.rank and all(0 <= s <= n for s, n in zip(sizes, x.shape)),
            f"general_gather: slice_sizes {list(sizes)} do not fit {x}")
    require(len(attrs["start_index_map"]) == _vector_size(idx, ivd),
            f"general_gather: start_index_map {list(attrs['start_index_map'])} needs one entry per index component")
    for d in (*collapsed, *batching, *attrs["start_index_map"]):
        check_dim("general_gather", d, x.rank, "operand dimension")
    require(all(sizes[d] == 1 for d in (*collapsed, *batching)),
            "general_gather: collapsed and batching dims must have slice size 1")
    require(len(batching) == len(attrs["start_indices_batching_dims"]),
            "general_gather: operand_batching_dims and start_indices_batching_dims differ in length")
    for ob, ib in zip(batching, attrs["start_indices_batching_dims"]):
        require(ib in _index_dims(idx, ivd) and x.shape[ob] == idx.shape[ib],
                f"general_gather: batching dims {ob} of {x} and {ib} of {idx} do not match")
    window = _window_dims(x.rank, collapsed, batching)
    require(len(window) == len(offset), f"general_gather: {len(offset)} offset_dims for {len(window)} window dims")
    rank = len(offset) + len(_index_dims(idx, ivd))
    require(sorted(offset) == sorted(set(offset)) and all(0 <= d < rank for d in offset),
            f"general_gather: offset_dims {list(offset)} are not distinct result dims")
    batch_sizes = iter(idx.shape[d] for d in _index_dims(idx, ivd))
    window_sizes = dict(zip(offset, (sizes[d] for d in window)))
    shape = tuple(window_sizes[d] if d in window_sizes else next(batch_sizes) for d in range(rank))
    return (TensorType(shape, x.dtype),)


def _gather_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    x, idx = operand_types
    (y,) = result_types
    ivd, sizes, indexed = attrs["index_vector_dim"], attrs["slice_sizes"], set(attrs["start_index_map"])
    batching = dict(zip(attrs["start_indices_batching_dims"], attrs["operand_batching_dims"]))
    x_dims = [f"v{d}" for d in range(x.rank)]  # opaque unless named below
    idx_dims = ["iv" if d == ivd else f"b{d}" for d in range(idx.rank)]
    result_batch = [d for d in range(y.rank) if d not in attrs["offset_dims"]]
    y_dims = [""] * y.rank
    for rd, id_ in zip(result_batch, _index_dims(idx, ivd)):
        y_dims[rd] = f"b{id_}"
        if id_ in batching:
            x_dims[batching[id_]] = f"b{id_}"
    window = _window_dims(x.rank, attrs["collapsed_slice_dims"], attrs["operand_batching_dims"])
    for od, rd in zip(window, attrs["offset_dims"]):
        whole = od not in indexed and sizes[od] == x.shape[od]
        y_dims[rd] = f"p{od}" if whole else f"o{rd}"
        if whole:
            x_dims[od] = f"p{od}"
    opaque = [n for n in x_dims + idx_dims + y_dims if n[0] in "vio"]
    return FactorRule.build(operand_types, result_types, [x_dims, idx_dims], [y_dims], opaque=opaque)


def _start_vectors(idx: np.ndarray, ivd: int, grid: np.ndarray, batch_dims: list[int]) -> tuple[np.ndarray, list]:
    """The indices with an explicit vector dim, and a selector template
    mapping their non-vector dims to the grid's batch dims."""
    idx = idx if ivd < idx.ndim else idx[..., None]
    select: list[Any] = [None] * idx.ndim
    for j, d in enumerate(d for d in range(idx.ndim) if d != ivd):
        select[d] = grid[batch_dims[j]]
    return idx, select


def _gather_impl(args, attrs: Attrs):
    x, idx = args
    (y,) = _gather_infer((TensorType(x.shape, "f32"), TensorType(idx.shape, "i32")), attrs, Mesh())
    grid = np.indices(y.shape, dtype=np.int64)
    batch_dims = [d for d in range(y.rank) if d not in attrs["offset_dims"]]
    ivd = attrs["index_vector_dim"]
    vectors, select = _start_vectors(idx, ivd, grid, batch_dims)
    position = [np.zeros(y.shape, np.int64) for _ in range(x.ndim)]
    fits = np.ones(y.shape, bool)
    for k, od in enumerate(attrs["start_index_map"]):
        start = vectors[tuple(k if d == ivd else s for d, s in enumerate(select))].astype(np.int64)
        clamped = np.clip(start, 0, x.shape[od] - attrs["slice_sizes"][od])
        fits &= clamped == start
        position[od] += clamped
    index_dims = [d for d in range(vectors.ndim) if d != ivd]
    for ob, ib in zip(attrs["operand_batching_dims"], attrs["start_indices_batching_dims"]):
        position[ob] += grid[batch_dims[index_dims.index(ib)]]
    window = _window_dims(x.ndim, attrs["collapsed_slice_dims"], attrs["operand_batching_dims"])
    for od, rd in zip(window, attrs["offset_dims"]):
        position[od] += grid[rd]
    gathered = x[tuple(position)]
    return (gathered if attrs["out_of_bounds"] == "clamp" else np.where(fits, gathered, np.zeros((), x.dtype)),)


def _gather_localize(attrs: Attrs, local_operands: Types, local_results: Types) -> Attrs:
    sizes = list(attrs["slice_sizes"])
    window = _window_dims(local_operands[0].rank, attrs["collapsed_slice_dims"], attrs["operand_batching_dims"])
    for od, rd in zip(window, attrs["offset_dims"]):
        sizes[od] = local_results[0].shape[rd]
    return attrs.replace(slice_sizes=sizes)


def _gather_vjp(b, op, g, wanted):
    x, idx = op.operands
    a = op.attrs
    return (b.op("general_scatter", [idx, g], update_window_dims=a["offset_dims"],
                 inserted_window_dims=a["collapsed_slice_dims"], input_batching_dims=a["operand_batching_dims"],
                 scatter_indices_batching_dims=a["start_indices_batching_dims"],
                 scatter_dims_to_operand_dims=a["start_index_map"], index_vector_dim=a["index_vector_dim"],
                 shape=list(x.type.shape), out_of_bounds="clamp" if a["out_of_bounds"] == "clamp" else "skip"), None)


def _gather_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # Reads the indices and only the gathered elements, writes the result.
    return OpCost(0, operand_types[1].num_bytes + 2 * result_types[0].num_bytes)


register(OpDef(
    "general_gather", "indexing", 2,
    tuple(AttrSpec(n, attr_ints, ()) for n in GATHER_ATTRS)
    + (AttrSpec("index_vector_dim", attr_int), AttrSpec("slice_sizes", attr_ints),
       AttrSpec("out_of_bounds", attr_choice("clamp", "fill"), "clamp")),
    _gather_infer, _gather_factors, _gather_cost, impl=_gather_impl, localize=_gather_localize, vjp=_gather_vjp,
    doc="StableHLO's gather: slices of the operand at start indices (clamped), with batching dims",
))


# ---------------------------------------------------------------- general_scatter


def _scatter_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    idx, updates = types
    shape, ivd = attrs["shape"], attrs["index_vector_dim"]
    window, inserted = attrs["update_window_dims"], attrs["inserted_window_dims"]
    batching = attrs["input_batching_dims"]
    require(idx.dtype in INT_DTYPES, f"general_scatter: indices must be integers, got {idx}")
    require(0 <= ivd <= idx.rank, f"general_scatter: index_vector_dim {ivd} out of range for {idx}")
    require(len(attrs["scatter_dims_to_operand_dims"]) == _vector_size(idx, ivd),
            "general_scatter: scatter_dims_to_operand_dims needs one entry per index component")
    for d in (*inserted, *batching, *attrs["scatter_dims_to_operand_dims"]):
        check_dim("general_scatter", d, len(shape), "result dimension")
    operand_window = _window_dims(len(shape), inserted, batching)
    require(len(window) == len(operand_window),
            f"general_scatter: {len(window)} update_window_dims for {len(operand_window)} window dims")
    scatter_dims = [d for d in range(updates.rank) if d not in window]
    require(updates.rank == len(window) + len(_index_dims(idx, ivd))
            and [updates.shape[d] for d in scatter_dims] == [idx.shape[d] for d in _index_dims(idx, ivd)],
            f"general_scatter: updates {updates} do not line up with indices {idx}")
    require(all(updates.shape[u] <= shape[r] for u, r in zip(window, operand_window)),
            f"general_scatter: a window of {updates} is larger than the result {list(shape)}")
    for rb, ib in zip(batching, attrs["scatter_indices_batching_dims"]):
        require(ib in _index_dims(idx, ivd) and shape[rb] == idx.shape[ib],
                f"general_scatter: batching dims {rb} of the result and {ib} of {idx} do not match")
    return (TensorType(tuple(shape), updates.dtype),)


def _scatter_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    idx, updates = operand_types
    (y,) = result_types
    ivd, scattered = attrs["index_vector_dim"], set(attrs["scatter_dims_to_operand_dims"])
    batching = dict(zip(attrs["scatter_indices_batching_dims"], attrs["input_batching_dims"]))
    idx_dims = ["iv" if d == ivd else f"s{d}" for d in range(idx.rank)]
    y_dims = [f"r{d}" for d in range(y.rank)]  # opaque unless named below
    u_dims = [""] * updates.rank
    scatter_dims = [d for d in range(updates.rank) if d not in attrs["update_window_dims"]]
    for ud, id_ in zip(scatter_dims, _index_dims(idx, ivd)):
        u_dims[ud] = f"s{id_}"
        if id_ in batching:
            y_dims[batching[id_]] = f"s{id_}"
    window = _window_dims(y.rank, attrs["inserted_window_dims"], attrs["input_batching_dims"])
    for rd, ud in zip(window, attrs["update_window_dims"]):
        whole = rd not in scattered and updates.shape[ud] == y.shape[rd]
        u_dims[ud] = f"w{rd}" if whole else f"u{ud}"
        if whole:
            y_dims[rd] = f"w{rd}"
    in_result = set(y_dims)
    sums = {n: "sum" for n in idx_dims if n.startswith("s") and n not in in_result}
    opaque = [n for n in idx_dims + u_dims + y_dims if n[0] in "iur"]
    return FactorRule.build(operand_types, result_types, [idx_dims, u_dims], [y_dims], combiners=sums,
                            opaque=opaque)


def _scatter_impl(args, attrs: Attrs):
    idx, updates = args
    shape, ivd = tuple(attrs["shape"]), attrs["index_vector_dim"]
    out = np.zeros(shape, updates.dtype)
    grid = np.indices(updates.shape, dtype=np.int64)
    scatter_dims = [d for d in range(updates.ndim) if d not in attrs["update_window_dims"]]
    vectors, select = _start_vectors(idx, ivd, grid, scatter_dims)
    window = _window_dims(len(shape), attrs["inserted_window_dims"], attrs["input_batching_dims"])
    window_size = {rd: updates.shape[ud] for rd, ud in zip(window, attrs["update_window_dims"])}
    position = [np.zeros(updates.shape, np.int64) for _ in shape]
    fits = np.ones(updates.shape, bool)
    for k, rd in enumerate(attrs["scatter_dims_to_operand_dims"]):
        start = vectors[tuple(k if d == ivd else s for d, s in enumerate(select))].astype(np.int64)
        clamped = np.clip(start, 0, shape[rd] - window_size.get(rd, 1))
        fits &= clamped == start
        position[rd] += clamped
    index_dims = [d for d in range(vectors.ndim) if d != ivd]
    for rb, ib in zip(attrs["input_batching_dims"], attrs["scatter_indices_batching_dims"]):
        position[rb] += grid[scatter_dims[index_dims.index(ib)]]
    for rd, ud in zip(window, attrs["update_window_dims"]):
        position[rd] += grid[ud]
    keep = fits if attrs["out_of_bounds"] == "skip" else np.ones(updates.shape, bool)
    np.add.at(out, tuple(p[keep] for p in position), updates[keep])
    return (out,)


def _scatter_vjp(b, op, g, wanted):
    idx, updates = op.operands
    a = op.attrs
    window = _window_dims(g.type.rank, a["inserted_window_dims"], a["input_batching_dims"])
    sizes = [1] * g.type.rank
    for rd, ud in zip(window, a["update_window_dims"]):
        sizes[rd] = updates.type.shape[ud]
    return (None, b.op("general_gather", [g, idx], offset_dims=a["update_window_dims"],
                       collapsed_slice_dims=a["inserted_window_dims"], operand_batching_dims=a["input_batching_dims"],
                       start_indices_batching_dims=a["scatter_indices_batching_dims"],
                       start_index_map=a["scatter_dims_to_operand_dims"], index_vector_dim=a["index_vector_dim"],
                       slice_sizes=sizes, out_of_bounds="clamp" if a["out_of_bounds"] == "clamp" else "fill"))


def _scatter_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # One add per update element; reads updates and indices, writes the result.
    return OpCost(operand_types[1].num_elements, io_bytes(operand_types, result_types))


register(OpDef(
    "general_scatter", "indexing", 2,
    tuple(AttrSpec(n, attr_ints, ()) for n in SCATTER_ATTRS)
    + (AttrSpec("index_vector_dim", attr_int), AttrSpec("shape", attr_ints),
       AttrSpec("out_of_bounds", attr_choice("skip", "clamp"), "skip")),
    _scatter_infer, _scatter_factors, _scatter_cost, impl=_scatter_impl, localize=local_shape_attrs,
    vjp=_scatter_vjp,
    doc="StableHLO's scatter with an add region, into zeros of `shape` (general_gather's transpose)",
))


# ---------------------------------------------------------------- dynamic slices


def _starts(args: list[np.ndarray], shape: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[slice, ...]:
    """The slice each (clamped) start selects, as StableHLO clamps it."""
    return tuple(slice(s, s + n) for s, n in
                 ((int(np.clip(int(a), 0, dim - size)), size) for a, dim, size in zip(args, shape, sizes)))


def _check_starts(kind: str, x: TensorType, starts: Types) -> None:
    require(len(starts) == x.rank, f"{kind}: {len(starts)} start indices for {x}")
    require(all(s.rank == 0 and s.dtype in INT_DTYPES for s in starts), f"{kind}: start indices must be integer "
            "scalars")


def _dynamic_slice_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, *starts = types
    sizes = attrs["sizes"]
    _check_starts("dynamic_slice", x, starts)
    require(len(sizes) == x.rank and all(0 <= s <= n for s, n in zip(sizes, x.shape)),
            f"dynamic_slice: sizes {list(sizes)} do not fit {x}")
    return (TensorType(tuple(sizes), x.dtype),)


def _whole_dims_rule(operand_types: Types, result_types: Types, whole: list[bool], operands: int) -> FactorRule:
    """Dims taken whole are parallel across the first `operands` operands and
    the result; the others opaque; trailing scalar starts carry no dims."""
    dims = [[f"d{d}" if w else f"{t}{d}" for d, w in enumerate(whole)] for t in "xuy"[:operands] + "y"]
    opaque = [n for spec in dims for n in spec if not n.startswith("d")]
    scalars = [[] for _ in operand_types[operands:]]
    return FactorRule.build(operand_types, result_types, dims[:operands] + scalars, [dims[-1]], opaque=opaque)


def _dynamic_slice_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    x = operand_types[0]
    return _whole_dims_rule(operand_types, result_types, [s == n for s, n in zip(attrs["sizes"], x.shape)], 1)


register(OpDef(
    "dynamic_slice", "indexing", None, (AttrSpec("sizes", attr_ints),),
    _dynamic_slice_infer, _dynamic_slice_factors,
    lambda operand_types, result_types, attrs: OpCost(0, 2 * result_types[0].num_bytes),
    impl=lambda args, attrs: (args[0][_starts(args[1:], args[0].shape, attrs["sizes"])],),
    localize=lambda attrs, local_operands, local_results: attrs.replace(sizes=local_results[0].shape),
    vjp=lambda b, op, g, wanted: (
        b.op("dynamic_update_slice", [b.zeros(op.operands[0].type.shape, g.type.dtype), g, *op.operands[1:]]),
        *([None] * (len(op.operands) - 1))),
    doc="x[s0:s0+sizes[0], ...] at run-time starts (clamped so the slice fits)",
))


def _dynamic_update_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    require(len(types) >= 2, "dynamic_update_slice: takes x, update and one start index per dimension")
    x, update, *starts = types
    _check_starts("dynamic_update_slice", x, starts)
    require(update.rank == x.rank and update.dtype == x.dtype and all(u <= n for u, n in zip(update.shape, x.shape)),
            f"dynamic_update_slice: update {update} does not fit in {x}")
    return (x,)


def _dynamic_update_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    x, update = operand_types[:2]
    return _whole_dims_rule(operand_types, result_types, [u == n for u, n in zip(update.shape, x.shape)], 2)


def _dynamic_update_impl(args, attrs: Attrs):
    x, update, *starts = args
    out = x.copy()
    out[_starts(starts, x.shape, update.shape)] = update
    return (out,)


def _dynamic_update_vjp(b, op, g, wanted):
    x, update, *starts = op.operands
    gx = b.op("dynamic_update_slice", [g, b.zeros(update.type.shape, g.type.dtype), *starts]) if wanted[0] else None
    gu = b.op("dynamic_slice", [g, *starts], sizes=list(update.type.shape)) if wanted[1] else None
    return (gx, gu, *([None] * len(starts)))


register(OpDef(
    "dynamic_update_slice", "indexing", None, (),
    _dynamic_update_infer, _dynamic_update_factors,
    lambda operand_types, result_types, attrs: OpCost(0, 2 * operand_types[1].num_bytes),
    impl=_dynamic_update_impl, vjp=_dynamic_update_vjp,
    doc="x with `update` written at run-time starts (clamped so it fits)",
))


# ---------------------------------------------------------------- argmax, argmin


def _arg_infer(kind: str):
    def infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
        (x,) = types
        check_dim(kind, attrs["dim"], x.rank)
        require(x.shape[attrs["dim"]] > 0, f"{kind}: dimension {attrs['dim']} of {x} is empty")
        require(attrs["dtype"] in INT_DTYPES, f"{kind}: the index dtype must be an integer type")
        return (TensorType(x.shape[:attrs["dim"]] + x.shape[attrs["dim"] + 1:], attrs["dtype"]),)

    return infer


def _arg_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    (x,) = operand_types
    names = ["r" if d == attrs["dim"] else f"d{d}" for d in range(x.rank)]
    return FactorRule.build(operand_types, result_types, [names], [[n for n in names if n != "r"]], opaque=["r"])


register(OpDef(
    "argmax", "indexing", 1, (AttrSpec("dim", attr_int), AttrSpec("dtype", attr_dtype, "i32")),
    _arg_infer("argmax"), _arg_factors, elementwise_cost(1),
    impl=lambda args, attrs: (np.argmax(args[0], axis=attrs["dim"]),),
    vjp=lambda b, op, g, wanted: (None,),
    doc="index of the first maximum along `dim` (nan counts as the maximum)",
))
register(OpDef(
    "argmin", "indexing", 1, (AttrSpec("dim", attr_int), AttrSpec("dtype", attr_dtype, "i32")),
    _arg_infer("argmin"), _arg_factors, elementwise_cost(1),
    impl=lambda args, attrs: (np.argmin(args[0], axis=attrs["dim"]),),
    vjp=lambda b, op, g, wanted: (None,),
    doc="index of the first minimum along `dim` (nan counts as the minimum)",
))

