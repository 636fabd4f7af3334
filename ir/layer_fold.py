"""A step of many equal layers priced from shallow copies of it.

Lowering and pricing a step costs time in proportion to its layers, and a
mesh search prices hundreds of plans of an 80-layer step. Where every
inner layer is provably the same (`ir.pipeline_fold`'s proof, each layer
a stage of its own: the same ops, attributes, result types and factor
shardings, reading the same kinds of operands), the step is priced from
shallow copies of itself, each a few layers deep: the first `count` layers
of each stage, the last stage ending with the step's last layer (the head
and the loss). A copy is the step itself with the other layers' ops left
out (`ir.lower.lower_ops`); nothing is built again and the plan's colors
are the step's own. So that each copy is, op for op, the step of a model
with `count` layers per stage under the same plan:
  - a kept layer reads, in place of a value a left-out layer makes, the
    same value of the nearest kept layer, chosen at its first read:
    forward, the output of the last kept layer before it; backward, the
    gradient the next kept layer sent;
  - a value read across layers is whole (no pending partial sum), so a
    stand-in has the state of the value it stands for;
  - a constant a kept layer reads is made, not stood in for;
  - what a kept layer makes for a left-out layer of its own stage is not
    returned by its task (the step's frees it there); for one of another
    stage, it is, as the step's sends it.

A layer adds the same ops to every copy, so a figure of the step (a
task's time, a memory term, a count) is affine in the layers per stage
once the copies are past the boundary layers. Three copies (3, 4 and 5
layers a stage; 4, 5 and 6 where every stage has more than 15) are priced
and the figure taken on to the step's depth by their difference, where
both differences agree (`extend`); where they do not, the caller prices
the whole step. A copy of 3 layers a stage has one inner layer, and the
first layers a backward passes can differ from the next: under GPT
145.6B's searched plans (ZeRO with gathered K/V) a stage's backward held
more at one place of its inner layers than a line through 3, 4 and 5
layers gives, so 8 of the 19 shallow prices of its mesh search were not
affine and lowered the folded pipeline after the copies; copies of 4, 5
and 6 layers priced every one of them. A figure affine from 3 layers is
affine from 4, so deeper copies only cost their extra layer, and
shallower stages keep the cheaper ones: the pipelines that search priced
(from copies or folded, one process) took 73 -> 64 s, 310.1B's 46 -> 43
s, for the same answers. A peak is a most over places, extended place by
place (`Shallow.place`, `solver.planning.shallow`).
tests/test_layer_fold.py checks the extended prices against the whole
step's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ir.core import Function, Recent, Value
from ir.lower import Lowered, LoweringError, LowerOptions, lower_ops
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import layer_stages
from ir.pipeline_fold import StageLayout, StageReads, equal_stages, stage_layout
from ir.remat import layer_count
from ir.sharding import FactorSharding

COUNTS = (3, 4, 5)  # layers per stage of the three shallow copies
DEEP_COUNTS = (4, 5, 6)  # where every stage has more layers than these together (module docstring)
_TWINS = Recent(4)  # the last few plans' layer classes, by program identity and sharding
_PLACES = Recent(2)  # the places of the last few programs' ops (`_places`), by program identity


@dataclass(frozen=True, slots=True)
class Shallow:
    """One shallow copy: the kept ops lowered, the copy's stage of each
    local value that a stage reads or makes (its layer's), what a task
    returns for a stage left out, the copy's stage each stage of the step
    runs as (`ir.pipeline_fold.Folded.stage_map`), the layers kept per
    stage of the copy and the step's per stage of the step."""

    lowered: Lowered
    placed: Mapping[str, int]
    sent: frozenset[str]
    stage_map: tuple[int, ...]
    kept: int  # layers in each stage of the copy
    layers: tuple[int, ...]  # per stage of the step, its layers
    places: Mapping[str, tuple]  # each op's result and parameter (global name): its place (`place`)

    def place(self, name: str) -> tuple:
        """The place of the local op that defines `name`: its global op's
        layer, the first, an inner or the last (every inner layer's op at
        one place has one), its place among that layer's ops, and what the
        lowering made of it. A local op carries its global op's name, or
        that name and `-<suffix>` (what the lowering adds: a collective, a
        cast, which can run far from the op: a loss's all_reduce at the
        step's end)."""
        base = name
        while base not in self.places and "-" in base:
            base = base.rsplit("-", 1)[0]
        return (*self.places[base], name[len(base):])


def shallow_steps(model: Model, nda: NDA, sharding: FactorSharding, stages: int = 1,
                  options: LowerOptions | None = None, counts: Sequence[int] | None = None) -> list[Shallow] | None:
    """The step's shallow copies of `counts` layers per stage (default:
    `DEEP_COUNTS` where every stage has more layers than they keep, else
    `COUNTS`; module docstring), or None where it cannot be priced so: a
    stage of no more layers than the copies' together (the whole step is
    then as cheap), inner layers that differ, a read with no stand-in, or a
    value that would cross a left-out layer with a pending partial sum. Of
    four stages or more, a copy keeps the first, the second and the last:
    the inner stages of a copy are equal whatever their layers in the step
    (`ir.pipeline_fold` folds stages so)."""
    fn = model.function
    layers = layer_count(fn, model.forward_ops)
    per_stage = layer_stages(range(layers), stages) if layers >= stages else {}
    sizes = [sum(1 for s in per_stage.values() if s == stage) for stage in range(stages)]
    if counts is None:
        counts = DEEP_COUNTS if min(sizes, default=0) > sum(DEEP_COUNTS) else COUNTS
    if layers < 3 or min(sizes, default=0) <= sum(counts):
        return None
    layout = stage_layout(model, layers)  # each layer a stage of its own
    twin = _TWINS.get((fn, nda), sharding, lambda: equal_stages(fn, nda, sharding, layout))
    if any(twin[v] != twin[1] for v in range(1, layers - 1)):
        return None
    first = [min(v for v, s in per_stage.items() if s == stage) for stage in range(stages)]
    kept_stages = list(range(stages)) if stages <= 3 else [0, 1, stages - 1]
    stage_map = tuple(kept_stages.index(s) if s in kept_stages else 1 for s in range(stages))
    places = _PLACES.get((fn,), layers, lambda: _places(fn, layout))
    out = []
    for count in counts:
        kept = {first[s] + k for s in kept_stages for k in range(count - (s == stages - 1))} | {layers - 1}
        copy = _copy(model, nda, sharding, layout, twin, kept, per_stage, stage_map, options)
        if copy is None:
            return None
        lowered, placed, sent = copy
        out.append(Shallow(lowered, placed, frozenset(sent), stage_map, count, tuple(sizes), places))
    return out


def _places(fn: Function, layout: StageLayout) -> dict[str, tuple]:
    """Each op's result and each parameter of `fn` (one layer a stage of
    `layout`): its layer's role and its place in the layer (`Shallow.place`).
    A parameter is its first reader's layer's, placed among that layer's
    parameters (a weight's gather is named after it)."""
    layers = len(layout.members)
    role = ["first"] + ["inner"] * (layers - 2) + ["last"]
    places = {r.name: (role[v], q) for v, ops in enumerate(layout.members) for q, i in enumerate(ops)
              for r in fn.ops[i].results}
    count: dict[int, int] = {}
    for p in fn.params:
        v = layout.stage_of[p.name]
        places[p.name] = (role[v], "param", count.setdefault(v, 0))
        count[v] += 1
    return places


def _copy(model: Model, nda: NDA, sharding: FactorSharding, layout: StageLayout, twin: list[int], kept: set[int],
          stage: Mapping[int, int], stage_map: Sequence[int], options: LowerOptions | None) -> tuple | None:
    """One copy keeping the layers `kept` (`stage`: each layer's stage of the
    step; `stage_map`: each stage's of the copy): (lowered, each local
    value's stage of the copy, what its task returns for another stage of
    the step), or None."""
    fn = model.function
    members, stage_of = layout.members, layout.stage_of
    layers = StageReads(fn, stage_of, members, twin)
    substitute: dict[Value, Value] = {}
    constants: set[int] = set()  # made from constants alone in a layer left out: made here too, as read
    # A value's stand-in is chosen at its first read (the remat of a layer reads its input again, later).
    for s, q, i, a, v, src in sorted(layers.reads_left_out(kept), key=lambda read: read[2]):
        if v in layout.constant:
            constants |= _made_from(fn, layout.constant, v)
        elif v not in substitute:
            w = _stand_in(layers, kept, s, q, i, a, v, src)
            if w is None:
                return None
            substitute[v] = w
    keep = sorted(constants.union(i for s in kept for i in members[s]))
    params = layout.params
    # What crosses between layers crosses whole: a stand-in then has the state of the value it stands for.
    # (Between the first and the last layer, both always kept, a tied embedding's gradient is a partial sum.)
    last = len(members) - 1
    whole = {v for i in keep for v in fn.ops[i].operands if v not in params and v not in layout.constant
             and stage_of[v.name] != stage_of[fn.ops[i].results[0].name]
             and {stage_of[v.name], stage_of[fn.ops[i].results[0].name]} != {0, last}}
    left_out = set(range(len(members))).difference(kept)
    # What a kept layer makes that a layer left out reads is whole (as a stand-in read in its place is).
    # What it sends to a left-out layer of another stage, its task returns, as the step's does; to one of
    # its own stage, it does not: the step's task frees it there. (Not a constant: each reader's task makes
    # its own, `ir.pipeline`.)
    read_out = {r: {stage_of[op.results[0].name] for op in layout.readers.get(r, ())
                    if stage_of[op.results[0].name] in left_out}
                for i in keep for r in fn.ops[i].results if r in layout.varying}
    sent = {r for r, readers in read_out.items() if readers}
    try:
        lowered = lower_ops(fn, nda, sharding, keep, substitute, whole, options, sent)
    except LoweringError:
        return None
    # The kept layers' values, the parameters and the constants made: by layer, not over the whole step's.
    placed = {name: stage_map[stage[layer]] for layer in kept for name in layout.names[layer]}
    placed.update((name, stage_map[stage[stage_of[name]]])
                  for name in [*(p.name for p in params), *(r.name for i in constants for r in fn.ops[i].results)])
    return lowered, placed, {r.name for r in sent if any(stage[v] != stage[stage_of[r.name]] for v in read_out[r])}


def _made_from(fn: Function, constant: Mapping[Value, int], v: Value) -> set[int]:
    """The ops that make the constant `v`, it and those it reads, by index."""
    out, todo = set(), [v]
    while todo:
        i = constant[todo.pop()]
        if i not in out:
            out.add(i)
            todo.extend(fn.ops[i].operands)
    return out


def _stand_in(layers: StageReads, kept: set[int], s: int, q: int, i: int, a: int, v: Value, src: int) -> Value | None:
    """The kept value read in place of `v` (module docstring): the latest made
    before op `i` of the values at v's place in a kept layer equal to v's,
    or of the values a layer equal to `s` reads at the same operand from a
    kept layer at the same offset."""
    fn, members, twin, made_at, stage_of = layers.fn, layers.members, layers.twin, layers.made_at, layers.stage_of
    at = layers.position[v]
    candidates = [fn.ops[members[r][at]].results[0] for r in kept
                  if r != s and twin[r] == twin[src] and members[r][at] < i]
    if not candidates:
        for s2 in range(len(members)):
            if s2 == s or twin[s2] != twin[s]:
                continue
            w = fn.ops[members[s2][q]].operands[a]
            home = stage_of[w.name] if w in layers.position else None
            if home in kept and home != s and home - s2 == src - s and made_at[w] < i:
                candidates.append(w)
    return max(candidates, key=made_at.__getitem__, default=None)


def extend(points: Sequence[tuple[float, float]], at: float, relative: float = 1e-9) -> float | None:
    """The figure at `at` on the line through `points` ((x, figure) at equal
    steps of x), or None where the steps differ by more than `relative` of
    the figures (not affine: the caller prices the whole)."""
    (x0, y0), (x1, y1), (x2, y2) = points
    step = y1 - y0
    if not math.isclose(y2 - y1, step, rel_tol=relative, abs_tol=relative * max(abs(y0), abs(y2), 1.0)):
        return None
    return y2 + (at - x2) / (x2 - x1) * step


__all__ = ["COUNTS", "DEEP_COUNTS", "Shallow", "extend", "shallow_steps"]
