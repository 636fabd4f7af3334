"""The mesh search's screen: every candidate mesh priced with plans it
already has, so that only the most promising few are searched.

A search per mesh costs seconds to minutes at scale, and a thousand devices
factor into a hundred meshes. The screen prices each mesh with the plans it
can have without a search, by the same cost model the search answers with
(a pipeline folded to its distinct stages, `ir.pipeline_fold`; a step of
equal layers from shallow copies of it, `solver.planning.shallow`):

  - the spec's named schedules whose axes the mesh has (the published
    split names `data` and `model`, and applies to every mesh with those
    axes whatever their sizes);
  - the best plan searched so far on another mesh, its decisions on the
    axes this mesh shares (`meshes._seed`, what CP-SAT is hinted with).

With `microbatches: auto` a pipeline is screened with the most
microbatches the plan's batch splits into (Megatron's one sequence per
replica: the smallest bubble and activations), gradient accumulation with
one microbatch, and with that many where one does not fit (with one stage
more microbatches are never faster: `pipelining.choose_microbatches`). A
plan whose weights and optimizer state, split over the stages, already
exceed a device's memory does not fit and is not lowered. The meshes'
screens are independent: `screen_meshes` runs them in processes. The
screened price of a mesh is its fastest plan that fits; the meshes are then searched in that order, the
fitting first (`meshes.plan_meshes`). A mesh is judged by plans it already
has, so a mesh that only a searched plan makes fast can rank low: the
count searched (`--search-meshes`) trades time for that risk.

Bounds. Only the best few screens are searched, and at a thousand devices
half the meshes screen at 3x to 80x the best (a tensor axis across nodes)
after a second or more of lowering each. So each mesh is first given a
lower bound of what its plans can screen at (`screen_bound`, a cost-table
evaluation: milliseconds), the meshes are priced in the order of their
bounds, `ROUND` at a time, and a mesh whose bound exceeds the `keep`-th
best fitting price so far is not priced at all: its price could only rank
after those, so the meshes searched, and the answer, are the same
(tests/test_mesh_screen.py checks the bound against every screened price
and the search against one without bounds). The rounds are a fixed size,
so the screens priced do not depend on the processes that price them.
The bound: a pipeline's (or gradient accumulation's) step is at least its
busiest stage's tasks, each a lowered program whose time is its compute
plus its collectives, so at least the stages' work over the stages; that
work is at least the whole step's, the whole batch at once on one stage's
devices, as the cost table prices it (a microbatch repeats the weights'
reads, its collectives' latencies and reshardings; a stage cuts kernels
and adds the sums and the transfers). With stages, the same holds stage
by stage, and a device waits for the first microbatch's forward on the
stages before it and, after its last backward, for that backward's way
back (`costmodel.table_stages`): 80 layers over 64 stages put 2 on 16 of
them, and the step waits for those. Without a pipeline or microbatches
the bound is the screened price itself.

A mesh none of whose plans can fit is priced after those that may: the
cost model keeps a step's inputs and results live to its end, so a plan
needs at least its weights and optimizer state and their updates, split
over the stages (`screen_memory_bound`, a sum over the parameters). Once
`keep` meshes fit it is not priced at all, ranking after each of them
(Megatron's 145.6B: 3 meshes of 96 or 128 replicas on 3 to 6 stages,
whose plans need 102 to 136 GiB of the 80).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.evaluate import evaluate
from costmodel.table import CostTable, TimedPlan
from costmodel.table_stages import pipeline_lower_bound, stage_seconds
from ir.core import DTYPE_BYTES, IRError, Mesh, Recent, Value
from ir.lower import LoweringError, LowerOptions, lower
from ir.models.base import Model
from ir.nda import NDA
from ir.pipeline import check_stages, value_stages
from ir.remat import layer_count
from ir.sharding import FactorSharding, local_type
from solver.plan import Plan
from solver.planning.floor import Priced, manual_schedules
from solver.planning.pipelining import check_spec_stages, microbatch_counts, pipelined_cost, search_nda
from solver.planning.plan_text import format_bytes
from solver.planning.planner import Prepared
from solver.planning.shallow import shallow_step_cost
from solver.planning.spec import Spec, SpecError
from solver.planning.tactics import Pin, apply_schedule
from solver.search.forked import Helpers, forked_map, forks
from solver.search.report import SILENT, Progress


@dataclass(frozen=True, slots=True)
class Screened:
    """A mesh's fastest plan without a search (`source` says whose), or why none ran."""

    step_time_s: float | None  # None: no plan of the screen could run on this mesh
    peak_memory_bytes: int | None
    fits: bool
    source: str  # "schedule Megatron", "the plan of data=8 x model=8", or why none ran
    plan: Plan | None = None
    remat: tuple[str, ...] = ()
    microbatches: int | None = None  # the K screened, for a pipeline or gradient accumulation
    priced: tuple[Priced, ...] = ()  # every pipeline the screen priced (the mesh's search reads them)
    bound_s: float | None = None  # not priced: its plans' lower bound (`screen_bound`) ranks it after the best
    # Not priced: its plans need more memory than a device has (`screen_memory_bound`), and enough meshes fit.
    memory_bound_bytes: int | None = None

    @property
    def rank(self) -> tuple[bool, float]:
        """Fitting plans first, then the faster."""
        return (not self.fits, self.step_time_s if self.step_time_s is not None else math.inf)

    def to_json(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits,
                "source": self.source, "microbatches": self.microbatches, "bound_s": self.bound_s,
                "memory_bound_bytes": self.memory_bound_bytes}


@dataclass(frozen=True, slots=True)
class ScreenJob:
    """One mesh to screen: its spec, the seed (`screen_mesh`'s), and whether its named schedules are priced."""

    mesh: tuple[tuple[str, int], ...]
    spec: Spec
    seed: tuple[str, tuple, Plan] | None
    schedules: bool = True


def mesh_shape(mesh) -> str:
    """`batch=2 x model=8` for (axis, size) pairs."""
    return " x ".join(f"{a}={n}" for a, n in mesh)


ROUND = 4  # meshes priced between two looks at the bounds (`screen_meshes`)

# (source, the remat of its program, the plan or None, why none): what a mesh is screened with.
_Plans = list[tuple[str, tuple[str, ...], Plan | None, str]]


def screen_meshes(jobs: list[ScreenJob], built: dict[tuple[str, ...], Prepared], prepare,
                  options: LowerOptions | None, processes: int = 1, progress: Progress = SILENT,
                  keep: int | None = None, known: dict[tuple, float] | None = None) -> list[tuple[Screened, float]]:
    """Each job's `screen_mesh` and the seconds it took, in order. With
    `keep`, a mesh whose lower bound exceeds the `keep`-th best fitting
    price is not priced (module docstring, "Bounds"): `known` holds the
    fitting prices of meshes screened before (one per mesh), the rest are
    found here, the meshes priced in the order of their bounds. With
    processes > 1 (and fork, which shares the programs without copying
    them), each round's meshes are priced in that many processes: the
    screens are independent and deterministic, so the answers are the
    same. The programs the named schedules need (of any job: the first mesh
    may have none of their axes), the plans and the bounds are made first,
    here, so that no process makes its own and the searches after find them."""
    for job in jobs:
        for name in manual_schedules(job.spec) if job.schedules else ():
            try:
                _program(job.spec, name, built, prepare)
            except (IRError, SpecError):
                continue  # each screen reports it
    plans, bounds, needs, spent = _bounds(jobs, built, prepare, processes, bool(keep))
    best = dict(known or {})  # per mesh, its fastest fitting price
    out: list[tuple[Screened, float] | None] = [None] * len(jobs)
    # A mesh none of whose plans can fit is priced last: by then `keep` meshes that fit are usually known,
    # and it ranks after each of them.
    cannot_fit = [need > job.spec.hardware_obj().capacity_bytes for job, need in zip(jobs, needs)]
    order = sorted(range(len(jobs)), key=lambda k: (cannot_fit[k], bounds[k]))
    size = ROUND if keep else max(len(jobs), 1)  # without bounds, one round
    # The processes are kept from round to round: what each made for the program (its layers' layout, the
    # lowering's recipes) it keeps, where a process forked per round made it again each round.
    with Helpers(lambda k: _timed(jobs[k], built, options, plans[k], spent[k]), processes) as helpers:
        for at in range(0, len(order), size):
            fastest = sorted(best.values())
            threshold = fastest[keep - 1] if keep and len(fastest) >= keep else math.inf
            todo = []
            for k in order[at: at + size]:
                if bounds[k] * (1 - 1e-9) > threshold:  # its price could only rank after `keep` fitting ones
                    out[k] = (Screened(None, None, False, f"not priced: its plans take at least {bounds[k]:.4g} s",
                                       bound_s=bounds[k]), spent[k])
                elif cannot_fit[k] and threshold < math.inf:  # as could a plan that does not fit
                    out[k] = (Screened(None, None, False, f"not priced: its plans need at least "
                                       f"{format_bytes(needs[k])} a device", memory_bound_bytes=needs[k]), spent[k])
                else:
                    todo.append(k)
            if todo:
                progress.update(f"mesh screen: {', '.join(mesh_shape(jobs[k].mesh) for k in todo)} ({at + 1} of "
                                f"{len(jobs)} meshes" + (f", {processes} processes)" if forks(processes, len(todo))
                                                         else ")"), force=True)
            for k, (screened, seconds) in zip(todo, helpers.map(todo)):
                out[k] = (screened, seconds)
                if screened.fits and screened.step_time_s is not None:
                    best[jobs[k].mesh] = min(best.get(jobs[k].mesh, math.inf), screened.step_time_s)
    return out  # type: ignore[return-value]


def _bounds(jobs: list[ScreenJob], built: dict[tuple[str, ...], Prepared], prepare, processes: int,
            bounded: bool) -> tuple[list[_Plans], list[float], list[int], list[float]]:
    """Each job's plans, their bounds of time and memory (0 unless
    `bounded`) and the seconds they took, in `processes` processes (each
    mesh's plans are made from the programs already built: a few tenths of
    a second each at scale)."""
    if bounded and forks(processes, len(jobs)):
        for program in built.values():  # its table's index, made here once, is shared by the processes
            for values in _state_values(program.model):  # and its weights, state and updates, by dimension
                _dim_table(values, program.nda)
            try:
                table = CostTable(program.model.function, program.nda, jobs[0].spec.sharding_mesh(),
                                  jobs[0].spec.hardware_obj())
                if any(job.spec.stages > 1 for job in jobs):
                    _value_layers(table, program.model)  # and its values' layers (`_stages_bound`)
            except (IRError, NotImplementedError):
                continue  # no bound from this program (`screen_bound`)

    def one(k: int) -> tuple[_Plans, float, int, float]:
        start = time.perf_counter()
        plans = _plans(jobs[k].spec, built, prepare, jobs[k].seed, jobs[k].schedules)
        bound = screen_bound(jobs[k].spec, built, plans) if bounded else 0.0
        need = screen_memory_bound(jobs[k].spec, built, plans) if bounded else 0
        return plans, bound, need, time.perf_counter() - start

    made = forked_map(one, len(jobs), processes)
    return [m[0] for m in made], [m[1] for m in made], [m[2] for m in made], [m[3] for m in made]


def _timed(job: ScreenJob, built: dict, options: LowerOptions | None, plans: _Plans,
           spent: float) -> tuple[Screened, float]:
    start = time.perf_counter()
    screened = _priced(job.spec, built, plans, options)
    return screened, spent + time.perf_counter() - start


def screen_mesh(spec: Spec, built: dict[tuple[str, ...], Prepared], prepare, seed: tuple[str, tuple, Plan] | None,
                options: LowerOptions | None = None, schedules: bool = True) -> Screened:
    """Price the mesh of `spec` (a concrete mesh) with its named schedules
    (unless not `schedules`) and `seed` (a source, the remat of its program, a
    plan of it on this mesh); `built[remat]` or `prepare(spec, remat)`: the
    program (shared by every mesh)."""
    return _priced(spec, built, _plans(spec, built, prepare, seed, schedules), options)


def _plans(spec: Spec, built: dict[tuple[str, ...], Prepared], prepare, seed: tuple[str, tuple, Plan] | None,
           schedules: bool) -> _Plans:
    """What `screen_mesh` prices the mesh with."""
    plans: _Plans = []
    for name in manual_schedules(spec) if schedules else ():
        remat = spec.remat(name)
        try:
            program = _program(spec, name, built, prepare)
            pins = [Pin(program.model.pinned)] if program.model.pinned else []
            plan = apply_schedule(search_nda(spec, program.model, program.nda), spec.sharding_mesh(),
                                  pins + spec.tactics(name), origins=program.model.origins)
        except (IRError, SpecError) as exc:
            plans.append((f"schedule {name}", remat, None, str(exc)))
            continue
        plans.append((f"schedule {name}", remat, plan, ""))
    if seed is not None:
        plans.append((seed[0], seed[1], seed[2], ""))
    return plans


def screen_bound(spec: Spec, built: dict[tuple[str, ...], Prepared], plans: _Plans) -> float:
    """A lower bound of the step time the mesh screens at with `plans`
    (module docstring, "Bounds"): the least of their whole steps on one
    stage's devices, priced by the cost table, over the stages; 0 where a
    plan cannot be priced so (the screen then says why)."""
    mesh, hardware = spec.sharding_mesh(), spec.hardware_obj()
    tables: dict[tuple[str, ...], CostTable] = {}
    least = math.inf
    for _, remat, plan, _ in plans:
        if plan is None:
            continue
        program = built[remat]
        try:
            if spec.stages * spec.chunks > 1:  # more stages than layers: no bound, its pricing says why (at once)
                check_stages(program.model.function, program.model.forward_ops, spec.stages * spec.chunks)
            if remat not in tables:
                tables[remat] = CostTable(program.model.function, program.nda, mesh, hardware)
            # Its time alone: the peak memory's replay, a third of an evaluation, says nothing of it.
            timed = tables[remat].timed(plan.materialize(program.nda))
            bound_s = timed.step_time_s / spec.stages
            if spec.stages > 1:  # the busiest device, after the first microbatch reaches it
                bound_s = max(bound_s, _stages_bound(spec, program, plan, tables[remat], timed))
        except (IRError, LoweringError, NotImplementedError):
            return 0.0
        least = min(least, bound_s)
    return least if least < math.inf else 0.0


def screen_memory_bound(spec: Spec, built: dict[tuple[str, ...], Prepared], plans: _Plans) -> int:
    """A lower bound of the peak memory of a device with each of `plans`,
    the least of them (module docstring, "Bounds"); 0 where a plan has no
    bound (the screen says why). The cost model keeps the step's inputs
    and its results live to its end, so a step's peak is at least the
    weights and optimizer state it reads plus their updates. A pipelined
    (or accumulating) stage's peak is its inputs and then the larger of
    its microbatches' memory and its update's, which holds the update's
    results (`costmodel.pipeline`): the busiest of P stages holds at least
    a P-th of the inputs and of the updates (with v chunks a device, a
    P v-th of the updates, its chunks' updates running one after another)."""
    mesh = spec.sharding_mesh()
    least = None
    for _, remat, plan, _ in plans:
        if plan is None:
            continue
        program = built[remat]
        try:
            sharding = plan.materialize(program.nda)
        except (IRError, NotImplementedError):
            return 0
        read, updates = _state_values(program.model)
        inputs, made = (_local_bytes(values, program.nda, sharding, mesh) for values in (read, updates))
        need = inputs // spec.stages + made // (spec.stages * spec.chunks) if spec.pipelined else inputs + made
        least = need if least is None else min(least, need)
    return least or 0


def _local_bytes(values: tuple[Value, ...], nda: NDA, sharding: FactorSharding, mesh: Mesh) -> int:
    """The bytes of `values` on one device, each as the plan defines it.
    Counted over arrays of their dimensions made once per program
    (`_DimTable`): a mesh search asks it of every mesh's plans (GPT
    529.6B: 418 meshes of 3,000 values each; value by value, 3% of the
    search's wall)."""
    dims = _dim_table(values, nda)
    axes = [sharding.axes[i] for i in dims.iclasses]
    devices = {a: mesh.group_size(a) for a in set(axes)}
    split = np.array([devices[a] for a in axes], dtype=np.int64)[dims.inverse]
    if np.any(dims.sizes % split):  # a plan that does not divide a dimension: say which, as `local_type` does
        return sum(local_type(v.type, sharding.def_dims(nda, v), mesh).num_bytes for v in values)
    elements = np.ones(len(values), dtype=np.int64)
    np.multiply.at(elements, dims.value, dims.sizes // split)
    return int(elements @ dims.item_bytes)


class _DimTable:
    """Every dimension of some values as arrays: its value's index, its
    size and its I-class (`inverse` into the distinct `iclasses`); per
    value, the bytes of one element."""

    def __init__(self, values: tuple[Value, ...], nda: NDA) -> None:
        rows = [(k, size, nda.def_iclass(v, d)) for k, v in enumerate(values) for d, size in enumerate(v.type.shape)]
        self.value, self.sizes, iclass = np.array(rows, dtype=np.int64).reshape(-1, 3).T
        unique, self.inverse = np.unique(iclass, return_inverse=True)
        self.iclasses = unique.tolist()
        self.item_bytes = np.array([DTYPE_BYTES[v.type.dtype] for v in values], dtype=np.int64)


_DIM_TABLES = Recent(4)  # per (values, analysis): the state values' dimensions (`_local_bytes`)


def _dim_table(values: tuple[Value, ...], nda: NDA) -> _DimTable:
    return _DIM_TABLES.get((values, nda), None, lambda: _DimTable(values, nda))


_STATE_VALUES = Recent(2)  # per program: the weights and state its step reads, and the results updating them


def _state_values(model: Model) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The parameters of the step that are not batch inputs and that some
    op reads, and the results an op makes whose origin is a weight or
    optimizer state (`Model.origins`: their updates; none for an imported
    step)."""
    def make() -> tuple[tuple[Value, ...], tuple[Value, ...]]:
        fn = model.function
        operands = {v for op in fn.ops for v in op.operands}
        made = {r for op in fn.ops for r in op.results}
        origins, state = dict(model.origins), set(model.params) | set(model.state)
        read = tuple(p for p in fn.params if p.name not in model.inputs and p in operands)
        updates = tuple(dict.fromkeys(r for r in fn.results if r in made and origins.get(r.name) in state))
        return read, updates

    return _STATE_VALUES.get((model.function,), None, make)


_VALUE_LAYERS = Recent(2)  # per program: its layers, and each of its table's values' (`_value_layers`)


def _stages_bound(spec: Spec, program: Prepared, plan: Plan, table: CostTable, timed: TimedPlan) -> float:
    """`costmodel.table_stages.pipeline_lower_bound` of the plan with the
    microbatches the screen prices it with (`_price`)."""
    model, stages = program.model, spec.stages * spec.chunks
    layers, value_layer = _value_layers(table, model)
    value_stage = value_layer * stages // layers  # `ir.pipeline.layer_stages`: the n-th of L layers' stage
    k = microbatch_counts(program.nda, model, plan, spec)[-1] if spec.microbatches_auto else spec.microbatch_count
    over_batch, _ = table.batch_ops(model.inputs)
    total, forward, backward = stage_seconds(table, timed, value_stage, model.forward_ops, over_batch)
    return pipeline_lower_bound(total, forward, backward, k, spec.chunks)


def _value_layers(table: CostTable, model: Model) -> tuple[int, np.ndarray]:
    """The program's layers L, and each of the table's values' stage with a
    stage a layer (`ir.pipeline.value_stages`): its stage on P stages is that
    times P over L. Each value's stage is its layer's, or the most of its
    operands' or the least of its readers', and the layers' stages only grow
    along the layers; so the most and the least are taken as well before as
    after. A thousand devices factor into pipelines of a dozen sizes, one
    mesh after another: the values' stages are made once a program."""
    def make() -> tuple[int, np.ndarray]:
        layers = layer_count(table.fn, model.forward_ops)
        layer_of = value_stages(table.fn, model.forward_ops, dict(model.origins), layers)
        return layers, np.array([layer_of[v.name] for v in table.values], dtype=np.int64)

    return _VALUE_LAYERS.get((table.fn,), None, make)


def _priced(spec: Spec, built: dict[tuple[str, ...], Prepared], plans: _Plans,
            options: LowerOptions | None) -> Screened:
    """The mesh's screen with `plans` (`screen_mesh`)."""
    best: Screened | None = None
    failures, priced = [], []
    for source, remat, plan, error in plans:
        if plan is None:
            failures.append(f"{source}: {error}")
            continue
        try:
            screened = _price(spec, built[remat], plan, source, remat, options)
        except (IRError, SpecError) as exc:
            failures.append(f"{source}: {exc}")
            continue
        priced.extend(screened.priced)
        if best is None or screened.rank < best.rank:
            best = screened
    if best is None:
        return Screened(None, None, False, "; ".join(failures) or "no plan to screen with (no named schedule "
                                                                  "applies to this mesh)")
    return dataclasses.replace(best, priced=tuple(priced))


def _program(spec: Spec, schedule: str, built: dict[tuple[str, ...], Prepared], prepare) -> Prepared:
    """The program a named schedule plans: `built` under its rematerialized layers, made there once."""
    remat = spec.remat(schedule)
    if remat not in built:
        built[remat] = prepare(spec, remat)
    return built[remat]


def _price(spec: Spec, program: Prepared, plan: Plan, source: str, remat: tuple[str, ...],
           options: LowerOptions | None) -> Screened:
    """The plan's step on the mesh: its pipeline (or accumulation) with the
    screened counts of microbatches, or the lowered program."""
    hardware = spec.hardware_obj()
    check_spec_stages(spec, program.model)  # before anything is materialized
    # Whatever the microbatches, a stage holds its weights and optimizer state: if the step's, split over
    # the stages, exceed a device's memory, the plan does not fit, and lowering it would only say so.
    sharding = plan.materialize(program.nda)
    mesh = spec.sharding_mesh()
    read, _ = _state_values(program.model)
    resident = _local_bytes(read, program.nda, sharding, mesh)
    if resident / spec.stages > hardware.capacity_bytes:
        return Screened(None, resident // spec.stages, False, f"{source} (its weights and state alone exceed a "
                        "device's memory)", plan, remat)
    if not spec.pipelined:
        # From a few layers where the inner ones are equal (`solver.planning.shallow`): the same price.
        cost = shallow_step_cost(program.model, program.nda, sharding, hardware, options) or evaluate(
            lower(program.model.function, program.nda, sharding, options or LowerOptions()).function, hardware)
        return Screened(cost.step_time_s, cost.peak_memory_bytes, cost.fits, source, plan, remat)
    if spec.microbatches_auto:
        most = microbatch_counts(program.nda, program.model, plan, spec)[-1]
        counts = [most] if spec.stages > 1 else sorted({1, most})
    else:
        counts = [spec.microbatch_count]
    best, priced = None, []
    for k in counts:
        cost = pipelined_cost(spec, program.model, program.nda, plan, hardware, options, microbatches=k,
                              shallow=True)
        screened = Screened(cost.step_time_s, max(cost.peak_memory_bytes), cost.fits, source, plan, remat, k)
        priced.append(Priced(remat, plan, k, screened.step_time_s, screened.peak_memory_bytes, screened.fits))
        if best is None or screened.rank < best.rank:
            best = screened
        if cost.fits and spec.stages == 1:  # more microbatches are no faster (`choose_microbatches`)
            break
    assert best is not None
    return dataclasses.replace(best, priced=tuple(priced))


__all__ = ["ScreenJob", "Screened", "mesh_shape", "screen_bound", "screen_memory_bound", "screen_mesh",
           "screen_meshes"]
