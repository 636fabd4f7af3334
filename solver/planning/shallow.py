"""Prices of a deep step from its shallow copies (`ir.layer_fold`).

A figure of the step is affine in its layers once past the boundary
layers; the copies' figures, 3, 4 and 5 layers a stage deep (4, 5 and 6
where the stages are deep enough), are taken on to the step's depth where
their steps agree (`ir.layer_fold.extend`). Every figure a price reports
is extended so, or none is: then the caller prices the whole step, as it
would without the copies.

A peak is the most over the step's places, and which place holds it can
change with the depth (in small layers the logits outweigh three layers'
activations, not ten): a copy's peak, extended, would miss it. So a peak
is extended place by place (`ir.layer_fold.Shallow.place`: an op of the
first or the last layer, or an op at one place of every inner layer, whose
most is at the first or the last inner layer, affine in the layers either
way) and its most taken at the step's depth. The same for a task's
transient and the update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from costmodel.evaluate import Cost, evaluate, live_curve
from costmodel.hardware import Hardware
from costmodel.pipeline import PipelineCost, PipelineParts, StageMemory, pipeline_parts, price_parts, stage_curves
from ir.core import Function
from ir.layer_fold import Shallow, extend, shallow_steps
from ir.lower import LowerOptions
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import Pipeline, Task, lower_pipeline
from ir.sharding import FactorSharding


def shallow_step_cost(model: Model, nda: NDA, sharding: FactorSharding, hardware: Hardware,
                      options: LowerOptions | None = None) -> Cost | None:
    """The step's `evaluate` (on one stage, no microbatches) from its shallow
    copies, or None where it is not priced so (module docstring)."""
    copies = shallow_steps(model, nda, sharding, 1, options)
    if copies is None:
        return None
    costs = [evaluate(c.lowered.function, hardware) for c in copies]
    peak = _extend_most([(c.kept, _peak_by_place(c, c.lowered.function)) for c in copies], copies[0].layers[0])
    return _extend_cost([(c.kept, cost) for c, cost in zip(copies, costs)], copies[0].layers[0], peak)


def _peak_by_place(copy: Shallow, fn: Function) -> dict[tuple, int]:
    """The most `evaluate`'s live count of `fn` (the copy's step or a task of
    it) reaches at each of its places (before any op: "start")."""
    resident, live, _ = live_curve(fn)
    return _by_place(copy, fn, live, {("start",): resident})


def _by_place(copy: Shallow, fn: Function, curve: Sequence[int], out: dict[tuple, int],
              phase: str = "", less: int = 0) -> dict[tuple, int]:
    """`out` with the most of `curve` (a count at each op of `fn`, and after
    its last: "end") less `less` at each of its places, keyed with `phase`."""
    places = [(phase, *copy.place(op.results[0].name)) for op in fn.ops] + [(phase, "end")]
    for key, here in zip(places, curve):
        out[key] = max(out.get(key, here - less), here - less)
    return out


def _extend_most(points: Sequence[tuple[int, Mapping[tuple, int]]], layers: int) -> int | None:
    """The most, at `layers`, of the places' figures extended (None where one
    is not affine, or the copies have other places)."""
    if any(m.keys() != points[0][1].keys() for _, m in points):
        return None
    most = 0
    for key in points[0][1]:
        value = extend([(x, m[key]) for x, m in points], layers)
        if value is None:
            return None
        most = max(most, round(value))
    return most


def shallow_pipelined_cost(model: Model, nda: NDA, sharding: FactorSharding, hardware: Hardware, stages: int,
                           schedule: str | None, options: LowerOptions | None = None) -> PipelineCost | None:
    """The pipelined step's cost (`stages` stages, one microbatch's
    `sharding` on the micro mesh, `solver.planning.pipelining.with_schedule`'s
    choice of `schedule`) from its shallow copies, or None (module
    docstring). Each copy is cut into its stages' tasks as the step is
    (`ir.pipeline.lower_pipeline`); their parts are extended stage by
    stage to the stage's layers, and the schedule simulated over those."""
    copies = shallow_steps(model, nda, sharding, stages, options)
    if copies is None:
        return None
    forward = {r.name for op in model.function.ops[:model.forward_ops] for r in op.results}
    pipelines = [lower_pipeline(c.lowered, c.placed, forward, max(c.stage_map) + 1, "gpipe", sent=c.sent)
                 for c in copies]
    memory = _stage_memory(copies, pipelines)  # the schedule changes only the microbatches in flight
    if memory is None:
        return None
    peaks = [{(s, t.phase): _peak_by_place(c, t.function) for t in p.tasks for s, own in enumerate(c.stage_map)
              if own == t.stage} for c, p in zip(copies, pipelines)]
    chosen = schedule or ("1f1b" if stages == 1 else "gpipe")
    while True:
        parts = [pipeline_parts(dataclasses.replace(p, schedule=chosen), hardware, c.stage_map, memory=memory)
                 for c, p in zip(copies, pipelines)]
        extended = _extend_parts([(c.kept, part) for c, part in zip(copies, parts)], copies[0].layers, peaks)
        if extended is None:
            return None
        cost = price_parts(extended)
        if schedule is not None or cost.fits or chosen == "1f1b":
            return cost
        chosen = "1f1b"  # GPipe's microbatches in flight do not fit: the same time, less memory


def _stage_memory(copies: Sequence[Shallow], pipelines: Sequence[Pipeline]) -> tuple[StageMemory, ...] | None:
    """Each stage's memory terms at its layers (in flight: none yet), the
    transient and the update extended place by place (module docstring)."""
    memory = []
    for stage, layer_count in enumerate(copies[0].layers):
        held, transient, update = [], [], []
        for copy, pipeline in zip(copies, pipelines):
            terms, curves = stage_curves(pipeline, copy.stage_map[stage])
            held.append((copy.kept, terms))
            transient.append((copy.kept, _task_places(copy, curves, per_microbatch=True)))
            update.append((copy.kept, _task_places(copy, curves, per_microbatch=False)))
        terms = [extend([(x, t[n]) for x, t in held], layer_count) for n in range(3)]
        most = [_extend_most(points, layer_count) for points in (transient, update)]
        if None in terms or None in most:
            return None
        memory.append(StageMemory(*(round(t) for t in terms), 0, *most))
    return tuple(memory)


def _task_places(copy: Shallow, curves: Sequence[tuple[Task, list[int], int]], per_microbatch: bool) -> dict:
    """The most of the curves of a stage's forward and backward (less their
    own) or of its post, place by place."""
    out: dict[tuple, int] = {}
    for task, curve, own in curves:
        if task.per_microbatch == per_microbatch:
            _by_place(copy, task.function, curve, out, task.phase, own)
    return out


def _extend_parts(points: Sequence[tuple[int, PipelineParts]], layers: Sequence[int],
                 peaks: Sequence[Mapping[tuple[int, str], Mapping[tuple, int]]]) -> PipelineParts | None:
    """The parts of a step of `layers` per stage, each task's figures
    extended from the copies' (`points`: layers per stage, parts; `peaks`:
    per copy, each task's peak by place), or None; the stages' memory is
    the parts' own (already the step's, `_stage_memory`). What no layer
    changes (the transfers) must be the same in every copy."""
    first = points[0][1]
    if any(p.arrive_s != first.arrive_s or p.start_s != first.start_s or p.transfer_s != first.transfer_s
           for _, p in points):
        return None
    costs, task_s = {}, {}
    for key in first.costs:
        peak = _extend_most([(x, by_task[key]) for (x, _), by_task in zip(points, peaks)], layers[key[0]])
        cost = _extend_cost([(x, p.costs[key]) for x, p in points], layers[key[0]], peak)
        seconds = extend([(x, p.task_s[key]) for x, p in points], layers[key[0]])
        if cost is None or seconds is None:
            return None
        costs[key], task_s[key] = cost, seconds
    counts = {}
    for kind in first.collective_counts:
        n = extend([(x * len(layers), p.collective_counts[kind]) for x, p in points], sum(layers))  # every stage's
        if n is None:
            return None
        counts[kind] = round(n)
    return dataclasses.replace(first, costs=costs, task_s=task_s, collective_counts=counts)


def _extend_cost(points: Sequence[tuple[int, Cost]], layers: int, peak: int | None) -> Cost | None:
    """A Cost whose every figure is extended from `points` to `layers` but
    its peak, `peak` (extended place by place); None where one is not."""
    def one(field: str) -> float | None:
        return extend([(x, getattr(c, field)) for x, c in points], layers)

    def each(field: str) -> dict[str, float] | None:
        maps: list[Mapping[str, float]] = [getattr(c, field) for _, c in points]
        out = {}
        for key in sorted(set().union(*maps)):
            value = extend([(x, m.get(key, 0)) for (x, _), m in zip(points, maps)], layers)
            if value is None:
                return None
            out[key] = value
        return out

    figures = {f: one(f) for f in ("step_time_s", "compute_s", "communication_s", "flops", "kernels", "fused_ops")}
    by_kind, counts = each("seconds_by_kind"), each("collective_counts")
    if None in figures.values() or by_kind is None or counts is None or peak is None:
        return None
    return Cost(figures["step_time_s"], figures["compute_s"], figures["communication_s"],
                peak, points[0][1].capacity_bytes, round(figures["flops"]), by_kind,
                {k: round(n) for k, n in counts.items()}, round(figures["kernels"]), round(figures["fused_ops"]))


__all__ = ["shallow_pipelined_cost", "shallow_step_cost"]
