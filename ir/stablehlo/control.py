"""Handlers of structure rather than arithmetic: calls (inlined), `while`
loops with a static trip count (unrolled), `optimization_barrier` (the
values pass through) and the sharding annotations jax emits (the values
pass through; the annotation is recorded as the user's constraint)."""

from __future__ import annotations

import re

from ir.core import Value
from ir.stablehlo.importer import Importer, Scope, handles
from ir.stablehlo.reader import VALUE, Stmt

MAX_CALL_DEPTH = 64
MAX_TRIPS = 4096  # a loop that runs longer is not a layer stack; unrolling it would not help


@handles("call", "func.call")
def call(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    m = re.match(r"@([\w.$-]+)\((.*?)\)\s*:", stmt.rest)
    if m is None:
        raise imp.error(stmt, "call: expected call @name(%args) : ...")
    callee = imp.funcs.get(m.group(1))
    if callee is None:
        raise imp.error(stmt, f"call: no function @{m.group(1)} in the module")
    args = imp.args(stmt, scope, m.group(2))
    if len(args) != len(callee.args):
        raise imp.error(stmt, f"call: @{callee.name} takes {len(callee.args)} argument(s), {len(args)} given")
    if imp.depth >= MAX_CALL_DEPTH:
        raise imp.error(stmt, f"call: calls nested more than {MAX_CALL_DEPTH} deep (recursion?)")
    imp.depth += 1
    try:
        return imp.function(callee, args)
    finally:
        imp.depth -= 1


@handles("stablehlo.while")
def while_loop(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """Unrolled: the condition is evaluated on the known values of the loop
    state (jax's `scan` and `fori_loop` count with a constant-initialised
    counter), and the body is emitted once per trip. A stacked parameter
    read by `dynamic_slice` at the counter becomes a static slice per trip,
    so each layer's slice of it is sharded like an unrolled layer's weight."""
    header = stmt.rest.split(" : ")[0]
    inits = re.findall(r"%[\w.$-]+\s*=\s*(" + VALUE + ")", header)
    values = [scope.get(n, imp, stmt) for n in inits]
    if len(stmt.regions) != 2:
        raise imp.error(stmt, "stablehlo.while: expected a cond { ... } and a do { ... } region")
    cond, body = stmt.regions
    if len(cond.args) != len(values):
        raise imp.error(stmt, f"stablehlo.while: {len(cond.args)} iteration argument(s), "
                        f"{len(values)} initial value(s)")
    for trip in range(MAX_TRIPS + 1):
        outcome = imp.block(cond.body, Scope({**scope.values, **dict(zip(cond.args, values))}))
        if not outcome or len(outcome) != 1:
            raise imp.error(stmt, "stablehlo.while: the condition must return one boolean")
        decided = imp.known.get(id(outcome[0]))
        if decided is None:
            raise imp.error(stmt, "stablehlo.while: the trip count is not static (the condition depends on "
                            "values computed at run time); only loops with a static trip count are unrolled")
        if not bool(decided):
            return values
        if trip == MAX_TRIPS:
            break
        values = imp.block(body.body, Scope({**scope.values, **dict(zip(body.args, values))}))
        if values is None or len(values) != len(inits):
            raise imp.error(stmt, f"stablehlo.while: the body must return {len(inits)} value(s)")
    raise imp.error(stmt, f"stablehlo.while: more than {MAX_TRIPS} trips; not unrolled")


@handles("stablehlo.optimization_barrier")
def optimization_barrier(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """jax.checkpoint's fence: XLA must not move computation across it. The
    IR has no scheduling, so the values pass through unchanged."""
    return imp.args(stmt, scope)


# custom_call targets that state a sharding of their operand and return it unchanged.
SHARDING_TARGETS = ("Sharding", "mhlo.sharding")


@handles("stablehlo.custom_call")
def custom_call(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    m = re.match(r"@([\w.$-]+)\((.*?)\)", stmt.rest)
    if m is None:
        raise imp.error(stmt, "stablehlo.custom_call: expected @target(%args)")
    target = m.group(1)
    if target not in SHARDING_TARGETS:
        raise imp.error(stmt, f"stablehlo.custom_call @{target} is not supported (only @Sharding, the sharding "
                        "constraint jax emits); an op jax lowers to a library call has no registry semantics")
    args = imp.args(stmt, scope, m.group(2))
    if len(args) != 1 or len(stmt.results) != 1:
        raise imp.error(stmt, "stablehlo.custom_call @Sharding: expected one operand and one result")
    sharding = re.search(r'mhlo\.sharding\s*=\s*"([^"]*)"', stmt.rest)
    imp.constraints.append((args[0].name, sharding.group(1) if sharding else ""))
    return args


@handles("sdy.sharding_constraint")
def sharding_constraint(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """Shardy's `sdy.sharding_constraint %x <@mesh, [{"b"}, {}]>`."""
    args = imp.args(stmt, scope, stmt.rest.split("<")[0])
    if len(args) != 1 or len(stmt.results) != 1:
        raise imp.error(stmt, "sdy.sharding_constraint: expected one operand and one result")
    m = re.search(r"<(@.*)>", stmt.rest.split(" : ")[0])
    imp.constraints.append((args[0].name, m.group(1) if m else ""))
    return args


def sdy_axes(text: str, rank: int) -> tuple[tuple[str, ...], ...] | None:
    """Per dimension, the mesh axes of a Shardy sharding `@mesh, [{"b"}, {}]`;
    None for another form (an HLO sharding `{devices=[2,1]<=[2]}` names
    devices, not axes) or a rank that does not match."""
    m = re.fullmatch(r'\s*@[\w.$-]+\s*,\s*\[(.*)\]\s*(?:,.*)?', text)
    if m is None:
        return None
    dims = re.findall(r"\{([^}]*)\}", m.group(1))
    if len(dims) != rank:
        return None
    return tuple(tuple(re.findall(r'"([^"]+)"', d)) for d in dims)
