"""A list schedule of a device-local program on one device, and its Chrome trace.

`costmodel.evaluate` prices a program as the sum of its kernels' times: no
communication ever overlaps compute. This module places the same kernels
(`costmodel.fusion.fuse`, with the durations of `evaluate.kernel_times`) on
a timeline, to show what overlap could hide and what it costs in memory:

  - *Program order* of kernels is the order of their last ops. A fused
    kernel is an in-tree whose only value read outside it is its last op's
    result, so this order is topological; `Fusion.kernels` (by first op) is
    not: `add(exp(x), dot(y, w))` fuses the exp with the add, after the dot.
  - *One compute stream* runs every kernel that is not a communicating
    collective (`evaluate.COMMUNICATION`; `all_slice` is a local copy), in
    program order except that a kernel a collective reads moves up to just
    after its last operand is made (so a gradient's scaling, listed by the
    optimizer step after the backward, runs where the gradient is made): a
    kernel starts at max(the stream is free, its operands are ready).
  - *Collectives* run beside it, each as soon as its operand is ready and
    every mesh axis it spans is free, in order of readiness, not of the
    program: an optimizer step lists every gradient reduction at its end,
    but XLA's latency-hiding scheduler starts each one where its gradient
    is made, under the rest of the backward. `Hardware` gives each axis a
    link of its own, so collectives on disjoint axis sets run at once and
    collectives sharing an axis queue. One track per axis set.
  - *Prefetch window*, for all_gathers (a parameter's gather is ready at
    time 0): with c_1 .. c_m the compute kernels before it in program
    order, it may not start before c_(m - prefetch) starts (no bound if
    m <= prefetch). That is XLA's async collective start hoisted above
    `prefetch` compute kernels: with prefetch = 0 it is issued right after
    c_m is, so it overlaps c_m at most. Without a window every parameter
    all_gather of a ZeRO-3 plan would start at time 0 and hold every
    gathered weight at once.
  - An operand is ready when the kernel producing it ends; parameters at 0.

Memory follows the schedule: parameters are resident throughout; each op
result is allocated when its op starts and freed when the last op reading it
ends (a value nobody reads, when its own op ends; function results are kept
to the end). A one-op kernel's op spans the kernel; the ops of a fused
kernel take equal parts of its span in program order, so an intermediate
lives from its op to its last use as `evaluate` counts it (XLA keeps it in
registers; the two models over-estimate alike). A value lives on
[allocation, free), so back-to-back ops do not share a buffer. A prefetched
all_gather's result therefore counts while it waits for its consumer, and a
gradient while it waits for its reduce_scatter. Without communication, when
every kernel's ops are contiguous in program order (no fusion, or chains
that nothing interleaves), the ops run back to back in program order and the
peak is exactly `evaluate.peak_memory_bytes`; a kernel placed after ops that
come between its own moves its intermediates' lifetimes with it.

`critical_path_s <= makespan_s <= serial_s`: every start is the end of an
earlier task or the start of one, so [0, makespan] is covered by distinct
tasks; `serial_s` is `evaluate`'s step time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.evaluate import COMMUNICATION, fused_kernel_times
from costmodel.fusion import FUSION
from costmodel.hardware import Hardware
from ir.core import Function, Op

# The lowered forward of one decoder layer of the bundled transformer (gated
# MLP, Megatron + ZeRO-3) is 18 compute kernels after fusion: norm, q, k, v,
# scaled q, scores, mask, two softmax kernels, context, out projection,
# residual, norm, gate, up, activation, down projection, residual. A window of
# one layer lets layer l+1's weight all_gathers run under layer l's compute,
# as FSDP's one-layer prefetch does, while holding one layer's gathered
# weights in advance, not the whole model's.
DEFAULT_PREFETCH = 18
COMPUTE = "compute"
PID = 1  # the trace's one process: the device


@dataclass(frozen=True, slots=True)
class Task:
    """One kernel on the timeline."""

    name: str  # as in the device-local IR text: "%x", or "fusion(%a..%z, N ops)"
    kind: str  # the op kind, or "fusion" for a kernel of several ops
    stream: str  # "compute", or "comm:<axes joined by ,>"
    start_s: float
    end_s: float
    ops: tuple[str, ...]  # the kernel's ops by their results' names, program order
    flops: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Timeline:
    """The list schedule of one device's program (see the module docstring)."""

    tasks: tuple[Task, ...]  # in program order (of kernels' last ops)
    makespan_s: float
    serial_s: float  # the sum of all kernel times: evaluate's step time
    critical_path_s: float  # the longest dependency chain, streams ignored
    peak_memory_bytes: int
    # (time, live bytes from then on) at each change; points at one time are the
    # instants of a kernel of zero time, the last of them what stays
    memory: tuple[tuple[float, int], ...]
    prefetch: int = DEFAULT_PREFETCH

    @property
    def compute_s(self) -> float:
        """The compute stream's busy time."""
        return sum(t.duration_s for t in self.tasks if t.stream == COMPUTE)

    @property
    def exposed_communication_s(self) -> float:
        """The part of the makespan the compute stream spends idle, waiting for
        communication (or for nothing, in a program of only collectives)."""
        return max(0.0, self.makespan_s - self.compute_s)

    @property
    def streams(self) -> tuple[str, ...]:
        """The tracks: compute first, then each axis set's in order of first use."""
        return tuple(dict.fromkeys([COMPUTE] + [t.stream for t in self.tasks]))


@dataclass(frozen=True, slots=True)
class _Kernel:
    ops: tuple[int, ...]  # op indices, program order
    kind: str
    seconds: float
    flops: int
    axes: tuple[str, ...] | None  # a communicating collective's mesh axes; None for compute
    deps: tuple[int, ...]  # the kernels (program-order positions) producing its operands


def simulate(fn: Function, hardware: Hardware, prefetch: int = DEFAULT_PREFETCH) -> Timeline:
    """The list schedule of `fn`'s kernels on one compute stream and a link
    per mesh axis, with memory over time (see the module docstring)."""
    if prefetch < 0:
        raise ValueError(f"prefetch is a number of compute kernels, at least 0; got {prefetch}")
    kernels = _kernels(fn, hardware)
    spans = _schedule(kernels, prefetch)
    makespan = max((end for _, end in spans), default=0.0)
    peak, curve = _memory(fn, kernels, spans)
    tasks = tuple(
        Task(_name(fn, k), k.kind, _stream(k.axes), start, end, tuple(_op_name(fn.ops[i]) for i in k.ops), k.flops)
        for k, (start, end) in zip(kernels, spans)
    )
    return Timeline(tasks, makespan, sum(k.seconds for k in kernels), _critical_path(kernels), peak, curve,
                    prefetch)


def _kernels(fn: Function, hardware: Hardware) -> list[_Kernel]:
    """`fn`'s kernels in program order (of last ops), with their times and dependencies."""
    fusion, timed = fused_kernel_times(fn, hardware)  # `evaluate`'s; in fusion.kernels order
    order = sorted(range(len(fusion.kernels)), key=lambda k: fusion.kernels[k][-1])
    position = {k: p for p, k in enumerate(order)}
    producer = {r: position[fusion.kernel_of[i]] for i, op in enumerate(fn.ops) for r in op.results}
    out = []
    for p, k in enumerate(order):
        members = fusion.kernels[k]
        kind, seconds, flops = timed[k]
        deps = {producer[v] for i in members for v in fn.ops[i].operands if v in producer} - {p}
        axes = tuple(fn.ops[members[0]].attrs["axes"]) if kind in COMMUNICATION else None
        out.append(_Kernel(members, kind, seconds, flops, axes, tuple(sorted(deps))))
    return out


def _schedule(kernels: Sequence[_Kernel], prefetch: int) -> list[tuple[float, float]]:
    """(start, end) of each kernel: an event-driven list schedule. The compute
    stream takes its kernels in `_compute_order`; a collective becomes a
    candidate once its operand's producer and (an all_gather) its window's
    compute kernel are placed, and candidates go in order of earliest
    possible start (program order on ties). Each step places whichever of the
    next compute kernel and the best candidate can start first, so starts
    are placed in time order and a link's free time is all it needs."""
    spans: list[tuple[float, float] | None] = [None] * len(kernels)
    compute = _compute_order(kernels)
    gates, blocked, window = _gates(kernels, prefetch)
    candidates = [(0.0, p) for p, n in blocked.items() if n == 0]  # (earliest start ignoring links, kernel)
    heapq.heapify(candidates)
    compute_free, next_compute = 0.0, 0
    link_free: dict[str, float] = {}

    def place(p: int, start: float) -> None:
        spans[p] = (start, start + kernels[p].seconds)
        for q in gates.get(p, ()):
            blocked[q] -= 1
            if blocked[q] == 0:
                ready = max((spans[d][1] for d in kernels[q].deps), default=0.0)
                heapq.heappush(candidates, (max(ready, spans[window[q]][0] if q in window else 0.0), q))

    while next_compute < len(compute) or candidates:
        best, best_start = None, float("inf")
        while candidates:  # lazily: a candidate's links may have become busy since it was pushed
            est, p = candidates[0]
            start = max(est, max((link_free.get(a, 0.0) for a in kernels[p].axes), default=0.0))
            if start == est:
                best, best_start = p, start
                break
            heapq.heapreplace(candidates, (start, p))
        if next_compute < len(compute):
            c = compute[next_compute]
            if all(spans[d] is not None for d in kernels[c].deps):
                start = max([compute_free] + [spans[d][1] for d in kernels[c].deps])
                if start <= best_start:
                    place(c, start)
                    compute_free = spans[c][1]
                    next_compute += 1
                    continue
        if best is None:
            raise AssertionError("internal: the schedule is stuck")  # dependencies always come earlier
        heapq.heappop(candidates)
        place(best, best_start)
        link_free.update((a, spans[best][1]) for a in kernels[best].axes)
    return spans


def _gates(kernels: Sequence[_Kernel], prefetch: int) -> tuple[dict[int, list[int]], dict[int, int], dict[int, int]]:
    """What each collective waits for: (kernel -> the collectives it gates,
    collective -> how many gates it has, all_gather -> its window's compute
    kernel, the one `prefetch` compute kernels before it in program order)."""
    in_program = [p for p, k in enumerate(kernels) if k.axes is None]
    before = 0  # compute kernels so far, in program order
    gates: dict[int, list[int]] = {}
    blocked: dict[int, int] = {}
    window: dict[int, int] = {}
    for p, k in enumerate(kernels):
        if k.axes is None:
            before += 1
            continue
        needs = set(k.deps)
        if k.kind == "all_gather" and before > prefetch:
            window[p] = in_program[before - 1 - prefetch]
            needs.add(window[p])
        blocked[p] = len(needs)
        for q in needs:
            gates.setdefault(q, []).append(p)
    return gates, blocked, window


def _compute_order(kernels: Sequence[_Kernel]) -> list[int]:
    """The compute stream's order: program order, except that a kernel whose
    result a collective reads runs right after its last operand is made. An
    optimizer step lists its gradient scaling after the whole backward; XLA's
    scheduler runs it where the gradient is made, so the gradient's
    reduction can start under the rest of the backward. Still topological:
    every operand of a moved kernel comes before the place it moves to."""
    feeds = {d for k in kernels if k.axes is not None for d in k.deps}
    compute = [p for p, k in enumerate(kernels) if k.axes is None]
    return sorted(compute, key=lambda p: (max(kernels[p].deps, default=-1) + 0.5 if p in feeds else p, p))


def _memory(fn: Function, kernels: Sequence[_Kernel],
            spans: Sequence[tuple[float, float]]) -> tuple[int, tuple[tuple[float, int], ...]]:
    """(peak live bytes, the curve) under the schedule `spans` (see the module
    docstring). Changes are ordered by (time, the op's place in the
    schedule, allocations before frees), so a kernel of zero time (a
    reshape, a collective over one device) still holds its operands and
    results together for an instant: the curve keeps it as points at one
    time, and the peak counts it."""
    span_of: dict[int, tuple[float, float, int]] = {}  # op index -> its part of its kernel's span, its place
    for k, (start, end) in zip(kernels, spans):
        n = len(k.ops)
        for j, i in enumerate(k.ops):
            part_end = end if j == n - 1 else start + (end - start) * (j + 1) / n
            span_of[i] = (start + (end - start) * j / n, part_end, len(span_of))
    freed: dict = {}  # value -> (end, place) of the last op reading it
    for i, op in enumerate(fn.ops):
        for v in op.operands:
            freed[v] = max(freed.get(v, (0.0, -1)), (span_of[i][1], span_of[i][2]))
    returned = set(fn.results)
    events = []  # (time, place, 0 allocate | 1 free, bytes)
    for i, op in enumerate(fn.ops):
        start, end, place = span_of[i]
        for r in op.results:
            events.append((start, place, 0, r.type.num_bytes))
            if r not in returned:  # results stay to the end
                events.append((*freed.get(r, (end, place)), 1, -r.type.num_bytes))
    level = sum(p.type.num_bytes for p in fn.params)
    curve = [(0.0, level)]
    for t, _, _, delta in sorted(events):
        level += delta
        if level != curve[-1][1]:
            curve.append((t, level))
    return max(b for _, b in curve), tuple(curve)


def _critical_path(kernels: Sequence[_Kernel]) -> float:
    finish: list[float] = []
    for k in kernels:
        finish.append(k.seconds + max((finish[d] for d in k.deps), default=0.0))
    return max(finish, default=0.0)


def _op_name(op: Op) -> str:
    return ", ".join(f"%{r.name}" for r in op.results)


def _name(fn: Function, kernel: _Kernel) -> str:
    first, last = fn.ops[kernel.ops[0]], fn.ops[kernel.ops[-1]]
    if kernel.kind != FUSION:
        return _op_name(first)
    return f"fusion(%{first.results[0].name}..%{last.results[0].name}, {len(kernel.ops)} ops)"


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _stream(axes: tuple[str, ...] | None) -> str:
    return COMPUTE if axes is None else "comm:" + ",".join(axes)


def _track_name(stream: str) -> str:
    return stream if stream == COMPUTE else "comm: " + stream.removeprefix("comm:")


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The timeline as a Chrome trace-event JSON object (Perfetto and
    chrome://tracing open it; docs/trace.md): one complete ("X") event per
    task on its stream's track, times in microseconds, and the live memory
    as a counter ("C") track in GiB.

    Times are whole nanoseconds written in microseconds: a track's slices
    must nest or not overlap, and a kernel that starts where the one before
    it ends must still do so once the viewer has rounded both to
    nanoseconds."""
    # Ids from 1: Perfetto reserves pid 0 for the swapper in some traces, and
    # its JSON import merged tid 0 into tid 1 until google/perfetto#2278.
    tid = {stream: n for n, stream in enumerate(timeline.streams, start=1)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 1, "args": {"name": "one device"}},
    ]
    for stream, n in tid.items():
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": n, "args": {"name": _track_name(stream)}})
        # chrome://tracing orders tracks by this: compute on top.
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": n, "args": {"sort_index": n}})
    for task in timeline.tasks:
        events.append({
            "ph": "X", "name": task.name, "cat": task.kind, "pid": PID, "tid": tid[task.stream],
            "ts": _ns(task.start_s) / 1e3, "dur": (_ns(task.end_s) - _ns(task.start_s)) / 1e3,
            "args": {"kind": task.kind, "ops": list(task.ops), "flops": task.flops},
        })
    for time_s, nbytes in timeline.memory:
        events.append({"ph": "C", "name": "memory", "pid": PID, "tid": 1, "ts": _ns(time_s) / 1e3,
                       "args": {"GiB": nbytes / 2**30}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
