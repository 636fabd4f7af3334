"""A uniform pipeline priced from three of its stages.

A model of L equal layers cut into P stages of L / P layers has P - 2 inner
stages that run the same tasks under other names: each receives the same
values from its neighbours and sends the same values on. Lowering and
cutting the whole step costs time in proportion to L; pricing it needs only
the first stage, one inner stage and the last. `fold_pipeline` lowers those
three alone (`ir.lower.lower_ops`) as a three-stage pipeline: the last stage
reads what the inner stage makes in place of what stage P - 2 makes, and the
inner stage's backward reads what the last stage sends back in place of what
stage 2 sends. `costmodel.pipeline.pipeline_cost` then simulates the P
stages, each inner one running the inner stage's tasks, and gives each
stage the memory of its stand-in with its own microbatches in flight.

That is the whole step's price exactly when the inner stages are equal, and
`fold_pipeline` proves it before folding, on the global program and its
sharding: every inner stage has the same ops (kinds, attributes, result
types, factor shardings, how many read each result) reading the same kinds
of operands (their own earlier results by position, parameters by type and
sharding, the k-th value received from the stage at the same offset, by
type and sharding), and no value crosses a stage boundary with a pending
partial sum (its state is then its sharding, which the comparison saw). A
pipeline that is not so (layers that differ, a plan that shards some
layers differently, a stage that reads from one further away) is not
folded: the caller prices the whole one. tests/test_pipeline_fold.py checks
the folded price against the whole one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ir.core import Function, Mesh, Value, users
from ir.lower import LoweringError, LowerOptions, lower_ops
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import Pipeline, check_schedule, lower_pipeline, microbatch_sharding, value_stages
from ir.sharding import Decision, FactorSharding

FOLDED_STAGES = 3  # the first stage, one inner stage, the last


@dataclass(frozen=True, slots=True)
class Folded:
    """A three-stage pipeline standing for a longer one: `stage_map[s]` is
    the stage of `pipeline` that stage s of the step runs as, `chunks` the
    step's stages per device (interleaved)."""

    pipeline: Pipeline
    stage_map: tuple[int, ...]
    chunks: int = 1


def fold_pipeline(model: Model, nda: NDA, mesh: Mesh, decisions: Sequence[Decision], *, stages: int,
                  microbatches: int, schedule: str = "gpipe", resolutions: Mapping[int, int] | None = None,
                  replicated: Sequence[tuple[int, str]] = (), options: LowerOptions | None = None,
                  chunks: int = 1) -> Folded | None:
    """`ir.pipeline.pipeline_step`'s step folded to three stages (module
    docstring), or None when its inner stages are not provably equal or it
    has fewer than four stages (nothing to fold). Interleaved (`chunks` >
    1), it folds on three devices or more, where every transfer the fold
    keeps (between neighbours, or stage 1 or the first and the last) is
    between two devices; on two, stage 1 and the last share a device."""
    if stages <= FOLDED_STAGES or (chunks != 1 and stages // chunks < 3):
        return None
    check_schedule(schedule, stages, chunks)
    fn = model.function
    sharding = microbatch_sharding(model, nda, mesh, decisions, microbatches, resolutions, replicated)
    cut = _cut(model, nda, sharding, stages, (tuple(decisions), tuple(sorted((resolutions or {}).items())),
                                             tuple(replicated)))
    if cut is None:
        return None
    stage_of, keep, substitute, whole = cut
    try:
        lowered = lower_ops(fn, nda, sharding, keep, substitute, whole, options)
    except LoweringError:  # a value crosses a stage boundary with a pending partial sum
        return None
    last = stages - 1
    kept = {0, 1, last}
    params = {p.name for p in fn.params}
    stand_in = {s: (0 if s == 0 else 2 if s == last else 1) for s in range(stages)}
    three = {name: stand_in[s] for name, s in stage_of.items() if s in kept or name in params}
    forward = {r.name for op in fn.ops[:model.forward_ops] for r in op.results}
    # The three stand-ins are no interleaved pipeline of their own: `pipeline_cost` runs the step's
    # schedule over `stage_map` with `chunks`.
    pipeline = lower_pipeline(lowered, three, forward, FOLDED_STAGES, "gpipe" if chunks > 1 else schedule)
    return Folded(pipeline, tuple(stand_in[s] for s in range(stages)), chunks)


_CUTS: dict[tuple, tuple] = {}  # the last few `_cut`s, by program identity and plan
_CUTS_KEPT = 8


def _cut(model: Model, nda: NDA, sharding: FactorSharding, stages: int, plan: tuple) -> tuple | None:
    """Where the fold cuts the step (the stage of every value, the ops kept,
    the stand-ins, what must cross whole), or None when it cannot. It reads
    the sharding's axes, not their sizes, so it is the same for every count
    of microbatches: `choose_microbatches` prices several with one cut."""
    fn = model.function
    key = (id(fn), id(nda), stages, plan)
    if key in _CUTS and _CUTS[key][0] is fn and _CUTS[key][1] is nda:
        return _CUTS[key][2]
    stage_of = value_stages(fn, model.forward_ops, dict(model.origins), stages)
    members = _stage_members(fn, stage_of, stages)
    substitute = _stand_ins(fn, stage_of, members) if _inner_stages_equal(fn, nda, sharding, stage_of,
                                                                          members) else None
    cut = None
    if substitute is not None:
        last = stages - 1
        keep = sorted(members[0] + members[1] + members[last])
        # What crosses to or from an inner stage must cross whole: the inner stage then stands for all.
        # (Between the first and the last stage, a tied embedding's gradient crosses as a partial sum.)
        whole = {v for i in keep for v in fn.ops[i].operands if v not in fn.params
                 and stage_of[v.name] != stage_of[fn.ops[i].results[0].name]
                 and {stage_of[v.name], stage_of[fn.ops[i].results[0].name]} != {0, last}}
        cut = (stage_of, keep, substitute, whole)
    if len(_CUTS) >= _CUTS_KEPT:
        del _CUTS[next(iter(_CUTS))]
    _CUTS[key] = (fn, nda, cut)
    return cut


def _stage_members(fn: Function, stage_of: Mapping[str, int], stages: int) -> list[list[int]]:
    """Each stage's ops (indices, in program order)."""
    members: list[list[int]] = [[] for _ in range(stages)]
    for i, op in enumerate(fn.ops):
        members[stage_of[op.results[0].name]].append(i)
    return members


def _inner_stages_equal(fn: Function, nda: NDA, sharding: FactorSharding, stage_of: Mapping[str, int],
                        members: list[list[int]]) -> bool:
    """Every inner stage's ops equal stage 1's but for names (module docstring)."""
    uses = {v: len(us) for v, us in users(fn).items()}
    results = set(fn.results)
    params = set(fn.params)
    constant = _constants(fn)
    dims: dict[Value, tuple] = {}

    def sharded(v: Value) -> tuple:
        if v not in dims:
            dims[v] = sharding.def_dims(nda, v)
        return dims[v]

    def key(s: int) -> tuple:
        own: dict[Value, int] = {}
        received: dict[Value, int] = {}
        body = []
        for q, i in enumerate(members[s]):
            op = fn.ops[i]
            refs = []
            for v in op.operands:
                if v in own:
                    refs.append(("own", own[v]))
                elif v in params:
                    refs.append(("param", v.type, sharded(v)))
                elif v in constant:  # every task that reads a constant makes its own (`ir.pipeline`)
                    refs.append(("constant", constant[v]))
                else:
                    k = received.setdefault(v, len(received))
                    refs.append(("from", stage_of[v.name] - s, k, v.type, sharded(v)))
            (r,) = op.results
            factors = tuple(sharding.of(k) for k in nda.op_factor_iclass[i])
            body.append((op.kind, op.attrs, r.type, factors, tuple(refs), uses.get(r, 0), r in results))
            own[r] = q
        return tuple(body)

    first = key(1)
    return all(key(s) == first for s in range(2, len(members) - 1))


def _constants(fn: Function) -> dict[Value, int]:
    """The values made from constants alone (a causal mask), each with the
    index of its op: the same constant wherever it is read."""
    made: dict[Value, int] = {}
    for i, op in enumerate(fn.ops):
        if all(v in made for v in op.operands):
            made.update((r, i) for r in op.results)
    return made


def _stand_ins(fn: Function, stage_of: Mapping[str, int], members: list[list[int]]) -> dict[Value, Value] | None:
    """For each value a kept stage reads from a stage left out, the kept
    value read in its place: the last stage reads inner stage 1's value at
    the position stage P - 2 made its own; stage 1's backward reads what
    the last stage sends to stage P - 2 at the same op and operand. None
    when a kept stage reads from a stage left out in another way."""
    last = len(members) - 1
    position = {fn.ops[i].results[0]: q for s in range(len(members)) for q, i in enumerate(members[s])}
    substitute: dict[Value, Value] = {}
    for s in (0, 1, last):
        for q, i in enumerate(members[s]):
            for a, v in enumerate(fn.ops[i].operands):
                src = stage_of[v.name] if v in position else s
                if src in (0, 1, last):
                    continue
                if s == last and src == last - 1:
                    substitute[v] = fn.ops[members[1][position[v]]].results[0]
                elif s == 1 and src == 2:
                    w = fn.ops[members[last - 1][q]].operands[a]
                    if w not in position or stage_of[w.name] != last:
                        return None
                    substitute[v] = w
                else:
                    return None
    return substitute


__all__ = ["FOLDED_STAGES", "Folded", "fold_pipeline"]
