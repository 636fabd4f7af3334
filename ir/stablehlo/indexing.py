"""Handlers of indexing ops: gather and scatter in every form jax prints,
dynamic slices, and argmax / argmin (a reduction of (value, index) pairs).

The embedding forms (`table[ids]` and its gradient) map to the `gather` and
`scatter_add` kinds the model builders use, whose lowering is well
trodden; every other gather or additive scatter maps to `general_gather`
or `general_scatter`, which carry StableHLO's dimension numbers."""

from __future__ import annotations

import re

from ir.core import Value
from ir.stablehlo.importer import Importer, Scope, handles, region_combiner
from ir.stablehlo.reader import Stmt

GATHER_FIELDS = ("offset_dims", "collapsed_slice_dims", "operand_batching_dims", "start_indices_batching_dims",
                 "start_index_map")
SCATTER_FIELDS = ("update_window_dims", "inserted_window_dims", "input_batching_dims",
                  "scatter_indices_batching_dims", "scatter_dims_to_operand_dims")


def dimension_numbers(imp: Importer, stmt: Stmt, kind: str) -> dict[str, list[int]]:
    """The fields of a `#stablehlo.gather<...>` or `#stablehlo.scatter<...>`;
    an absent field is empty, an absent index_vector_dim 0 (as printed)."""
    m = re.search(rf"#stablehlo\.{kind}<([^>]*)>", stmt.rest)
    if m is None:
        raise imp.error(stmt, f"stablehlo.{kind}: missing #stablehlo.{kind}<...> dimension numbers")
    out: dict[str, list[int]] = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|-?\d+)", m.group(1)):
        out[key] = [int(v) for v in value.strip("[]").split(",") if v.strip()]
    out.setdefault("index_vector_dim", [0])
    return out


def _operands(imp: Importer, stmt: Stmt, scope: Scope, n: int) -> list[Value]:
    args = imp.args(stmt, scope, stmt.rest.split(")")[0])
    if len(args) != n:
        raise imp.error(stmt, f"{stmt.op}: expected {n} operands, found {len(args)} (several operands at once are "
                        "not supported)")
    return args


@handles("stablehlo.gather")
def gather(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    table, idx = _operands(imp, stmt, scope, 2)
    numbers = dimension_numbers(imp, stmt, "gather")
    sizes = imp.ints(stmt, "slice_sizes")
    (ivd,) = numbers["index_vector_dim"]
    lookup = (numbers.get("collapsed_slice_dims") == [0] and numbers.get("start_index_map") == [0]
              and ivd == idx.type.rank - 1 and idx.type.shape[-1:] == (1,) and idx.type.dtype == "i32"
              and sizes == [1, *table.type.shape[1:]] and not numbers.get("operand_batching_dims")
              and numbers.get("offset_dims") == list(range(idx.type.rank - 1, idx.type.rank + table.type.rank - 2)))
    if lookup:  # table[ids]: rows of the table's first dimension
        rows = imp.op("reshape", [idx], shape=list(idx.type.shape[:-1]))
        return [imp.checked(stmt, scope, "gather", [table, rows], axis=0)]
    return [imp.checked(stmt, scope, "general_gather", [table, idx], index_vector_dim=ivd, slice_sizes=sizes,
                        **{f: numbers.get(f, []) for f in GATHER_FIELDS})]


@handles("stablehlo.scatter")
def scatter(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """An additive scatter: updates added into the operand (jax's gradient
    of a gather). Scattered into known zeros it is the scatter alone;
    otherwise the operand is added."""
    operand, idx, updates = _operands(imp, stmt, scope, 3)
    combiner = region_combiner(imp, stmt) if len(stmt.region) == 2 else "the region's value"
    if combiner != "add":
        raise imp.error(stmt, f"stablehlo.scatter: only additive scatters are supported (this region returns "
                        f"{combiner}; a `.at[].set` or a max scatter is not)")
    numbers = dimension_numbers(imp, stmt, "scatter")
    (ivd,) = numbers["index_vector_dim"]
    rows = (numbers.get("inserted_window_dims") == [0] and numbers.get("scatter_dims_to_operand_dims") == [0]
            and ivd == idx.type.rank - 1 and idx.type.shape[-1:] == (1,) and idx.type.dtype == "i32"
            and not numbers.get("input_batching_dims")
            and updates.type.shape == idx.type.shape[:-1] + operand.type.shape[1:])
    known = imp.known.get(id(operand))
    zeros = known is not None and not known.any()
    if rows:
        kind, operands, attrs = "scatter_add", [updates, imp.op("reshape", [idx], shape=list(idx.type.shape[:-1]))], \
            {"axis": 0, "size": operand.type.shape[0]}
    else:
        kind, operands, attrs = "general_scatter", [idx, updates], {
            "index_vector_dim": ivd, "shape": list(operand.type.shape),
            **{f: numbers.get(f, []) for f in SCATTER_FIELDS}}
    if zeros:
        return [imp.checked(stmt, scope, kind, operands, **attrs)]
    return [imp.checked(stmt, scope, "add", [operand, imp.op(kind, operands, **attrs)])]


@handles("stablehlo.dynamic_slice")
def dynamic_slice(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """A static `slice` where every start is known (a scanned layer's weight
    at the loop counter), else a `dynamic_slice`."""
    x, *starts = imp.args(stmt, scope)
    sizes = imp.ints(stmt, "sizes")
    known = [imp.known_int(s) for s in starts]
    if len(known) == len(sizes) == x.type.rank and all(k is not None for k in known):
        begin = [min(max(k, 0), n - s) for k, n, s in zip(known, x.type.shape, sizes)]
        return [imp.checked(stmt, scope, "slice", [x], start=begin, limit=[b + s for b, s in zip(begin, sizes)])]
    return [imp.checked(stmt, scope, "dynamic_slice", [x, *starts], sizes=sizes)]


@handles("stablehlo.dynamic_update_slice")
def dynamic_update_slice(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    return [imp.checked(stmt, scope, "dynamic_update_slice", imp.args(stmt, scope))]


def multi_operand_reduce(imp: Importer, stmt: Stmt, scope: Scope, pairs: list) -> list[Value]:
    """jnp.argmax / argmin: a reduction of (value, index) pairs whose region
    keeps the greater (GT) or smaller (LT) value and, on ties, the smaller
    index; the indices are an iota along the reduced dimension."""
    dims = imp.ints(stmt, "dimensions")
    if len(pairs) != 2 or len(dims) != 1:
        raise imp.error(stmt, "stablehlo.reduce: of several operands only argmax and argmin (two operands, one "
                        "dimension) are supported")
    values, indices = (scope.get(name, imp, stmt) for name, _ in pairs)
    compares = [re.match(r"(GT|LT|GE|LE|EQ|NE)", s.rest) for s in stmt.region if s.op == "stablehlo.compare"]
    kinds = {s.op for s in stmt.region} - {"stablehlo.compare", "stablehlo.or", "stablehlo.and", "stablehlo.select",
                                            "stablehlo.return", "return"}
    producer = next((op for op in reversed(imp.b.body) if indices in op.results), None)
    first = compares[0].group(1) if compares and compares[0] else None
    if kinds or first not in ("GT", "LT") or producer is None or producer.kind != "iota" \
            or producer.attrs["dimension"] != dims[0]:
        raise imp.error(stmt, "stablehlo.reduce: of several operands only argmax and argmin (values with an iota "
                        "along the reduced dimension, a compare-and-select region) are supported")
    kind, combiner = ("argmax", "max") if first == "GT" else ("argmin", "min")
    best = imp.checked(stmt, scope, "reduce", [values], result=0, dims=dims, combiner=combiner)
    where = imp.checked(stmt, scope, kind, [values], result=1, dim=dims[0], dtype=indices.type.dtype)
    return [best, where]
