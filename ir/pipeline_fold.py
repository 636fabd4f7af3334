"""A pipeline priced from its distinct stages.

A model of L equal layers cut into P stages has inner stages that run the
same tasks under other names: each receives the same values from its
neighbours and sends the same values on. Where P does not divide L they
come in two sizes (128 layers over 12 stages: 11 or 10 layers), each a
class of equal stages. Lowering and cutting the whole step costs time in
proportion to L; pricing it needs only the first stage, one stage of each
class and the last. `fold_pipeline` lowers those alone
(`ir.lower.lower_ops`) as a shorter pipeline, each kept stage reading, in
place of a value made by a stage left out, a stand-in: a value of equal
type and sharding that a kept stage made earlier in the step (the same
op's result in a kept stage of the left-out stage's class, or what another
stage of the reader's class reads at the same op and operand from a kept
stage). `costmodel.pipeline.pipeline_cost` then simulates the P stages,
each running its class's kept stage's tasks, and gives each stage the
memory of its stand-in with its own microbatches in flight.

That is the whole step's price exactly when the stages of a class are
equal, and `fold_pipeline` proves it before folding, on the global program
and its sharding: the stages of a class have the same ops (kinds,
attributes, result types, factor shardings, how many read each result)
reading the same kinds of operands (their own earlier results by position,
parameters by type and sharding, the k-th value received from the stage
at the same offset, by type and sharding), and no value crosses a stage
boundary with a pending partial sum (its state is then its sharding, which
the comparison saw). A backward that only a later stage of its own class
could feed keeps that stage too. A pipeline with as many distinct stages
as stages (a plan that shards each layer its own way) is not folded: the
caller prices the whole one. tests/test_pipeline_fold.py checks the folded
price against the whole one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from ir.core import Function, Mesh, Recent, Value, users
from ir.lower import LoweringError, LowerOptions, lower_ops
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import Pipeline, check_schedule, lower_pipeline, microbatch_sharding, value_stages
from ir.sharding import Decision, FactorSharding


@dataclass(frozen=True, slots=True)
class Folded:
    """A shorter pipeline standing for a longer one: `stage_map[s]` is the
    stage of `pipeline` that stage s of the step runs as, `chunks` the
    step's stages per device (interleaved)."""

    pipeline: Pipeline
    stage_map: tuple[int, ...]
    chunks: int = 1


def fold_pipeline(model: Model, nda: NDA, mesh: Mesh, decisions: Sequence[Decision], *, stages: int,
                  microbatches: int, schedule: str = "gpipe", resolutions: Mapping[int, int] | None = None,
                  replicated: Sequence[tuple[int, str]] = (), options: LowerOptions | None = None,
                  chunks: int = 1, sharding: FactorSharding | None = None) -> Folded | None:
    """`ir.pipeline.pipeline_step`'s step folded to its distinct stages
    (module docstring), or None when no stage can be left out (fewer than
    four stages, or every inner stage its own). Interleaved (`chunks` > 1),
    it folds on three devices or more, where every transfer the fold keeps
    stands for one between two devices; on two, stage 1 and the last share
    a device. `sharding`: as `pipeline_step` takes it."""
    if stages <= 3 or (chunks != 1 and stages // chunks < 3):
        return None
    check_schedule(schedule, stages, chunks)
    fn = model.function
    if sharding is None:
        sharding = microbatch_sharding(model, nda, mesh, decisions, microbatches, resolutions, replicated)
    cut = _cut(model, nda, sharding, stages, (tuple(decisions), tuple(sorted((resolutions or {}).items())),
                                             tuple(replicated)))
    if cut is None:
        return None
    layout, kept, twin, keep, substitute, whole, sent = cut
    try:
        lowered = lower_ops(fn, nda, sharding, keep, substitute, whole, options, sent)
    except LoweringError:  # a value crosses a stage boundary with a pending partial sum
        return None
    folded = {s: n for n, s in enumerate(kept)}
    stand_in = [folded[s] if s in folded else folded[twin[s]] for s in range(stages)]
    placed = {name: n for s, n in folded.items() for name in layout.names[s]}  # the kept stages' values
    placed.update((p.name, stand_in[layout.stage_of[p.name]]) for p in fn.params)
    forward = {r.name for op in fn.ops[:model.forward_ops] for r in op.results}
    # The kept stages are no interleaved pipeline of their own: `pipeline_cost` runs the step's
    # schedule over `stage_map` with `chunks`.
    pipeline = lower_pipeline(lowered, placed, forward, len(kept), "gpipe" if chunks > 1 else schedule,
                              sent={v.name for v in sent})
    return Folded(pipeline, tuple(stand_in), chunks)


_CUTS = Recent(8)  # the last few `_cut`s, by program identity, stages and plan


def _cut(model: Model, nda: NDA, sharding: FactorSharding, stages: int, plan: tuple) -> tuple | None:
    """Where the fold cuts the step (its `StageLayout`, the stages
    kept, each stage's first equal stage, the ops kept, the stand-ins, what
    must cross whole, what a kept stage sends to one left out), or None when
    it cannot. It reads the sharding's axes, not their sizes, so it is the
    same for every count of microbatches: `choose_microbatches` prices
    several with one cut."""
    return _CUTS.get((model.function, nda), (stages, plan), lambda: _cut_afresh(model, nda, sharding, stages))


def _cut_afresh(model: Model, nda: NDA, sharding: FactorSharding, stages: int) -> tuple | None:
    """`_cut`, not kept."""
    fn = model.function
    layout = stage_layout(model, stages)
    stage_of, members, readers = layout.stage_of, layout.members, layout.readers
    twin = equal_stages(fn, nda, sharding, layout)
    picked = _stand_ins(fn, stage_of, members, twin)
    cut = None
    if picked is not None and len(picked[0]) < stages:
        kept, substitute = picked
        last = stages - 1
        keep = sorted(i for s in kept for i in members[s])
        # What crosses to or from an inner stage must cross whole: the inner stage then stands for all.
        # (Between the first and the last stage, a tied embedding's gradient crosses as a partial sum.)
        params = layout.params
        whole = {v for i in keep for v in fn.ops[i].operands if v not in params
                 and stage_of[v.name] != stage_of[fn.ops[i].results[0].name]
                 and {stage_of[v.name], stage_of[fn.ops[i].results[0].name]} != {0, last}}
        # What a kept stage sends to one left out: its task returns it, as the whole step's does. (What
        # is made from weights and constants alone, each reader's task makes for itself, `ir.pipeline`.)
        left_out = set(range(stages)).difference(kept)
        sent = {r for i in keep for r in fn.ops[i].results
                if r in layout.varying and any(stage_of[op.results[0].name] in left_out for op in readers.get(r, ()))}
        cut = (layout, kept, twin, keep, substitute, whole, sent)
    return cut


@dataclass(frozen=True, slots=True)
class StageLayout:
    """What the cut reads of the step and its stages whatever the plan: the
    stage of every value, each stage's ops, each value's readers, the
    parameters, the values that vary with the batch, those made from
    constants alone (`_constants`)."""

    stage_of: Mapping[str, int]
    members: list[list[int]]
    readers: Mapping[Value, list]
    params: frozenset[Value]
    varying: frozenset[Value]
    constant: Mapping[Value, int]
    names: tuple[tuple[str, ...], ...]  # per stage, the names `stage_of` puts there (a fold places its kept stages')


# The last few `stage_layout`s, by program identity and stages: a mesh search at 2,520 devices meets
# some 40 counts of stages, in the order of its meshes' bounds (a layout is two maps of the program's
# values; what does not depend on the stages is made once, `_STAGELESS`).
_LAYOUTS = Recent(32)
_STAGELESS = Recent(2)  # per program: its readers, parameters, values varying with the batch, constants


def stage_layout(model: Model, stages: int) -> StageLayout:
    """The step's `StageLayout` on `stages` stages, kept for the last few: a mesh
    search cuts the same program on the same stages under hundreds of plans."""
    fn = model.function

    def stageless() -> tuple:
        varying = {p for p in fn.params if p.name in model.inputs}
        for op in fn.ops:
            if any(v in varying for v in op.operands):
                varying.update(op.results)
        return users(fn), frozenset(fn.params), frozenset(varying), _constants(fn)

    def make() -> StageLayout:
        stage_of = value_stages(fn, model.forward_ops, dict(model.origins), stages)
        readers, params, varying, constant = _STAGELESS.get((fn,), tuple(model.inputs), stageless)
        names: list[list[str]] = [[] for _ in range(stages)]
        for name, s in stage_of.items():
            names[s].append(name)
        return StageLayout(stage_of, _stage_members(fn, stage_of, stages), readers, params, varying, constant,
                           tuple(map(tuple, names)))

    return _LAYOUTS.get((fn,), stages, make)


def _stage_members(fn: Function, stage_of: Mapping[str, int], stages: int) -> list[list[int]]:
    """Each stage's ops (indices, in program order)."""
    members: list[list[int]] = [[] for _ in range(stages)]
    for i, op in enumerate(fn.ops):
        members[stage_of[op.results[0].name]].append(i)
    return members


def equal_stages(fn: Function, nda: NDA, sharding: FactorSharding, layout: StageLayout) -> list[int]:
    """Per stage, the first stage equal to it but for names (module
    docstring): itself for the first and the last stage and for an inner
    stage unlike every inner stage before it. Two stages are equal where
    their structure is (`_structures`) and the sharding gives the I-classes
    each reads at the same places the same axes."""
    structure, read = _STRUCTURES.get((fn, nda, layout), None, lambda: _structures(fn, nda, layout))
    axes = (*sharding.axes, ())  # -1 (a factor that names no dimension): unsharded
    last = len(structure) - 1
    first_of: dict[tuple, int] = {}
    return [s if s in (0, last) else first_of.setdefault((structure[s], tuple(map(axes.__getitem__, read[s]))), s)
            for s in range(len(structure))]


_STRUCTURES = Recent(16)  # per (program, analysis, layout): `_structures` (a layout kept, its structures too)


def _structures(fn: Function, nda: NDA, layout: StageLayout) -> tuple[list[int], list[tuple[int, ...]]]:
    """Per stage, what `equal_stages` compares but the sharding, as a number
    (equal stages, equal numbers), and the I-classes whose axes it compares:
    its ops (kinds, attributes, result types, how many read each result,
    whether the step returns it) reading the same kinds of operands (their
    own earlier results by position, parameters by type, constants by op,
    the k-th value received from the stage at the same offset, by type),
    with the I-classes of each op's factors and of each parameter and
    received value's dimensions."""
    readers, stage_of, members = layout.readers, layout.stage_of, layout.members
    results = set(fn.results)
    params, constant = layout.params, layout.constant
    numbers: dict[tuple, int] = {}
    structure, read = [], []
    for s, stage in enumerate(members):
        own: dict[Value, int] = {}
        received: dict[Value, int] = {}
        body, iclasses = [], []
        for q, i in enumerate(stage):
            op = fn.ops[i]
            refs = []
            for v in op.operands:
                if v in own:
                    refs.append(("own", own[v]))
                elif v in constant:  # every task that reads a constant makes its own (`ir.pipeline`)
                    refs.append(("constant", constant[v]))
                else:
                    if v in params:
                        refs.append(("param", v.type))
                    else:
                        k = received.setdefault(v, len(received))
                        refs.append(("from", stage_of[v.name] - s, k, v.type))
                    iclasses.extend(nda.def_iclass(v, d) for d in range(v.type.rank))
            (r,) = op.results
            factors = nda.op_factor_iclass[i]
            iclasses.extend(factors)
            body.append((op.kind, op.attrs, r.type, len(factors), tuple(refs), len(readers.get(r, ())), r in results))
            own[r] = q
        structure.append(numbers.setdefault(tuple(body), len(numbers)))
        read.append(tuple(iclasses))
    return structure, read


def _constants(fn: Function) -> dict[Value, int]:
    """The values made from constants and scalar parameters alone (a causal
    mask, Adam's bias corrections), each with the index of its op: the same
    constant wherever it is read (each task makes its own, `ir.pipeline`)."""
    made: dict[Value, int] = {p: -1 for p in fn.params if not p.type.shape}
    for i, op in enumerate(fn.ops):
        if all(v in made for v in op.operands):
            made.update((r, i) for r in op.results)
    return made


def _stand_ins(fn: Function, stage_of: Mapping[str, int], members: list[list[int]],
              twin: Sequence[int]) -> tuple[list[int], dict[Value, Value]] | None:
    """The stages kept (the first, the last and one of each class of equal
    stages, `twin`, and any later stage a backward needs) and, for each value
    a kept stage reads from a stage left out, the kept value read in its
    place (module docstring); None when some read has no stand-in."""
    stages = StageReads(fn, stage_of, members, twin)
    kept = set(twin)
    while True:
        substitute: dict[Value, Value] = {}
        needed = set()
        for s, q, i, a, v, src in stages.reads_left_out(kept):
            w = stages.stand_in(kept, s, q, i, a, v, src)
            if w is None and src > s:  # a backward reads from the stage after: keep that stage too
                needed.add(src)
            elif w is None or substitute.setdefault(v, w) is not w:
                return None
        if not needed:
            return sorted(kept), substitute
        kept |= needed


# Both indexes are of the whole step, and a mesh search reads them for every plan it folds or copies (the
# shallow copies, three a plan, `ir.layer_fold`): kept for the last few programs and layouts.
_MADE_AT = Recent(2)
_POSITIONS = Recent(8)


@dataclass(frozen=True)
class StageReads:
    """The step's ops by stage, for finding stand-ins."""

    fn: Function
    stage_of: Mapping[str, int]
    members: list[list[int]]  # per stage, its ops in program order
    twin: Sequence[int]  # per stage, the first stage equal to it

    @cached_property
    def made_at(self) -> dict[Value, int]:
        """Each op result's op (its index)."""
        return _MADE_AT.get((self.fn,), None, lambda: {op.results[0]: i for i, op in enumerate(self.fn.ops)})

    @cached_property
    def position(self) -> dict[Value, int]:
        """Each op result's place among its stage's ops."""
        return _POSITIONS.get((self.fn, self.members), None, lambda: {
            self.fn.ops[i].results[0]: q for ops in self.members for q, i in enumerate(ops)})

    def reads_left_out(self, kept: set[int]) -> Iterator[tuple[int, int, int, int, Value, int]]:
        """(stage, place, op, operand, value, its stage) of every read by a kept stage from one left out."""
        for s in sorted(kept):
            for q, i in enumerate(self.members[s]):
                for a, v in enumerate(self.fn.ops[i].operands):
                    src = self.stage_of[v.name] if v in self.position else s
                    if src not in kept:
                        yield s, q, i, a, v, src

    def stand_in(self, kept: set[int], s: int, q: int, i: int, a: int, v: Value, src: int) -> Value | None:
        """A kept value standing for `v`, which op `i` (the q-th of stage `s`)
        reads as operand `a` from the stage `src` left out: made before op
        `i`, in a kept stage other than `s`, by the op at v's place in a kept
        stage equal to `src`, or read at the same op and operand by a stage
        equal to `s` from a kept stage at the same offset."""
        fn, members, twin, made_at = self.fn, self.members, self.twin, self.made_at
        at = self.position[v]
        for r in sorted(kept):
            if r != s and twin[r] == twin[src] and members[r][at] < i:
                return fn.ops[members[r][at]].results[0]
        for s2 in reversed(range(len(members))):
            if s2 == s or twin[s2] != twin[s]:
                continue
            w = fn.ops[members[s2][q]].operands[a]
            home = self.stage_of[w.name] if w in self.position else None
            if home in kept and home != s and home - s2 == src - s and made_at[w] < i:
                return w
        return None


__all__ = ["Folded", "StageLayout", "StageReads", "equal_stages", "fold_pipeline", "stage_layout"]
