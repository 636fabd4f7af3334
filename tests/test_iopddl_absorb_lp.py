"""IOPDDL: absorbing the nodes a neighbour determines, and the LP relaxation
with its roundings (split from test_iopddl.py; the instances and the brute
force they are checked against are its)."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
from test_iopddl import PATHS, binding_instance, brute_force, instance

from solver.iopddl import (
    INFINITE,
    SolveOptions,
    _combined_load,
    _greedy_sweeps,
    _implied_segments,
    _lp_roundings,
    _lp_start,
    _merge_determined,
    _merged_state,
    _repair_memory,
    _round_along_edges,
    _start,
    _State,
    _subsolve,
    evaluate,
    parse_problem,
    presolve,
    solve,
    usage_profile,
)

# ------------------------------------------------------------------ 2b. nodes that a neighbour determines


def merged_cost_and_profile(problem, red, choice) -> tuple[int, np.ndarray]:
    """Cost and usage profile of `choice` read off the merged problem alone (costs, edges, loads)."""
    cost = sum(int(red.cost[v][c]) for v, c in enumerate(choice))
    cost += sum(int(m[choice[u], choice[v]]) for (u, v), m in red.edges.items())
    profile = np.zeros(problem.horizon, dtype=np.int64)
    for v, c in enumerate(choice):
        b = red.bounds[v]
        for k in range(len(b) - 1):
            profile[b[k]:b[k + 1]] += red.load[v][c, k]
    return cost, profile


DETERMINED_SEEDS = (0, 1, 4, 5)  # instances where 2 to 4 nodes are absorbed and 2 to 4 stay free


@pytest.mark.parametrize("seed", DETERMINED_SEEDS)
def test_merging_determined_nodes_is_exact(seed):
    # Every assignment of the merged problem costs and uses what its expansion does in the original, and the
    # cheapest feasible one of them is the brute-force optimum of the original.
    problem = parse_problem(json.loads(binding_instance(seed, determined=0.5)[0]))
    red = _merge_determined(problem, presolve(problem))
    assert red.stats["merged"] >= 2 and red.stats["free_nodes"] >= 2
    best = None
    for choice in itertools.product(*(range(len(k)) for k in red.kept)):
        cost, profile = merged_cost_and_profile(problem, red, choice)
        original = red.original(np.array(choice))
        evaluation = evaluate(problem, original)
        assert np.array_equal(profile, usage_profile(problem, original))
        if cost < INFINITE:
            assert evaluation.cost == cost
            if evaluation.feasible and (best is None or cost < best):
                best = cost
        else:
            assert evaluation.forbidden
    assert best == brute_force(problem).cost


def test_combined_load_joins_equal_segments_and_keeps_gaps():
    # Node 0 (the one that absorbed) at [0, 2), node 1 at [2, 4) with the same usage, node 2 at [6, 8) taking
    # strategy 1 when node 0 takes 0 and 0 when it takes 1.
    problem = parse_problem(instance([[0, 2], [2, 4], [6, 8]], [[0, 0]] * 3, [[1, 2], [1, 2], [5, 0]]))
    bounds, load = _combined_load(problem, [(0, np.array([0, 1])), (1, np.array([0, 1])), (2, np.array([1, 0]))])
    assert bounds.tolist() == [0, 4, 6, 8]
    assert load.tolist() == [[1, 0, 0], [2, 0, 5]]


@pytest.mark.parametrize("tight", [True, False], ids=["tight", "rows"])
@pytest.mark.parametrize("memory", ["sums", "sweep"])
def test_whole_model_of_the_absorbed_problem_proves_the_optimum(tight, memory):
    for seed in DETERMINED_SEEDS:
        problem = parse_problem(json.loads(binding_instance(seed, determined=0.5)[0]))
        state = _start(problem, presolve(problem))
        _greedy_sweeps(state, list(range(problem.num_nodes)), random.Random(0), math.inf, math.inf)
        state = _merged_state(problem, state)  # what `solve` does (it repairs forbidden choices first)
        free = [v for v in range(problem.num_nodes) if state.red.free(v)]
        assert state.red.stats["merged"] >= 2
        improved, optimal = _subsolve(state, free, 10.0, 1, 0, tight=tight, memory=memory)
        assert optimal
        assert evaluate(problem, state.original()).cost == brute_force(problem).cost


def implied(owner, usages, first, stop, capacity) -> list[bool]:
    usages = [np.array(u) for u in usages]
    return _implied_segments(owner, usages, np.array([u.min() for u in usages]), np.array(first), np.array(stop),
                             np.array(capacity)).tolist()


def test_implied_segments():
    # Node 0's load over segments 0, 1, 2 grows from [1, 2] to [3, 4] and shrinks to [2, 2]: only the top binds.
    assert implied([0, 0, 0], [[1, 2], [3, 4], [2, 2]], [0, 1, 2], [1, 2, 3], [10, 10, 10]) == [True, False, True]
    # Not when the top has more capacity than its neighbours, nor when one node grows while another shrinks.
    assert implied([0, 0, 0], [[1, 2], [3, 4], [2, 2]], [0, 1, 2], [1, 2, 3], [10, 11, 10]) == [False] * 3
    assert implied([0, 0, 1, 1], [[1, 2], [3, 4], [5, 5], [4, 4]], [0, 1, 0, 1], [1, 2, 1, 2],
                   [10, 10]) == [False, False]
    # A node arriving anew at segment 1 uses at least 5 there: segment 0 follows while segment 1 has at most
    # 5 more capacity.
    assert implied([0, 1], [[1, 2], [5, 6]], [0, 1], [2, 2], [10, 14]) == [True, False]
    assert implied([0, 1], [[1, 2], [5, 6]], [0, 1], [2, 2], [10, 16]) == [False, False]
    # Equal neighbours imply each other; one of them stays.
    assert implied([0, 0], [[1, 1], [1, 1]], [0, 1], [1, 2], [10, 10]) == [True, False]


@pytest.mark.parametrize("path", ["lns", "lns-sweep"])  # small enough for one tight model: nothing absorbed
def test_solver_matches_brute_force_with_determined_nodes(path):
    for seed in DETERMINED_SEEDS:
        problem = parse_problem(json.loads(binding_instance(seed, determined=0.5)[0]))
        result = solve(problem, SolveOptions(time_limit_s=5, max_rounds=60, **PATHS[path]))
        assert result.stats["merged"] >= 2
        assert result.evaluation.feasible and result.evaluation.cost == brute_force(problem).cost


# ------------------------------------------------------------------ 2c. the LP relaxation


def tree_instance(seed: int, nodes: int = 7) -> dict:
    """A random tree (each node hangs off an earlier one), 2 to 3 strategies a node, one forbidden pair."""
    rng = np.random.default_rng(seed)
    counts = [int(k) for k in rng.integers(2, 4, size=nodes)]
    pairs = [[int(rng.integers(v)), v] for v in range(1, nodes)]
    edge_costs = [rng.integers(0, 60, size=counts[u] * counts[v]).tolist() for u, v in pairs]
    edge_costs[0][0] = INFINITE
    return instance([[0, 4]] * nodes, [rng.integers(0, 100, size=k).tolist() for k in counts],
                    [[1] * k for k in counts], pairs, edge_costs, limit=10**6, name=f"tree-{seed}")


@pytest.mark.parametrize("seed", range(4))
def test_lp_rounding_is_the_optimum_on_a_tree(seed):
    # The local polytope is integral on a tree: with memory not binding, the rounding is the brute-force optimum.
    problem = parse_problem(tree_instance(seed))
    state = _start(problem, presolve(problem))
    free = [v for v in range(problem.num_nodes) if state.red.free(v)]
    roundings = _lp_roundings(state, free, math.inf)
    assert len(roundings) == 2
    for rounded in roundings:
        choice = state.choice.copy()
        choice[free] = rounded
        assert evaluate(problem, state.red.original(choice)).cost == brute_force(problem).cost


def test_rounding_along_edges_keeps_a_mixture_consistent():
    # Nodes 0 and 1, two strategies each, the edge allowing only (0, 1) and (1, 0): an LP solution half one and
    # half the other rounds node by node to (0, 0), forbidden; along the edge it follows node 0's choice.
    problem = parse_problem(instance([[0, 1]] * 2, [[0, 0]] * 2, [[1, 1]] * 2, [[0, 1]],
                                     [[INFINITE, 0, 0, INFINITE]], limit=10))
    red = presolve(problem)
    values = {0: np.array([0.5, 0.5]), 1: np.array([0.5, 0.5])}
    pair = {(0, 1): np.array([[0.0, 0.5], [0.5, 0.0]])}
    assert _round_along_edges(red, [0, 1], values, pair) == {0: 0, 1: 1}


def test_repair_memory_frees_the_cheapest_usage_first():
    # A [0,10), B [5,15), C [12,20), limit 10; strategy 0 uses 8, strategy 1 uses 2 and costs more: A 20, B 10,
    # C 100. All at strategy 0 overfill steps 5..9 (A, B) and 12..14 (B, C); B's change frees both for 9.
    problem = parse_problem(instance([[0, 10], [5, 15], [12, 20]], [[1, 20], [1, 10], [1, 100]],
                                     [[8, 2], [8, 2], [8, 2]], limit=10))
    red = presolve(problem)
    state = _State(problem, red, np.zeros(3, dtype=np.int64))
    assert _repair_memory(state, [0, 1, 2])
    assert state.choice.tolist() == [0, 1, 0]
    assert evaluate(problem, state.original()).feasible
    # Nothing frees enough when the limit is below the least usage.
    tight = parse_problem(instance([[0, 10], [5, 15]], [[1, 20], [1, 10]], [[8, 2], [8, 2]], limit=3))
    state = _State(tight, presolve(tight), np.zeros(2, dtype=np.int64))
    assert not _repair_memory(state, [0, 1])


@pytest.mark.parametrize("seed", range(6))
def test_lp_start_fits_memory_and_never_costs_more(seed):
    problem = parse_problem(json.loads(binding_instance(seed)[0]))
    state = _start(problem, presolve(problem))
    free = [v for v in range(problem.num_nodes) if state.red.free(v)]
    before = evaluate(problem, state.original()).cost
    assert _lp_roundings(state, free, math.inf)  # the LP is solved, memory rows and all
    after, lp_cost = _lp_start(state, free, math.inf, math.inf, random.Random(0))
    evaluation = evaluate(problem, after.original())
    assert evaluation.feasible and evaluation.cost <= before
    assert after is state or evaluation.cost == lp_cost < before
    assert lp_cost is None or lp_cost >= brute_force(problem).cost


