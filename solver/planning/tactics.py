"""Tactics and schedules (PartIR): a schedule is a list of tactics applied in
order to a growing `Plan`; a later tactic never undoes an earlier one (its
decisions come after, and earlier decisions win on a contended axis).

  Manual(axis, values)   shard parameters (name or glob -> dimension, or
                         "first_divisible") along `axis`; a pattern that
                         names no parameter names op results, pinned where
                         they are made. The dimensions it
                         names are pinned first, then each one's sharding
                         propagates along its color, stopping where the axis
                         is taken: otherwise ZeRO-3's "every parameter on
                         its first dimension" could be pre-empted by another
                         parameter's color reaching a shared tensor (in the
                         MLP, w1's second dimension shares w2's first
                         dimension's color).
  Replicate(axis, values) keep the named parameters or results unsharded
                         along `axis` (PartIR's atomic). Naming results is
                         how ZeRO-2 keeps the updated parameters whole
                         while their optimizer state is sharded: the
                         update is all_gathered before it is applied.
                         With `dims` ((name or glob, dimension) of any
                         named value): that one dimension kept whole where
                         the value is made, recomputed and differentiated
                         (a layout boundary: expert parallelism's all_to_all).
  Pin(values)            shard named values' dimensions along mesh axes,
                         propagating like Manual: the program's own sharding
                         constraints (an imported jax program's
                         `with_sharding_constraint`s), applied first.
  RingAttention(axis)    run context parallelism's attention over `axis` as
                         a ring of key/value blocks (a lowering choice).
  Resolve(bits)          set resolution-class bits (`shardplan explain`
                         lists the classes and what each resolution shards).
  Auto(axes, solver, ...) run a search backend on the given axes, after the
                         earlier tactics (their decisions stay fixed); the
                         caller supplies the backend (`solver.planning.planner`), since
                         a search needs the cost model.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ir.core import IRError, Mesh, Recent, Value
from ir.nda import NDA
from ir.remat import REMAT_SUFFIX
from ir.sharding import Decision
from solver.plan import Plan

FIRST_DIVISIBLE = "first_divisible"


class TacticError(IRError):
    """A tactic names something the program or mesh does not have."""


@dataclass(frozen=True, slots=True)
class Manual:
    axis: str
    values: tuple[tuple[str, int | str], ...]  # (name or glob, dim or FIRST_DIVISIBLE)


@dataclass(frozen=True, slots=True)
class Replicate:
    axis: str
    values: tuple[str, ...]  # parameters or results (names or globs), every dimension
    dims: tuple[tuple[str, int], ...] = ()  # any named value of the program (name or glob), one dimension


@dataclass(frozen=True, slots=True)
class Pin:
    values: tuple[tuple[str, int, str], ...]  # (value name, dimension, axis)


@dataclass(frozen=True, slots=True)
class Resolve:
    bits: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Remat:
    """Recompute the forward of the layers matching `values` (globs over
    `layers.<l>`) in the backward: a change of the program, made when it is
    built (`ir.remat`), so `apply_schedule` passes over it."""

    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RingAttention:
    """Run the attention kernels whose keys and values context parallelism
    gathers over `axis` as rings instead (`ir.ring_attention`): a choice of
    the lowering, made after the plan, so `apply_schedule` passes over it."""

    axis: str


@dataclass(frozen=True, slots=True)
class Auto:
    axes: tuple[str, ...]
    solver: str = "cpsat"
    time_limit_s: float | None = None  # None: the solver's (`solver.search.default_time_limit_s`)
    workers: int = 1  # CP-SAT
    seed: int = 0
    iterations: int = 200  # MCTS trajectories
    rerank: int = 1  # CP-SAT: the best distinct plans the simulator re-ranks (1: none)


Tactic = Manual | Pin | Replicate | Resolve | Remat | RingAttention | Auto


Search = Callable[[Plan, Auto, str], Plan]


def apply_schedule(nda: NDA, mesh: Mesh, schedule: Sequence[Tactic], search: Search | None = None,
                   origins: Sequence[tuple[str, str]] = ()) -> Plan:
    """The plan a schedule builds, tactic by tactic. `search(plan, auto, where)`
    runs an auto tactic on the plan so far and returns the extended plan.
    `origins`: a training step's (`Model.origins`), which a `replicate` of a
    named value's dimension follows into its gradient's computation."""
    plan = Plan(mesh)
    for index, tactic in enumerate(schedule):
        where = f"schedule.{index}.{type(tactic).__name__.lower()}"
        if isinstance(tactic, Manual):
            plan = _manual(nda, plan, tactic, where)
        elif isinstance(tactic, Replicate):
            _check_axis(mesh, tactic.axis, where)
            named = _matching(nda, tactic.values, where, results=True) if tactic.values else []
            pairs = [(nda.def_iclass(v, d), tactic.axis) for v in named for d in range(v.type.rank)]
            pairs += [(k, tactic.axis) for k in _kept_whole(nda, _named_dims(nda, tactic.dims, where), origins)]
            plan = plan.with_replicated(pairs)
        elif isinstance(tactic, Pin):
            plan = _pin(nda, plan, tactic, where)
        elif isinstance(tactic, Resolve):
            plan = plan.with_resolutions(_checked_bits(nda, tactic.bits, where))
        elif isinstance(tactic, Remat):
            continue  # applied to the program when it is built (planner.prepare)
        elif isinstance(tactic, RingAttention):
            _check_axis(mesh, tactic.axis, where)  # applied by the lowering (planner._plan)
        else:
            for axis in tactic.axes:
                _check_axis(mesh, axis, where)
            if search is None:
                raise TacticError(f"{where}: an auto tactic needs a search backend and the cost model; "
                                  "run the schedule through solver.planning.planner.plan_spec")
            plan = search(plan, tactic, where)
    return plan


def _manual(nda: NDA, plan: Plan, tactic: Manual, where: str) -> Plan:
    _check_axis(plan.mesh, tactic.axis, where)
    # The plan so far is materialized only for a dimension chosen by it (`first_divisible`).
    sharding = plan.materialize(nda) if any(dim == FIRST_DIVISIBLE for _, dim in tactic.values) else None
    pins: list[tuple[Value, int]] = []
    for pattern, dim in tactic.values:
        for v in _manual_values(nda, pattern, where):
            d = _pick_dim(nda, sharding, v, dim, tactic.axis, plan.mesh, where)
            if d is not None and (v, d) not in pins:
                pins.append((v, d))
    pinned = [Decision(tactic.axis, nda.def_color(v, d), only=nda.def_iclass(v, d)) for v, d in pins]
    spread = [Decision(tactic.axis, nda.def_color(v, d), only=nda.def_iclass(v, d), spread=True) for v, d in pins]
    return plan.with_decisions(*pinned, *spread)


_MANUAL_VALUES = Recent(64)  # by program and pattern: a mesh search applies one schedule to a hundred meshes


def _manual_values(nda: NDA, pattern: str, where: str) -> list[Value]:
    """The parameters a manual pattern names or, where it names none, the op
    results (and their recomputations, `<name>.remat`): a layout inside the
    program, such as Ulysses' heads split between the two all_to_alls
    around attention, has no parameter to start from. (Matching every op's
    result of an 80-layer program is a tenth of a second a pattern: the
    last few programs' matches are kept.)"""
    def match() -> tuple[Value, ...]:
        params = [v for v in nda.function.params if fnmatch.fnmatchcase(v.name, pattern)]
        return tuple(params or _named([r for op in nda.function.ops for r in op.results], pattern))

    found = _MANUAL_VALUES.get((nda.function,), pattern, match)
    return list(found) or _matching(nda, (pattern,), where)  # the parameters' error message


def _named(values: Sequence[Value], pattern: str) -> list[Value]:
    """The values a name or glob names; a rematerialized layer's recomputed
    values (`<name>.remat`, `ir.remat`) are the same values again."""
    return [v for v in values if fnmatch.fnmatchcase(v.name.removesuffix(REMAT_SUFFIX), pattern)]


def _pin(nda: NDA, plan: Plan, tactic: Pin, where: str) -> Plan:
    values = {v.name: v for v in nda.function.params} | {v.name: v for op in nda.function.ops for v in op.results}
    pins = []
    for name, dim, axis in tactic.values:
        _check_axis(plan.mesh, axis, where)
        v = values.get(name)
        if v is None or not 0 <= dim < v.type.rank:
            raise TacticError(f"{where}: the program has no value %{name} with a dimension {dim}")
        pins.append((v, dim, axis))
    pinned = [Decision(axis, nda.def_color(v, d), only=nda.def_iclass(v, d)) for v, d, axis in pins]
    spread = [Decision(axis, nda.def_color(v, d), only=nda.def_iclass(v, d), spread=True) for v, d, axis in pins]
    return plan.with_decisions(*pinned, *spread)


def _pick_dim(nda: NDA, sharding, v: Value, dim: int | str, axis: str, mesh: Mesh, where: str) -> int | None:
    if dim != FIRST_DIVISIBLE:
        if not isinstance(dim, int) or not 0 <= dim < v.type.rank:
            raise TacticError(f"{where}: %{v.name} is {v.type}: dimension {dim!r} is not one of 0..{v.type.rank - 1}"
                              f" (or {FIRST_DIVISIBLE!r})")
        return dim
    dims = sharding.def_dims(nda, v)
    if any(axis in axes for axes in dims):
        return None  # already sharded along this axis
    for d in range(v.type.rank):
        ic = nda.iclasses[nda.def_iclass(v, d)]
        devices = math.prod(mesh.size(a) for a in dims[d]) * mesh.size(axis)
        if ic.shardable and v.type.shape[d] % devices == 0:
            return d
    return None


def _matching(nda: NDA, patterns: Sequence[str], where: str, results: bool = False) -> list[Value]:
    """The parameters (inputs, as in PartIR), and with `results` the
    function's results, matching any of the glob patterns."""
    values = list(nda.function.params) + (list(nda.function.results) if results else [])
    what = "parameter or result" if results else "parameter"
    out: list[Value] = []
    for pattern in patterns:
        found = [v for v in values if fnmatch.fnmatchcase(v.name, pattern)]
        if not found:
            names = [v.name for v in values]
            shown = ", ".join(names[:12]) + (f", ... ({len(names)} {what}s)" if len(names) > 12 else "")
            raise TacticError(f"{where}: no {what} matches {pattern!r}; {what}s: {shown}")
        out += [v for v in found if v not in out]
    return out


def _named_dims(nda: NDA, dims: Sequence[tuple[str, int]], where: str) -> list[tuple[Value, int]]:
    """Each (value, dimension) that a (name or glob, dimension) names among
    every named value of the program: parameters and op results alike (a
    builder names the values a schedule may need, `layers.3.moe.expert_in`),
    and a rematerialized value's recomputation with it."""
    values = list(nda.function.params) + [r for op in nda.function.ops for r in op.results]
    out: list[tuple[Value, int]] = []
    for pattern, dim in dims:
        found = _named(values, pattern)
        if not found:
            raise TacticError(f"{where}: no value of the program matches {pattern!r}")
        for v in found:
            if not 0 <= dim < v.type.rank:
                raise TacticError(f"{where}: %{v.name} is {v.type}: dimension {dim} is not one of 0..{v.type.rank - 1}")
            out.append((v, dim))
    return out


def _kept_whole(nda: NDA, named: Sequence[tuple[Value, int]], origins: Sequence[tuple[str, str]]) -> list[int]:
    """The I-classes that keep each value's dimension whole: its definition's
    (the factor of the op that makes it) and, in a training step, those of
    that dimension's color in the ops of its maker's backward (whose origin
    is the value): a layout constraint holds for the cotangent too (the
    transpose of jax's sharding constraint is the same constraint)."""
    made_for: dict[str, list[int]] = {}
    for i, op in enumerate(nda.function.ops):
        for r in op.results:
            made_for.setdefault(r.name, []).append(i)
    backward: dict[str, list[int]] = {}
    for result, origin in origins:
        backward.setdefault(origin, []).extend(made_for.get(result, ()))
    out: list[int] = []
    for v, d in named:
        k = nda.def_iclass(v, d)
        out.append(k)
        color = nda.iclasses[k].color
        for i in dict.fromkeys(backward.get(v.name, ())):
            op = nda.function.ops[i]
            for r in op.results:
                out += [nda.def_iclass(r, e) for e in range(r.type.rank) if nda.def_color(r, e) == color]
            for j, operand in enumerate(op.operands):
                out += [nda.use_iclass(i, j, e) for e in range(operand.type.rank) if nda.use_color(i, j, e) == color]
    return list(dict.fromkeys(out))


def _check_axis(mesh: Mesh, axis: str, where: str) -> None:
    if axis not in mesh.names:
        raise TacticError(f"{where}: unknown mesh axis {axis!r}; mesh axes: {', '.join(mesh.names)}")


def _checked_bits(nda: NDA, bits: tuple[tuple[int, int], ...], where: str) -> dict[int, int]:
    count = len(nda.resolution_classes)
    for k, bit in bits:
        if not 0 <= k < count:
            valid = f"0..{count - 1}" if count else "none: the program has no conflicts"
            raise TacticError(f"{where}: no resolution class {k}; classes: {valid}")
        if bit not in (0, 1):
            raise TacticError(f"{where}: resolution bits are 0 or 1, got {bit!r} for class {k}")
    return dict(bits)
