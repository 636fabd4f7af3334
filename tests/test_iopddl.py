"""The IOPDDL problem (solver/iopddl/ and `shardplan iopddl`): the
evaluator against hand-computed costs, the solver against brute force on
small instances, presolve, input validation, solution files and the CLI."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
from typing import NamedTuple

import numpy as np
import pytest
from conftest import ROOT, shardplan

from solver.iopddl import (
    INFINITE,
    IopddlError,
    SolveOptions,
    _hot_nodes,
    _neighbourhood,
    _start,
    _subsolve,
    _sweep_constraints,
    _whole_model,
    evaluate,
    parse_problem,
    presolve,
    read_problem,
    read_solution,
    solve,
    usage_profile,
)
from solver.iopddl.wcsp import available as wcsp_available

# The contest's toy instance, copied unmodified from google/iopddl (Apache-2.0)
# so the tests need nothing outside the repository.
EXAMPLE = ROOT / "tests" / "fixtures" / "iopddl" / "example.json"

# example.json by hand (intervals are half-open [start, end)):
#   node 0 [30, 70)   costs [15]          usages [10]
#   node 1 [40, 70)   costs [55, 65]      usages [25, 25]
#   node 2 [50, 120)  costs [25, 45, 35]  usages [15, 20, 15]
#   node 3 [110, 140) costs [85, 75]      usages [10, 10]
#   node 4 [110, 150) costs [95]          usages [15]
#   edges (0,1) [30, 40]; (0,2) [50, 10, 40]; (1,3) [[90, 10], [20, 80]]; (2,4) [60, 20, 30]; (3,4) [70, 60]
#   usage_limit 50
# Live usage per step: 30-39: u0 = 10; 40-49: u0+u1 = 35; 50-69: u0+u1+u2 = 35+u2;
# 70-109: u2; 110-119: u2+u3+u4 = u2+25; 120-139: u3+u4 = 25; 140-149: u4 = 15.
# So node 2 at strategy 1 (usage 20) gives 55 > 50 at steps 50..69, the others peak at exactly 50.
# Cost = 15 + 95 (nodes 0, 4) + [c1 + e01] + [c2 + e02 + e24] + [c3 + e34] + e13:
#   c1 + e01:         s1=0: 55+30 = 85    s1=1: 65+40 = 105
#   c2 + e02 + e24:   s2=0: 25+50+60 = 135  s2=1: 45+10+20 = 75  s2=2: 35+40+30 = 105
#   c3 + e34:         s3=0: 85+70 = 155   s3=1: 75+60 = 135
#   e13 (s1, s3):     (0,0) 90  (0,1) 10  (1,0) 20  (1,1) 80
# Best (s1, s3): (0,1) = 85+135+10 = 230 (others 330, 280, 320).
#   [0,0,0,0,0]: 110 + 85 + 135 + 155 + 90 = 575, feasible, peak 50
#   [0,0,2,1,0]: 110 + 230 + 105 = 445, feasible, peak 50: the optimum
#   [0,0,1,1,0]: 110 + 230 + 75 = 415, infeasible (55 at step 50): the optimum without the memory limit
#   [0,1,1,1,0]: 110 + (105+135+80) + 75 = 505, infeasible, first violation at step 50, peak 55
EXAMPLE_OPTIMUM = 445

# The solver's two ways: one CP-SAT model of the whole reduced problem (small instances, the default),
# or neighbourhoods of the incumbent (forced with whole_model_limit=0); and the memory limit's two
# encodings, one sum per segment of time (what small models get) or a running sweep (forced here).
PATHS = {"whole": {}, "lns": {"whole_model_limit": 0, "wcsp": "off"},
         "whole-sweep": {"memory_encoding": "sweep"},
         "lns-sweep": {"whole_model_limit": 0, "memory_encoding": "sweep", "wcsp": "off"}}
# toulbar2 before the neighbourhoods (solver.iopddl.penalty), memory imposed exactly or by prices, each
# solve bounded by backtracks (reproducible); where pytoulbar2 is installed (Linux).
if wcsp_available():
    PATHS |= {"wcsp-exact": {"whole_model_limit": 0, "wcsp_backtracks": 20_000},
              "wcsp-prices": {"whole_model_limit": 0, "wcsp_backtracks": 20_000, "wcsp_exact_nodes": 0}}


def example_data() -> dict:
    return json.loads(EXAMPLE.read_text())


def instance(intervals, costs, usages, pairs=(), edge_costs=(), limit=100, name="t") -> dict:
    return {"problem": {"name": name, "nodes": {"intervals": [list(i) for i in intervals], "costs": costs,
                                                 "usages": usages},
                        "edges": {"nodes": [list(p) for p in pairs], "costs": list(edge_costs)},
                        "usage_limit": limit}}


class Best(NamedTuple):
    cost: int
    strategies: tuple[int, ...]


def brute_force(problem) -> Best | None:
    """The cheapest feasible assignment by enumeration (ties: the first in lexicographic order)."""
    counts = [len(c) for c in problem.node_costs]
    assert int(np.prod(counts)) <= 5000, "too many assignments to enumerate"
    best = None
    for s in itertools.product(*(range(k) for k in counts)):
        ev = evaluate(problem, s)
        if ev.feasible and (best is None or ev.cost < best.cost):
            best = Best(ev.cost, s)
    return best


def extreme_peak(problem, pick) -> int:
    """The peak with every node at its least (pick=np.argmin) or largest (np.argmax) usage."""
    chosen = [int(pick(u)) for u in problem.node_usages]
    return int(usage_profile(problem, np.array(chosen)).max(initial=0))


def synthetic(seed: int, nodes: int, max_strategies: int = 4, horizon: int = 24, max_product: int | None = 4000,
              determined: float = 0.0):
    """A random instance in the file format: a random path through the nodes (so the graph is connected)
    plus random edges, one pair repeated the same way and one the other way round, a few forbidden node
    and edge entries, some empty intervals. usage_limit is left huge (no memory constraint). A fraction
    `determined` of the edges allow one pair per row (the rest forbidden), now and then none."""
    rng = np.random.default_rng(seed)
    counts = [int(k) for k in rng.integers(2, max_strategies + 1, size=nodes)]
    while max_product is not None and int(np.prod(counts)) > max_product:
        v = int(rng.choice([v for v, k in enumerate(counts) if k > 2]))
        counts[v] -= 1
    intervals = []
    for _ in range(nodes):
        start = int(rng.integers(0, horizon))
        intervals.append([start, start + int(rng.integers(0, 10))])
    costs = [rng.integers(0, 100, size=k).tolist() for k in counts]
    usages = [rng.integers(1, 30, size=k).tolist() for k in counts]
    for v in rng.choice(nodes, size=max(2, nodes // 8), replace=False):
        costs[v][int(rng.integers(counts[v]))] = INFINITE  # one forbidden strategy: never all of them
    order = rng.permutation(nodes)
    pairs = [[int(a), int(b)] for a, b in zip(order[:-1], order[1:])]
    for _ in range(nodes // 2):
        u, v = rng.choice(nodes, size=2, replace=False)
        pairs.append([int(u), int(v)])
    pairs += [list(pairs[0]), pairs[1][::-1]]
    edge_costs = []
    for u, v in pairs:
        flat = rng.integers(0, 60, size=counts[u] * counts[v]).tolist()
        if rng.random() < determined:
            for i in range(counts[u]):
                allowed = int(rng.integers(counts[v])) if rng.random() < 0.9 else -1
                flat[i * counts[v]:(i + 1) * counts[v]] = [flat[i * counts[v] + j] if j == allowed else INFINITE
                                                         for j in range(counts[v])]
        elif rng.random() < 0.4:
            flat[int(rng.integers(len(flat)))] = INFINITE
        edge_costs.append(flat)
    return instance(intervals, costs, usages, pairs, edge_costs, limit=10**12, name=f"synthetic-{seed}")


@functools.cache
def binding_instance(seed: int, determined: float = 0.0) -> tuple[str, tuple[int, ...]]:
    """A small synthetic instance (JSON text) whose usage_limit lies between the least-usage peak and the
    peak of the optimum without memory limit, and still admits a feasible solution; and that optimum."""
    for attempt in range(50):
        data = synthetic(1000 * seed + attempt, nodes=6 + seed % 4, determined=determined)
        free = brute_force(parse_problem(data))
        if free is None:
            continue
        problem = parse_problem(data)
        least, top = extreme_peak(problem, np.argmin), evaluate(problem, free.strategies).peak
        if least >= top:
            continue
        data["problem"]["usage_limit"] = int(np.random.default_rng(seed).integers(least, top))
        if brute_force(parse_problem(data)) is not None:
            return json.dumps(data), free.strategies
    raise AssertionError("no binding instance found")


# ------------------------------------------------------------------ 1. the evaluator on example.json


def test_example_reads_as_documented():
    problem = read_problem(EXAMPLE)
    assert problem.name == "example"
    assert (problem.num_nodes, problem.num_edges, problem.usage_limit, problem.horizon) == (5, 5, 50, 150)
    # row-major with u's strategy major: edge (1, 3) costs [90, 10, 20, 80]
    assert problem.edge_costs[2].tolist() == [[90, 10], [20, 80]]
    assert problem.edge_costs[3].tolist() == [[60], [20], [30]]


@pytest.mark.parametrize("strategies, cost, peak, first_violation", [
    ([0, 0, 0, 0, 0], 575, 50, None),
    ([0, 0, 2, 1, 0], 445, 50, None),
    ([0, 1, 1, 1, 0], 505, 55, 50),
    ([0, 0, 1, 1, 0], 415, 55, 50),
])
def test_evaluate_example_by_hand(strategies, cost, peak, first_violation):
    ev = evaluate(read_problem(EXAMPLE), strategies)
    assert ev.cost == cost
    assert ev.peak == peak
    assert ev.first_violation == first_violation
    assert ev.feasible is (first_violation is None)
    assert ev.forbidden == 0


def test_usage_profile_is_half_open():
    profile = usage_profile(read_problem(EXAMPLE), np.array([0, 0, 0, 0, 0]))
    assert len(profile) == 150
    expected = {0: 0, 29: 0, 30: 10, 39: 10, 40: 35, 49: 35, 50: 50, 69: 50, 70: 15, 109: 15,
                110: 40, 119: 40, 120: 25, 139: 25, 140: 15, 149: 15}
    assert {t: int(profile[t]) for t in expected} == expected


def test_first_violation_is_the_first_step_over_the_limit():
    data = example_data()
    data["problem"]["usage_limit"] = 30  # 35 at steps 40..49 is the first excess (10 at 30..39 fits)
    ev = evaluate(parse_problem(data), [0, 0, 0, 0, 0])
    assert (ev.feasible, ev.first_violation, ev.peak, ev.cost) == (False, 40, 50, 575)


def test_forbidden_choices_and_exact_big_sums():
    big = 5 * 10**18  # three of them overflow int64
    data = instance([[0, 1]] * 3, [[big, 1], [big, 2], [big, 3]], [[1, 1]] * 3, [[0, 1]], [[INFINITE, 0, 0, 0]])
    ev = evaluate(parse_problem(data), [0, 0, 0])
    assert ev.cost == 3 * big + INFINITE
    assert ev.forbidden == 4  # the three node costs are >= 10**18, and the edge entry
    assert ev.feasible is False and ev.first_violation is None
    ev = evaluate(parse_problem(data), [1, 1, 1])
    assert (ev.cost, ev.forbidden, ev.feasible) == (6, 0, True)


# ------------------------------------------------------------------ 2. the solver against brute force


def test_brute_force_example():
    assert brute_force(read_problem(EXAMPLE)) == Best(EXAMPLE_OPTIMUM, (0, 0, 2, 1, 0))


@pytest.mark.parametrize("path", PATHS)
def test_solver_finds_example_optimum(path):
    problem = read_problem(EXAMPLE)
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=50, **PATHS[path]))
    assert result.evaluation.feasible
    assert result.evaluation.cost == EXAMPLE_OPTIMUM
    assert result.strategies == (0, 0, 2, 1, 0)  # the unique optimum
    assert evaluate(problem, result.strategies) == result.evaluation


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", range(6))
def test_solver_matches_brute_force_on_synthetic(seed, path):
    text, unconstrained = binding_instance(seed)
    problem = parse_problem(json.loads(text), f"synthetic-{seed}")
    assert extreme_peak(problem, np.argmin) <= problem.usage_limit < extreme_peak(problem, np.argmax)
    assert not evaluate(problem, unconstrained).feasible  # memory binds: the unconstrained optimum is out
    assert len({tuple(sorted(p)) for p in problem.edges.tolist()}) < problem.num_edges  # parallel edges
    assert any((c >= INFINITE).any() for c in problem.node_costs)
    best = brute_force(problem)
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=60, **PATHS[path]))
    assert result.evaluation.feasible
    assert result.evaluation.cost == best.cost
    assert evaluate(problem, result.strategies) == result.evaluation
    if path.startswith("whole"):
        assert result.message == "optimal"  # one CP-SAT model of everything: proven


@pytest.mark.parametrize("memory", ["sums", "sweep"])
def test_row_encoding_proves_the_brute_force_optimum(memory):
    # One model of every free node with edges as rows (what neighbourhoods and P get): random strategy counts put
    # the smaller side on either end of an edge, with forbidden pairs and parallel edges.
    sides = set()
    for seed in range(6):
        problem = parse_problem(json.loads(binding_instance(seed)[0]))
        red = presolve(problem)
        state = _start(problem, red)
        free = [v for v in range(problem.num_nodes) if red.free(v)]
        sides |= {np.sign(len(red.kept[u]) - len(red.kept[v])) for u, v in red.edges}
        improved, optimal = _subsolve(state, free, 10.0, 1, 0, tight=False, memory=memory)
        assert optimal
        assert evaluate(problem, state.original()).cost == brute_force(problem).cost
    assert sides == {-1, 0, 1}


@pytest.mark.parametrize("path", PATHS)
def test_memory_forces_the_costlier_strategy(path):
    # A [0,10) and B [5,15) overlap on 5..9, B and C [12,20) on 12..14; limit 10; cheap = usage 8, dear = 2.
    # Two cheap neighbours use 16 > 10, so: B dear (1 + 10 + 1 = 12) or A and C dear (10 + 1 + 100 = 111).
    data = instance([[0, 10], [5, 15], [12, 20]], [[1, 10], [1, 10], [1, 100]], [[8, 2], [8, 2], [8, 2]],
                    limit=10)
    problem = parse_problem(data)
    assert evaluate(problem, [0, 0, 0]).first_violation == 5
    assert brute_force(problem) == Best(12, (0, 1, 0))
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=30, **PATHS[path]))
    assert result.strategies == (0, 1, 0)
    assert (result.evaluation.cost, result.evaluation.peak, result.evaluation.feasible) == (12, 10, True)


def test_no_feasible_solution():
    data = example_data()
    data["problem"]["usage_limit"] = 49  # every node at its least usage: 10 + 25 + 15 = 50 at step 50
    problem = parse_problem(data)
    assert brute_force(problem) is None
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=10))
    assert result.evaluation.feasible is False
    assert result.evaluation.first_violation == 50
    assert "no feasible solution exists" in result.message


@pytest.mark.parametrize("path", PATHS)
def test_fixed_node_after_the_neighbourhood_does_not_shrink_its_room(path):
    # A, B live at step 0 (usage 5 or 0 each), F (one strategy) at step 1 with usage 10; limit 10.
    # A and B both at 0 cost 0 (usage 10 at step 0: fits); a mismatch costs 1000, both at 1 cost 50.
    # Greedy cannot move one node alone (1000 > 50); only a joint move finds the optimum.
    data = instance([[0, 1], [0, 1], [1, 2]], [[0, 0], [0, 0], [0]], [[5, 0], [5, 0], [10]],
                    [[0, 1]], [[0, 1000, 1000, 50]], limit=10)
    problem = parse_problem(data)
    assert brute_force(problem) == Best(0, (0, 0, 0))
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=20, **PATHS[path]))
    assert result.evaluation.cost == 0


def hub_instance(spokes: int = 200) -> dict:
    """A hub (strategy 0 costs 10,000, strategy 1 nothing) with `spokes` neighbours, every edge 0 when both
    ends agree and 100 when not, memory far from binding. Least usage puts everyone at 0 (cost 10,000); moving
    the hub with k spokes saves 10,000 - 100 * (spokes - k): an improvement only with more than half of
    them, the optimum (0) with all of them. A chain of small moves never gets there."""
    n = spokes + 1
    return instance([[0, 1]] * n, [[10_000, 0]] + [[0, 0]] * spokes, [[1, 2]] * n,
                    [[0, v] for v in range(1, n)], [[0, 100, 100, 0]] * spokes, limit=10**6, name="hub")


class _FirstChoice:
    """A stand-in random source: the first kind of neighbourhood (an expensive seed), the first seed."""

    def random(self) -> float:
        return 0.0

    def choice(self, items):
        return items[0]

    def shuffle(self, items) -> None:
        pass


def test_an_expensive_seed_brings_its_whole_star():
    problem = parse_problem(hub_instance(spokes=200))
    state = _start(problem, presolve(problem))
    free = list(range(problem.num_nodes))
    hot = _hot_nodes(state, free, set())
    assert hot == ([0] + list(range(1, 16)), 0)  # the hub first (its 10,000), then spokes in node order
    nodes, seed = _neighbourhood(state, _FirstChoice(), 20, free, hot)
    assert seed == 0
    assert sorted(nodes) == free  # all 201 nodes, 402 strategies, though the budget is 20
    assert _hot_nodes(state, free, {0}) == (list(range(1, 17)), 0)  # a tried seed is skipped
    nodes, seed = _neighbourhood(state, _FirstChoice(), 20, free, _hot_nodes(state, free, {0}))
    assert seed == 1 and sorted(nodes) == free  # a spoke's star: itself, the hub and the hub's neighbours


def test_star_moves_a_hub_with_all_its_neighbours():
    # With a budget of 20 strategies that grows by 1.3x a round, 8 budget-bound neighbourhoods hold at most
    # 163 strategies (81 spokes): none improves. A star seeded at the hub holds them all.
    problem = parse_problem(hub_instance(spokes=200))
    assert evaluate(problem, [0] * 201).cost == 10_000 and evaluate(problem, [1] * 201).cost == 0
    result = solve(problem, SolveOptions(time_limit_s=10, max_rounds=8, budget=20, whole_model_limit=0))
    assert result.greedy_cost == 10_000  # no single node can move
    assert result.evaluation.cost == 0


def test_sweep_levels_follow_arrivals_and_departures():
    # Three nodes live in segments [0, 2), [1, 3), [2, 3) with usage terms 4, 5, 6 when their literal is set;
    # caps per segment 9, 9, 10: a and b together fit in segment 1 (9), b and c in segment 2 do not (11).
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    a, b, c = (model.new_bool_var(name) for name in "abc")
    _sweep_constraints(model, [[(a, 4)], [(b, 5)], [(c, 6)]], np.array([0, 1, 2]), np.array([2, 3, 3]),
                       np.array([9, 9, 10]))
    model.maximize(a + b + c)
    solver = cp_model.CpSolver()
    assert solver.solve(model) == cp_model.OPTIMAL
    assert solver.objective_value == 2 and not (solver.boolean_value(b) and solver.boolean_value(c))
    model.add(b == 1)
    model.add(c == 1)
    assert solver.solve(model) == cp_model.INFEASIBLE
    empty = cp_model.CpModel()  # a segment whose room is already negative: no assignment fits
    _sweep_constraints(empty, [[(empty.new_bool_var("d"), 1)]], np.array([0]), np.array([1]), np.array([-1]))
    assert solver.solve(empty) == cp_model.INFEASIBLE


def test_whole_model_when_small_or_made_of_small_tables():
    problem = parse_problem(hub_instance(spokes=10))  # 11 nodes x 2 strategies, 10 edges of 4 pairs: 62 literals
    red = presolve(problem)
    free = list(range(problem.num_nodes))
    assert [_whole_model(red, free, limit) for limit in (62, 61, 16, 15)] == ["tight", "rows", "rows", None]


def test_self_edge_takes_its_diagonal():
    # Not in the contest data (every edge has two ends) but accepted: node 1's self-edge costs its diagonal
    # [[5, 7], [9, 10**18]], so strategy 1 (cost 0, usage 1) is forbidden and node 1 pays 2 + 5 at strategy 0.
    data = instance([[0, 2], [0, 2]], [[4, 1], [2, 0]], [[1, 3], [2, 1]], [[1, 1], [0, 1]],
                    [[5, 7, 9, INFINITE], [0, 6, 6, 0]], limit=5)
    problem = parse_problem(data)
    assert evaluate(problem, [0, 0]).cost == 4 + 2 + 5 + 0
    assert evaluate(problem, [1, 1]).forbidden == 1
    assert brute_force(problem) == Best(11, (0, 0))  # (1, 0): usage 3 + 2 = 5 fits, cost 1 + 2 + 5 + 6 = 14
    result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=20))
    assert (result.strategies, result.evaluation.cost) == ((0, 0), 11)


# ------------------------------------------------------------------ 3. presolve


def test_presolve_drops_a_dominated_strategy_only():
    # Node 1: s2 (cost 4 >= 3, usage 6 >= 6, every edge entry >= s0's) is dominated by s0; s3 is dearer and
    # bigger than s0 but cheaper on one edge entry (9 < 10), so it stays. Nodes 0 and 2 trade cost for usage.
    data = instance([[0, 4], [2, 6], [3, 8]],
                    [[5, 9], [3, 7, 4, 6], [2, 8]],
                    [[8, 2], [6, 1, 6, 7], [9, 3]],
                    [[0, 1], [1, 2]],
                    [[10, 15, 12, 9,
                      20, 5, 20, 30],
                     [4, 6, 7, 1, 4, 7, 5, 8]])
    red = presolve(parse_problem(data))
    assert [k.tolist() for k in red.kept] == [[0, 1], [0, 1, 3], [0, 1]]
    assert red.stats["dominated"] == 1
    assert red.edges[(0, 1)].tolist() == [[10, 15, 9], [20, 5, 30]]


def test_presolve_keeps_the_first_of_identical_strategies():
    data = instance([[0, 2], [0, 2]], [[3, 1, 3], [1, 2]], [[1, 5, 1], [2, 1]], [[0, 1]], [[1, 2, 7, 7, 1, 2]])
    red = presolve(parse_problem(data))
    assert red.kept[0].tolist() == [0, 1]


def test_presolve_all_forbidden_node():
    data = instance([[0, 2]] * 3, [[1, 2], [INFINITE, INFINITE], [3]], [[1, 1], [1, 1], [1]])
    with pytest.raises(IopddlError, match="node 1 has only forbidden strategies"):
        presolve(parse_problem(data))
    with pytest.raises(IopddlError, match="node 1 has only forbidden strategies"):
        solve(parse_problem(data), SolveOptions(time_limit_s=5, max_rounds=5))


def test_presolve_node_incompatible_with_its_fixed_neighbour():
    # node 0 has one strategy, and node 1 (two undominated ones) is forbidden with it either way
    data = instance([[0, 2]] * 2, [[1], [1, 2]], [[1], [2, 1]], [[0, 1]], [[INFINITE, INFINITE]])
    with pytest.raises(IopddlError, match="node 1 has no strategy compatible with its fixed neighbours"):
        presolve(parse_problem(data))


def test_presolve_merges_parallel_edges():
    # No strategy can dominate another: cost goes up exactly when usage goes down.
    m1 = [[INFINITE, 1], [2, 3], [4, 5]]  # (0, 1): rows are node 0's 3 strategies
    m2 = [[10, 20, 30], [40, 50, 60]]  # (1, 0): rows are node 1's 2 strategies
    m3 = [[INFINITE, 100], [200, 300], [400, 500]]  # (0, 1) again
    data = instance([[0, 3], [1, 4]], [[1, 2, 3], [1, 2]], [[3, 2, 1], [2, 1]], [[0, 1], [1, 0], [0, 1]],
                    [sum(m, []) for m in (m1, m2, m3)])
    problem = parse_problem(data)
    red = presolve(problem)
    assert list(red.edges) == [(0, 1)]
    expected = np.array(m1, dtype=object) + np.array(m2, dtype=object).T + np.array(m3, dtype=object)
    expected[0, 0] = INFINITE  # forbidden stays forbidden (10**18 exactly), not 2 * 10**18 + 10
    assert red.edges[(0, 1)].tolist() == expected.tolist()
    assert [k.tolist() for k in red.kept] == [[0, 1, 2], [0, 1]]
    best = brute_force(problem)
    assert solve(problem, SolveOptions(time_limit_s=5, max_rounds=20)).evaluation.cost == best.cost


# ------------------------------------------------------------------ 4. malformed instances


def _mutate(path: tuple, value) -> dict:
    data = example_data()
    obj = data
    for key in path[:-1]:
        obj = obj[key]
    if value is _DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("path, value, message", [
    (("problem",), _DELETE, "x.json: missing key 'problem'"),
    (("problem", "nodes", "usages"), _DELETE, "x.json: problem.nodes: missing key 'usages'"),
    (("problem", "edges"), _DELETE, "x.json: problem: missing key 'edges'"),
    (("problem", "nodes", "costs"), {"a": 1}, "x.json: problem.nodes.costs: expected a list, got dict"),
    (("problem", "nodes", "usages", 2), [15, 20], "node 2 has 3 costs and 2 usages"),
    (("problem", "nodes", "costs", 1), [], "node 1 has 0 costs and 2 usages"),
    (("problem", "nodes", "usages"), [[10]], "intervals, costs and usages have different lengths (5, 5, 1)"),
    (("problem", "nodes", "usages", 3), [10, -4], "problem.nodes.usages[3]: negative usage -4"),
    (("problem", "nodes", "costs", 2), [25, 4.5, 35], "problem.nodes.costs[2]: expected a list of integers"),
    (("problem", "nodes", "costs", 0), [2**63], "problem.nodes.costs[0]: a value does not fit in 64 bits"),
    (("problem", "edges", "nodes", 4), [3, 5], "problem.edges.nodes[4]: [3, 5] names a node outside 0..4"),
    (("problem", "edges", "nodes", 0), [-1, 1], "problem.edges.nodes[0]: [-1, 1] names a node outside 0..4"),
    (("problem", "edges", "nodes", 1), [0, 2, 3], "problem.edges.nodes: each edge is a pair [u, v]"),
    (("problem", "edges", "costs", 2), [90, 10, 20],
     "problem.edges.costs[2]: 3 costs for nodes 1 and 3 with 2 x 2 strategies"),
    (("problem", "edges", "costs"), [[30, 40]], "problem.edges: 5 node pairs but 1 cost lists"),
    (("problem", "nodes", "intervals", 1), [70, 40], "problem.nodes.intervals[1]: [70, 40] is not 0 <= start <= end"),
    (("problem", "nodes", "intervals", 0), [30], "problem.nodes.intervals: each interval is a pair [start, end]"),
    (("problem", "usage_limit"), 50.5, "problem.usage_limit: expected a non-negative integer, got 50.5"),
    (("problem", "usage_limit"), "50", "problem.usage_limit: expected a non-negative integer, got '50'"),
    (("problem", "usage_limit"), -1, "problem.usage_limit: expected a non-negative integer, got -1"),
    (("problem", "usage_limit"), _DELETE, "problem.usage_limit: expected a non-negative integer, got None"),
])
def test_malformed_instance(path, value, message):
    with pytest.raises(IopddlError) as info:
        parse_problem(_mutate(path, value), "x.json")
    assert message in str(info.value)


def test_boolean_usage_limit_is_rejected():
    with pytest.raises(IopddlError, match="usage_limit"):
        parse_problem(_mutate(("problem", "usage_limit"), True), "x.json")


def test_not_json_files(tmp_path):
    plain = tmp_path / "bad.json"
    plain.write_text('{"problem": {')
    packed = tmp_path / "bad.json.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("not json at all")
    not_gzip = tmp_path / "plain.json.gz"
    not_gzip.write_text(EXAMPLE.read_text())
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(gzip.compress(EXAMPLE.read_bytes())[:200])
    for path in (plain, packed, not_gzip, truncated):
        with pytest.raises(IopddlError, match="not a JSON instance") as info:
            read_problem(path)
        assert str(info.value).startswith(f"{path}: ")


def test_gzipped_instance_reads_like_the_plain_one(tmp_path):
    packed = tmp_path / "example.json.gz"
    packed.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    a, b = read_problem(packed), read_problem(EXAMPLE)
    assert evaluate(a, [0, 0, 2, 1, 0]) == evaluate(b, [0, 0, 2, 1, 0])
    assert [c.tolist() for c in a.edge_costs] == [c.tolist() for c in b.edge_costs]


def test_corrupt_gzip_is_an_input_error(tmp_path):
    raw = gzip.compress(EXAMPLE.read_bytes())
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(raw[:10] + bytes(b ^ 0xFF for b in raw[10:40]) + raw[40:])
    with pytest.raises(IopddlError, match="corrupt.json.gz"):
        read_problem(corrupt)


# ------------------------------------------------------------------ 5. solutions


def test_read_solution_shapes(tmp_path):
    listed = tmp_path / "a.json"
    listed.write_text("[0, 0, 2, 1, 0]")
    wrapped = tmp_path / "b.json"
    wrapped.write_text('{"instance": "example", "cost": 445, "strategies": [0, 1, 2, 0, 0]}')
    assert read_solution(listed) == [0, 0, 2, 1, 0]
    assert read_solution(wrapped) == [0, 1, 2, 0, 0]


@pytest.mark.parametrize("text, message", [
    ('{"solution": [0, 0]}', "expected a list of strategy indices"),
    ('"0 0 2 1 0"', "expected a list of strategy indices"),
    ("[0, 1.0, 2]", "expected a list of strategy indices"),
    ("[0, true, 2]", "expected a list of strategy indices"),
    ('{"strategies": 3}', "expected a list of strategy indices"),
    ("[0, 0,", "not JSON"),
])
def test_read_solution_rejects(tmp_path, text, message):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(IopddlError, match=message) as info:
        read_solution(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("strategies, message", [
    ([0, 0, 2, 1], "a solution needs 5 strategies, got 4"),
    ([0, 0, 2, 1, 0, 0], "a solution needs 5 strategies, got 6"),
    ([0, 0, 3, 1, 0], "strategy 3 of node 2 is not one of 0..2"),
    ([0, 0, 2, 1, 1], "strategy 1 of node 4 is not one of 0..0"),
    ([0, -1, 2, 1, 0], "strategy -1 of node 1 is not one of 0..1"),
])
def test_evaluate_rejects_bad_solutions(strategies, message):
    with pytest.raises(IopddlError) as info:
        evaluate(read_problem(EXAMPLE), strategies)
    assert message in str(info.value)


# ------------------------------------------------------------------ 6. the CLI


def test_cli_solve_and_eval(capsys, tmp_path):
    out_file = tmp_path / "solution.json"
    code, out, err = shardplan(capsys, "iopddl", "solve", EXAMPLE, "--time-limit", "5", "--json", "--out", out_file)
    assert code == 0, err
    report = json.loads(out)
    assert report["cost"] == brute_force(read_problem(EXAMPLE)).cost == EXAMPLE_OPTIMUM
    assert report["feasible"] is True
    assert report["strategies"] == [0, 0, 2, 1, 0]
    assert report["lp_cost"] == EXAMPLE_OPTIMUM  # a whole model: its LP's rounding is already the optimum
    assert (report["nodes"], report["edges"], report["usage_limit"], report["peak_usage"]) == (5, 5, 50, 50)
    written = json.loads(out_file.read_text())
    assert written == {"instance": "example", "cost": EXAMPLE_OPTIMUM, "strategies": [0, 0, 2, 1, 0]}
    code, out, err = shardplan(capsys, "iopddl", "eval", EXAMPLE, out_file, "--json")
    assert code == 0, err
    assert json.loads(out) == {"instance": "example", "cost": EXAMPLE_OPTIMUM, "peak_usage": 50, "feasible": True,
                               "forbidden_choices": 0, "first_violated_step": None}


def test_cli_solve_text(capsys):
    code, out, _ = shardplan(capsys, "iopddl", "solve", EXAMPLE, "--time-limit", "5", "--max-rounds", "30")
    assert code == 0
    lines = out.splitlines()
    assert "cost 445, peak usage 50 of 50" in lines[1] and "LP rounding 445" in lines[1]
    assert lines[-1] == "0 0 2 1 0"


def test_cli_eval_infeasible(capsys, tmp_path):
    solution = tmp_path / "s.json"
    solution.write_text("[0, 1, 1, 1, 0]")
    code, out, _ = shardplan(capsys, "iopddl", "eval", EXAMPLE, solution)
    assert code == 1
    assert "INFEASIBLE" in out and "cost 505" in out and "peak usage 55 of 50" in out
    assert "usage over the limit first at step 50" in out
    code, out, _ = shardplan(capsys, "iopddl", "eval", EXAMPLE, solution, "--json")
    assert code == 1
    assert json.loads(out)["first_violated_step"] == 50


def test_cli_solve_infeasible_instance(capsys, tmp_path):
    data = example_data()
    data["problem"]["usage_limit"] = 49
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(data))
    code, out, _ = shardplan(capsys, "iopddl", "solve", path, "--time-limit", "5", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["feasible"] is False and "no feasible solution exists" in report["message"]


@pytest.mark.parametrize("verb", ["solve", "eval"])
def test_cli_malformed_instance(capsys, tmp_path, verb):
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(_mutate(("problem", "nodes", "usages", 3), [10, -4])))
    solution = tmp_path / "s.json"
    solution.write_text("[0, 0, 0, 0, 0]")
    argv = ["iopddl", verb, bad] + ([solution] if verb == "eval" else ["--time-limit", "5"])
    code, out, err = shardplan(capsys, *argv)
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert str(bad) in lines[0] and "negative usage -4" in lines[0]


def test_cli_not_json_instance(capsys, tmp_path):
    bad = tmp_path / "garbage.json"
    bad.write_text("<html>")
    code, out, err = shardplan(capsys, "iopddl", "solve", bad, "--time-limit", "5")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and "not a JSON instance" in err


# ------------------------------------------------------------------ 7. determinism


@pytest.mark.parametrize("path", ["whole", "lns"])
def test_solve_is_reproducible_with_a_seed(path):
    data = synthetic(7, nodes=40, max_strategies=3, horizon=60, max_product=None)
    problem = parse_problem(data)
    least, most = extreme_peak(problem, np.argmin), extreme_peak(problem, np.argmax)
    data["problem"]["usage_limit"] = (least + most) // 2
    problem = parse_problem(data)
    # Time never binds (a generous cap per neighbourhood), so the search depends on the seed alone.
    options = SolveOptions(time_limit_s=60, workers=1, seed=3, max_rounds=30, budget=20, sub_time_s=20,
                           **PATHS[path])
    a, b = solve(problem, options), solve(problem, options)
    assert a.strategies == b.strategies
    assert (a.evaluation, a.rounds, a.improvements) == (b.evaluation, b.rounds, b.improvements)
    assert a.evaluation.feasible
    assert a.evaluation.cost <= a.greedy_cost <= a.start_cost
    assert a.evaluation.cost < a.start_cost
    if path == "lns":
        assert a.rounds > 5 and a.improvements > 0  # many neighbourhoods, some of them improving
