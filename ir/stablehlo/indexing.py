"""Handlers of indexing ops: gather and scatter (the embedding forms so
far), to be generalized."""

from __future__ import annotations

import re

from ir.core import Value
from ir.stablehlo.basic import region_combiner
from ir.stablehlo.importer import Importer, Scope, handles
from ir.stablehlo.reader import Stmt


def dimension_numbers(text: str) -> dict[str, list[int]]:
    """The fields of a `#stablehlo.gather<...>` or `#stablehlo.scatter<...>`."""
    m = re.search(r"#stablehlo\.(?:gather|scatter)<([^>]*)>", text)
    if m is None:
        return {}
    out: dict[str, list[int]] = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|\d+)", m.group(1)):
        out[key] = [int(v) for v in value.strip("[]").split(",") if v.strip()]
    return out


@handles("stablehlo.gather")
def gather(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """The embedding lookup form: rows of the operand at indices with a
    trailing index vector of size 1 (jax's `table[ids]`)."""
    table, idx = imp.args(stmt, scope, stmt.rest.split(")")[0])
    numbers = dimension_numbers(stmt.rest)
    sizes = imp.ints(stmt, "slice_sizes")
    lookup = (numbers.get("collapsed_slice_dims") == [0] and numbers.get("start_index_map") == [0]
              and numbers.get("index_vector_dim") == [idx.type.rank - 1] and idx.type.shape[-1:] == (1,)
              and sizes == [1, *table.type.shape[1:]]
              and numbers.get("offset_dims") == list(range(idx.type.rank - 1, idx.type.rank + table.type.rank - 2)))
    if not lookup:
        raise imp.error(stmt, "stablehlo.gather: only the embedding-lookup form (rows of the operand at "
                        "indices with a trailing index vector of size 1) is supported")
    rows = imp.op("reshape", [idx], shape=list(idx.type.shape[:-1]))
    return [imp.checked(stmt, scope, "gather", [table, rows], axis=0)]


@handles("stablehlo.scatter")
def scatter(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """The embedding-gradient form of `gather`'s transpose: updates added
    into rows of the operand (a scatter whose region adds)."""
    operand, idx, updates = imp.args(stmt, scope, stmt.rest.split(")")[0])
    numbers = dimension_numbers(stmt.rest)
    add = region_combiner(imp, stmt) == "add"
    rows_form = (numbers.get("inserted_window_dims") == [0] and numbers.get("scatter_dims_to_operand_dims") == [0]
                 and numbers.get("index_vector_dim") == [idx.type.rank - 1] and idx.type.shape[-1:] == (1,)
                 and updates.type.shape == idx.type.shape[:-1] + operand.type.shape[1:])
    if not (add and rows_form):
        raise imp.error(stmt, "stablehlo.scatter: only the embedding-gradient form (updates added into rows "
                        "of the operand at indices with a trailing index vector of size 1) is supported")
    rows = imp.op("reshape", [idx], shape=list(idx.type.shape[:-1]))
    known = imp.known.get(id(operand))
    if known is not None and not known.any():  # scattered into zeros: the scatter_add is the result
        return [imp.checked(stmt, scope, "scatter_add", [updates, rows], axis=0, size=operand.type.shape[0])]
    added = imp.op("scatter_add", [updates, rows], axis=0, size=operand.type.shape[0])
    return [imp.checked(stmt, scope, "add", [operand, added])]


def multi_operand_reduce(imp: Importer, stmt: Stmt, scope: Scope, pairs: list) -> list[Value]:
    raise imp.error(stmt, "stablehlo.reduce: only single-operand reductions `(%x init: %c)` are supported")
