"""A plan with a `pipeline` mesh axis or gradient accumulation: its stages,
their tasks and the schedule's cost, as the planner and the reports use them.

The plan itself shards one stage's devices (the mesh without its pipeline
axis) and is the same for every stage: the stages of the programs here are
runs of the same repeated layer. It is searched on the whole step, which
does not know about stages; so the search sees the device's memory times
the stages, the share of the step one stage holds (1/P of the layers, and
under GPipe the activations of every microbatch of them). The pipelined
step's real peak is then computed stage by stage (`costmodel.pipeline`).

Gradient accumulation (`microbatches: K` without a pipeline axis) is the
same machinery with one stage: each microbatch's forward and backward, the
gradients summed, one update, on a 1F1B schedule (one microbatch's
activations live). Its search sees the device's own memory: the whole
batch's step, which a plan that fits also fits with microbatches (the
activations only shrink); a plan that fits only with microbatches is found
by the re-ranking and the expert floor, which price the microbatched step.
In the search's time (pipelined or not) a weight's resharding counts once
per microbatch (`CostTable.microbatch_repeats`, from the planner's cost
table).

Whatever K is, the search sees the program as one microbatch's plans see
it (`search_nda`): the batch splits only as far as a microbatch of it
does, so the search never finds a plan its own pipeline refuses. With
`microbatches: auto` the search sees the whole batch and K is chosen for
its plan (`choose_microbatches`): the fastest step that fits among the
counts that split the batch, K = 1 among them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from costmodel.evaluate import COMMUNICATION, Cost
from costmodel.hardware import Hardware
from costmodel.pipeline import PipelineCost, pipeline_cost
from ir import ops
from ir.core import Recent
from ir.lower import LowerOptions
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import (
    Pipeline,
    PipelineError,
    bubble_fraction,
    check_stages,
    microbatch_nda,
    microbatch_sharding,
    pipeline_step,
)
from ir.pipeline_fold import fold_pipeline
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.planning.shallow import shallow_pipelined_cost
from solver.planning.spec import Spec, SpecError


def search_hardware(spec: Spec, hardware: Hardware) -> Hardware:
    """The hardware the search of a pipelined spec's plan sees (module docstring)."""
    if spec.stages == 1:
        return hardware
    device = hardware.device.model_copy(update={"memory": hardware.device.memory * spec.stages})
    return hardware.model_copy(update={"device": device})


def search_nda(spec: Spec, model: Model, nda: NDA) -> NDA:
    """The analysis the spec's plans are made on: `nda` with the batch a
    microbatch's (`ir.pipeline.microbatch_nda`; `nda` itself for K = 1)."""
    try:
        return microbatch_nda(nda, model.inputs, spec.searched_microbatches)
    except PipelineError as exc:
        field = "microbatches" if spec.microbatches is not None else "pipeline.microbatches"
        raise SpecError(f"{spec.source}: {field}: {exc}") from exc


def pipelined(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
              options: LowerOptions | None = None, microbatches: int | None = None) -> tuple[Pipeline, PipelineCost]:
    """The spec's pipelined step under `plan` (which shards each stage), with
    `microbatches` (default: the spec's, or with `microbatches: auto` the
    best count for the plan, `choose_microbatches`), and its cost."""
    microbatches, sharding = _microbatched(spec, model, nda, plan, hardware, options, microbatches)
    pipeline = _staged(pipeline_step, spec, model, nda, plan, options, microbatches, sharding)
    return with_schedule(pipeline, hardware, spec.pipeline_schedule)


_PRICED: dict[tuple, tuple] = {}  # the last few `pipelined_cost`s, by program identity and microbatch sharding
_PRICED_KEPT = 64  # a mesh search prices a plan on one mesh in its screen, then in its floor or re-ranking
_PRICED_RUNS = 100_000  # and at most this many schedule runs held (about 15 MB)
_MICROBATCH_SHARDINGS = Recent(4)  # the last few microbatch shardings, by program identity, plan and K


def pipelined_cost(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
                   options: LowerOptions | None = None, microbatches: int | None = None,
                   shallow: bool = False) -> PipelineCost:
    """`pipelined`'s cost, from the pipeline folded to its distinct stages
    where its inner stages are provably equal in classes (`ir.pipeline_fold`:
    the same price without lowering every layer), else from the whole one.
    With `shallow` (the mesh screen's), from shallow copies of the step
    where its inner layers are provably equal and that lowers fewer layers
    (`solver.planning.shallow`: the same price, the times to float rounding).
    What the floor, the re-ranking and the choice of K price; the answer is
    made whole (a mesh search's, only its best mesh's: `planner.complete`).

    The last few prices are kept by what they follow from: the program, the
    hardware, the stages, K and the microbatch's factor sharding. Plans
    that differ in decisions but shard alike (a decision on a color nothing
    of the program splits; the floor's and the mesh screen's plans met
    again) are priced once."""
    microbatches, sharding = _microbatched(spec, model, nda, plan, hardware, options, microbatches, shallow)
    key = (id(model), id(nda), spec.stages, spec.chunks, spec.pipeline_schedule, microbatches, options, sharding,
           shallow)
    known = _PRICED.get(key)  # (the hardware is made anew per call, `Spec.hardware_obj`: it is compared)
    if known is not None and known[0] is model and known[1] is nda and known[2] == hardware:
        return known[3]
    cost = (_shallow(spec, model, nda, sharding, hardware, options) if shallow else None) or _whole_or_folded(
        spec, model, nda, plan, hardware, options, microbatches, sharding)
    _PRICED[key] = (model, nda, hardware, cost)
    # A deep pipeline's price holds every task run of its schedule (for the trace): 100,000s at 1T.
    while len(_PRICED) > _PRICED_KEPT or sum(len(c.schedule.runs) for *_, c in _PRICED.values()) > _PRICED_RUNS:
        del _PRICED[next(iter(_PRICED))]
    return cost


def _whole_or_folded(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
                     options: LowerOptions | None, microbatches: int, sharding: FactorSharding) -> PipelineCost:
    """The step priced from its stages: folded to the distinct ones where it can be, else all of them."""
    folded = _staged(fold_pipeline, spec, model, nda, plan, options, microbatches, sharding)
    if folded is None:
        pipeline = _staged(pipeline_step, spec, model, nda, plan, options, microbatches, sharding)
        return with_schedule(pipeline, hardware, spec.pipeline_schedule)[1]
    return with_schedule(folded.pipeline, hardware, spec.pipeline_schedule, folded.stage_map, folded.chunks)[1]


def _shallow(spec: Spec, model: Model, nda: NDA, sharding: FactorSharding, hardware: Hardware,
             options: LowerOptions | None) -> PipelineCost | None:
    """The step priced from its shallow copies (`solver.planning.shallow`),
    where its stages have more layers than the copies together (not
    interleaved: a device's chunks are not consecutive layers)."""
    if spec.chunks != 1:
        return None
    try:
        return shallow_pipelined_cost(model, nda, sharding, hardware, spec.stages, spec.pipeline_schedule, options)
    except PipelineError:
        return None


def _microbatched(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
                  options: LowerOptions | None, microbatches: int | None,
                  shallow: bool = False) -> tuple[int, FactorSharding]:
    """The count of microbatches `plan` runs with (`pipelined`'s default) and
    one microbatch's factor sharding (`ir.pipeline.microbatch_sharding`,
    kept for the last few: choosing K prices the count it then returns,
    `shallow` or not as the caller will); a PipelineError as the spec's error."""
    check_spec_stages(spec, model)  # before anything is materialized
    try:
        if microbatches is None and spec.microbatches_auto:
            microbatches = choose_microbatches(spec, model, nda, plan, hardware, options, shallow)
        k = microbatches or spec.microbatch_count
        return k, _MICROBATCH_SHARDINGS.get((model, nda), (plan, k), lambda: microbatch_sharding(
            model, nda, plan.mesh, plan.decisions, k, dict(plan.resolutions), plan.replicated))
    except PipelineError as exc:
        raise SpecError(f"{spec.source}: pipeline: {exc}") from exc


def check_spec_stages(spec: Spec, model: Model) -> None:
    """The spec's error unless the step has a layer for each of its pipeline
    stages (cheap: a mesh search meets many meshes of more stages than layers)."""
    if spec.stages * spec.chunks > 1:
        try:
            check_stages(model.function, model.forward_ops, spec.stages * spec.chunks)
        except PipelineError as exc:
            raise SpecError(f"{spec.source}: pipeline: {exc}") from exc


def _staged(make: Callable[..., Any], spec: Spec, model: Model, nda: NDA, plan: Plan,
            options: LowerOptions | None, microbatches: int, sharding: FactorSharding) -> Any:
    """`make` (`pipeline_step` or `fold_pipeline`) on the spec's stages under
    `plan` with `microbatches` of one microbatch's `sharding`; a
    PipelineError as the spec's error."""
    try:
        return make(model, nda, plan.mesh, plan.decisions, stages=spec.stages * spec.chunks,
                    microbatches=microbatches, schedule="interleaved" if spec.chunks > 1 else "gpipe",
                    resolutions=dict(plan.resolutions), replicated=plan.replicated, options=options,
                    chunks=spec.chunks, sharding=sharding)
    except PipelineError as exc:
        raise SpecError(f"{spec.source}: pipeline: {exc}") from exc


def microbatch_counts(nda: NDA, model: Model, plan: Plan, spec: Spec | None = None) -> list[int]:
    """The microbatch counts a plan can run with: the divisors of the batch
    over the devices the plan splits it over (under the spec's interleaved
    schedule, those that are multiples of its pipeline devices)."""
    sharding = plan.materialize(nda)
    batch = next(p for p in nda.function.params if p.name in model.inputs and p.type.rank)
    split = math.prod(plan.mesh.size(a) for a in sharding.def_dims(nda, batch)[0])
    per_device = batch.type.shape[0] // split
    rounds = spec.stages if spec is not None and spec.chunks > 1 else 1
    counts = [k for k in range(1, per_device + 1) if per_device % k == 0 and k % rounds == 0]
    if not counts:
        raise SpecError(f"{spec.source}: microbatches: auto: the batch a device holds ({per_device}) splits into "
                        f"no multiple of the {rounds} pipeline devices the interleaved schedule needs")
    return counts


def choose_microbatches(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
                        options: LowerOptions | None = None, shallow: bool = False) -> int:
    """`microbatches: auto`: the count that gives the plan's fastest
    pipelined step that fits (the smaller count on a tie), else the
    smallest peak; the counts are those that split the batch
    (`microbatch_counts`).

    With one stage (gradient accumulation) the step is no faster with more
    microbatches: the cost model prices each kernel and collective as a
    roofline or ring time affine in the batch a microbatch holds, with a
    term that does not shrink with it (a weight read, gathered or reduced,
    a latency), so K runs of 1/K of the batch take at least one run of all
    of it. The counts go from the fewest up and the first that fits is the
    answer (tests/test_accumulation.py prices every count to check it).
    With a pipeline the bubble shrinks with K: the counts go from the most
    down, and once a count fits, a count whose bound (`_least_compute_s`
    over one minus the bubble, (K + P - 1) / K times it with one stage a
    device: no step of P devices and K microbatches is faster) is no faster
    is not priced."""
    counts = microbatch_counts(nda, model, plan, spec)
    if spec.stages * spec.chunks == 1:
        for k in counts:
            cost = pipelined_cost(spec, model, nda, plan, hardware, options, microbatches=k, shallow=shallow)
            if cost.fits:
                return k
        return _smallest_peak(spec, model, nda, plan, hardware, options, counts, shallow)
    ideal = _least_compute_s(model, spec.mesh_obj().num_devices, hardware)
    best = None
    for k in sorted(counts, reverse=True):
        if best is not None and not best[0][0] and ideal / (1 - bubble_fraction(spec.stages * spec.chunks, k,
                                                                                 spec.chunks)) > best[0][1]:
            continue
        cost = pipelined_cost(spec, model, nda, plan, hardware, options, microbatches=k, shallow=shallow)
        key = (not cost.fits, cost.step_time_s if cost.fits else max(cost.peak_memory_bytes))
        if best is None or key <= best[0]:
            best = (key, k)
    assert best is not None  # `microbatch_counts` is never empty
    return best[1]


def _smallest_peak(spec: Spec, model: Model, nda: NDA, plan: Plan, hardware: Hardware,
                   options: LowerOptions | None, counts: list[int], shallow: bool) -> int:
    """The count of the smallest peak where none fits (the smaller count on a tie)."""
    peaks = {k: max(pipelined_cost(spec, model, nda, plan, hardware, options, microbatches=k,
                                   shallow=shallow).peak_memory_bytes) for k in counts}
    return min(counts, key=peaks.__getitem__)


def _least_compute_s(model: Model, devices: int, hardware: Hardware) -> float:
    """A lower bound of the compute any plan of `model` spends per device:
    its flops spread evenly over the devices at the device's highest peak
    (every kernel the cost model prices takes at least its flops over that).
    A pipeline's step is at least (K + P - 1) / K times it: a device runs its
    stage's K microbatches, and the schedule at least P - 1 more stage runs
    (interleaved, (v K + P - 1) / v K: its v chunks' v K runs, and P - 1
    more chunk runs)."""
    flops = sum(ops.op_cost(op).flops for op in model.function.ops if op.kind not in COMMUNICATION)
    return flops / devices / max(hardware.device.peak_flops.values())


def pipelined_step_s(priced: Callable[[], PipelineCost]) -> float:
    """The step time of a plan's pipelined step (`priced()`: its
    `pipelined_cost`); infinite when it does not fit or cannot be pipelined
    (what re-ranks CP-SAT's best plans)."""
    try:
        cost = priced()
    except SpecError:
        return math.inf
    return cost.step_time_s if cost.fits else math.inf


def with_schedule(pipeline: Pipeline, hardware: Hardware, schedule: str | None,
                  stage_map: tuple[int, ...] | None = None, chunks: int = 1) -> tuple[Pipeline, PipelineCost]:
    """The pipeline on `schedule`, priced; None: GPipe, or 1F1B where
    GPipe's microbatches in flight do not fit (the same time, less memory);
    1F1B for one stage (gradient accumulation: one microbatch at a time).
    `stage_map`, `chunks`: a folded pipeline's (`costmodel.pipeline.pipeline_cost`)."""
    stages = pipeline.stages if stage_map is None else len(stage_map)
    default = "1f1b" if stages == 1 else "gpipe"
    chosen = dataclasses.replace(pipeline, schedule=schedule or default)
    cost = pipeline_cost(chosen, hardware, stage_map, chunks)
    if schedule is None and not cost.fits:
        chosen = dataclasses.replace(pipeline, schedule="1f1b")
        cost = pipeline_cost(chosen, hardware, stage_map, chunks)
    return chosen, cost


def as_cost(cost: PipelineCost) -> Cost:
    """The pipelined step as a `Cost`, for every report that reads one: the
    simulated schedule's step time, the largest stage's peak, and the
    compute, communication (by kind) and flops of one device of the busiest
    stage; the transfers are in the schedule's time, not in these. The
    kernel counts are every task's, once. (The stages are those of the
    tasks, the devices those of the memory: a folded pipeline's cost is
    the step's, `ir.pipeline_fold`.)"""
    stages, devices = 1 + max(s for s, _ in cost.tasks), len(cost.memory)
    work = [cost.work(range(d, stages, devices), cost.microbatches) for d in range(devices)]
    compute, communication, flops, by_kind = max(work, key=lambda w: w[0] + w[1])
    kernels = sum(c.kernels for c in cost.tasks.values())
    fused = sum(c.fused_ops for c in cost.tasks.values())
    return Cost(cost.step_time_s, compute, communication, max(cost.peak_memory_bytes), cost.capacity_bytes,
                flops, by_kind, dict(cost.collective_counts), kernels, fused)


def pipeline_json(pipeline: Pipeline, cost: PipelineCost) -> dict[str, Any]:
    """The `pipeline` object of `shardplan plan --json` (docs/json.md)."""
    stages = []
    for s in range(pipeline.stages):
        memory = cost.memory[pipeline.device(s)]
        stages.append({
            "stage": s,
            "device": pipeline.device(s),
            "layers": list(pipeline.stage_layers[s]) if pipeline.stage_layers else [],
            **{f"{phase}_s": cost.tasks[(s, phase)].step_time_s if (s, phase) in cost.tasks else 0.0
               for phase in ("forward", "backward", "post")},
            "ops": sum(len(t.function.ops) for t in pipeline.tasks if t.stage == s),
            "peak_memory_bytes": memory.peak_bytes,
            "resident_bytes": memory.resident_bytes,
            "accumulated_bytes": memory.accumulated_bytes,
            "stash_bytes": memory.stash_bytes,
            "in_flight": memory.in_flight,
            "held_bytes": memory.held,
            "transient_bytes": memory.transient_bytes,
            "update_bytes": memory.update_bytes,
        })
    return {
        "stages": pipeline.stages,
        "chunks": pipeline.chunks,
        "microbatches": pipeline.microbatches,
        "schedule": pipeline.schedule,
        "step_time_s": cost.step_time_s,
        "bubble_fraction": cost.bubble_fraction,
        "transfer_s": cost.transfer_s,
        "transfers": [{"value": t.value, "type": str(t.type), "from": t.src, "to": t.dst, "phase": t.phase,
                       "per_microbatch": t.per_microbatch} for t in pipeline.transfers],
        "per_stage": stages,
    }
