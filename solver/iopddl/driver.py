"""The driver: `solve`, its options and its result."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from solver.iopddl.model import _subsolve
from solver.iopddl.neighbourhood import _hot_nodes, _neighbourhood, _whole_model
from solver.iopddl.penalty import EXACT_NODES, memory_search
from solver.iopddl.presolve import presolve
from solver.iopddl.problem import INFINITE, Evaluation, Problem, evaluate
from solver.iopddl.relaxation import _lp_start
from solver.iopddl.state import _greedy_sweeps, _merged_state, _start, _State
from solver.iopddl.wcsp import available as wcsp_available

# ------------------------------------------------------------------ solve


@dataclass(frozen=True, slots=True)
class SolveResult:
    """The best assignment found (original strategy indices), its exact
    evaluation, and how the search went."""

    strategies: tuple[int, ...]
    evaluation: Evaluation
    seconds: float
    rounds: int  # neighbourhoods re-solved
    improvements: int
    start_cost: int  # least-usage start, then after the greedy sweeps
    greedy_cost: int
    stats: dict[str, int]
    message: str
    lp_cost: int | None = None  # the best LP rounding, repaired and improved (None: no LP solved)
    wcsp_cost: int | None = None  # the incumbent after the toulbar2 phase (None: it did not run)

    def to_json(self) -> dict[str, Any]:
        return {**self.evaluation.to_json(), "time_s": self.seconds, "rounds": self.rounds,
                "improvements": self.improvements, "start_cost": self.start_cost, "greedy_cost": self.greedy_cost,
                "lp_cost": self.lp_cost, "wcsp_cost": self.wcsp_cost, "presolve": dict(self.stats),
                "message": self.message, "strategies": list(self.strategies)}


@dataclass(frozen=True, slots=True)
class SolveOptions:
    time_limit_s: float = 60.0
    workers: int = 1
    seed: int = 0
    max_rounds: int | None = None  # neighbourhoods; with it and workers=1 the search is reproducible
    budget: int = 300  # strategies in a neighbourhood at first (adapts)
    whole_model_limit: int = 400_000  # literals up to which one CP-SAT model is solved (see `_whole_model`)
    sub_time_s: float = 2.0  # per neighbourhood (a star above the budget: up to 5x)
    memory_encoding: str = "auto"  # "sums", "sweep" or "auto" (see `_memory_constraints`)
    # toulbar2 before the neighbourhoods of a problem too large for one CP-SAT model ("auto": when
    # pytoulbar2 is installed; "off": never), for `wcsp_share` of the time, each solve bounded by
    # `wcsp_seconds` (None: a ninth of the time limit, 2 to 30 s) or, reproducibly, `wcsp_backtracks`;
    # memory imposed exactly up to `wcsp_exact_nodes` free nodes, by prices above (solver.iopddl.penalty).
    wcsp: str = "auto"
    wcsp_share: float = 0.75
    wcsp_seconds: float | None = None
    wcsp_backtracks: int | None = None
    wcsp_exact_nodes: int = EXACT_NODES

    def __post_init__(self) -> None:
        if self.memory_encoding not in ("auto", "sums", "sweep"):
            raise ValueError(f"memory_encoding must be 'auto', 'sums' or 'sweep', not {self.memory_encoding!r}")
        if self.wcsp not in ("auto", "off"):
            raise ValueError(f"wcsp must be 'auto' or 'off', not {self.wcsp!r}")
        if not 0 <= self.wcsp_share <= 1:
            raise ValueError(f"wcsp_share must be within [0, 1], not {self.wcsp_share!r}")


def solve(problem: Problem, options: SolveOptions = SolveOptions(),
          progress: Callable[[str], None] | None = None) -> SolveResult:
    """The best solution found within the time limit (see the module doc)."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    red = presolve(problem)
    state = _start(problem, red)
    start_cost = evaluate(problem, state.original()).cost
    if state.profile.max(initial=0) > problem.usage_limit:
        evaluation = evaluate(problem, state.original())
        return SolveResult(tuple(state.original().tolist()), evaluation, time.perf_counter() - start, 0, 0,
                           start_cost, start_cost, red.stats, "no feasible solution exists: every node at its "
                           f"least usage already exceeds the limit at step {evaluation.first_violation}")
    free = [v for v in range(problem.num_nodes) if red.free(v)]
    rng = random.Random(options.seed)
    order = list(free)
    # Greedy sweeps until nothing moves: the first whatever it takes (it
    # repairs most forbidden choices), later ones within a third of what is left.
    sweeps_until = time.perf_counter() + (deadline - time.perf_counter()) / 3
    _greedy_sweeps(state, order, rng, deadline, sweeps_until)
    # A problem small enough for one tight model is left as it is: CP-SAT
    # proves B and G optimal that way, where absorbing makes their memory
    # sums denser (B: 10.5e6 against 2.4e6 after 20 s, 1.05e6 against its
    # optimum 532,843 after 60 s; G proven in 108 s against 58 s).
    small = _whole_model(red, free, options.whole_model_limit) == "tight"
    merged = _merged_state(problem, state) if free and not small else None
    if merged is not None:
        state, red = merged, merged.red
        free = [v for v in range(problem.num_nodes) if red.free(v)]
        _greedy_sweeps(state, list(free), rng, deadline, sweeps_until)  # whole chains move at once now
    greedy_cost = evaluate(problem, state.original()).cost
    rounds = improvements = 0
    lp_cost = None
    proven = not free  # nothing left to choose: presolve decided every node
    whole = _whole_model(red, free, options.whole_model_limit) if free else None
    if whole is not None:
        # A tight model starts from its LP's rounding, given up to three
        # quarters of the time (GLOP's time varies with the objective's
        # scale: D's LP took 11.5 s to 29 s for scales 10x apart). It took
        # C, D and Q below the best known costs, where CP-SAT alone
        # stalled 15% to 50% above them, and CP-SAT seldom improves on it.
        # The LP has at most `whole_model_limit` columns (C: 91,291).
        if whole == "tight":
            state, lp_cost = _lp_start(state, free, deadline - (deadline - time.perf_counter()) / 4, deadline, rng)
        # CP-SAT's own portfolio (its LNS and local search, hinted with the
        # incumbent) beats our neighbourhoods here.
        improved, proven = _subsolve(state, free, deadline - time.perf_counter(), options.workers, options.seed,
                                     tight=whole == "tight", memory=options.memory_encoding)
        rounds, improvements, free = 1, int(improved), []
    wcsp_cost = None
    if free and options.wcsp == "auto" and options.wcsp_share > 0 and wcsp_available():
        state, wcsp_cost, solved = _wcsp_phase(state, free, options, deadline, rng, progress)
        if solved:  # toulbar2 completed on an answer that fits: nothing is left to search
            proven, free = True, []
    if free:
        rounds, improvements, searched = _neighbourhoods(state, free, options, deadline, rng, progress)
        proven = proven or searched
    strategies = state.original()
    evaluation = evaluate(problem, strategies)
    message = (("optimal" if proven else "feasible") if evaluation.feasible else
               "no feasible solution found (forbidden choices remain)" if evaluation.forbidden else
               "no feasible solution found (memory)")
    return SolveResult(tuple(strategies.tolist()), evaluation, time.perf_counter() - start, rounds, improvements,
                       start_cost, greedy_cost, red.stats, message, lp_cost, wcsp_cost)


def _wcsp_phase(state: _State, free: list[int], options: SolveOptions, deadline: float, rng: random.Random,
                progress: Callable[[str], None] | None) -> tuple[_State, int, bool]:
    """Whole-problem answers by toulbar2 for `wcsp_share` of the time left,
    memory imposed exactly or by prices (solver.iopddl.penalty): what the
    neighbourhoods cannot do is trade memory between nodes far apart in the
    graph. Returns the incumbent, its cost and whether it is proven optimal;
    the phase's counts go into the reduced problem's stats."""
    seconds = options.wcsp_seconds or min(max(options.time_limit_s / 9, 2.0), 30.0)
    until = time.perf_counter() + options.wcsp_share * (deadline - time.perf_counter())
    state, stats = memory_search(state, free, until, rng, seconds=seconds, backtracks=options.wcsp_backtracks,
                                 seed=options.seed, workers=options.workers, exact_nodes=options.wcsp_exact_nodes,
                                 progress=progress)
    state.red.stats.update(wcsp_solves=stats.solves, wcsp_steps=stats.steps, wcsp_improvements=stats.improvements)
    return state, evaluate(state.problem, state.original()).cost, stats.proven


def _neighbourhoods(state: _State, free: list[int], options: SolveOptions, deadline: float, rng: random.Random,
                    progress: Callable[[str], None] | None) -> tuple[int, int, bool]:
    """Large-neighbourhood search until the deadline or `max_rounds`: CP-SAT
    re-solves neighbourhoods of the incumbent (`_neighbourhood`), improving
    `state` in place. Returns the rounds, the improvements, and whether one
    neighbourhood held every free node and was solved to optimality."""
    red = state.red
    rounds = improvements = 0
    proven = False
    budget = options.budget
    hot: tuple[list[int], int] = (free, 0)
    forbidden, stalled = INFINITE, 0  # nodes touching forbidden choices, rounds since that fell
    improved = False
    tried: set[int] = set()  # expensive seeds whose neighbourhood improved nothing
    while time.perf_counter() < deadline and (options.max_rounds is None or rounds < options.max_rounds):
        # An improvement may have cooled a hot node; while repairs go on
        # (thousands of small rounds on K), every 20 rounds is enough.
        if rounds % 20 == 0 or (improved and not hot[1]):
            hot = _hot_nodes(state, free, tried)
            forbidden, stalled = (hot[1], 0) if hot[1] < forbidden else (forbidden, stalled)
        nodes, seed = _neighbourhood(state, rng, budget, free, hot)
        began = time.perf_counter()
        # A star above the budget gets time in proportion (C's first: 6,873
        # strategies, closed in 2.4 s on 2 workers).
        size = sum(len(red.kept[v]) for v in nodes)
        seconds = min(max(options.sub_time_s, size / 2000), 5 * options.sub_time_s, deadline - began)
        # Penalise forbidden boundary choices only when repairs stall (see
        # `_build_submodel`): ruling them out repairs faster while it works (K).
        soft = 0 < forbidden and stalled >= 60
        improved, optimal = _subsolve(state, nodes, seconds, options.workers, rng.randrange(1 << 30), soft=soft,
                                      memory=options.memory_encoding)
        if seed is not None and not improved and not hot[1]:  # repairs retry their seeds (see `_hot_nodes`)
            tried.add(seed)
            hot = ([v for v in hot[0] if v != seed] or free, hot[1])
        stalled += 1
        rounds += 1
        improvements += improved
        if optimal and len(nodes) == len(free):  # the whole reduced problem, solved to optimality
            proven = True
            break
        # Aim at neighbourhoods CP-SAT closes in well under the cap: grow
        # those it closes quickly, shrink those it cannot close.
        if not optimal:
            budget = max(int(budget / 1.5), 50)
        elif time.perf_counter() - began < options.sub_time_s / 4:
            budget = min(int(budget * 1.3) + 1, 50_000)
        if progress is not None and rounds % 10 == 0:
            progress(f"round {rounds}: {improvements} improvements, neighbourhood budget {budget}")
    return rounds, improvements, proven
