"""The expert floor: the spec's own named schedules, priced before a search.

A search backend explores a space; what an expert wrote down is a plan the
user already trusts. Before `plan --solver cpsat|mcts` searches, every named
schedule written without an auto tactic is planned as written and priced
(the tabulated cost model, `costmodel.table`, which equals the lowered
program's cost; for a pipelined spec its pipeline schedule's step time).
The fastest that fits is

  - the search's starting point: CP-SAT's hint and objective bound, the
    MCTS's incumbent (`planner._Search`), when it is a plan of the searched
    program (same rematerialized layers);
  - the floor of the answer: the planner keeps the expert's plan when no
    searched plan is faster, and the report says so.

So a search never answers worse than the best schedule the spec names,
even where that schedule is not a point of the search space (a space that
folds repeated layers with a period of one layer misses Megatron's
alternating column and row sharding, for instance).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from costmodel.table import CostTable
from ir.core import IRError
from ir.lower import LowerOptions
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.planning.pipelining import pipelined_cost, search_nda
from solver.planning.spec import Spec, SpecError
from solver.planning.tactics import Auto, Pin, apply_schedule
from solver.search.forked import Beside


@dataclass(frozen=True, slots=True)
class Expert:
    """One named schedule priced as written."""

    schedule: str
    remat: tuple[str, ...]
    step_time_s: float | None  # None: it failed to plan
    peak_memory_bytes: int | None
    fits: bool
    plan: Plan | None
    error: str = ""  # why it was not priced: it could not be planned, or no plan of its program fits

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "remat": list(self.remat), "step_time_s": self.step_time_s,
                "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits, "error": self.error or None}


@dataclass(frozen=True, slots=True)
class Priced:
    """A pipelined step's figures under one plan at one count of
    microbatches, priced elsewhere: the mesh screen prices each mesh's named
    schedules, and that mesh's search then reads them for its floor rather
    than pricing the same pipelines again (`planner._Programs.figures`)."""

    remat: tuple[str, ...]
    plan: Plan
    microbatches: int
    step_time_s: float
    peak_memory_bytes: int
    fits: bool


@dataclass(frozen=True, slots=True)
class Floor:
    """The named schedules priced (`experts`, in the spec's order) and the
    fastest that fits (`best`, None if none does)."""

    experts: tuple[Expert, ...]
    best: Expert | None

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best.schedule if self.best else None,
                "best_step_time_s": self.best.step_time_s if self.best else None,
                "schedules": [e.to_json() for e in self.experts]}


def manual_schedules(spec: Spec) -> list[str]:
    """The named schedules without an auto tactic: plans an expert wrote."""
    return [name for name in spec.schedules if not any(isinstance(t, Auto) for t in spec.tactics(name))]


def expert_floor(spec: Spec, prepare, options: LowerOptions | None = None, table=None, pipeline=None,
                 unfit=None, jobs: int = 1) -> Floor:
    """Price every manual named schedule of `spec` (module docstring).
    `prepare(remat)` gives the program with those layers rematerialized
    (`planner.prepare`, memoized by the caller); `table(remat, hardware)`, if
    given, its cost table (the planner's, which the search then reuses);
    `pipeline(remat, plan, options)`, if given, a pipelined spec's step
    time, peak memory and whether it fits under a plan (the planner's:
    memoized, or known from the mesh screen); `unfit(remat)`, if given, why
    no plan of that program fits, else None (`planner.unfit`): a schedule
    of such a program cannot be the floor, so it is not priced (its program
    neither analyzed nor tabulated: llama2_70b's without recomputation,
    about 4 s) and its `error` says why. With `jobs` above 1, the schedules
    of a program whose cost table is still to make are planned, and their
    plans materialized, in a forked child while this process makes the
    table (llama2_70b: 0.4-0.6 s beside 1.1 s); the shardings are adopted
    here, where the search's incumbent reads one again."""
    hardware = spec.hardware_obj()
    mesh = spec.sharding_mesh()
    tables: dict[tuple[str, ...], CostTable] = {}
    schedules = manual_schedules(spec)
    beside: dict[str, tuple[Plan, FactorSharding | None] | Exception] = {}  # planned while a table was made
    experts = []
    for name in schedules:
        remat = spec.remat(name)
        why = unfit(remat) if unfit is not None and not spec.pipelined else None
        if why is not None:
            experts.append(Expert(name, remat, None, None, False, None, why))
            continue
        try:
            prepared = prepare(remat)
            if not spec.pipelined and remat not in tables:
                same = [n for n in schedules if spec.remat(n) == remat]
                with Beside(functools.partial(_plan_all, spec, same, prepared), jobs) as child:
                    tables[remat] = table(remat, hardware) if table is not None else \
                        CostTable(prepared.model.function, prepared.nda, mesh, hardware)
                    beside.update(child.result())
            made = beside.pop(name) if name in beside else _planned(spec, name, prepared)
            if isinstance(made, Exception):
                raise made
            plan, sharding = made
            if spec.pipelined:
                if pipeline is not None:
                    step, peak, fits = pipeline(remat, plan, options)
                else:
                    cost = pipelined_cost(spec, prepared.model, prepared.nda, plan, hardware, options)
                    step, peak, fits = cost.step_time_s, max(cost.peak_memory_bytes), cost.fits
            else:
                plan.adopt(prepared.nda, sharding)  # where it was made in a child
                cost = tables[remat].evaluate(sharding)
                step, peak, fits = cost.step_time_s, cost.peak_memory_bytes, cost.fits
        except (IRError, SpecError) as exc:  # a schedule that cannot be planned is no floor
            experts.append(Expert(name, remat, None, None, False, None, str(exc)))
            continue
        experts.append(Expert(name, remat, step, peak, fits, plan))
    fitting = [e for e in experts if e.fits and e.step_time_s is not None and math.isfinite(e.step_time_s)]
    best = min(fitting, key=lambda e: (e.step_time_s, len(e.remat))) if fitting else None
    return Floor(tuple(experts), best)


def _plan_all(spec: Spec, names: list[str], prepared: Any) -> dict[str, tuple[Plan, FactorSharding | None] | Exception]:
    """`_planned` of each schedule, or what planning it raised (a schedule
    that cannot be planned is no floor, the others still are)."""
    out: dict[str, tuple[Plan, FactorSharding | None] | Exception] = {}
    for name in names:
        try:
            out[name] = _planned(spec, name, prepared)
        except (IRError, SpecError) as exc:
            out[name] = exc
    return out


def _planned(spec: Spec, name: str, prepared: Any) -> tuple[Plan, FactorSharding | None]:
    """The schedule `name` planned as written on the program `prepared`, and
    (not pipelined) its plan's factor sharding."""
    pins = [Pin(prepared.model.pinned)] if prepared.model.pinned else []  # as `planner._schedule`
    plan = apply_schedule(search_nda(spec, prepared.model, prepared.nda), spec.sharding_mesh(),
                          pins + spec.tactics(name), origins=prepared.model.origins)
    return plan, None if spec.pipelined else plan.materialize(prepared.nda)
