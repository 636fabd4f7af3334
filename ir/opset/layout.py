"""Layout and data-movement ops: broadcast_in_dim, transpose, reshape,
concatenate, slice, gather, and the generators iota, full and constant.

Factor rules in brief (o = opaque: the dimension must be whole at this op):
  broadcast_in_dim  (i)->(i,j) {j:broadcast}; a size-1 operand dim
                    broadcast to n is (o)->(j) {j:broadcast}
  transpose         (i,j)->(j,i)
  reshape           split/merge groups: [6]->[2,3] is ([a*b])->(a,b); the
                    major factor of a merged dim is what block sharding of
                    that dim shards; groups with no common refinement
                    (e.g. [4,6]->[3,8]) are opaque
  concatenate       the concatenated dim is opaque, the others parallel
  slice             sliced dims are opaque, untouched dims parallel
  gather            (v,d),(i)->(i,d) with the looked-up dim v opaque
  iota / full       result-only (broadcast) dims; iota's counting dim is
                    opaque, since each shard would need its own offset
  constant          opaque: a dense literal is not split across devices
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ir.core import DTYPE_BYTES, NUMPY_DTYPES, Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_dtype,
    attr_int,
    attr_ints,
    attr_number,
    attr_numbers,
    check_dim,
    io_bytes,
    local_shape_attrs,
    register,
    require,
)


def _move_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    return OpCost(0, io_bytes(operand_types, result_types))


def _check_shape(kind: str, shape: tuple[int, ...]) -> None:
    require(all(s >= 0 for s in shape), f"{kind}: shape {list(shape)} has a negative dimension")


# ---- broadcast_in_dim


def _broadcast_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    shape, dims = attrs["shape"], attrs["dims"]
    _check_shape("broadcast_in_dim", shape)
    require(len(dims) == x.rank, f"broadcast_in_dim: dims {list(dims)} must name one result dim per operand dim of {x}")
    require(len(set(dims)) == len(dims), f"broadcast_in_dim: dims {list(dims)} repeat a dimension")
    for i, d in enumerate(dims):
        check_dim("broadcast_in_dim", d, len(shape), "result dimension")
        require(
            x.shape[i] in (1, shape[d]),
            f"broadcast_in_dim: operand dim {i} of size {x.shape[i]} cannot broadcast to result dim {d} "
            f"of size {shape[d]}",
        )
    return (TensorType(shape, x.dtype),)


def _broadcast_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    (x,), (y,) = operand_types, result_types
    result_dims = [f"d{j}" for j in range(y.rank)]
    operand_dims, opaque = [], []
    for i, j in enumerate(attrs["dims"]):
        if x.shape[i] == y.shape[j]:
            operand_dims.append(f"d{j}")
        else:  # size 1 stretched to n: nothing of the operand lines up with the result
            operand_dims.append(f"o{i}")
            opaque.append(f"o{i}")
    return FactorRule.build(operand_types, result_types, [operand_dims], [result_dims], opaque=opaque)


def _broadcast_impl(args, attrs: Attrs):
    (x,) = args
    dims, shape = attrs["dims"], attrs["shape"]
    order = np.argsort(dims)
    x = np.transpose(x, order)
    expanded = [1] * len(shape)
    for k, d in enumerate(sorted(dims)):
        expanded[d] = x.shape[k]
    return (np.broadcast_to(x.reshape(expanded), shape).copy(),)


def _broadcast_vjp(b, op, g, wanted):
    """Sum the cotangent over the dims the broadcast created or stretched, then
    lay the rest out like the operand (stretched size-1 dims come back by reshape)."""
    x, dims = op.operands[0].type, op.attrs["dims"]
    lined_up = [i for i in range(x.rank) if x.shape[i] == op.result.type.shape[dims[i]]]
    summed = sorted(set(range(op.result.type.rank)) - {dims[i] for i in lined_up})
    r = b.reduce(g, summed) if summed else g
    order = sorted(lined_up, key=lambda i: dims[i])  # operand dim held by each dim of r
    perm = [order.index(i) for i in lined_up]
    if perm != sorted(perm):
        r = b.transpose(r, perm)
    return (r if r.type.shape == x.shape else b.reshape(r, x.shape),)


register(OpDef(
    "broadcast_in_dim", "layout", 1,
    (AttrSpec("shape", attr_ints), AttrSpec("dims", attr_ints)),
    _broadcast_infer, _broadcast_factors, _move_cost, impl=_broadcast_impl, localize=local_shape_attrs,
    vjp=_broadcast_vjp,
    doc="operand dim i becomes result dim dims[i]; size-1 dims stretch",
))


# ---- transpose


def _transpose_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    perm = attrs["perm"]
    require(sorted(perm) == list(range(x.rank)),
            f"transpose: perm {list(perm)} is not a permutation of 0..{x.rank - 1}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


def _transpose_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    names = [f"d{d}" for d in range(operand_types[0].rank)]
    return FactorRule.build(operand_types, result_types, [names], [[names[p] for p in attrs["perm"]]])


register(OpDef(
    "transpose", "layout", 1, (AttrSpec("perm", attr_ints),),
    _transpose_infer, _transpose_factors, _move_cost,
    impl=lambda args, attrs: (np.transpose(args[0], attrs["perm"]),),
    vjp=lambda b, op, g, wanted: (b.transpose(g, np.argsort(op.attrs["perm"]).tolist()),),
    doc="result dim i is operand dim perm[i]",
))


# ---- reshape


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Split a reshape into minimal groups of consecutive dims with equal products.

    Size-1 dims that line up with nothing form groups of their own.
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and j < len(dst) and src[i] == dst[j]:
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
        elif i < len(src) and src[i] == 1:
            groups.append(([i], []))
            i += 1
        elif j < len(dst) and dst[j] == 1:
            groups.append(([], [j]))
            j += 1
        else:
            gi, gj, ps, pd = [i], [j], src[i], dst[j]
            i, j = i + 1, j + 1
            while ps != pd:
                if ps < pd:
                    gi.append(i)
                    ps *= src[i]
                    i += 1
                else:
                    gj.append(j)
                    pd *= dst[j]
                    j += 1
            groups.append((gi, gj))
    return groups


def _refine(sizes_a: list[int], sizes_b: list[int]) -> list[int] | None:
    """Factor sizes of the common refinement of two dim lists, or None.

    [6] and [2, 3] refine to [2, 3]: every prefix product of either side must
    be a product of consecutive factors, which needs each sorted prefix
    product to divide the next.
    """
    prefixes = sorted({math.prod(sizes_a[:k]) for k in range(1, len(sizes_a) + 1)}
                      | {math.prod(sizes_b[:k]) for k in range(1, len(sizes_b) + 1)})
    factors, previous = [], 1
    for p in prefixes:
        if p % previous:
            return None
        factors.append(p // previous)
        previous = p
    return factors


def _reshape_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    shape = attrs["shape"]
    require(all(s >= 1 for s in shape) and all(s >= 1 for s in x.shape),
            f"reshape: dimensions must be positive, got {x} -> {list(shape)}")
    require(math.prod(shape) == x.num_elements,
            f"reshape: cannot reshape {x} ({x.num_elements} elements) to {list(shape)} ({math.prod(shape)} elements)")
    return (TensorType(shape, x.dtype),)


def _dims_of_group(dims: list[int], shape: tuple[int, ...], factor_sizes: list[int], names: list[str]) -> dict:
    """Assign consecutive refined factors to each dim of one side of a group."""
    out, k = {}, 0
    for d in dims:
        taken, product = [], 1
        while product < shape[d]:
            product *= factor_sizes[k]
            taken.append(names[k])
            k += 1
        out[d] = tuple(taken)
    return out


def _reshape_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    src, dst = operand_types[0].shape, result_types[0].shape
    src_dims: dict[int, tuple[str, ...]] = {}
    dst_dims: dict[int, tuple[str, ...]] = {}
    opaque: list[str] = []
    sizes: dict[str, int] = {}
    for g, (gi, gj) in enumerate(reshape_groups(src, dst)):
        # Size-1 dims in a group carry nothing; each gets an opaque unit factor.
        for side, dims, shape, out in (("i", gi, src, src_dims), ("o", gj, dst, dst_dims)):
            for d in dims:
                if shape[d] == 1:
                    out[d] = (f"{side}{d}",)
                    opaque.append(f"{side}{d}")
        big_i = [d for d in gi if src[d] > 1]
        big_j = [d for d in gj if dst[d] > 1]
        refined = _refine([src[d] for d in big_i], [dst[d] for d in big_j]) if big_i and big_j else None
        if refined is None:
            for side, dims, out in (("i", big_i, src_dims), ("o", big_j, dst_dims)):
                for d in dims:
                    out[d] = (f"{side}{d}",)
                    opaque.append(f"{side}{d}")
            continue
        names = [f"g{g}" if len(refined) == 1 else f"g{g}{chr(ord('a') + k)}" for k in range(len(refined))]
        sizes.update(zip(names, refined))
        src_dims.update(_dims_of_group(big_i, src, refined, names))
        dst_dims.update(_dims_of_group(big_j, dst, refined, names))
    return FactorRule.build(
        operand_types, result_types,
        [[src_dims[d] for d in range(len(src))]], [[dst_dims[d] for d in range(len(dst))]],
        opaque=opaque, sizes=sizes,
    )


register(OpDef(
    "reshape", "layout", 1, (AttrSpec("shape", attr_ints),),
    _reshape_infer, _reshape_factors,
    # A row-major reshape is a bitcast: no data moves.
    lambda operand_types, result_types, attrs: OpCost(0, 0),
    impl=lambda args, attrs: (args[0].reshape(attrs["shape"]),),
    localize=local_shape_attrs,
    vjp=lambda b, op, g, wanted: (b.reshape(g, op.operands[0].type.shape),),
    doc="row-major reshape (split/merge of dimensions)",
))


# ---- concatenate


def _concat_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    first, dim = types[0], attrs["dim"]
    check_dim("concatenate", dim, first.rank)
    for t in types[1:]:
        require(t.dtype == first.dtype, f"concatenate: operand dtypes differ: {first}, {t}")
        require(
            t.rank == first.rank and all(a == b for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != dim),
            f"concatenate: {t} and {first} differ outside dimension {dim}",
        )
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in types)
    return (TensorType(tuple(shape), first.dtype),)


def _concat_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    dim, rank = attrs["dim"], result_types[0].rank
    operand_dims = [[f"c{k}" if d == dim else f"d{d}" for d in range(rank)] for k in range(len(operand_types))]
    result_dims = [["c" if d == dim else f"d{d}" for d in range(rank)]]
    opaque = ["c"] + [f"c{k}" for k in range(len(operand_types))]
    return FactorRule.build(operand_types, result_types, operand_dims, result_dims, opaque=opaque)


def _concat_vjp(b, op, g, wanted):
    dim, shape = op.attrs["dim"], g.type.shape
    out, offset = [], 0
    for x, want in zip(op.operands, wanted):
        size = x.type.shape[dim]
        start = [offset if d == dim else 0 for d in range(len(shape))]
        limit = [offset + size if d == dim else s for d, s in enumerate(shape)]
        out.append(b.slice(g, start, limit) if want else None)
        offset += size
    return tuple(out)


register(OpDef(
    "concatenate", "layout", None, (AttrSpec("dim", attr_int),),
    _concat_infer, _concat_factors, _move_cost,
    impl=lambda args, attrs: (np.concatenate(args, axis=attrs["dim"]),),
    vjp=_concat_vjp,
    doc="join operands along `dim`",
))


# ---- slice


def _slice_strides(attrs: Attrs, rank: int) -> tuple[int, ...]:
    return attrs["stride"] or (1,) * rank


def _slice_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    start, limit = attrs["start"], attrs["limit"]
    stride = _slice_strides(attrs, x.rank)
    require(len(start) == len(limit) == len(stride) == x.rank,
            f"slice: start, limit and stride need {x.rank} entries each for {x}")
    for d in range(x.rank):
        require(0 <= start[d] <= limit[d] <= x.shape[d],
                f"slice: dimension {d} needs 0 <= start <= limit <= {x.shape[d]}, got {start[d]}:{limit[d]}")
        require(stride[d] >= 1, f"slice: stride must be positive, got {stride[d]} in dimension {d}")
    shape = tuple(-(-(limit[d] - start[d]) // stride[d]) for d in range(x.rank))
    return (TensorType(shape, x.dtype),)


def _slice_untouched(attrs: Attrs, shape: tuple[int, ...]) -> list[bool]:
    stride = _slice_strides(attrs, len(shape))
    return [attrs["start"][d] == 0 and attrs["limit"][d] == shape[d] and stride[d] == 1 for d in range(len(shape))]


def untouched_dims_rule(operand_types: Types, result_types: Types, untouched: list[bool]) -> FactorRule:
    """Dims an op leaves alone are parallel; the dims it resizes are opaque on both sides."""
    operand_dims = [f"d{d}" if w else f"i{d}" for d, w in enumerate(untouched)]
    result_dims = [f"d{d}" if w else f"o{d}" for d, w in enumerate(untouched)]
    opaque = [n for n in operand_dims + result_dims if not n.startswith("d")]
    return FactorRule.build(operand_types, result_types, [operand_dims], [result_dims], opaque=opaque)


def _slice_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    return untouched_dims_rule(operand_types, result_types, _slice_untouched(attrs, operand_types[0].shape))


def _slice_localize(attrs: Attrs, local_operands: Types, local_results: Types) -> Attrs:
    # Only untouched dims can be sharded (the others are opaque); on those the
    # slice covers the whole local extent.
    limit = tuple(
        local_operands[0].shape[d] if attrs["start"][d] == 0 and local_results[0].shape[d] == local_operands[0].shape[d]
        else attrs["limit"][d]
        for d in range(local_operands[0].rank)
    )
    return attrs.replace(limit=limit)


def _slice_impl(args, attrs: Attrs):
    (x,) = args
    stride = _slice_strides(attrs, x.ndim)
    return (x[tuple(slice(s, e, k) for s, e, k in zip(attrs["start"], attrs["limit"], stride))],)


def _slice_vjp(b, op, g, wanted):
    """Zero-pad the cotangent back into place: pad is the transpose of slice."""
    x = op.operands[0].type
    stride = _slice_strides(op.attrs, x.rank)
    low = list(op.attrs["start"])
    high = [x.shape[d] - (low[d] + (g.type.shape[d] - 1) * stride[d] + 1) if g.type.shape[d] else x.shape[d] - low[d]
            for d in range(x.rank)]
    return (b.pad(g, low, high, [s - 1 for s in stride]),)


register(OpDef(
    "slice", "layout", 1,
    (AttrSpec("start", attr_ints), AttrSpec("limit", attr_ints), AttrSpec("stride", attr_ints, ())),
    _slice_infer, _slice_factors, _move_cost, impl=_slice_impl, localize=_slice_localize, vjp=_slice_vjp,
    doc="x[start:limit:stride] per dimension (empty stride: all 1)",
))


# ---- gather


def _gather_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    x, idx = types
    axis = attrs["axis"]
    check_dim("gather", axis, x.rank, "axis")
    require(idx.dtype == "i32", f"gather: indices must be i32, got {idx}")
    return (TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype),)


def _gather_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    x, idx = operand_types
    axis = attrs["axis"]
    x_dims = ["v" if d == axis else f"p{d}" for d in range(x.rank)]
    idx_dims = [f"i{k}" for k in range(idx.rank)]
    result_dims = x_dims[:axis] + idx_dims + x_dims[axis + 1:]
    return FactorRule.build(operand_types, result_types, [x_dims, idx_dims], [result_dims], opaque=["v"])


def _gather_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # Reads the indices and only the looked-up rows, writes the result.
    return OpCost(0, operand_types[1].num_bytes + 2 * result_types[0].num_bytes)


register(OpDef(
    "gather", "layout", 2, (AttrSpec("axis", attr_int, 0),),
    _gather_infer, _gather_factors, _gather_cost,
    # Out-of-range indices clamp, as XLA's gather does.
    impl=lambda args, attrs: (np.take(args[0], args[1], axis=attrs["axis"], mode="clip"),),
    vjp=lambda b, op, g, wanted: (
        b.scatter_add(g, op.operands[1], op.attrs["axis"], op.operands[0].type.shape[op.attrs["axis"]]), None),
    doc="take slices of the operand along `axis` at integer indices (embedding lookup)",
))


# ---- pad (zero padding; the transpose of slice)


def _pad_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    (x,) = types
    low, high, interior = attrs["low"], attrs["high"], attrs["interior"] or (0,) * x.rank
    require(len(low) == len(high) == len(interior) == x.rank,
            f"pad: low, high and interior need {x.rank} entries each for {x}")
    require(all(v >= 0 for v in low + high + interior), "pad: low, high and interior must be non-negative")
    shape = tuple(lo + n + max(n - 1, 0) * i + hi for lo, n, i, hi in zip(low, x.shape, interior, high))
    return (TensorType(shape, x.dtype),)


def _pad_untouched(attrs: Attrs, rank: int) -> list[bool]:
    interior = attrs["interior"] or (0,) * rank
    return [attrs["low"][d] == attrs["high"][d] == interior[d] == 0 for d in range(rank)]


def _pad_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    return untouched_dims_rule(operand_types, result_types, _pad_untouched(attrs, operand_types[0].rank))


def _pad_places(attrs: Attrs, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """Where the operand's elements land in the padded result."""
    interior = attrs["interior"] or (0,) * len(shape)
    return tuple(slice(lo, lo + max(n - 1, 0) * (i + 1) + 1, i + 1) for lo, n, i in zip(attrs["low"], shape, interior))


def _pad_impl(args, attrs: Attrs):
    (x,) = args
    (result,) = _pad_infer((TensorType(x.shape, "f32"),), attrs, Mesh())
    out = np.zeros(result.shape, x.dtype)
    out[_pad_places(attrs, x.shape)] = x
    return (out,)


def _pad_vjp(b, op, g, wanted):
    places = _pad_places(op.attrs, op.operands[0].type.shape)
    return (b.slice(g, [p.start for p in places], [p.stop for p in places], [p.step for p in places]),)


register(OpDef(
    "pad", "layout", 1,
    (AttrSpec("low", attr_ints), AttrSpec("high", attr_ints), AttrSpec("interior", attr_ints, ())),
    _pad_infer, _pad_factors, _move_cost, impl=_pad_impl, vjp=_pad_vjp,
    doc="zero padding: `low` before, `high` after, `interior` between elements (empty: none)",
))


# ---- scatter_add (the transpose of gather)


def _scatter_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    updates, idx = types
    axis, size = attrs["axis"], attrs["size"]
    require(idx.dtype == "i32", f"scatter_add: indices must be i32, got {idx}")
    require(size >= 1, f"scatter_add: size must be positive, got {size}")
    require(0 <= axis and axis + idx.rank <= updates.rank,
            f"scatter_add: updates {updates} cannot hold indices {idx} at axis {axis}")
    require(updates.shape[axis:axis + idx.rank] == idx.shape,
            f"scatter_add: updates {updates} dims {axis}..{axis + idx.rank - 1} must match indices {idx}")
    return (TensorType(updates.shape[:axis] + (size,) + updates.shape[axis + idx.rank:], updates.dtype),)


def _scatter_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    updates, idx = operand_types
    axis = attrs["axis"]
    idx_dims = [f"i{k}" for k in range(idx.rank)]
    prefix = [f"p{d}" for d in range(axis)]
    suffix = [f"p{d}" for d in range(axis + idx.rank, updates.rank)]
    # The index dims are summed over: sharding them leaves partial sums (the
    # embedding gradient of a batch-sharded lookup).
    return FactorRule.build(operand_types, result_types, [prefix + idx_dims + suffix, idx_dims],
                            [prefix + ["v"] + suffix], combiners={n: "sum" for n in idx_dims}, opaque=["v"])


def _scatter_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    # One add per update element; reads updates and indices, writes the result.
    return OpCost(operand_types[0].num_elements, io_bytes(operand_types, result_types))


def _scatter_impl(args, attrs: Attrs):
    updates, idx = args
    axis, size = attrs["axis"], attrs["size"]
    flat = updates.reshape(updates.shape[:axis] + (-1,) + updates.shape[axis + idx.ndim:])
    out = np.zeros(updates.shape[:axis] + (size,) + updates.shape[axis + idx.ndim:], updates.dtype)
    # Indices clamp like gather's, so scatter_add stays gather's exact transpose.
    np.add.at(out, (slice(None),) * axis + (np.clip(idx, 0, size - 1).ravel(),), flat)
    return (out,)


register(OpDef(
    "scatter_add", "layout", 2, (AttrSpec("axis", attr_int, 0), AttrSpec("size", attr_int)),
    _scatter_infer, _scatter_factors, _scatter_cost, impl=_scatter_impl,
    vjp=lambda b, op, g, wanted: (b.gather(g, op.operands[1], op.attrs["axis"]), None),
    doc="zeros of `size` along `axis`, plus each update added at its index (gather's transpose)",
))


# ---- generators: iota, full, constant


def no_operands(b, op, g, wanted) -> tuple:
    return ()


def _generated_cost(operand_types: Types, result_types: Types, attrs: Attrs) -> OpCost:
    return OpCost(0, result_types[0].num_bytes)


def mirrored_order(n: int, pairs: int) -> np.ndarray:
    """0, 1, ..., n - 1 laid out in 2 * pairs chunks, mirrored pairs side by
    side: chunks 0, 2p-1, 1, 2p-2, ... (the identity for pairs 0). A causal
    sequence in this order, split into k contiguous parts with k dividing
    `pairs`, gives each part the same attention work (`ir.opset.attention`)."""
    if not pairs:
        return np.arange(n)
    size = n // (2 * pairs)
    chunks = [c for pair in range(pairs) for c in (pair, 2 * pairs - 1 - pair)]
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in chunks])


def _iota_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    shape = attrs["shape"]
    _check_shape("iota", shape)
    check_dim("iota", attrs["dimension"], len(shape))
    require(attrs["dtype"] != "bool", "iota: dtype must be numeric")
    pairs, count = attrs["mirrored"], shape[attrs["dimension"]]
    require(pairs >= 0 and count % max(2 * pairs, 1) == 0,
            f"iota: mirrored={pairs} needs a count that splits into {2 * pairs} chunks, got {count}")
    return (TensorType(shape, attrs["dtype"]),)


def _iota_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    names = [f"d{d}" for d in range(result_types[0].rank)]
    return FactorRule.build((), result_types, [], [names], opaque=[names[attrs["dimension"]]])


def _iota_impl(args, attrs: Attrs):
    shape, dim = attrs["shape"], attrs["dimension"]
    line = mirrored_order(shape[dim], attrs["mirrored"])
    expanded = [1] * len(shape)
    expanded[dim] = shape[dim]
    return (np.broadcast_to(line.reshape(expanded), shape).copy(),)


register(OpDef(
    "iota", "layout", 0,
    (AttrSpec("shape", attr_ints), AttrSpec("dtype", attr_dtype), AttrSpec("dimension", attr_int, 0),
     AttrSpec("mirrored", attr_int, 0)),
    _iota_infer, _iota_factors, _generated_cost, impl=_iota_impl, localize=local_shape_attrs, vjp=no_operands,
    doc="0, 1, 2, ... counting along `dimension` (with `mirrored`, in `mirrored_order`)",
))


def _full_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    _check_shape("full", attrs["shape"])
    return (TensorType(attrs["shape"], attrs["dtype"]),)


def _full_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    return FactorRule.build((), result_types, [], [[f"d{d}" for d in range(result_types[0].rank)]])


register(OpDef(
    "full", "layout", 0,
    (AttrSpec("shape", attr_ints), AttrSpec("dtype", attr_dtype), AttrSpec("value", attr_number)),
    _full_infer, _full_factors, _generated_cost,
    impl=lambda args, attrs: (np.full(attrs["shape"], attrs["value"]),),
    localize=local_shape_attrs,
    vjp=no_operands,
    doc="a tensor filled with one scalar `value`",
))


def attr_hex(v: Any) -> str:
    if not isinstance(v, str) or (v and not (v.startswith("0x") and _is_hex(v[2:]))):
        raise ValueError(f"expected a hex string of bytes like 0x00FF, got {str(v)[:40]!r}")
    return v


def _is_hex(digits: str) -> bool:
    # bytes.fromhex checks megabytes in milliseconds, where a regex takes a third of a second.
    try:
        bytes.fromhex(digits)
    except ValueError:
        return False
    return " " not in digits


def constant_array(attrs: Attrs) -> np.ndarray:
    """The literal's elements, from `value` or from the raw bytes in `data`."""
    shape, dtype = attrs["shape"], attrs["dtype"]
    if not attrs["data"]:
        return np.array(attrs["value"]).reshape(shape)
    raw = bytes.fromhex(attrs["data"][2:])
    if dtype == "bf16":  # the top half of an f32
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, np.dtype(NUMPY_DTYPES[dtype]).newbyteorder("<")).reshape(shape)


def _constant_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    shape, dtype = attrs["shape"], attrs["dtype"]
    _check_shape("constant", shape)
    if attrs["data"]:
        require(not attrs["value"], "constant: give value or data, not both")
        size = (len(attrs["data"]) - 2) // 2
        require(size == math.prod(shape) * DTYPE_BYTES[dtype],
                f"constant: {size} bytes of data for shape {list(shape)} of {dtype} "
                f"({math.prod(shape) * DTYPE_BYTES[dtype]} bytes)")
    else:
        require(len(attrs["value"]) == math.prod(shape),
                f"constant: {len(attrs['value'])} values given for shape {list(shape)} ({math.prod(shape)} elements)")
    return (TensorType(shape, dtype),)


def _constant_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    names = [f"d{d}" for d in range(result_types[0].rank)]
    return FactorRule.build((), result_types, [], [names], opaque=names)


register(OpDef(
    "constant", "layout", 0,
    (AttrSpec("shape", attr_ints), AttrSpec("dtype", attr_dtype), AttrSpec("value", attr_numbers, ()),
     AttrSpec("data", attr_hex, "")),
    _constant_infer, _constant_factors, _generated_cost,
    impl=lambda args, attrs: (constant_array(attrs),),
    vjp=no_operands,
    doc="a dense literal: `value` in row-major order, or `data`, its little-endian bytes in hex (how large "
        "literals are kept: a tuple of millions of Python numbers would not be)",
))
