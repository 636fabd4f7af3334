"""From a spec to a plan and its device-local program: the pipeline behind
`shardplan plan` and `shardplan lower`.

build the program -> Named Dimension Analysis -> the schedule's plan (or a
search backend's) -> factor sharding -> lowering -> collective counts and
the cost model's assessment of the device-local program.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.evaluate import (
    Assessment,
    Cost,
    adopt_one_device_seconds,
    evaluate,
    ideal_step_time_s,
    min_peak_memory_bytes,
    one_device_seconds,
)
from costmodel.fusion import Fusion, adopt, fuse
from costmodel.hardware import Hardware
from costmodel.pipeline import PipelineCost
from costmodel.simulate import Timeline, simulate
from ir import ops
from ir.core import Function, IRError
from ir.lower import Lowered, LowerOptions, lower
from ir.models.base import Model
from ir.nda import NDA, analyze
from ir.pipeline import Pipeline
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.planning.expect import COLLECTIVE_KINDS
from solver.planning.floor import Floor, Priced, expert_floor
from solver.planning.pipelining import (
    as_cost,
    microbatch_counts,
    pipelined,
    pipelined_cost,
    pipelined_step_s,
    search_hardware,
    search_nda,
)
from solver.planning.plan_text import format_bytes
from solver.planning.spec import Spec, SpecError
from solver.planning.tactics import Auto, Pin, RingAttention, Tactic, apply_schedule
from solver.search import default_time_limit_s
from solver.search.forked import Beside
from solver.search.report import SILENT, NoPlanFits, Progress

SOLVERS = ("none", "cpsat", "mcts")


@dataclass(frozen=True, slots=True)
class Planned:
    spec: Spec
    model: Model
    nda: NDA
    plan: Plan
    sharding: FactorSharding
    lowered: Lowered | None  # None: priced, not yet lowered (`plan_spec(..., whole=False)`, `complete`)
    assessment: Assessment
    seconds: dict[str, float]
    search: tuple[Any, ...] = ()  # the backends' reports (cpsat.SolveReport, mcts.MctsReport), one per auto tactic
    schedule: str | None = None  # the named schedule that ran (None: `schedule:`)
    remat: tuple[str, ...] = ()  # the layers rematerialized (by the schedule, or chosen by the search)
    # The rematerializations the search compared: (layer globs, serial step time; None: no plan fits).
    remat_tried: tuple[tuple[tuple[str, ...], float | None], ...] = ()
    # With a pipeline axis: the pipelined step (its stages' tasks) and its cost. `lowered` is then
    # the whole batch's program on one stage's devices, `assessment.cost` the pipelined step's.
    pipeline: Pipeline | None = None
    pipeline_cost: PipelineCost | None = None
    # A search's expert floor (`solver.planning.floor`): the named schedules priced before it, and
    # whether the plan is the best of them because no searched plan was faster.
    floor: Floor | None = None
    floor_kept: bool = False
    searched_step_s: float | None = None  # with a floor: the searched plan's step time (None: none fits)


@dataclass(frozen=True, slots=True)
class SearchOverrides:
    """Command-line settings for the auto tactics (None: the spec's, or the defaults)."""

    time_limit_s: float | None = None
    workers: int | None = None
    seed: int | None = None
    iterations: int | None = None
    rerank: int | None = None
    jobs: int = 1  # processes for work whose results do not depend on where it runs (`--jobs`)

    def apply(self, auto: Auto, solver: str) -> Auto:
        def pick(name: str, field: str):
            mine = getattr(self, name)
            return getattr(auto, field) if mine is None else mine

        return Auto(auto.axes, solver, pick("time_limit_s", "time_limit_s"), pick("workers", "workers"),
                    pick("seed", "seed"), pick("iterations", "iterations"), pick("rerank", "rerank"))


ALL_LAYERS = ("layers.*",)
# The rematerializations a search tries when memory shaped its plan: every other layer, then every layer.
REMAT_CHOICES = (("layers.*[02468]",), ALL_LAYERS)
# CP-SAT's best plans of the whole step a pipelined spec's schedule re-ranks (the search does not see stages).
PIPELINE_RERANK = 4


@dataclass(frozen=True, slots=True)
class Prepared:
    """What every schedule of one spec shares: the traced program, its
    analysis and its unpartitioned cost (built once by `prepare`)."""

    model: Model
    nda: NDA
    baseline: Cost
    seconds: dict[str, float]
    remat: tuple[str, ...] = ()  # the layers rematerialized in this program


def prepare(spec: Spec, remat: tuple[str, ...] = (), built: tuple[Model, float] | None = None,
            jobs: int = 1) -> Prepared:
    """Build the spec's program (with the layers matching `remat`
    rematerialized), analyze it and cost it on one device. `built`: the
    program built already, and the seconds that took. With `jobs` above 1
    the cost on one device, which needs no analysis, is made in a forked
    process while this one analyzes (llama2_70b recomputed: 1.4 s and
    0.3 s), with the program's kernels and its flops' seconds on one
    device, which the cost table and the search read later (0.18 s and
    0.09 s, adopted here); its seconds are then the wait for it after the
    analysis."""
    start = time.perf_counter()
    model, build_s = built if built is not None else (spec.build(remat), None)
    built_at = time.perf_counter()
    fn, hardware = model.function, spec.hardware_obj()

    def costed() -> tuple[Cost, Fusion, float]:
        # With what that makes and this process reads later: the kernels (the cost table's) and the
        # flops' seconds on one device (the search's ideal), 0.18 s and 0.09 s on llama2_70b recomputed.
        return evaluate(fn, hardware), fuse(fn), one_device_seconds(fn, hardware)

    with Beside(costed, jobs) as beside:
        nda = analyze(fn, model.groupable)
        analyzed = time.perf_counter()
        baseline, fusion, seconds = beside.result()
    adopt(fn, fusion)
    adopt_one_device_seconds(fn, hardware, seconds)
    return Prepared(model, nda, baseline, {"build": built_at - start if build_s is None else build_s,
                                           "analysis": analyzed - built_at,
                                           "baseline": time.perf_counter() - analyzed}, remat)


def unfit(fn: Function, devices: int, hardware: Hardware, least_peak: int | None = None) -> str | None:
    """Why no plan of the global program `fn` over `devices` devices fits
    the hardware's memory, or None where one may: even its live bytes split
    evenly over the devices exceed the capacity (`min_peak_memory_bytes`,
    or `least_peak` where it is known). Issue 27: the remat search priced
    hundreds of plans of such programs to find none."""
    least = min_peak_memory_bytes(fn, devices) if least_peak is None else least_peak
    capacity = hardware.capacity_bytes
    if least <= capacity:
        return None
    return (f"no plan fits: {format_bytes(capacity)} per device on {hardware.name}, and every plan's peak is at "
            f"least {format_bytes(least)} (the program's live bytes split evenly over its {devices} devices)")


def plan_spec(spec: Spec, solver: str = "none", options: LowerOptions | None = None,
              overrides: SearchOverrides | None = None, progress: Progress = SILENT,
              schedule: str | None = None, prepared: Prepared | None = None, hint: Plan | None = None,
              floor: bool = True, built: dict[tuple[str, ...], Prepared] | None = None,
              hint_remat: tuple[str, ...] | None = None, whole: bool = True,
              known: tuple[Priced, ...] = ()) -> Planned:
    """Run one of the spec's schedules (`schedule`: a name under `schedules:`;
    None: the default, see `Spec.schedule_name`) and lower the plan.
    `solver="none"` runs the schedule as written (its auto tactics with their
    own backends); a named backend runs its auto tactics with that backend
    or, if the schedule has none, a fully automatic schedule (auto on every
    mesh axis) hinted with the schedule's manual plan. `prepared` reuses the
    program of an earlier call on the same spec (unless the schedule
    rematerializes other layers: a remat tactic changes the program).
    `hint`: a plan of that program (or of the one with `hint_remat`
    rematerialized) for CP-SAT's hint when the schedule gives none (a mesh
    search passes the best plan of the meshes before). `built`: the programs
    by rematerialized layers, shared with other calls on the same model
    (a mesh search's meshes) and filled as they are built.
    `floor`: a fully automatic search starts from, and never answers worse
    than, the fastest named schedule that fits (`solver.planning.floor`).
    Not `whole`: a pipelined answer is priced folded, as the search priced
    it, and not lowered (`lowered` and `pipeline` None) until `complete`
    makes it whole (a mesh search lowers only its best mesh's), and from
    shallow copies of the step where that lowers fewer layers. `known`:
    pipelines priced already with `options` (a mesh screen's), which the
    floor reads rather than prices again."""
    remat = spec.remat(schedule)
    programs = _Programs(spec, prepared, built, whole, known, (overrides or SearchOverrides()).jobs)
    experts = None
    if floor and solver != "none" and not any(isinstance(t, Auto) for t in spec.tactics(schedule)) \
            and spec.schedules:
        progress.update("pricing the named schedules (the expert floor)", force=True)
        experts = expert_floor(spec, programs, options, programs.table, programs.figures, programs.unfit,
                               programs.jobs)
        progress.clear()
    hints = {} if experts is None or experts.best is None else {experts.best.remat: experts.best.plan}
    # The step time a searched plan must beat to be the answer: CP-SAT stops once it proves none can.
    floor_s = None if experts is None or experts.best is None else experts.best.step_time_s
    if hint is not None:
        hints.setdefault(hint_remat if hint_remat is not None else prepared.remat if prepared is not None else (),
                         hint)
    try:
        planned = _plan(spec, solver, options, overrides, progress, schedule, programs, remat, hints, floor_s)
        if not remat and planned.search and _memory_binds(planned):
            planned = _choose_remat(spec, solver, options, overrides, progress, schedule, programs, hints,
                                    planned, None, floor_s)
    except NoPlanFits as no_fit:
        if remat:  # the schedule chose its remat itself
            planned = _floor_or_raise(spec, options, progress, programs, experts, no_fit)
        else:
            try:
                planned = _choose_remat(spec, solver, options, overrides, progress, schedule, programs, hints,
                                        None, no_fit, floor_s)
            except NoPlanFits as none_fits:
                planned = _floor_or_raise(spec, options, progress, programs, experts, none_fits)
    if experts is None or planned.floor_kept:
        return planned
    best, searched = experts.best, planned.assessment.cost.step_time_s
    # The floor fits (`expert_floor` keeps only schedules that do): a faster plan that does not is no answer.
    if best is not None and (best.step_time_s < searched * (1 - 1e-9) or not planned.assessment.cost.fits):
        kept = _plan(spec, "none", options, None, progress, best.schedule, programs, best.remat, {})
        return dataclasses.replace(kept, search=planned.search, remat_tried=planned.remat_tried,
                                   floor=experts, floor_kept=True, searched_step_s=searched)
    return dataclasses.replace(planned, floor=experts, searched_step_s=searched)


class _Programs:
    """The spec's programs by rematerialized layers, each built once, and
    their cost tables, one per hardware: shared by the floor and the search."""

    def __init__(self, spec: Spec, prepared: Prepared | None, built: dict | None = None, whole: bool = True,
                 known: tuple[Priced, ...] = (), jobs: int = 1) -> None:
        self.spec, self.whole = spec, whole  # whole: answers are lowered and their pipelines made whole
        self.built = {} if built is None else built
        if prepared is not None:
            self.built.setdefault(prepared.remat, prepared)
        self.tables: dict[tuple[str, ...], list] = {}  # remat -> [(hardware, CostTable)]
        self.pipelines: dict[tuple, tuple[Pipeline, PipelineCost]] = {}  # (remat, plan, options) -> made
        self.prices: dict[tuple, PipelineCost] = {}  # (remat, plan, options) -> priced
        self.known = {(p.remat, p.plan, p.microbatches): p for p in known}  # priced elsewhere (`plan_spec`)
        self.models: dict[tuple[str, ...], tuple[Model, float]] = {}  # built, not yet analyzed (`model`)
        self.unfits: dict[tuple[str, ...], str | None] = {}  # why no plan fits, or None (`unfit`)
        self.jobs = jobs  # processes a program's preparation and the floor may use (`prepare`, `expert_floor`)

    def pipelined(self, remat: tuple[str, ...], plan: Plan,
                  options: LowerOptions | None) -> tuple[Pipeline, PipelineCost]:
        """The spec's pipelined step under `plan` on the program with `remat`
        rematerialized, and its cost, made once per plan (the answer's)."""
        key = (remat, plan, options)
        if key not in self.pipelines:
            program = self(remat)
            self.pipelines[key] = _made_whole(self.spec, program.model, program.nda, plan,
                                              lambda: self.priced(remat, plan, options), options)
        return self.pipelines[key]

    def priced(self, remat: tuple[str, ...], plan: Plan, options: LowerOptions | None) -> PipelineCost:
        """That step's cost alone, once per plan: the floor and the re-ranking
        of the search's best plans price the same plans, most of them never
        made whole (`pipelined_cost` folds a uniform pipeline)."""
        key = (remat, plan, options)
        if key in self.pipelines:
            return self.pipelines[key][1]
        if key not in self.prices:
            program = self(remat)
            # Not whole (a mesh search's meshes): from shallow copies of the step where they lower fewer
            # layers, as the mesh screen priced it; the answer's price is made whole (`complete`).
            self.prices[key] = pipelined_cost(self.spec, program.model, program.nda, plan,
                                              self.spec.hardware_obj(), options, shallow=not self.whole)
        return self.prices[key]

    def figures(self, remat: tuple[str, ...], plan: Plan, options: LowerOptions | None) -> tuple[float, int, bool]:
        """The step time, peak memory and fit of `priced`, read from `known`
        where the count of microbatches it prices was priced there (the
        floor's): the spec's, or under `microbatches: auto` with one stage,
        one microbatch where it fits (`choose_microbatches` takes the first
        count that fits, and one is the first)."""
        spec = self.spec
        k = 1 if spec.microbatches_auto and spec.stages * spec.chunks == 1 else \
            None if spec.microbatches_auto else spec.microbatch_count
        known = self.known.get((remat, plan, k))
        if known is not None and (known.fits or not spec.microbatches_auto):
            return known.step_time_s, known.peak_memory_bytes, known.fits
        cost = self.priced(remat, plan, options)
        return cost.step_time_s, max(cost.peak_memory_bytes), cost.fits

    def __call__(self, remat: tuple[str, ...]) -> Prepared:
        if remat not in self.built:
            self.built[remat] = prepare(self.spec, remat, self.models.pop(remat, None), self.jobs)
        return self.built[remat]

    def model(self, remat: tuple[str, ...]) -> Model:
        """The program alone, built once: enough to tell that no plan of it
        fits (`unfit`) before it is analyzed (`__call__`)."""
        if remat in self.built:
            return self.built[remat].model
        if remat not in self.models:
            start = time.perf_counter()
            model = self.spec.build(remat)
            self.models[remat] = (model, time.perf_counter() - start)
        return self.models[remat][0]

    def unfit(self, remat: tuple[str, ...]) -> str | None:
        """Why no plan of the program fits, or None where one may (`unfit`,
        on the hardware the search sees), known before it is analyzed."""
        if remat not in self.unfits:
            spec = self.spec
            self.unfits[remat] = unfit(self.model(remat).function, spec.sharding_mesh().num_devices,
                                       search_hardware(spec, spec.hardware_obj()))
        return self.unfits[remat]

    def table(self, remat: tuple[str, ...], hardware) -> Any:
        from costmodel.table import CostTable

        tables = self.tables.setdefault(remat, [])
        for built_for, table in tables:
            if built_for == hardware:
                return table
        program, k = self(remat), self.spec.searched_microbatches
        # With K microbatches a weight's resharding runs once per microbatch (`CostTable`).
        repeats = (program.model.inputs, k) if k > 1 else None
        baseline = program.baseline if hardware == self.spec.hardware_obj() else None  # `prepare`'s, on it
        table = CostTable(program.model.function, program.nda, self.spec.sharding_mesh(), hardware, repeats, baseline)
        tables.append((hardware, table))
        return table


def _floor_or_raise(spec: Spec, options: LowerOptions | None, progress: Progress, programs,
                    experts: Floor | None, no_fit: NoPlanFits) -> Planned:
    """No searched plan fits: the expert floor's schedule if one fits (with the
    report of the search that proved that no plan beats it, where one did),
    else the error."""
    if experts is None or experts.best is None:
        raise no_fit
    best = experts.best
    kept = _plan(spec, "none", options, None, progress, best.schedule, programs, best.remat, {})
    # A search that proved that no plan beats the floor, and so returned none, is reported.
    search = () if no_fit.report is None else (no_fit.report,)
    return dataclasses.replace(kept, floor=experts, floor_kept=True, search=search)


def _floor_proven(reports: Sequence[Any]) -> bool:
    """CP-SAT proved that no plan of the program, whether it fits or not (no
    memory cut or no-good had removed any), beats the expert floor."""
    return any(getattr(r, "status", None) == "floor" and not r.memory_cuts and not r.no_goods for r in reports)


def _memory_binds(planned: Planned) -> bool:
    """Memory shaped the searched plan: CP-SAT added memory cuts (its first
    solve ignores memory, so without cuts its optimum is the best plan of the
    program whatever the capacity, and recomputing layers only adds flops to
    it); the MCTS priced a faster plan that did not fit."""
    return any(getattr(r, "memory_cuts", 0) or getattr(r, "memory_shaped", False) for r in planned.search)


def _choose_remat(spec: Spec, solver: str, options: LowerOptions | None, overrides: SearchOverrides | None,
                  progress: Progress, schedule: str | None, programs, hints: dict,
                  plain: Planned | None, no_fit: NoPlanFits | None, floor_s: float | None = None) -> Planned:
    """Rematerialization as a searched choice: when no plan of the program
    fits, or memory shaped the plan found, the same search runs on the
    program with every other layer and with every layer recomputed in its
    backward (each is its own program, `ir.remat`), and the fastest plan that
    fits is kept (the fewer layers recomputed on a tie). As for the program
    without recomputation, the next program is searched only where memory
    shaped the plan of the one before (`_memory_binds`): recomputing more
    layers only adds compute to a plan memory did not shape
    (deepseek_v3_moe's MCTS: every layer's 2.4 s search answered 2.569 s
    after every other layer's 2.339 s). Not for a pipelined step: there a
    plan's memory is a microbatch's, which the re-ranking's score judges,
    not the whole step's search."""
    tried: list[tuple[tuple[str, ...], Planned | None]] = [((), plain)]
    failures = [f"{no_fit}"] if no_fit else []
    floored = None  # the report of a search that proved that no plan beats the floor, where it found none
    for choice in REMAT_CHOICES:
        try:
            why = programs.unfit(choice)
        except SpecError:  # a program without repeated layers to recompute
            break
        if why is not None:  # neither analyzed nor searched (the search would say the same)
            tried.append((choice, None))
            failures.append(f"with {', '.join(choice)} rematerialized: {why}")
            continue
        try:
            tried.append((choice, _plan(spec, solver, options, overrides, progress, schedule, programs, choice,
                                        hints, floor_s)))
        except NoPlanFits as again:
            tried.append((choice, None))
            failures.append(f"with {', '.join(choice)} rematerialized: {again}")
            if _floor_proven([again.report]):  # recomputing more layers only adds compute: none beats it either
                floored = again.report
                break
            continue
        if _floor_proven(tried[-1][1].search) or not (spec.pipelined or _memory_binds(tried[-1][1])):
            break
    fitting = [p for _, p in tried if p is not None and p.assessment.cost.fits]
    if not fitting:
        if no_fit is not None and len(tried) == 1:
            raise no_fit
        raise NoPlanFits("; ".join(failures), floored)
    best = min(fitting, key=lambda p: p.assessment.cost.step_time_s)
    times = tuple((choice, p.assessment.cost.step_time_s if p is not None and p.assessment.cost.fits else None)
                  for choice, p in tried)
    return dataclasses.replace(best, remat_tried=times)


def _plan(spec: Spec, solver: str, options: LowerOptions | None, overrides: SearchOverrides | None,
          progress: Progress, schedule: str | None, programs, remat: tuple[str, ...],
          hints: dict, floor_s: float | None = None) -> Planned:
    """One schedule on the program with `remat` rematerialized; `hints`: per
    program (its remat), a plan of it for the search to start from, before
    the schedule's own manual plan; `floor_s`: the expert floor's step time
    (`_Search.floor_s`)."""
    tactics, hint_tactics = _schedule(spec, schedule, solver, overrides or SearchOverrides(),
                                      programs.model(remat).pinned)
    searched = [k for k, tactic in enumerate(tactics) if isinstance(tactic, Auto)]
    why = programs.unfit(remat) if searched else None
    if why is not None:  # no search where no plan can fit, and the program is not analyzed for one
        raise NoPlanFits(f"schedule.{searched[0]}.auto: {why}")
    prepared = programs(remat)
    model, nda = prepared.model, prepared.nda
    planning = search_nda(spec, model, nda)  # the batch as a microbatch's plans split it
    seconds = dict(prepared.seconds)
    options = _with_ring(spec, tactics, options)
    t0 = time.perf_counter()
    mesh, hardware = spec.sharding_mesh(), spec.hardware_obj()
    search = _Search(model, planning, mesh, search_hardware(spec, hardware), progress)
    search.make_table = lambda: programs.table(remat, search.hardware)
    if spec.pipelined:
        search.score = _reranking_score(spec, programs, remat, options)
        search.score_at_least_step_time = spec.stages * spec.chunks == 1
        search.score_first_alone = spec.microbatches_auto  # its K is chosen for the first (`_reranking_score`)
    search.jobs = (overrides or SearchOverrides()).jobs
    search.floor_s = floor_s
    if remat in hints:
        search.hint = hints[remat]
    elif hint_tactics:
        search.hint = apply_schedule(planning, mesh, hint_tactics, origins=model.origins)
    plan = apply_schedule(planning, mesh, tactics, search, origins=model.origins)
    sharding = plan.materialize(planning)
    seconds["plan"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if spec.pipelined and not programs.whole:  # priced as the search priced it (folded); `complete` makes it whole
        lowered, pipeline, pipeline_cost = None, None, programs.priced(remat, plan, options)
    else:
        lowered = lower(model.function, nda, sharding, options or LowerOptions())
        seconds["lower"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        pipeline, pipeline_cost = programs.pipelined(remat, plan, options) if spec.pipelined else (None, None)
    assessment = Assessment(
        cost=evaluate(lowered.function, hardware) if pipeline_cost is None else as_cost(pipeline_cost),
        baseline=prepared.baseline,
        ideal_step_time_s=ideal_step_time_s(model.function, spec.mesh_obj().num_devices, hardware),
    )
    seconds["cost"] = time.perf_counter() - t0
    return Planned(spec, model, nda, plan, sharding, lowered, assessment, seconds, tuple(search.reports),
                   spec.schedule_name(schedule), remat, pipeline=pipeline, pipeline_cost=pipeline_cost)


def _with_ring(spec: Spec, tactics: list[Tactic], options: LowerOptions | None) -> LowerOptions | None:
    """The lowering options with the schedule's `ring_attention` axis, if it names one."""
    rings = [t.axis for t in tactics if isinstance(t, RingAttention)]
    if not rings:
        return options
    return dataclasses.replace(options or LowerOptions(), ring_axis=rings[0])


def complete(planned: Planned, options: LowerOptions | None = None) -> Planned:
    """A plan priced but not made whole (`plan_spec(..., whole=False)`: a
    pipelined mesh of a mesh search) with its device-local program and its
    whole pipeline, as `plan_spec` answers; the same plan as it is."""
    if planned.lowered is not None:
        return planned
    spec, t0 = planned.spec, time.perf_counter()
    lowered = lower(planned.model.function, planned.nda, planned.sharding, options or LowerOptions())
    t1 = time.perf_counter()
    pipeline, cost = _made_whole(spec, planned.model, planned.nda, planned.plan, lambda: planned.pipeline_cost,
                                 options)
    seconds = {**planned.seconds, "lower": t1 - t0, "cost": time.perf_counter() - t1}
    return dataclasses.replace(planned, lowered=lowered, pipeline=pipeline, pipeline_cost=cost, seconds=seconds,
                               assessment=dataclasses.replace(planned.assessment, cost=as_cost(cost)))


def _reranking_score(spec: Spec, programs: _Programs, remat: tuple[str, ...],
                     options: LowerOptions | None) -> Callable[[Plan, FactorSharding], float]:
    """What re-ranks CP-SAT's best plans of a pipelined spec: each plan's
    pipelined step time. Under `microbatches: auto` the plans after the first
    (the optimum) are priced at the count chosen for it, where they can run
    it: choosing a count prices every count (eight lowerings on Megatron's
    1.7B), and the plans compared are distinct but close. The plan kept then
    gets its own count when its pipeline is made (`_made_whole`)."""
    chosen: list[int] = []

    def score(plan: Plan, _: FactorSharding) -> float:
        program = programs(remat)
        if chosen and chosen[0] in microbatch_counts(program.nda, program.model, plan, spec):
            return pipelined_step_s(lambda: pipelined_cost(spec, program.model, program.nda, plan,
                                                           spec.hardware_obj(), options, microbatches=chosen[0]))
        step_s = pipelined_step_s(lambda: programs.priced(remat, plan, options))
        if spec.microbatches_auto and not chosen and step_s < math.inf:
            chosen.append(programs.priced(remat, plan, options).microbatches)
        return step_s

    return score


def _made_whole(spec: Spec, model: Model, nda: NDA, plan: Plan, priced: Callable[[], PipelineCost],
                options: LowerOptions | None) -> tuple[Pipeline, PipelineCost]:
    """The pipelined step of `plan`, whole, priced as `priced()` was: with
    `microbatches: auto`, the K its pricing chose (choosing again would
    price every K again). With the spec's own K the price is not asked for:
    the whole step prices itself, and pricing it folded first only to read
    K cost megatron_gpt_18b's MCTS answer about a second."""
    k = priced().microbatches if spec.microbatches_auto else None
    return pipelined(spec, model, nda, plan, spec.hardware_obj(), options, microbatches=k)


def _schedule(spec: Spec, name: str | None, solver: str, overrides: SearchOverrides,
              pinned: tuple = ()) -> tuple[list[Tactic], list[Tactic]]:
    """The tactics to run, and the manual schedule that hints a fully
    automatic one; the program's own sharding constraints come first."""
    pins: list[Tactic] = [Pin(pinned)] if pinned else []
    tactics, hint = _spec_schedule(spec, name, solver, overrides, bool(pins))
    return pins + tactics, pins + hint if hint else hint


def _spec_schedule(spec: Spec, name: str | None, solver: str, overrides: SearchOverrides,
                   pinned: bool) -> tuple[list[Tactic], list[Tactic]]:
    tactics = spec.tactics(name)
    autos = [t for t in tactics if isinstance(t, Auto)]
    if solver == "none":
        if not tactics and not pinned:  # the program's own constraints are a schedule too
            raise IRError(f"{spec.source}: no schedule: add tactics under `schedule:` or `schedules:` (see "
                          "docs/specs.md), or choose a search backend with --solver")
        return [overrides.apply(t, t.solver) if isinstance(t, Auto) else t for t in tactics], []
    if autos:
        return [overrides.apply(t, solver) if isinstance(t, Auto) else t for t in tactics], []
    axes = spec.sharding_mesh().names  # not the pipeline axis: stages split the layers
    return ([overrides.apply(Auto(axes), solver)] if axes else []), tactics


class _Search:
    """Runs auto tactics for `apply_schedule` with the shared cost table."""

    def __init__(self, model: Model, nda: NDA, mesh, hardware, progress: Progress) -> None:
        self.model, self.nda, self.mesh, self.hardware = model, nda, mesh, hardware
        self.progress = progress
        self.hint: Plan | None = None  # where a search starts: CP-SAT's hint, the MCTS's incumbent
        # A pipelined spec's: the pipelined step time of a plan (inf if it does not fit), which re-ranks
        # CP-SAT's best plans of the whole step (at least PIPELINE_RERANK of them).
        self.score: Callable[[Plan, FactorSharding], float] | None = None
        # The score is a step of one stage (gradient accumulation): never faster than the whole batch's step
        # the search prices (`pipelining.choose_microbatches`), so the re-ranking may stop early.
        self.score_at_least_step_time = False
        self.score_first_alone = True  # the first plan's score sets what the others are scored with
        # Processes for work whose answer does not depend on where it runs: the MCTS's candidates
        # (`MctsOptions.jobs`), the plans CP-SAT re-ranks (`CpSatOptions.score_jobs`).
        self.jobs = 1
        # The expert floor's step time: the planner answers the floor's plan unless a searched one is faster,
        # so CP-SAT stops once it proves that none is (`CpSatOptions.floor_s`), where it prices what the floor
        # does (not where a score re-ranks its plans: a pipeline's or accumulation's step time).
        self.floor_s: float | None = None
        self.reports: list[Any] = []
        self._table = None
        self.make_table: Callable[[], Any] | None = None  # the cost table, shared with the expert floor

    def __call__(self, plan: Plan, auto: Auto, where: str) -> Plan:
        from costmodel.table import CostTable
        from solver.search.space import SearchSpace

        if self._table is None:
            self._table = self.make_table() if self.make_table is not None else \
                CostTable(self.model.function, self.nda, self.mesh, self.hardware)
        space = SearchSpace(self.nda, plan, auto.axes, data_inputs=self.model.inputs,
                            optimizer_state=self.model.state)
        budget = default_time_limit_s(auto.solver) if auto.time_limit_s is None else auto.time_limit_s
        try:
            if auto.solver == "mcts":  # each backend imported where it runs (OR-tools: a quarter second)
                from solver.search import mcts

                options = mcts.MctsOptions(iterations=auto.iterations, time_limit_s=budget, seed=auto.seed,
                                           jobs=self.jobs)
                result = mcts.solve(space, self._table, options, self.progress, incumbent=self._start(space))
            else:
                from solver.search import cpsat

                hint = self._start(space)
                # The floor's step time is what a plan must beat only where the search's optimum is the answer.
                alone = auto.rerank == 1 and self.score is None
                options = cpsat.CpSatOptions(budget, auto.workers, auto.seed, rerank=auto.rerank,
                                             floor_s=self.floor_s if alone else None)
                if self.score is not None:
                    options = dataclasses.replace(options, rerank=max(auto.rerank, PIPELINE_RERANK), score=self.score,
                                                  score_name="the pipeline schedule",
                                                  score_at_least_step_time=self.score_at_least_step_time,
                                                  score_jobs=self.jobs, score_first_alone=self.score_first_alone)
                result = cpsat.solve(space, self._table, options, hint, self.progress)
        finally:
            self.progress.clear()
        self.reports.append(result.report)
        if result.plan is None:
            raise NoPlanFits(f"{where}: {result.report.message}", result.report)
        return result.plan

    def _start(self, space) -> Any:
        """The hint as a point of `space` (its nearest: `SearchSpace.point_of`), or None."""
        if self.hint is None:
            return None
        return space.point_of(self.hint.materialize(self.nda), dict(self.hint.resolutions))


def collective_counts(lowered: Lowered) -> dict[str, int]:
    counts = Counter(op.kind for op in lowered.function.ops if ops.get(op.kind).is_collective)
    return {kind: counts.get(kind, 0) for kind in COLLECTIVE_KINDS}


def planned_counts(planned: Planned) -> dict[str, int]:
    """The collectives of the plan's step: its device-local program's, or,
    pipelined, every stage's per step (per-microbatch tasks K times) and the
    transfers between stages."""
    if planned.pipeline is None:
        return collective_counts(planned.lowered)
    counts = planned.pipeline.collective_counts()
    return {kind: counts.get(kind, 0) for kind in COLLECTIVE_KINDS}


def simulate_planned(planned: Planned) -> Timeline:
    """The plan's device-local program on the two-stream simulator."""
    return simulate(planned.lowered.function, planned.spec.hardware_obj())
