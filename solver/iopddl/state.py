"""The search state (an assignment with its costs and memory) and the greedy sweeps."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np

from solver.iopddl.presolve import _merge_determined, _Reduced
from solver.iopddl.problem import INFINITE, Problem, usage_profile

# ------------------------------------------------------------------ search state


class _State:
    """An assignment of the reduced problem (`choice[v]`: a position in
    `kept[v]`) with its usage profile, kept up to date by `move`."""

    def __init__(self, problem: Problem, red: _Reduced, choice: np.ndarray):
        self.problem, self.red, self.choice = problem, red, choice
        self.profile = usage_profile(problem, self.original())

    def original(self) -> np.ndarray:
        """Strategy indices of the original problem."""
        return self.red.original(self.choice)

    def costs_of(self, v: int) -> np.ndarray:
        """v's cost at every strategy given the neighbours' choices (int64, capped)."""
        total = self.red.cost[v].astype(np.int64).copy()
        for w, key in self.red.adjacent[v]:
            total = np.minimum(total + self.red.matrix(v, key)[:, self.choice[w]], INFINITE)
        return total

    def fits(self, v: int) -> np.ndarray:
        """Per strategy of v, whether moving v to it keeps memory within the
        limit wherever it adds usage."""
        bounds, load = self.red.bounds[v], self.red.load[v]
        if not len(bounds):
            return np.ones(len(load), dtype=bool)
        peak = np.maximum.reduceat(self.profile[bounds[0]:bounds[-1]], bounds[:-1] - bounds[0])
        extra = load - load[self.choice[v]]
        return ((extra <= 0) | (peak + extra <= self.problem.usage_limit)).all(axis=1)

    def move(self, v: int, s: int) -> None:
        bounds, load = self.red.bounds[v], self.red.load[v]
        if len(bounds):
            delta = load[s] - load[self.choice[v]]
            if len(delta) == 1:
                self.profile[bounds[0]:bounds[1]] += delta[0]
            elif delta.any():
                self.profile[bounds[0]:bounds[-1]] += np.repeat(delta, np.diff(bounds))
        self.choice[v] = s


def _start(problem: Problem, red: _Reduced) -> _State:
    """Least usage everywhere (cheapest among ties): feasible whenever any
    assignment is, unless forbidden pairs get in the way (greedy fixes those)."""
    choice = np.array([int(np.lexsort((c, u[k]))[0]) for c, u, k in zip(red.cost, problem.node_usages, red.kept)],
                      dtype=np.int64)
    return _State(problem, red, choice)


def _merged_state(problem: Problem, state: _State) -> _State | None:
    """The incumbent on the problem with determined nodes absorbed
    (`_merge_determined`). Without a forbidden choice it follows every
    determining edge and carries over exactly; otherwise a node whose
    strategy no longer exists takes its least memory (its load summed over
    time), and if memory then breaks, every node does. None when that too
    breaks memory."""
    red = _merge_determined(problem, state.red)
    chosen = state.original()
    least = np.zeros(problem.num_nodes, dtype=np.int64)
    choice = np.zeros(problem.num_nodes, dtype=np.int64)
    for v in range(problem.num_nodes):
        if len(red.kept[v]) > 1:
            least[v] = int(np.lexsort((red.cost[v], red.load[v] @ np.diff(red.bounds[v])))[0])
            at = int(np.searchsorted(red.kept[v], chosen[v]))
            choice[v] = at if at < len(red.kept[v]) and red.kept[v][at] == chosen[v] else least[v]
    for start in (choice, least):
        merged = _State(problem, red, start)
        if merged.profile.max(initial=0) <= problem.usage_limit:
            return merged
    return None


def _greedy_sweeps(state: _State, order: list[int], rng: random.Random, deadline: float, later: float) -> None:
    """Greedy sweeps in random orders until nothing moves: the first until
    `deadline` (it repairs most forbidden choices), later ones until `later`."""
    for sweep in range(5):
        rng.shuffle(order)
        if not _greedy(state, order, deadline if sweep == 0 else later):
            break


def _greedy(state: _State, order: Sequence[int], deadline: float) -> int:
    """One sweep: each node to its cheapest strategy that fits in memory.
    Returns how many nodes moved."""
    moved = 0
    for v in order:
        if time.perf_counter() > deadline:
            break
        costs = np.where(state.fits(v), state.costs_of(v), INFINITE + 1)
        current = state.choice[v]
        best = int(np.argmin(costs))
        if costs[best] < costs[current]:
            state.move(v, best)
            moved += 1
    return moved
