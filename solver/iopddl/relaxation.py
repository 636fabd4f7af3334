"""The LP relaxation (local polytope, memory rows added lazily) and its roundings."""

from __future__ import annotations

import random
import time

import numpy as np

from solver.iopddl.memory import _memory_pieces, _repair_memory, _segment_sums
from solver.iopddl.presolve import _Reduced
from solver.iopddl.problem import INFINITE, evaluate
from solver.iopddl.state import _greedy_sweeps, _State


def _lp_roundings(state: _State, nodes: list[int], deadline: float, rows_per_round: int = 5) -> list[np.ndarray]:
    """Assignments of `nodes` (positions in `kept`, everything else fixed
    at the incumbent) rounded from an optimal solution of the LP
    relaxation (`_Relaxation`): along the edges (`_round_along_edges`)
    and node by node. Empty when the LP was not solved by `deadline`. The
    roundings may overfill memory (see `_repair_memory`).

    Memory rows are added lazily, the `rows_per_round` segments the LP
    solution overfills most at a time: C needs about 20 of its 21,849
    segments. Each row is dense, and the rows change the LP's difficulty
    more than its size: 5 at a time solved C's LP in 12 s and D's in 12 s,
    10 at a time in 10 s and 28 s, 50 at a time C's in 31 s, all of
    C's segments at once took more than 5 minutes."""
    from ortools.linear_solver import pywraplp

    relaxation = _Relaxation(state, nodes)
    lp, limit = relaxation.lp, state.problem.usage_limit
    pieces = _memory_pieces(state, nodes)
    added: set[int] = set()
    while True:
        lp.SetTimeLimit(max(int(min(deadline - time.perf_counter(), 1e6) * 1000), 1))  # ms
        if lp.Solve() != pywraplp.Solver.OPTIMAL or time.perf_counter() > deadline:
            return []
        values = {v: np.array([var.solution_value() for var in relaxation.weight[v]]) for v in nodes}
        if pieces is None:
            break
        owner, column, first, stop, room = pieces
        used = np.array([state.red.load[v][:, k] @ values[v] for v, k in zip(owner, column)])
        over = _segment_sums(first, stop, used, len(room)) - room
        worst = [k for k in np.argsort(-over, kind="stable")[:rows_per_round].tolist()
                 if over[k] > 1e-7 * limit and k not in added]
        if not worst:
            break
        added.update(worst)
        for k in worst:
            live = np.nonzero((first <= k) & (k < stop))[0].tolist()
            relaxation.add_memory_row([(owner[i], state.red.load[owner[i]][:, column[i]]) for i in live],
                                      float(room[k]) / limit, limit)
    along = _round_along_edges(state.red, nodes, values, relaxation.pair_values())
    return [np.array([along[v] for v in nodes], dtype=np.int64),
            np.array([int(np.argmax(values[v])) for v in nodes], dtype=np.int64)]


class _Relaxation:
    """The LP relaxation (GLOP) of re-choosing `nodes` with every other
    node fixed, memory rows added by `add_memory_row`: the local polytope, a weight per
    strategy and per allowed pair of an edge, each node's weights summing
    to 1 and each edge's pair weights to its two nodes' weights. It is
    exact on a tree and tight on these graphs: C's absorbed problem
    without memory comes out integral in a second (80.2e9, where CP-SAT
    stalled at 112e9). Dual simplex: 1.4 s there against 12 s with
    GLOP's default primal."""

    def __init__(self, state: _State, nodes: list[int]):
        from ortools.linear_solver import pywraplp

        red, choice = state.red, state.choice
        self.red = red
        self.lp = lp = pywraplp.Solver.CreateSolver("GLOP")
        lp.SetSolverSpecificParametersAsString("use_dual_simplex: true")
        inside = set(nodes)
        unary = {}
        for v in nodes:
            unary[v] = red.cost[v].astype(np.int64).copy()
            for w, key in red.adjacent[v]:
                if w not in inside:
                    unary[v] = np.minimum(unary[v] + red.matrix(v, key)[:, choice[w]], INFINITE)
            unary[v] -= unary[v][unary[v] < INFINITE].min(initial=0)
        pairs = {key: m for key, m in red.edges.items() if key[0] in inside and key[1] in inside}
        relative = {key: np.where(m >= INFINITE, 0, m - m[m < INFINITE].min(initial=0)) for key, m in pairs.items()}
        # Costs relative to each node's and edge's least, scaled so that the
        # incumbent's weigh about 10^6: GLOP's tolerances are absolute.
        now = sum(int(unary[v][choice[v]]) for v in nodes if unary[v][choice[v]] < INFINITE)
        now += sum(int(relative[key][choice[key[0]], choice[key[1]]]) for key in pairs)
        scale = 1e6 / max(now, 1)
        objective = lp.Objective()
        self.weight = {}
        for v in nodes:
            self.weight[v] = [lp.NumVar(0.0, 1.0 if c < INFINITE else 0.0, "") for c in unary[v].tolist()]
            one = lp.Constraint(1.0, 1.0)
            for var, c in zip(self.weight[v], unary[v].tolist()):
                one.SetCoefficient(var, 1.0)
                if 0 < c < INFINITE:
                    objective.SetCoefficient(var, c * scale)
        self.joint: dict[tuple[int, int], list] = {}
        for (u, v), m in pairs.items():
            rows = [lp.Constraint(0.0, 0.0) for _ in range(m.shape[0])]
            cols = [lp.Constraint(0.0, 0.0) for _ in range(m.shape[1])]
            for row, var in zip(rows, self.weight[u]):
                row.SetCoefficient(var, -1.0)
            for col, var in zip(cols, self.weight[v]):
                col.SetCoefficient(var, -1.0)
            self.joint[(u, v)] = []
            for i, j in zip(*np.nonzero(m < INFINITE)):
                var = lp.NumVar(0.0, 1.0, "")
                rows[i].SetCoefficient(var, 1.0)
                cols[j].SetCoefficient(var, 1.0)
                if relative[(u, v)][i, j]:
                    objective.SetCoefficient(var, float(relative[(u, v)][i, j]) * scale)
                self.joint[(u, v)].append((int(i), int(j), var))
        objective.SetMinimization()

    def add_memory_row(self, loads: list[tuple[int, np.ndarray]], room: float, unit: float) -> None:
        """sum over (v, usage per strategy) of usage . weight[v] <= room,
        usages in `unit`s."""
        row = self.lp.Constraint(-self.lp.infinity(), room)
        for v, usage in loads:
            for var, u in zip(self.weight[v], usage.tolist()):
                if u:
                    row.SetCoefficient(var, u / unit)

    def pair_values(self) -> dict[tuple[int, int], np.ndarray]:
        """The solution's pair weights, one matrix per edge."""
        pair = {}
        for (u, v), entries in self.joint.items():
            pair[(u, v)] = np.zeros((len(self.red.kept[u]), len(self.red.kept[v])))
            for i, j, var in entries:
                pair[(u, v)][i, j] = var.solution_value()
        return pair


def _lp_start(state: _State, free: list[int], lp_deadline: float, deadline: float,
              rng: random.Random) -> tuple[_State, int | None]:
    """The incumbent or, when cheaper, one of the LP's roundings
    (`_lp_roundings`) made to fit memory and improved greedily; and the
    cheapest such rounding's cost (None: the LP was not solved in time or
    no rounding fit memory)."""
    problem = state.problem
    best, best_cost = state, evaluate(problem, state.original()).cost
    lp_cost = None
    for rounded in _lp_roundings(state, free, lp_deadline):
        choice = state.choice.copy()
        choice[free] = rounded
        candidate = _State(problem, state.red, choice)
        if not _repair_memory(candidate, free, deadline):
            continue
        _greedy_sweeps(candidate, list(free), rng, deadline, deadline)
        cost = evaluate(problem, candidate.original()).cost
        lp_cost = cost if lp_cost is None else min(lp_cost, cost)
        if cost < best_cost:
            best, best_cost = candidate, cost
    return best, lp_cost



def _round_along_edges(red: _Reduced, nodes: list[int], values: dict[int, np.ndarray],
                       pair: dict[tuple[int, int], np.ndarray]) -> dict[int, int]:
    """A strategy per node from an LP solution (`values[v]` per strategy,
    `pair[(u, v)]` per pair of an edge inside): breadth-first from the most
    certain node, each next node by its own weights plus, per neighbour
    already rounded, the LP's weights conditional on that neighbour's
    choice. A fractional LP solution is often a mixture of consistent
    assignments, which rounding each node alone mixes up (C: 307e9
    against 92.9e9 from the same LP solution)."""
    inside = set(nodes)
    rounded: dict[int, int] = {}
    for root in sorted(nodes, key=lambda v: -values[v].max()):
        if root in rounded:
            continue
        queue, seen = [root], {root}
        while queue:
            v = queue.pop(0)
            score = values[v].copy()
            for w, key in red.adjacent[v]:
                if w in rounded and w in inside:
                    mass = (pair[key] if key[0] == w else pair[key].T)[rounded[w]]
                    if mass.sum() > 1e-9:
                        score += mass / mass.sum()
            rounded[v] = int(np.argmax(score))
            for w, _ in red.adjacent[v]:
                if w in inside and w not in seen:
                    seen.add(w)
                    queue.append(w)
    return rounded
