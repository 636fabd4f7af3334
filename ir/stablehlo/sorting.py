"""Handlers of sorting: `stablehlo.sort` (jnp.sort, argsort, lax.sort with
payloads) and `chlo.top_k` (lax.top_k, what a mixture of experts routes
tokens with).

A sort's comparator is a region; the registry's `sort` and `argsort` order
by value (`ir.opset.sorting`), so a comparator is read, not run: it must
compare one operand's pair of block arguments with LT or GT, each argument
at most canonicalized as jax does (-0.0 to 0.0, any NaN to one NaN, which
the registry's order already treats alike). The compared operand (the
keys) is sorted; every other operand (a payload) is read at the keys'
sorted positions, and an iota along the sorted dimension (argsort's
payload) is those positions themselves. Anything else in a comparator (two
keys, a transformed key) is refused at its line.

`chlo.top_k(x, k)` is the first k of x sorted from the largest along its
last dimension, and of their positions; equal values keep the lowest
position first and 0.0 comes before -0.0, as XLA's TopK does.
"""

from __future__ import annotations

import re

import numpy as np

from ir.core import Value
from ir.stablehlo.basic import parse_literal
from ir.stablehlo.importer import RETURNS, Importer, Scope, handles
from ir.stablehlo.reader import VALUE, Stmt

DIRECTIONS = {"LT": "ascending", "GT": "descending"}


@handles("stablehlo.sort")
def sort(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    operands = imp.args(stmt, scope, stmt.rest.split(")")[0])
    if not operands or len(stmt.regions) != 1:
        raise imp.error(stmt, "stablehlo.sort: expected operands and one comparator region")
    dim = imp.int_attr(stmt, "dimension")
    key, order = comparator(imp, stmt, len(operands))
    keys = operands[key]
    if not 0 <= dim < keys.type.rank:
        raise imp.error(stmt, f"stablehlo.sort: dimension {dim} out of range for {keys.type}")
    where: Value | None = None
    results = []
    for i, operand in enumerate(operands):
        if i == key:
            results.append(imp.checked(stmt, scope, "sort", [keys], result=i, dim=dim, order=order))
        elif _iota_along(imp, operand, dim):
            results.append(imp.checked(stmt, scope, "argsort", [keys], result=i, dim=dim, order=order,
                                       dtype=operand.type.dtype))
        else:
            if where is None:
                where = imp.op("argsort", [keys], dim=dim, order=order)
                where = imp.op("reshape", [where], shape=[*keys.type.shape, 1])
            results.append(imp.checked(stmt, scope, "general_gather", [operand, where], result=i,
                                       **take_along(dim, keys.type.rank)))
    return results


def take_along(dim: int, rank: int) -> dict[str, list[int] | int]:
    """general_gather's attributes of `np.take_along_axis(x, positions, dim)`
    with the positions given a trailing index vector of one."""
    others = [d for d in range(rank) if d != dim]
    return {"offset_dims": [], "collapsed_slice_dims": [dim], "operand_batching_dims": others,
            "start_indices_batching_dims": others, "start_index_map": [dim], "index_vector_dim": rank,
            "slice_sizes": [1] * rank}


def _iota_along(imp: Importer, value: Value, dim: int) -> bool:
    producer = next((op for op in reversed(imp.b.body) if value in op.results), None)
    return producer is not None and producer.kind == "iota" and producer.attrs["dimension"] == dim


def comparator(imp: Importer, stmt: Stmt, operands: int) -> tuple[int, str]:
    """The operand a sort's comparator orders by and the order (module
    docstring), or an error naming what the comparator does instead."""
    region = stmt.regions[0]
    args = region.args
    if len(args) != 2 * operands:
        raise imp.error(stmt, f"stablehlo.sort: the comparator takes {len(args)} argument(s), "
                        f"expected 2 per operand ({2 * operands})")
    defs = {s.results[0]: s for s in region.body if len(s.results) == 1}
    returned = next((re.findall(VALUE, s.rest) for s in region.body if s.op in RETURNS), None)
    compare = defs.get(returned[0]) if returned and len(returned) == 1 else None
    m = re.match(r"(\w+)\s*,\s*(" + VALUE + r")\s*,\s*(" + VALUE + ")", compare.rest) if compare else None
    unsupported = imp.error(stmt, "stablehlo.sort: the comparator must return one LT or GT compare of one "
                            "operand's two values, each as it is or canonicalized as jax does; a comparator on "
                            "several keys or on a function of a key is not supported")
    if compare is None or compare.op != "stablehlo.compare" or m is None or m.group(1) not in DIRECTIONS:
        raise unsupported
    first, second = (_canonical(imp, defs, args, v) for v in m.group(2, 3))
    if first is None or second is None or {first, second} != {first - first % 2, first - first % 2 + 1}:
        raise unsupported
    ascending = (m.group(1) == "LT") == (first % 2 == 0)
    return first // 2, "ascending" if ascending else "descending"


def _canonical(imp: Importer, defs: dict[str, Stmt], args: list[str], name: str) -> int | None:
    """The block argument `name` is, through jax's canonicalizing selects:
    `select(x == 0, 0, x)` and `select(x != x, NaN, y)`; else None."""
    for _ in range(len(defs) + 1):
        if name in args:
            return args.index(name)
        select = defs.get(name)
        if select is None or select.op != "stablehlo.select":
            return None
        pred, chosen, rest = re.findall(VALUE, select.rest.split(" : ")[0])[:3]
        test, constant = defs.get(pred), defs.get(chosen)
        if test is None or test.op != "stablehlo.compare" or constant is None or constant.op != "stablehlo.constant":
            return None
        value = _scalar(imp, constant)
        operands = re.match(r"(\w+)\s*,\s*(" + VALUE + r")\s*,\s*(" + VALUE + ")", test.rest)
        if operands is None:
            return None
        direction, lhs, rhs = operands.groups()
        zero = direction == "EQ" and value == 0 and lhs == rest and _scalar(imp, defs.get(rhs)) == 0
        # jax tests the NaN on the argument itself and selects over its zero-canonicalized form.
        nan = (direction == "NE" and value is not None and np.isnan(value) and lhs == rhs
               and _canonical(imp, defs, args, lhs) == _canonical(imp, defs, args, rest) is not None)
        if not (zero or nan):
            return None
        name = rest
    return None


def _scalar(imp: Importer, stmt: Stmt | None) -> float | None:
    """A scalar constant's value, or None for anything else."""
    if stmt is None or stmt.op != "stablehlo.constant":
        return None
    m = re.match(r"dense<(.*)>\s*$", stmt.rest.rsplit(" : ", 1)[0].strip())
    (ty,) = imp.declared(stmt)
    if m is None or ty.shape != ():
        return None
    return float(parse_literal(m.group(1), ty)[0])


@handles("chlo.top_k")
def top_k(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    args = imp.args(stmt, scope, stmt.rest.split(" : ")[0])
    if len(args) != 1 or len(stmt.results) != 2:
        raise imp.error(stmt, "chlo.top_k: expected one operand, `k = N` and two results (values, indices)")
    (x,) = args
    k = imp.int_attr(stmt, "k")
    if x.type.rank == 0 or not 0 <= k <= x.type.shape[-1]:
        raise imp.error(stmt, f"chlo.top_k: k = {k} is not between 0 and the last dimension of {x.type}")
    dim = x.type.rank - 1
    _, index_type = imp.declared(stmt)
    order = {"dim": dim, "order": "descending", "zeros": "ordered"}
    return [_first(imp, stmt, scope, 0, k, imp.op("sort", [x], **order)),
            _first(imp, stmt, scope, 1, k, imp.op("argsort", [x], dtype=index_type.dtype, **order))]


def _first(imp: Importer, stmt: Stmt, scope: Scope, result: int, k: int, ordered: Value) -> Value:
    """The first k along the last dimension of `ordered`, checked as the statement's `result`-th result."""
    shape = ordered.type.shape
    return imp.checked(stmt, scope, "slice", [ordered], result=result, start=[0] * len(shape),
                       limit=[*shape[:-1], k])


__all__ = ["comparator", "take_along"]
