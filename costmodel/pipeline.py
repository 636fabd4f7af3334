"""The cost of a pipelined step (`ir.pipeline.Pipeline`): its schedule
simulated with each task's time, the transfers, and each stage's memory.

Time. Every task is priced by `evaluate` (fused kernels, one device of the
stage), once per task that differs in more than its names (`unnamed`). The
schedule is simulated stage by stage in its own order
(`ir.pipeline.stage_sequences`): a forward of microbatch k starts when its
stage is free and the previous stage's forward of k has finished and its
transfers have arrived; a backward likewise waits for the next stage's
backward. A transfer costs one collective_permute over the pipeline axis
(`costmodel.evaluate.collective_s`). With equal stages and free transfers
the idle share of every device is GPipe's bubble, (P - 1) / (K + P - 1),
for both schedules; 1F1B changes memory, not time. The interleaved
schedule runs v stages (chunks) on each of P devices, a device one task
at a time in Megatron's order: its bubble is (P - 1) / (v K + P - 1), for
v times the transfers (a transfer between two chunks of one device is
none).

Memory, per stage, on one device:

    resident     the step inputs its tasks read (weights, optimizer state,
                 the whole local batch)
    accumulated  the sums over microbatches (the gradients), held from the
                 first backward to the update; none with one microbatch,
                 whose backward makes its gradients as the step's does
    stash        per microbatch in flight: what its forward makes or
                 receives that its backward reads; GPipe holds K
                 microbatches at once, 1F1B at most P - s
    transient    the most one forward or backward holds beyond those, its
                 own microbatch's stash counted while it lives (a backward
                 frees a layer's as it passes it) and, with one microbatch,
                 the gradients as they are made: at K = 1 a one-stage
                 step's peak is the whole step's
    update       the most the post (the optimizer update) holds beyond the
                 inputs, the sums freed as it reads them

and the stage's peak is resident + the larger of accumulated + in-flight x
stash + transient (the microbatches) and update (the end of the step). A
device that runs several chunks holds their inputs and sums, the most
stash its order holds at once, and the largest transient and update.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.evaluate import COMMUNICATION, Cost, collective_s, evaluate
from costmodel.hardware import Hardware
from ir.core import Function, TensorType
from ir.pipeline import PHASES, PIPELINE, Pipeline, Task, Transfer
from ir.pipeline_run import device_sequences


@dataclass(frozen=True, slots=True)
class ScheduleTimes:
    """A simulated schedule: when it ends and how busy each stage was."""

    makespan_s: float
    busy_s: tuple[float, ...]  # per device: the time its tasks run
    in_flight: tuple[int, ...]  # per device: the most stage microbatches between forward and backward
    runs: tuple[tuple[int, str, int, float, float], ...] = ()  # (stage, phase, microbatch, start s, end s)

    @property
    def idle_fraction(self) -> float:
        """The devices' idle share of the step: the bubble."""
        if not self.makespan_s:
            return 0.0
        return 1 - sum(self.busy_s) / (len(self.busy_s) * self.makespan_s)


def simulate_schedule(stages: int, microbatches: int, schedule: str, task_s: Mapping[tuple[int, str], float],
                      arrive_s: Mapping[tuple[int, str], float] | None = None,
                      start_s: Mapping[int, float] | None = None, chunks: int = 1) -> ScheduleTimes:
    """Simulate the schedule, each device running its stages' tasks in its
    order (`ir.pipeline_run.device_sequences`; `chunks` stages a device).
    `task_s[(stage, phase)]` is one task's time (a missing task takes none);
    `arrive_s[(stage, phase)]` the time the transfers a forward or backward
    of that stage waits for take; `start_s[stage]` when the stage can start
    (values sent to it once)."""
    arrive_s, start_s = arrive_s or {}, start_s or {}
    seqs = device_sequences(stages, microbatches, schedule, chunks)
    finish: dict[tuple[int, str, int], float] = {}
    runs = []
    free = [0.0] * len(seqs)
    at = [0] * len(seqs)
    while any(at[d] < len(seq) for d, seq in enumerate(seqs)):
        moved = False
        for d, seq in enumerate(seqs):
            if at[d] == len(seq):
                continue
            s, phase, k = seq[at[d]]
            before = _dependency(stages, s, phase, k)
            if before is not None and before not in finish:
                continue
            ready = finish[before] + arrive_s.get((s, phase), 0.0) if before is not None else 0.0
            start = max(free[d], ready, start_s.get(s, 0.0))
            free[d] = finish[(s, phase, k)] = start + task_s.get((s, phase), 0.0)
            runs.append((s, phase, k, start, free[d]))
            at[d] += 1
            moved = True
        if not moved:
            raise AssertionError(f"the {schedule} schedule deadlocks")
    busy = tuple(sum(task_s.get((s, phase), 0.0) for s, phase, _ in seq) for seq in seqs)
    return ScheduleTimes(max(free), busy, tuple(_most_held(seq) for seq in seqs), tuple(runs))


def schedule_trace(times: ScheduleTimes) -> dict[str, Any]:
    """The simulated schedule as a Chrome trace (docs/trace.md): one track
    per device along the pipeline axis (a stage, unless the schedule is
    interleaved), one slice per task run, times in microseconds."""
    devices = len(times.busy_s)
    interleaved = any(s >= devices for s, *_ in times.runs)
    track = "device" if interleaved else "stage"
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 1,
                                     "args": {"name": f"pipeline {track}s"}}]
    for d in range(devices):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": d + 1, "args": {"name": f"{track} {d}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": d + 1, "args": {"sort_index": d}})
    for s, phase, k, start, end in times.runs:
        if end > start:
            name = f"{phase} {k}" if phase in ("forward", "backward") else phase
            name += f" (stage {s})" if interleaved else ""
            events.append({"ph": "X", "name": name, "cat": phase, "pid": 1, "tid": s % devices + 1,
                           "ts": round(start * 1e9) / 1e3, "dur": (round(end * 1e9) - round(start * 1e9)) / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _dependency(stages: int, s: int, phase: str, k: int) -> tuple[int, str, int] | None:
    if phase == "forward" and s > 0:
        return s - 1, "forward", k
    if phase == "backward" and s < stages - 1:
        return s + 1, "backward", k
    return None


def _most_held(seq: list[tuple[int, str, int]], weight: Sequence[int] | None = None) -> int:
    """The most a device's sequence holds at once between a stage's forward
    and its backward of a microbatch: stage microbatches, or with `weight`
    (per stage) their sum."""
    held = most = 0
    for s, phase, _ in seq:
        held += {"forward": 1, "backward": -1}.get(phase, 0) * (1 if weight is None else weight[s])
        most = max(most, held)
    return most


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One stage's memory on one device (module docstring)."""

    resident_bytes: int  # the step inputs it reads
    accumulated_bytes: int  # the sums over microbatches
    stash_bytes: int  # per microbatch in flight
    in_flight: int
    transient_bytes: int  # the largest forward or backward beyond the above
    update_bytes: int  # the post (the update) beyond the inputs, the sums freed as it reads them
    held_bytes: int | None = None  # the most stash held at once, where stashes differ (a device's chunks)

    @property
    def held(self) -> int:
        """The most stash held at once: in-flight x stash, or a device's own count."""
        return self.in_flight * self.stash_bytes if self.held_bytes is None else self.held_bytes

    @property
    def peak_bytes(self) -> int:
        microbatches = self.accumulated_bytes + self.held + self.transient_bytes
        return self.resident_bytes + max(microbatches, self.update_bytes)


@dataclass(frozen=True, slots=True)
class PipelineCost:
    step_time_s: float
    bubble_fraction: float  # the devices' idle share of the step
    tasks: Mapping[tuple[int, str], Cost]  # each task's cost on one device, by (stage, phase)
    task_s: Mapping[tuple[int, str], float]  # each task's time in the schedule, with the transfers it waits for
    transfer_s: float  # all transfers of one step, summed
    memory: tuple[StageMemory, ...]  # per device along the pipeline axis (per stage, unless interleaved)
    schedule: ScheduleTimes
    capacity_bytes: float
    collective_counts: Mapping[str, int]
    seconds_by_kind: Mapping[str, float]  # every task run of the step and the transfers, summed over the stages
    microbatches: int = 1  # the K it was priced with

    @property
    def peak_memory_bytes(self) -> tuple[int, ...]:
        """Per device along the pipeline axis (a stage's, unless interleaved), on one device."""
        return tuple(m.peak_bytes for m in self.memory)

    @property
    def fits(self) -> bool:
        return max(self.peak_memory_bytes) <= self.capacity_bytes

    def work(self, stages: Container[int], microbatches: int) -> tuple[float, float, int, dict[str, float]]:
        """What one device running `stages` spends in a step: compute s, communication s, flops, seconds by kind."""
        return task_work(self.tasks, microbatches, stages)


def task_work(tasks: Mapping[tuple[int, str], Cost], microbatches: int,
              stages: Container[int] | None = None) -> tuple[float, float, int, dict[str, float]]:
    """Compute s, communication s, flops and seconds by kind of the tasks of
    `stages` (None: every stage's), summed over a step: a forward or
    backward runs once per microbatch, the update once."""
    compute = communication = 0.0
    flops = 0
    by_kind: dict[str, float] = {}
    for (s, phase), cost in tasks.items():
        if stages is None or s in stages:
            runs = microbatches if phase in ("forward", "backward") else 1
            compute, communication = compute + cost.compute_s * runs, communication + cost.communication_s * runs
            flops += cost.flops * runs
            for kind, seconds in cost.seconds_by_kind.items():
                by_kind[kind] = by_kind.get(kind, 0.0) + seconds * runs
    return compute, communication, flops, by_kind


def transfer_time_s(pipeline: Pipeline, hardware: Hardware, value_type: TensorType) -> float:
    """One transfer: a collective_permute of the value over the pipeline axis."""
    return collective_s("collective_permute", (PIPELINE,), value_type, value_type, pipeline.mesh, hardware)


@dataclass(frozen=True, slots=True)
class PipelineParts:
    """What a pipelined step's price is made of before its schedule runs:
    per stage of the step (`stage_map` applied) each task's cost and time,
    the transfers it waits for, its memory but the microbatches in flight;
    the step's transfers and collectives. `price_parts` simulates them;
    `solver.planning.shallow` extends a shallow copy's to the step's depth."""

    microbatches: int
    schedule: str
    chunks: int
    costs: Mapping[tuple[int, str], Cost]
    task_s: Mapping[tuple[int, str], float]
    arrive_s: Mapping[tuple[int, str], float]
    start_s: Mapping[int, float]
    transfer_s: float
    collective_counts: Mapping[str, int]
    memory: tuple[StageMemory, ...]  # per stage of the step, in_flight 0
    capacity_bytes: float

    @property
    def stages(self) -> int:
        return len(self.memory)


def pipeline_cost(pipeline: Pipeline, hardware: Hardware, stage_map: tuple[int, ...] | None = None,
                  chunks: int = 1) -> PipelineCost:
    """Step time, bubble and per-device peak memory of a pipelined step.
    `stage_map`: the stage of `pipeline` each stage of the step runs as (a
    pipeline folded to its distinct stages, `ir.pipeline_fold`), and
    `chunks` the step's stages per device; None: the pipeline's own stages
    and chunks. A stage receives what its stand-in receives."""
    return price_parts(pipeline_parts(pipeline, hardware, stage_map, chunks))


def pipeline_parts(pipeline: Pipeline, hardware: Hardware, stage_map: tuple[int, ...] | None = None,
                   chunks: int = 1, memory: tuple[StageMemory, ...] | None = None) -> PipelineParts:
    """`pipeline_cost`'s parts (`PipelineParts`); `memory`: the stages'
    memory where the caller has it (a shallow copy's, extended to the step)."""
    if stage_map is None:
        stage_map, chunks, same_device = tuple(range(pipeline.stages)), pipeline.chunks, pipeline.same_device
    else:
        # A folded step's transfers stand for the step's between neighbours or the first and the last
        # stage, on other devices whenever it is folded (`ir.pipeline_fold`: interleaved, 3 devices or more).
        def same_device(t: Transfer) -> bool:
            return False
    copies = Counter(stage_map)  # how many stages of the step each stage of `pipeline` stands for
    priced: dict[tuple, Cost] = {}  # a uniform model's inner stages run the same tasks under other names
    own: dict[tuple[int, str], Cost] = {}
    for t in pipeline.tasks:
        key = unnamed(t.function)
        if key not in priced:
            priced[key] = evaluate(t.function, hardware)
        own[(t.stage, t.phase)] = priced[key]
    own_s = {key: c.step_time_s for key, c in own.items()}
    arrive: dict[tuple[int, str], float] = {}
    start: dict[int, float] = {}
    total_transfer = 0.0
    for t in pipeline.transfers:
        if same_device(t):  # between two chunks of one device: it stays
            continue
        seconds = transfer_time_s(pipeline, hardware, t.type)
        total_transfer += seconds * (pipeline.microbatches if t.per_microbatch else 1) * copies[t.dst]
        # A forward or backward waits for its microbatch's values. A value sent
        # once delays the receiver's post, or, read before it, its start.
        if t.per_microbatch:
            arrive[(t.dst, t.phase)] = arrive.get((t.dst, t.phase), 0.0) + seconds
        elif _read_in_post(pipeline, t):
            own_s[(t.dst, "post")] = own_s.get((t.dst, "post"), 0.0) + seconds
        else:
            start[t.dst] = start.get(t.dst, 0.0) + seconds
    stages = range(len(stage_map))

    def per_stage(by_own: Mapping[tuple[int, str], Any]) -> dict[tuple[int, str], Any]:
        return {(s, phase): by_own[(stage_map[s], phase)] for s in stages for phase in PHASES
                if (stage_map[s], phase) in by_own}

    counted = pipeline.collective_counts(copies)
    if memory is None:
        own_memory = {s: _stage_memory(pipeline, s, 0) for s in copies}  # all but the microbatches in flight
        memory = tuple(own_memory[stage_map[s]] for s in stages)
    return PipelineParts(pipeline.microbatches, pipeline.schedule, chunks, per_stage(own), per_stage(own_s),
                         per_stage(arrive), {s: start[stage_map[s]] for s in stages if stage_map[s] in start},
                         total_transfer, {k: counted.get(k, 0) for k in COMMUNICATION}, memory,
                         hardware.capacity_bytes)


def price_parts(parts: PipelineParts) -> PipelineCost:
    """The schedule simulated over `parts`: the step's `PipelineCost`."""
    times = simulate_schedule(parts.stages, parts.microbatches, parts.schedule, parts.task_s, parts.arrive_s,
                              parts.start_s, parts.chunks)
    by_kind = task_work(parts.costs, parts.microbatches)[3]
    by_kind["collective_permute"] = by_kind.get("collective_permute", 0.0) + parts.transfer_s
    if parts.chunks == 1:
        memory = tuple(dataclasses.replace(m, in_flight=times.in_flight[s]) for s, m in enumerate(parts.memory))
    else:
        memory = _device_memory(list(parts.memory), device_sequences(parts.stages, parts.microbatches,
                                                                     parts.schedule, parts.chunks))
    return PipelineCost(times.makespan_s, times.idle_fraction, parts.costs, parts.task_s, parts.transfer_s, memory,
                        times, parts.capacity_bytes, parts.collective_counts, by_kind, parts.microbatches)


def unnamed(fn: Function) -> tuple:
    """`fn` without its names: its parameters' types, each op's kind,
    attributes, operands (by position) and result types, its results and mesh.
    Two functions with the same key have the same cost (`evaluate` reads no name)."""
    index = {p: n for n, p in enumerate(fn.params)}
    body = []
    for op in fn.ops:
        body.append((op.kind, op.attrs, tuple(index[v] for v in op.operands), tuple(r.type for r in op.results)))
        index.update((r, len(index)) for r in op.results)
    return tuple(p.type for p in fn.params), tuple(body), tuple(index[r] for r in fn.results), fn.mesh


def _read_in_post(pipeline: Pipeline, t: Transfer) -> bool:
    """Only the receiver's post reads the value."""
    return all(task.phase == "post" for task in pipeline.tasks
               if task.stage == t.dst and any(p.name == t.value for p in task.function.params))


def _stage_memory(pipeline: Pipeline, stage: int, in_flight: int) -> StageMemory:
    """The stage's memory terms (module docstring)."""
    held, curves = stage_curves(pipeline, stage)
    transient = max((max(curve) - own for task, curve, own in curves if task.per_microbatch), default=0)
    update = max((max(curve) for task, curve, _ in curves if not task.per_microbatch), default=0)
    return StageMemory(*held, in_flight, transient, update)


def stage_curves(pipeline: Pipeline, stage: int) -> tuple[tuple[int, int, int], list[tuple[Task, list[int], int]]]:
    """The stage's resident, accumulated and stash bytes, and per task its
    live bytes at each op beyond what those hold (`live_curve_bytes`) with
    the part of them that is its own (`_own_bytes`): a forward's or
    backward's transient is its curve's most less its own, the post's
    update its curve's most. The most own values hold at once beyond the
    others' is counted while they live: at a backward's peak the layers
    it has passed have freed their stash, and a forward's peak comes
    before it has made all of it; never negative (a backward holds all it
    reads at its start, a task all it makes at its end).
    `solver.planning.shallow` reads the curves place by place."""
    tasks = [t for t in pipeline.tasks if t.stage == stage]
    inputs = {p.name for p in pipeline.local.function.params}
    resident = {p.name: p.type.num_bytes * (pipeline.microbatches if p.name in pipeline.varying else 1)
                for t in tasks for p in t.function.params if p.name in inputs}
    totals = dict(pipeline.sums)
    accumulated = {totals[r.name]: r.type.num_bytes for t in tasks for r in t.function.results if r.name in totals}
    forward = next((t for t in tasks if t.phase == "forward"), None)
    backward = next((t for t in tasks if t.phase == "backward"), None)
    stash: dict[str, int] = {}
    if forward is not None and backward is not None:
        seen = {r.name for r in forward.function.results} | {p.name for p in forward.function.params}
        stash = {p.name: p.type.num_bytes for p in backward.function.params
                 if p.name in seen and p.name in pipeline.varying and p.name not in inputs}
    # A microbatch's gradient goes into its sum as it is made: the sum is its memory. With one
    # microbatch no sum is held before its backward: the gradients count as that backward makes them.
    kept = set(resident) | set(accumulated) | set(stash) | set(totals)
    growing = totals if pipeline.microbatches == 1 else {}
    curves = []
    for t in tasks:
        if t.per_microbatch:
            own = _own_bytes(t, stash, growing)
            curves.append((t, live_curve_bytes(t.function, kept - set(own)), sum(own.values())))
        else:
            curves.append((t, live_curve_bytes(t.function, set(resident)), 0))
    held = (sum(resident.values()), 0 if growing else sum(accumulated.values()), sum(stash.values()))
    return held, curves


def _own_bytes(task: Task, stash: Mapping[str, int], growing: Container[str]) -> dict[str, int]:
    """What of its microbatch's stash `task` makes or frees, and the
    gradients it makes whose sums are `growing` (`stage_curves`)."""
    fn, backward = task.function, task.phase == "backward"
    own = {v.name: n for v in (fn.params if backward else fn.results) if (n := stash.get(v.name))}
    if backward:
        own.update((r.name, r.type.num_bytes) for r in fn.results if r.name in growing)
    return own


def _device_memory(stage_memory: list[StageMemory],
                   seqs: list[list[tuple[int, str, int]]]) -> tuple[StageMemory, ...]:
    """Per device (`seqs`: each device's sequence), the memory of the stages
    it runs (interleaved chunks): their inputs and sums, summed (an input
    two of its stages read, a table every layer reads, counts twice: an
    upper bound by that input), the most stash its sequence holds at once
    (each stage microbatch in flight its own stage's); the largest
    transient; an update beside the other stages' sums (an upper bound:
    the posts run one after another and free the sums they read)."""
    out = []
    stash = [m.stash_bytes for m in stage_memory]
    for d, seq in enumerate(seqs):
        own = [stage_memory[s] for s in range(d, len(stage_memory), len(seqs))]
        accumulated = sum(m.accumulated_bytes for m in own)
        out.append(StageMemory(sum(m.resident_bytes for m in own), accumulated, max(m.stash_bytes for m in own),
                               _most_held(seq),
                               max(m.transient_bytes for m in own),
                               max(m.update_bytes + accumulated - m.accumulated_bytes for m in own),
                               _most_held(seq, stash)))
    return tuple(out)


def live_peak_bytes(fn: Function, held: set[str]) -> int:
    """The most bytes a task holds at once beyond the values `held` (counted
    elsewhere): its other parameters until their last use, what it makes
    from its definition to its last use, its results until it ends."""
    return max(live_curve_bytes(fn, held), default=0)


def live_curve_bytes(fn: Function, held: set[str]) -> list[int]:
    """`live_peak_bytes`'s count at each op of `fn` and after its last (n + 1 places)."""
    n = len(fn.ops)
    last: dict[str, int] = {}
    for i, op in enumerate(fn.ops):
        for v in op.operands:
            last[v.name] = i
    for r in fn.results:
        last[r.name] = n
    delta = [0] * (n + 2)
    for p in fn.params:
        if p.name not in held:
            delta[0] += p.type.num_bytes
            delta[last.get(p.name, 0) + 1] -= p.type.num_bytes
    for i, op in enumerate(fn.ops):
        for r in op.results:
            if r.name not in held:
                delta[i] += r.type.num_bytes
                delta[max(last.get(r.name, i), i) + 1] -= r.type.num_bytes
    live, here = [], 0
    for i in range(n + 1):
        here += delta[i]
        live.append(here)
    return live
