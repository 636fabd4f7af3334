"""Handlers of structure rather than arithmetic: calls (inlined), `while`
loops with a static trip count (unrolled), conditionals (`case`, `if`),
`optimization_barrier` (the values pass through) and the sharding
annotations jax emits (the values pass through; the annotation is recorded
as the user's constraint).

A conditional (`lax.cond`, `lax.switch`; optax.MultiSteps' test whether to
skip a step, which is known: never) whose index is known at import time is
its branch. Otherwise every branch is computed and each result selected by the
index, which computes the same values: the IR is straight-line, so a
plan shards both branches and the cost model prices both, where XLA runs
one. The import says so (`ImportedModule.notes`, shown by `explain`)."""

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


@handles("stablehlo.case")
def case(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """`lax.switch`/`lax.cond`: branch i for index i, the last branch for an
    index out of range (StableHLO's semantics)."""
    (index,) = _operand(imp, stmt, scope)
    if index.type.shape != () or index.type.dtype != "i32":
        raise imp.error(stmt, f"stablehlo.case: the index must be a scalar i32, got {index.type}")
    known = imp.known_int(index)
    count = len(stmt.regions)
    if known is not None:
        return _branch(imp, stmt, scope, known if 0 <= known < count else count - 1)
    outs = [_branch(imp, stmt, scope, i) for i in range(count)]
    chosen = outs[-1]
    for i in reversed(range(count - 1)):
        at = imp.op("full", [], shape=[], dtype="i32", value=i)
        chosen = _selected(imp, stmt, scope, imp.op("compare", [index, at], direction="eq"), outs[i], chosen,
                           last=i == 0)
    imp.notes.append(f"line {stmt.line}: stablehlo.case with an index known only at run time: its {count} branches "
                     "are all computed and each result selected by the index (XLA runs one branch; the plan and "
                     "its cost cover all)")
    return chosen


@handles("stablehlo.if")
def if_(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """The first region where the predicate holds, the second where not."""
    (pred,) = _operand(imp, stmt, scope)
    if pred.type.shape != () or pred.type.dtype != "bool":
        raise imp.error(stmt, f"stablehlo.if: the predicate must be a scalar i1, got {pred.type}")
    if len(stmt.regions) != 2:
        raise imp.error(stmt, f"stablehlo.if: expected two regions (true, false), found {len(stmt.regions)}")
    known = imp.known.get(id(pred))
    if known is not None:
        return _branch(imp, stmt, scope, 0 if bool(known) else 1)
    on_true, on_false = _branch(imp, stmt, scope, 0), _branch(imp, stmt, scope, 1)
    imp.notes.append(f"line {stmt.line}: stablehlo.if with a predicate known only at run time: both branches are "
                     "computed and each result selected by the predicate (XLA runs one branch; the plan and its "
                     "cost cover both)")
    return _selected(imp, stmt, scope, pred, on_true, on_false, last=True)


def _operand(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """A conditional's one operand, `"stablehlo.case"(%i) ({...`."""
    args = imp.args(stmt, scope, stmt.rest.split(")")[0])
    if len(args) != 1 or not stmt.regions:
        raise imp.error(stmt, f"{stmt.op}: expected one operand and a region per branch")
    return args


def _branch(imp: Importer, stmt: Stmt, scope: Scope, i: int) -> list[Value]:
    """Branch i emitted (a branch reads the enclosing values; it has no arguments)."""
    region = stmt.regions[i]
    if region.args:
        raise imp.error(stmt, f"{stmt.op}: branch {i} takes arguments; a branch reads the values around it")
    out = imp.block(region.body, Scope(dict(scope.values)))
    declared = imp.declared(stmt)
    if out is None or [v.type for v in out] != declared:
        got = "no return" if out is None else ", ".join(str(v.type) for v in out)
        raise imp.error(stmt, f"{stmt.op}: branch {i} returns {got}, the op declares "
                        f"{', '.join(map(str, declared))}")
    return out


def _selected(imp: Importer, stmt: Stmt, scope: Scope, pred: Value, on_true: list[Value], on_false: list[Value],
              last: bool) -> list[Value]:
    """Each result of `on_true` where the scalar `pred` holds, else of `on_false`
    (checked against the declared types, and named, by the `last` select)."""
    out = []
    for i, (a, b) in enumerate(zip(on_true, on_false)):
        spread = imp.op("broadcast_in_dim", [pred], shape=list(a.type.shape), dims=[])
        out.append(imp.checked(stmt, scope, "select", [spread, a, b], result=i) if last
                   else imp.op("select", [spread, a, b]))
    return out


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
