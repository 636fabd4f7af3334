"""Meeting the memory limit with toulbar2 (`solver.iopddl.wcsp`).

Memory is what separates our neighbourhoods from the best known costs: on
V the unconstrained optimum is 87,814 and the best known 1,632,051; a
neighbourhood must stay within the limit with everything else fixed, so it
cannot trade memory between nodes it does not hold together. Two ways
around that, both solving the whole reduced problem at once:

  - exact, lazily (`exact_search`, small problems): solve without the
    limit, impose it exactly at the most overfilled step of every run of
    steps over it (a knapsack constraint), solve again, until the answer
    fits. V needs 7 steps: 1,617,084 in 33 s, below the best known. When
    toulbar2 completes its search the answer is optimal.
  - by prices (`penalty_search`, large problems, where a knapsack over
    thousands of nodes stalls toulbar2's search): each node pays a price
    per unit of its extra usage (over its least), and the prices adapt
    node by node: up, by the square of how far memory overflowed where the
    node is live, down by a fifth where it fits. This is the contest
    winner's idea (soft constraints with adaptive penalties; ICLR 2026
    submission "Soft Constraints, Strong Solutions") in our own form. An
    answer close to the limit is repaired (`_repair_memory`) and improved
    greedily; the cheapest that fits is kept.
Either way the result is the incumbent the neighbourhood search then
polishes with exact memory.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from solver.iopddl.memory import _repair_memory
from solver.iopddl.problem import evaluate
from solver.iopddl.state import _greedy_sweeps, _State
from solver.iopddl.wcsp import fixed_profile, solve_many

# Up to this many free nodes the limit is imposed exactly (V: 767, or 339
# with determined nodes absorbed); above it a knapsack over thousands of
# nodes stalls toulbar2 (K, N: no solution in 30 s once one step is imposed).
EXACT_NODES = 2_000
# An answer over the limit by at most this factor is repaired; further out
# the repair costs more than the next, better priced answer.
_REPAIRABLE = 1.05
# Prices stop adapting after this many answers in a row brought nothing
# (on the contest's large instances time runs out long before).
_PATIENCE = 8


@dataclass
class WcspStats:
    """How the toulbar2 phase went (reported in `SolveResult.stats`)."""

    solves: int = 0
    steps: int = 0  # time steps imposed exactly
    improvements: int = 0
    proven: bool = False  # toulbar2 completed its search on an answer that fits
    costs: list[int] = field(default_factory=list)  # exact cost of each answer, repaired or not


def memory_search(state: _State, free: list[int], deadline: float, rng: random.Random, *, seconds: float,
                  backtracks: int | None = None, seed: int = 0, workers: int = 1, exact_nodes: int = EXACT_NODES,
                  progress: Callable[[str], None] | None = None) -> tuple[_State, WcspStats]:
    """The cheapest assignment that fits found by toulbar2, or `state` (a
    feasible incumbent) if none is cheaper: exact up to `exact_nodes` free
    nodes, by prices above. `seconds` bounds each toulbar2 solve; `workers`
    solves run side by side (`solve_many`)."""
    search = exact_search if len(free) <= exact_nodes else penalty_search
    return search(state, free, deadline, rng, seconds=seconds, backtracks=backtracks, seed=seed, workers=workers,
                  progress=progress)


def exact_search(state: _State, free: list[int], deadline: float, rng: random.Random, *, seconds: float,
                 backtracks: int | None = None, seed: int = 0, workers: int = 1,
                 progress: Callable[[str], None] | None = None) -> tuple[_State, WcspStats]:
    """Memory imposed lazily, step by step, until toulbar2's answer fits;
    then, while time is left and the search was cut short, solved again
    with twice the time (an answer that then breaks a step not yet imposed
    adds it). With several workers each round solves the same network
    with different seeds, and every answer's overflowing steps are added."""
    problem, stats = state.problem, WcspStats()
    best, best_cost = state, evaluate(problem, state.original()).cost
    fixed = fixed_profile(state, free)
    steps: list[int] = []
    while time.perf_counter() < deadline - 1:
        limit_s = min(seconds, deadline - time.perf_counter())
        requests = [{"steps": list(steps), "fixed": fixed, "seconds": limit_s, "backtracks": backtracks,
                     "seed": seed + stats.solves + k} for k in range(max(workers, 1))]
        answers = [a for a in solve_many(best, free, requests, workers) if a is not None]
        stats.solves += len(requests)
        if not answers:
            break
        new_steps, fitted = set(), False
        for found in answers:
            answer = _State(problem, state.red, found.choice)
            over = np.nonzero(answer.profile > problem.usage_limit)[0]
            if progress is not None:
                progress(f"toulbar2 with {len(steps)} steps imposed: cost "
                         f"{evaluate(problem, answer.original()).cost:,}, {len(over)} steps over the limit")
            if len(over):
                runs = np.split(over, np.nonzero(np.diff(over) > 1)[0] + 1)
                new_steps |= {int(run[np.argmax(answer.profile[run])]) for run in runs}
                continue
            # A complete search is optimal under the imposed steps, and the answer fits everywhere: optimal.
            stats.proven |= found.optimal
            fitted = True
            _greedy_sweeps(answer, list(free), rng, deadline, deadline)
            cost = evaluate(problem, answer.original()).cost
            stats.costs.append(cost)
            if cost < best_cost:
                best, best_cost, stats.improvements = answer, cost, stats.improvements + 1
        steps += sorted(new_steps - set(steps))
        stats.steps = len(steps)
        if stats.proven or (fitted and backtracks is not None):
            break
        if fitted:
            seconds *= 2
    return best, stats


def penalty_search(state: _State, free: list[int], deadline: float, rng: random.Random, *, seconds: float,
                   backtracks: int | None = None, seed: int = 0, workers: int = 1,
                   progress: Callable[[str], None] | None = None) -> tuple[_State, WcspStats]:
    """Adaptive prices on extra usage, node by node (module docstring).
    With several workers each round also solves with the prices doubled,
    tripled, ...: answers further from the limit's edge, one of which often
    fits, while the prices adapt from the first."""
    problem, red, stats = state.problem, state.red, WcspStats()
    limit = problem.usage_limit
    best, best_cost = state, evaluate(problem, state.original()).cost
    extra = {v: _extra_usage(red.load[v]) for v in free}
    priced = [v for v in free if extra[v].max() > 0]
    weight = dict.fromkeys(priced, 0.0)
    rounds = stale = 0
    while time.perf_counter() < deadline - 1 and stale < _PATIENCE:
        # The first two rounds only set the scale of the prices: a third of the time each.
        limit_s = min(seconds / 3 if rounds < 2 else seconds, deadline - time.perf_counter())
        scales = [1] if rounds == 0 else range(1, max(workers, 1) + 1)  # nothing to scale before prices exist
        requests = [{"penalty": {v: k * weight[v] * extra[v] for v in priced if weight[v] > 0}, "seconds": limit_s,
                     "backtracks": backtracks, "seed": seed + stats.solves + k} for k in scales]
        answers = solve_many(best, free, requests, workers)
        stats.solves += len(requests)
        rounds += 1
        if answers[0] is None:
            break
        first = _State(problem, red, answers[0].choice)
        if rounds == 1:
            if first.profile.max(initial=0) <= limit:  # memory does not bind: toulbar2's answer to the whole problem
                stats.proven = answers[0].optimal
                _greedy_sweeps(first, list(free), rng, deadline, deadline)
                cost = evaluate(problem, first.original()).cost
                stats.costs.append(cost)
                return (first, stats) if cost < best_cost else (best, stats)
            # A price per unit that makes a limit's worth of usage cost an eighth of the unconstrained answer.
            weight = dict.fromkeys(priced, max(evaluate(problem, first.original()).cost, 1) / max(limit, 1) / 8)
        else:
            _adapt(weight, priced, red, first.profile, limit)
        stale += 1
        for k, found in enumerate(answers):
            if found is None:
                continue
            answer = first if k == 0 else _State(problem, red, found.choice)
            peak = int(answer.profile.max(initial=0))
            raw = cost = evaluate(problem, answer.original()).cost
            if peak <= _REPAIRABLE * limit and _repair_memory(answer, free, deadline):
                _greedy_sweeps(answer, list(free), rng, deadline, deadline)
                cost = evaluate(problem, answer.original()).cost
                if cost < best_cost:
                    best, best_cost, stats.improvements, stale = answer, cost, stats.improvements + 1, 0
            stats.costs.append(cost)
            if progress is not None:
                progress(f"toulbar2 with prices x{k + 1}, round {rounds}: cost {raw:,}, peak {peak / limit:.3f} of "
                         f"the limit; best that fits {best_cost:,}")
    return best, stats


def _extra_usage(load: np.ndarray) -> np.ndarray:
    """Per strategy, its largest usage above the node's least at any segment."""
    if not load.shape[1]:
        return np.zeros(load.shape[0])
    return (load - load.min(axis=0)).max(axis=1).astype(np.float64)


def _adapt(weight: dict[int, float], priced: Sequence[int], red, profile: np.ndarray, limit: int) -> None:
    """Raise the price of every node live where memory overflowed, by the
    square of the worst overflow it saw (between 1.5x and 16x: a node in a
    10x overflow needs a far higher price at once); lower the others' by a
    fifth, so a price that is no longer needed fades."""
    for v in priced:
        bounds = red.bounds[v]
        ratio = profile[bounds[0]:bounds[-1]].max() / limit
        weight[v] *= min(max(ratio * ratio, 1.5), 16.0) if ratio > 1 else 0.8
