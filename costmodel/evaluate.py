"""The cost of a device-local program: step time and peak memory per device.

Every device runs the same program (SPMD), so one walk gives the step time:

  - a local op takes its roofline time, max(flops / peak flop/s of its dtype,
    bytes accessed / HBM bandwidth), from the op kind's registered cost;
  - a collective over axes of n devices takes its ring time on the slowest
    link of those axes, with `f = (n - 1) / n`:
        all_reduce       2 f * bytes / bandwidth + 2 (n - 1) * latency
        all_gather       f * result bytes / bandwidth + (n - 1) * latency
        reduce_scatter   f * operand bytes / bandwidth + (n - 1) * latency
        all_to_all       f * bytes / bandwidth + (n - 1) * latency
        collective_permute
                         bytes / bandwidth + latency: every member sends its
                         operand to one peer at once, one hop whatever the
                         shift (a pipeline axis is a chain of links)
    (`all_slice` moves nothing between devices: it is a local copy and is
    costed as one);
  - ops XLA would fuse run as one kernel (`costmodel.fusion`): a kernel of
    several ops takes max(its flops / peak, its boundary bytes / HBM
    bandwidth);
  - the step time is the sum over kernels (no overlap of compute and
    communication).

Peak memory: values live from the op that defines them to their last use;
parameters (weights, optimizer state, inputs) and results live throughout.
The peak is the largest sum over the program's ops.

The TOAST objective compares a plan with the unpartitioned program:
C(s) = RT(s) + MP(s), RT the step time relative to the unpartitioned one,
MP = penalty * (peak - capacity) / unpartitioned peak when over capacity.

`op_time_s` is the one place the formulas live: the evaluation here and
the tabulated form (`costmodel.table`) both call it, which is what makes the
table's sum equal this evaluation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from costmodel.fusion import FUSION, Fusion, fuse, fused_time_s, kernel_members, unfused
from costmodel.hardware import Hardware
from ir import ops
from ir.core import Attrs, Function, Mesh, Recent, TensorType

COMMUNICATION = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
MEMORY_PENALTY = 10.0


def roofline_s(flops: int, nbytes: int, dtype: str, hardware: Hardware) -> float:
    device = hardware.device
    return max(flops / device.compute_rate(dtype), nbytes / device.memory_rate)


def collective_s(kind: str, axes: Sequence[str], operand: TensorType, result: TensorType,
                 mesh: Mesh, hardware: Hardware) -> float:
    """Ring time of one collective over `axes` (see the module docstring)."""
    n = mesh.group_size(axes)
    if n == 1:
        return 0.0
    link = hardware.link(axes)
    f, hops = (n - 1) / n, n - 1
    if kind == "all_reduce":
        return 2 * f * operand.num_bytes / link.effective_bandwidth + 2 * hops * link.latency
    if kind == "all_gather":
        return f * result.num_bytes / link.effective_bandwidth + hops * link.latency
    if kind in ("reduce_scatter", "all_to_all"):
        return f * operand.num_bytes / link.effective_bandwidth + hops * link.latency
    if kind == "collective_permute":
        # No (n - 1) / n: each member's whole operand crosses one link, all links at once.
        return operand.num_bytes / link.effective_bandwidth + link.latency
    raise ValueError(f"not a communicating collective: {kind}")


def compute_dtype(operands: Sequence[TensorType], results: Sequence[TensorType]) -> str:
    """The dtype whose peak an op runs at: its first operand's (a comparison
    computes in its inputs' dtype, not in its bool result's)."""
    return operands[0].dtype if operands else results[0].dtype


def op_time_s(kind: str, attrs: Attrs, operands: Sequence[TensorType], results: Sequence[TensorType],
              mesh: Mesh, hardware: Hardware) -> tuple[float, int]:
    """The time of one op of a device-local program, and its flops (0 for a
    communicating collective: its combining is not counted as compute)."""
    if kind in COMMUNICATION:
        return collective_s(kind, attrs["axes"], operands[0], results[0], mesh, hardware), 0
    cost = ops.get(kind).cost(tuple(operands), tuple(results), attrs)
    return roofline_s(cost.flops, cost.bytes, compute_dtype(operands, results), hardware), cost.flops


@dataclass(frozen=True, slots=True)
class Cost:
    """The cost of one device-local program on one device."""

    step_time_s: float
    compute_s: float
    communication_s: float
    peak_memory_bytes: int
    capacity_bytes: float
    flops: int  # per device
    seconds_by_kind: Mapping[str, float] = field(default_factory=dict)  # op kind -> seconds, collectives included
    collective_counts: Mapping[str, int] = field(default_factory=dict)
    kernels: int = 0  # compute kernels and collectives, after fusion
    fused_ops: int = 0  # ops running inside a kernel of several

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes


def make_cost(seconds_by_kind: Mapping[str, float], peak_memory_bytes: int, flops: int,
              collective_counts: Mapping[str, int], hardware: Hardware, kernels: int = 0, fused_ops: int = 0) -> Cost:
    """Assemble a Cost from per-kind times (summed in kind order, so every
    producer of the same per-kind figures gets the same totals)."""
    by_kind = {k: seconds_by_kind[k] for k in sorted(seconds_by_kind)}
    communication = sum(t for k, t in by_kind.items() if k in COMMUNICATION)
    compute = sum(t for k, t in by_kind.items() if k not in COMMUNICATION)
    counts = {k: collective_counts.get(k, 0) for k in COMMUNICATION}
    return Cost(compute + communication, compute, communication, int(peak_memory_bytes),
                hardware.capacity_bytes, int(flops), by_kind, counts, kernels, fused_ops)


def peak_memory_bytes(fn: Function) -> int:
    """Largest live bytes over the program (see the module docstring)."""
    return _peak(fn)[0]


def min_peak_memory_bytes(fn: Function, devices: int) -> int:
    """A lower bound of the peak memory per device of every partitioning of
    the global program `fn` over `devices` devices: its liveness with every
    value split evenly (`ideal_step_time_s`'s counterpart). No local value is
    smaller (a tensor's dimensions are split over distinct mesh axes, at most
    all of them), and at each op of the global program the partitioned one
    holds a local form of every value live there (its own, its partial sum
    reduced, or a resharding's result) beside parameters and collective
    temporaries. The planner skips searching a program whose bound exceeds
    the capacity: no plan of it can fit (tests/test_remat.py checks the bound
    against brute force)."""
    return _peak(fn, devices)[0]


def live_at_peak(fn: Function) -> tuple[int, list[tuple[str, int]]]:
    """The peak of `peak_memory_bytes` and the values live there (name,
    bytes), largest first: what dominates a program's memory."""
    peak, at, last = _peak(fn)
    values = [(p.name, p.type.num_bytes) for p in fn.params]
    values += [(r.name, r.type.num_bytes) for i, op in enumerate(fn.ops[: at + 1]) for r in op.results
               if max(last.get(r, i), i) >= at]
    return peak, sorted(values, key=lambda nb: -nb[1])


def _peak(fn: Function, devices: int = 1) -> tuple[int, int, dict]:
    """(peak live bytes, the op index where it is first reached or -1 before
    any op, each value's last use: n for results), every value's bytes split
    over `devices`."""
    resident, live, last = live_curve(fn, devices)
    peak, at = resident, -1
    for i, here in enumerate(live):
        if here > peak:
            peak, at = here, i
    return peak, at, last


def live_curve(fn: Function, devices: int = 1) -> tuple[int, list[int], dict]:
    """(the parameters' bytes, live before any op; the live bytes at each op
    of `fn`, `peak_memory_bytes`'s count; each value's last use), every
    value's bytes split over `devices`. `solver.planning.shallow` reads the
    curve place by place."""
    n = len(fn.ops)
    last: dict = {}
    for i, op in enumerate(fn.ops):
        for v in op.operands:
            last[v] = i
    for r in fn.results:
        last[r] = n
    resident = sum(p.type.num_bytes // devices for p in fn.params)
    delta = [0] * (n + 2)
    for i, op in enumerate(fn.ops):
        for r in op.results:
            nbytes = r.type.num_bytes // devices
            delta[i] += nbytes
            delta[max(last.get(r, i), i) + 1] -= nbytes
    live, here = [], resident
    for i in range(n):
        here += delta[i]
        live.append(here)
    return resident, live, last


def kernel_times(fn: Function, hardware: Hardware, fusion: Fusion | None = None) -> list[tuple[str, float, int]]:
    """Per kernel of `fusion` (default `costmodel.fusion.fuse(fn)`), in its
    order: the kind it is reported under (the op's kind, or `fusion`), its
    time and its flops. A kernel of one op costs what the op costs alone."""
    fusion = fuse(fn) if fusion is None else fusion
    members = iter(kernel_members(fn, fusion))
    priced: dict[tuple, tuple[float, int]] = {}  # per kernel's members: repeated layers repeat their kernels
    out = []
    for kernel in fusion.kernels:
        if len(kernel) > 1:
            these = tuple(next(members))
            known = priced.get(these)
            if known is None:
                known = priced[these] = fused_time_s(these, hardware)
            out.append((FUSION, *known))
        else:
            op = fn.ops[kernel[0]]
            seconds, flops = op_time_s(op.kind, op.attrs, [v.type for v in op.operands],
                                       [v.type for v in op.results], fn.mesh, hardware)
            out.append((op.kind, seconds, flops))
    return out


# The last programs' fused kernels and their times, per hardware: a plan's `evaluate` and its simulation
# (`costmodel.simulate`) read the same (llama2_70b's device-local step: half a second each).
_FUSED = Recent(2)


def fused_kernel_times(fn: Function, hardware: Hardware) -> tuple[Fusion, tuple[tuple[str, float, int], ...]]:
    """`fuse(fn)` and `kernel_times` of its kernels on `hardware`, made once
    for the last few programs (read-only)."""
    def make() -> tuple[Fusion, tuple[tuple[str, float, int], ...]]:
        fusion = fuse(fn)
        return fusion, tuple(kernel_times(fn, hardware, fusion))

    return _FUSED.get((fn,), hardware.model_dump_json(), make)


def evaluate(fn: Function, hardware: Hardware, fused: bool = True) -> Cost:
    """Step time and peak memory of a device-local program (or of a global
    program on one device); `fused=False` prices every op alone."""
    by_kind: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    flops = 0
    kernels = fused_kernel_times(fn, hardware)[1] if fused else kernel_times(fn, hardware, unfused(fn))
    for kind, seconds, kernel_flops in kernels:
        by_kind[kind] += seconds
        flops += kernel_flops
        if kind in COMMUNICATION:
            counts[kind] += 1
    fused_ops = len(fn.ops) - sum(1 for kind, _, _ in kernels if kind != FUSION)
    return make_cost(by_kind, peak_memory_bytes(fn), flops, counts, hardware, len(kernels), fused_ops)


def ideal_step_time_s(fn: Function, devices: int, hardware: Hardware) -> float:
    """The lower bound: the global program's flops spread evenly over the
    devices, each at its peak for the op's dtype (their sum made once a
    program and device: each search and each plan's report reads it)."""
    return one_device_seconds(fn, hardware) / devices


_IDEAL_SECONDS = Recent(4)


def one_device_seconds(fn: Function, hardware: Hardware) -> float:
    """`ideal_step_time_s` on one device (made once a program and device)."""
    return _IDEAL_SECONDS.get((fn, hardware.device), None, lambda: _one_device_seconds(fn, hardware))


def adopt_one_device_seconds(fn: Function, hardware: Hardware, seconds: float) -> None:
    """Keep `seconds`, made in another process (a forked child:
    `solver.planning.planner.prepare`), as `one_device_seconds(fn, hardware)`."""
    _IDEAL_SECONDS.put((fn, hardware.device), None, seconds)


def _one_device_seconds(fn: Function, hardware: Hardware) -> float:
    total = 0.0
    for op in fn.ops:
        if op.kind in COMMUNICATION:
            continue
        dtype = compute_dtype([v.type for v in op.operands], [v.type for v in op.results])
        total += ops.op_cost(op).flops / hardware.device.peak(dtype)
    return total


def relative_memory_overflow(peak_bytes: int, capacity_bytes: float, baseline_peak_bytes: int,
                    penalty: float = MEMORY_PENALTY) -> float:
    """TOAST's MP(s): the bytes over capacity, relative to the unpartitioned
    program's peak, times the penalty; 0 for a plan that fits."""
    over = peak_bytes - capacity_bytes
    return penalty * over / baseline_peak_bytes if over > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Assessment:
    """A plan's cost next to the unpartitioned program's: what reports show
    and what the search backends minimize (`relative_cost`)."""

    cost: Cost
    baseline: Cost  # the unpartitioned program on one device
    ideal_step_time_s: float
    memory_penalty: float = MEMORY_PENALTY

    @property
    def efficiency(self) -> float:
        return self.ideal_step_time_s / self.cost.step_time_s if self.cost.step_time_s else 1.0

    @property
    def relative_runtime(self) -> float:
        return self.cost.step_time_s / self.baseline.step_time_s if self.baseline.step_time_s else 0.0

    @property
    def memory_overflow(self) -> float:
        return relative_memory_overflow(self.cost.peak_memory_bytes, self.cost.capacity_bytes,
                                        self.baseline.peak_memory_bytes, self.memory_penalty)

    @property
    def relative_cost(self) -> float:
        """TOAST's C(s) = RT(s) + MP(s)."""
        return self.relative_runtime + self.memory_overflow
