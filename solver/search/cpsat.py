"""The CP-SAT backend: an exact constraint model of an auto tactic's search
space (`solver.search.space`) whose objective is the shared cost model.

Variables (DESIGN.md, "Search backends"):

  x[g, a]  shard color group g along mesh axis a (the decision);
  y[g, a]  set data group g LATE on axis a (sequence parallelism,
           `solver.search.space`);
  z[g, a, l] the (g, a) decision reaches at least the partial level l
           (ZeRO's parts, `solver.search.zero`); x implies every z of its
           pair, and a wider z the narrower ones;
  r[c]     the bit of resolution class c;
  s[k, a]  derived: an I-class with key k holds axis a. Its definition is
           `ir.sharding.materialize`'s rule, exactly: x of its group (or the z
           of the narrowest level that holds its part), not deselected by r,
           the axis not taken by a higher-priority I-class of the same owner,
           and divisible given the axes it already holds; where its group
           may be LATE there, that or y, no group the LATE rule names set,
           and divisible.

Cost terms: `solver.search.cpsat_terms` (op, kernel, edge and end terms,
each priced by `costmodel.table`, the one pricing function).

Memory: the peak of the cost model is not linear, so capacity is enforced
lazily, and exactly. After each solve the plan is priced; if it does not
fit, a cut is added at every position (up to eight, spread over the program,
largest overflow first) where a lower bound of its live bytes, written as a
sum of the model's terms (`solver.search.cpsat_memory`), already exceeds the
capacity, and the plan itself is excluded (a no-good: a cut in whole KiB
may not reach a plan that overflows by a few KiB). Every cut is valid, and
each round removes the plan it priced, so the loop converges: it runs until
a plan fits, the model is infeasible (proven: no plan fits) or the time
limit is spent, with no round cap. The final optimum is the optimum among
plans that fit.

A hint that fits is an incumbent: the answer is never worse than it. (It
is not written into the model as a bound on the objective: on unet that
constraint steered CP-SAT's search to a 0.13% worse plan in the same
deterministic time; the hint alone starts the search there.)

A floor (`CpSatOptions.floor_s`: the expert floor's step time, which the
planner answers unless a searched plan is faster) is not written into the
model either, for the same reason (unet: 7.597 -> 7.772 ms with it as a
constraint). Where the hint is slower than the floor (the floor's plan is
outside the space), a copy of the model with the objective bounded by the
floor is solved first, for a tenth of the time limit, to its first plan:
infeasible proves that no plan beats the floor, and no solve runs
(`CpSatModel.beats_floor`). Otherwise each solve stops once its best bound passes
the floor. Either way no later memory round or remat program is searched
(each only removes plans or adds compute), status "floor".
deepseek_v3_moe, whose expert parallelism the space does not hold: 57-67 s
of CP-SAT over three programs to a plan 60% slower than the expert's, now
one bounded copy (1.5 s) and no solve (`plan --solver cpsat`: 7.4 s).

What the model proves is the serial step time (the sum of the fused
kernels' times, `costmodel.evaluate`). The overlap of the two-stream
simulator is a schedule, not a sum, so it is not in the model; with
`rerank` K > 1 the solve goes on after the optimum, excluding each plan found
(a no-good cut), until it holds the K best distinct plans that fit; the
simulator then picks the one with the shortest makespan
(`solver.search.rerank`) and the report says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.table import CostTable
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.search import CPSAT_TIME_LIMIT_S
from solver.search.cpsat_memory import memory_cuts
from solver.search.cpsat_model import CpSatModel
from solver.search.cpsat_terms import TermModel
from solver.search.forked import Helpers, forks
from solver.search.report import SILENT, AutoResult, Progress, no_fit_message, report_json
from solver.search.rerank import simulated_makespan_s
from solver.search.space import Point, SearchSpace

# The share of the time limit a solve may take to prove that no plan beats the floor (`CpSatModel.beats_floor`).
_PROBE_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class CpSatOptions:
    time_limit_s: float = CPSAT_TIME_LIMIT_S  # deterministic seconds, summed over the solves
    workers: int = 1
    seed: int = 0
    rerank: int = 1  # the best distinct plans the simulator compares (1: the solver's optimum as it is)
    # What re-ranks them (lower is better; default: the simulated makespan of the plan's program), and
    # its name in the report. A pipelined spec re-ranks by its pipeline schedule's step time.
    score: Callable[[Plan, FactorSharding], float] | None = None
    score_name: str = "the simulator"
    # The score is never below a plan's serial step time (gradient accumulation: K runs of a microbatch
    # take at least one run of the batch). A plan whose step time alone is no faster than the best score
    # so far is then not scored (its makespan is reported as None).
    score_at_least_step_time: bool = False
    # Processes that score the plans (`solver.search.forked`), this one among them: the scores depend on
    # none of one another's, so they are the same wherever they run. Where the first plan's score sets
    # what the others are scored with (`score_first_alone`: a pipelined spec's count of microbatches,
    # chosen for the first), it is scored first, here.
    score_jobs: int = 1
    score_first_alone: bool = True
    # A step time only a faster plan matters against (the expert floor's: the planner answers that plan
    # otherwise): the search stops once a bounded copy of the model or a solve's own bound proves that no
    # plan beats it (`CpSatModel.beats_floor`, `CpSatModel.solve`), status "floor".
    floor_s: float | None = None


@dataclass(frozen=True, slots=True)
class SolveReport:
    """What the backend says about its answer (the `search` objects of `shardplan plan --json`)."""

    solver: str
    axes: tuple[str, ...]
    status: str  # optimal | feasible | infeasible | unknown
    objective_s: float | None  # the model's step time of the plan (descaled)
    bound_s: float | None  # a proven lower bound among plans that fit
    gap: float | None
    solve_s: float
    build_s: float
    variables: int
    constraints: int
    terms: int
    folded: int  # ops and uses priced by a shared term
    space: int  # decision variables: (group, axis) pairs, their partial levels and free resolution bits
    rounds: int
    memory_cuts: int
    no_goods: int  # plans excluded one by one (the memory bound did not see their overflow)
    smallest_peak_bytes: int | None
    message: str
    # Re-ranking (rerank > 1): the serial step times and simulated makespans of the plans compared,
    # best serial first, and the index of the one chosen (the shortest makespan).
    rerank_objectives_s: tuple[float, ...] = ()
    rerank_makespans_s: tuple[float | None, ...] = ()  # None: not scored (its step time alone no faster), or unfit
    rerank_winner: int = 0

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


def solve(space: SearchSpace, table: CostTable, options: CpSatOptions | None = None,
          hint: Point | None = None, progress: Progress = SILENT) -> AutoResult:
    """The best plan of the space under the cost model that fits memory (module docstring)."""
    options = options or CpSatOptions()
    start = time.perf_counter()
    m = TermModel(space, table)
    cp = CpSatModel(m)
    build_s = time.perf_counter() - start
    # The budget is CP-SAT's deterministic time summed over the solves, so that the same inputs give the
    # same plan however loaded the machine is; the wall clock only stops a run three times over its limit.
    deadline = time.perf_counter() + 3 * options.time_limit_s
    capacity = table.hardware.capacity_bytes
    loop = _Loop()
    incumbent = _incumbent(space, table, hint, loop)
    solve_start = time.perf_counter()
    wanted = max(1, options.rerank)
    if options.floor_s is not None and (incumbent is None or incumbent[2].step_time_s > options.floor_s * (1 + 1e-9)):
        progress.update("cpsat: may a plan beat the expert floor?", force=True)
        loop.floored = not cp.beats_floor(_PROBE_SHARE * options.time_limit_s, options)
    while not loop.floored:
        left = options.time_limit_s - cp.deterministic_s
        if left <= 0 or time.perf_counter() > deadline:
            break
        cp.hint(hint)
        cp.rounds = loop.rounds
        progress.update(f"cpsat: solve {loop.rounds + 1}, {time.perf_counter() - solve_start:.1f} s", force=True)
        status, point, objective, bound = cp.solve(left, options, progress)
        loop.rounds += 1
        loop.floored = cp.floored  # no plan that fits beats the floor (cuts only remove plans): the last solve
        if point is None:
            loop.exhausted = status == "infeasible"  # every plan that fits (and beats the incumbent) is found
            break
        loop.bound = max(loop.bound, bound)  # each solve relaxes the plans that fit: a valid lower bound
        plan = space.plan(point)
        sharding = plan.materialize(space.nda)
        cost = table.evaluate(sharding)
        if cost.fits:
            hint = point
            loop.found.append((plan, sharding, cost, objective, bound, "floor" if loop.floored else status))
            if len(loop.found) == wanted or loop.floored:
                break
            cp.exclude(sharding)  # the next solve finds the next best distinct plan
            continue
        # The next solve keeps the hint it had: a hint the cuts below rule out sends CP-SAT after a plan it
        # may not take (bench/scale.py's 80 layers, two solves: 23-29 s hinted so, 9-11 s with the first's).
        loop.saw(cost.peak_memory_bytes, sharding)
        if loop.floored:
            break
        cuts = memory_cuts(m, np.append(table.codes(sharding), 0), capacity)
        for counts in cuts:
            cp.memory_cut(counts, capacity)
        # The plan goes too: a cut in whole KiB may not reach a plan that overflows by a few KiB, and
        # removing the plan priced each round is what makes the loop converge.
        cp.exclude(sharding)
        loop.no_goods += not cuts
    solve_s = time.perf_counter() - solve_start
    variables, constraints = cp.size()
    folded = sum(t.mult - 1 for t in m.terms.values() if t.kind != "param")
    common = dict(solver="cpsat", axes=space.axes, solve_s=solve_s, build_s=build_s, variables=variables,
                  constraints=constraints, terms=len(m.terms), folded=folded,
                  space=space.decisions,
                  rounds=loop.rounds,
                  memory_cuts=cp.memory_cuts, no_goods=loop.no_goods,
                  smallest_peak_bytes=loop.smallest[0] if loop.smallest else None)
    found = loop.with_incumbent(incumbent, options.floor_s if loop.floored else None)
    if found:
        return _answer(found, incumbent, options, table, progress, common)
    proven = loop.exhausted
    tries = f"in {loop.rounds} solves" if loop.rounds else f"within the time limit ({options.time_limit_s:g} s)"
    if loop.floored:
        report = SolveReport(status="floor", objective_s=None, bound_s=options.floor_s, gap=None,
                             message=_beaten(options.floor_s, _proof(loop.rounds)), **common)
        return AutoResult(None, None, None, report)
    if not proven:
        tries += f" ({options.time_limit_s:g} s of solving; {cp.memory_cuts} memory cuts, {loop.no_goods} plans " \
                 "excluded one by one)"
    message = no_fit_message(space, table, loop.smallest, proven, tries)
    report = SolveReport(status="infeasible" if proven else "unknown", objective_s=None, bound_s=None, gap=None,
                         message=message, **common)
    return AutoResult(None, None, None, report)


class _Loop:
    """The lazy memory loop's state: the plans that fit, in the order found
    (best serial first), the best bound, the smallest peak seen."""

    def __init__(self) -> None:
        self.rounds = self.no_goods = 0
        self.found: list[tuple] = []  # (plan, sharding, cost, objective, bound, status)
        self.bound = 0.0
        self.exhausted = False
        self.floored = False  # proven: no plan that fits beats `CpSatOptions.floor_s`
        self.smallest: tuple | None = None  # (peak, sharding)

    def saw(self, peak: int, sharding: FactorSharding) -> None:
        if self.smallest is None or peak < self.smallest[0]:
            self.smallest = (peak, sharding)

    def with_incumbent(self, incumbent: tuple | None, floor_s: float | None = None) -> list[tuple]:
        """The plans found, with a fitting hint first where the solve did not
        find it and it is faster than the best found (the model rounds step
        times: a plan within its rounding of the hint may come first).
        `floor_s`: the solves proved that no plan that fits is faster than
        it (`CpSatOptions.floor_s`)."""
        found = list(self.found)
        if incumbent is None or any(f[1] == incumbent[1] for f in found):
            return found
        plan, sharding, cost = incumbent
        if found and cost.step_time_s >= found[0][2].step_time_s:
            return found
        if found:  # what the solve proved about its optimum holds for the hint, as fast or faster
            bound, status = min(found[0][4], cost.step_time_s), found[0][5]
        elif floor_s is not None:
            bound, status = min(floor_s, cost.step_time_s), "floor"
        else:  # the time ran out before a plan that fits was found
            bound, status = min(self.bound, cost.step_time_s), "feasible"
        return [(plan, sharding, cost, cost.step_time_s, bound, status)] + found


def _incumbent(space: SearchSpace, table: CostTable, hint: Point | None, loop: _Loop) -> tuple | None:
    """A hint's (plan, sharding, cost) when it fits (module docstring)."""
    if hint is None:
        return None
    plan = space.plan(hint)
    sharding = plan.materialize(space.nda)
    cost = table.evaluate(sharding)
    if cost.fits:
        return plan, sharding, cost
    loop.saw(cost.peak_memory_bytes, sharding)
    return None


def _answer(found: list[tuple], incumbent: tuple | None, options: CpSatOptions, table: CostTable,
            progress: Progress, common: dict) -> AutoResult:
    """The report of the best plan found (re-ranked by the simulator when more were kept)."""
    winner, makespans = 0, ()
    if len(found) > 1:
        progress.update(f"cpsat: simulating the {len(found)} best plans", force=True)
        makespans = _scores(found, options, table)
        # The first of the fastest, to float rounding (a pipeline priced from shallow copies of its step):
        # of plans that run alike, the better objective.
        fastest = min(m for m in makespans if m is not None)
        winner = next(i for i, m in enumerate(makespans) if m is not None and m <= fastest * (1 + 1e-12))
    plan, sharding, cost, objective = found[winner][:4]
    best, bound, status = found[0][3:]  # what the solver proved is about the optimum
    gap = max(0.0, (best - bound) / best) if best > 0 else 0.0
    message = f"{status}: step time {best:.6g} s (bound {bound:.6g} s, gap {gap:.2%})"
    if status == "floor":
        whose = "the hint's" if incumbent is not None and found[winner][1] == incumbent[1] else "the plan found's"
        message = _beaten(options.floor_s, _proof(common["rounds"])) + f"; {whose} step time {best:.6g} s"
    elif incumbent is not None and found[winner][1] == incumbent[1]:
        message += "; the hint: no searched plan was faster" + (", none is" if status == "optimal" else "")
    if makespans:
        unscored, unfit = sum(m is None for m in makespans), math.isinf(makespans[winner])
        message += (f"; {options.score_name} re-ranked the {len(found)} best plans"
                    + (f" ({unscored} not scored: their step times alone are no faster)" if unscored else "") + ": "
                    + (f"none of them fits memory under {options.score_name}: the optimum is kept" if unfit else
                       f"the optimum has the shortest makespan ({makespans[0]:.6g} s)" if winner == 0 else
                       f"chose #{winner + 1}, step time {objective:.6g} s, makespan {makespans[winner]:.6g} s "
                       f"(the optimum's: {makespans[0]:.6g} s)"))
    report = SolveReport(status=status, objective_s=objective, bound_s=bound, gap=gap, message=message,
                         rerank_objectives_s=tuple(f[3] for f in found) if makespans else (),
                         rerank_makespans_s=tuple(None if m is not None and math.isinf(m) else m for m in makespans),
                         rerank_winner=winner, **common)
    return AutoResult(plan, sharding, cost, report)


def _proof(rounds: int) -> str:
    return f"in {rounds} solves" if rounds else "with the objective bounded by it"


def _beaten(floor_s: float, tries: str) -> str:
    return f"floor: no plan of the space that fits is faster than {floor_s:.6g} s, the expert floor's step time " \
           f"(proven {tries})"


def _scores(found: list[tuple], options: CpSatOptions, table: CostTable) -> tuple[float | None, ...]:
    """Each plan's score, best serial first; None for a plan not scored
    (`CpSatOptions.score_at_least_step_time`). With `score_jobs` the plans
    are scored side by side (after the first, with `score_first_alone`),
    this process scoring its share: the scores it made it keeps (a
    pipeline's price, which the plan kept is then answered with)."""
    def score(i: int) -> float:
        plan, sharding = found[i][:2]
        return options.score(plan, sharding) if options.score is not None else simulated_makespan_s(table, sharding)

    first = 1 if options.score_first_alone else 0
    side_by_side = forks(options.score_jobs, len(found) - first) and not options.score_at_least_step_time
    scores: list[float | None] = []
    best = math.inf
    for i, (_, _, cost, *_) in enumerate(found):
        if i == first and side_by_side and (best < math.inf or not first):
            with Helpers(score, options.score_jobs) as helpers:
                return (*scores, *helpers.map(list(range(first, len(found)))))
        if options.score_at_least_step_time and cost.step_time_s >= best:
            scores.append(None)
            continue
        scores.append(score(i))
        best = min(best, scores[-1])
    return tuple(scores)


__all__ = ["CpSatOptions", "SolveReport", "solve"]
