"""toulbar2 in the IOPDDL solver (solver/iopddl/wcsp.py, penalty.py): the
cost network against brute force, memory imposed exactly at chosen steps,
the lazy exact search and the priced search against brute force, the
prices' rule, and the solver without pytoulbar2."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from test_iopddl import Best, binding_instance, brute_force, instance

from solver.iopddl import SolveOptions, evaluate, parse_problem, presolve, solve
from solver.iopddl.penalty import _adapt, _extra_usage, exact_search, penalty_search
from solver.iopddl.state import _start
from solver.iopddl.wcsp import available, fixed_profile, solve_many, solve_wcsp

pytestmark = pytest.mark.skipif(not available(), reason="pytoulbar2 is not installed (it has Linux wheels only)")


def reduced(problem):
    red = presolve(problem)
    state = _start(problem, red)
    return state, [v for v in range(problem.num_nodes) if red.free(v)]


def unconstrained_brute_force(problem) -> Best:
    """The cheapest assignment with no forbidden choice, memory ignored."""
    counts = [len(c) for c in problem.node_costs]
    best = None
    for s in itertools.product(*(range(k) for k in counts)):
        ev = evaluate(problem, s)
        if not ev.forbidden and (best is None or ev.cost < best.cost):
            best = Best(ev.cost, s)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_cost_network_is_the_problem_without_its_limit(seed):
    # Forbidden node and edge entries, parallel edges, fixed nodes folded: toulbar2 proves the brute-force optimum.
    problem = parse_problem(json.loads(binding_instance(seed)[0]))
    state, free = reduced(problem)
    found = solve_wcsp(state, free, backtracks=100_000)
    assert found.optimal
    cost = evaluate(problem, state.red.original(found.choice)).cost
    assert cost == unconstrained_brute_force(problem).cost
    assert not evaluate(problem, state.red.original(found.choice)).feasible  # the limit binds on these instances


def test_a_penalty_is_added_to_the_node_costs():
    # One free node, strategies cost 0 and 5: a penalty of 10 on the first makes the second the optimum.
    problem = parse_problem(instance([[0, 1], [0, 1]], [[0, 5], [0]], [[2, 1], [1]], [[0, 1]], [[0, 0]]))
    assert reduced(problem)[1] == [0]  # the dearer strategy uses less: neither dominates
    state, free = reduced(problem)
    assert solve_wcsp(state, free, backtracks=1000).choice[0] == 0
    assert solve_wcsp(state, free, penalty={0: np.array([10.0, 0.0])}, backtracks=1000).choice[0] == 1


def test_an_imposed_step_holds_exactly():
    # Three nodes live at step 2 (usages 4 or 1), limit 9, fixed node F live there too with usage 3: at most one of
    # the three may take its cheap, large strategy (4 + 1 + 1 + 3 = 9). Without the step all three would.
    data = instance([[0, 3], [1, 3], [2, 4], [2, 3]], [[0, 7], [0, 8], [0, 9], [0]], [[4, 1], [4, 1], [4, 1], [3]],
                    limit=9)
    problem = parse_problem(data)
    state, free = reduced(problem)
    assert free == [0, 1, 2]
    assert list(solve_wcsp(state, free, backtracks=1000).choice[:3]) == [0, 0, 0]
    found = solve_wcsp(state, free, steps=[2], fixed=fixed_profile(state, free), backtracks=1000)
    assert found.optimal
    assert list(found.choice[:3]) == [1, 1, 0]  # the dearest to give up (cost 9) keeps its cheap strategy
    assert brute_force(problem) == Best(15, (1, 1, 0, 0))


def test_fixed_profile_is_the_usage_outside_the_free_nodes():
    problem = parse_problem(json.loads(binding_instance(2)[0]))
    state, free = reduced(problem)
    fixed = fixed_profile(state, free)
    outside = np.array([state.original()[v] if v not in free else -1 for v in range(problem.num_nodes)])
    expected = np.zeros_like(state.profile)
    for v, s in enumerate(outside):
        if s >= 0:
            start, end = problem.intervals[v]
            expected[start:end] += problem.node_usages[v][s]
    assert (fixed == expected).all()


@pytest.mark.parametrize("seed", range(6))
def test_exact_search_reaches_the_brute_force_optimum(seed):
    problem = parse_problem(json.loads(binding_instance(seed)[0]))
    state, free = reduced(problem)
    best, stats = exact_search(state, free, float("inf"), random.Random(0), seconds=10, backtracks=100_000)
    ev = evaluate(problem, best.original())
    assert ev.feasible
    assert ev.cost == brute_force(problem).cost
    assert stats.steps >= 1  # the unconstrained answer overflowed: at least one step was imposed


@pytest.mark.parametrize("seed", range(6))
def test_priced_search_fits_and_never_costs_more_than_its_start(seed):
    problem = parse_problem(json.loads(binding_instance(seed)[0]))
    state, free = reduced(problem)
    start = evaluate(problem, state.original()).cost
    best, stats = penalty_search(state, free, float("inf"), random.Random(0), seconds=10, backtracks=10_000)
    ev = evaluate(problem, best.original())
    assert ev.feasible and ev.cost <= start
    assert stats.solves >= 2  # the unconstrained answer overflowed, so prices were set and solved with
    assert ev.cost >= brute_force(problem).cost


def test_prices_rise_with_the_square_of_the_overflow_and_fade_where_memory_fits():
    # Node 0 live at steps [0, 2), node 1 at [2, 4), node 2 at [1, 3); limit 10; profile 5, 30, 12, 8.
    problem = parse_problem(instance([[0, 2], [2, 4], [1, 3]], [[0, 1]] * 3, [[1, 0]] * 3, limit=10))
    red = presolve(problem)
    weight = {0: 1.0, 1: 1.0, 2: 1.0}
    _adapt(weight, [0, 1, 2], red, np.array([5, 30, 12, 8]), 10)
    assert weight == {0: 9.0, 1: 1.5, 2: 9.0}  # 3x over: 9; 1.2x over: 1.44, raised to at least 1.5
    _adapt(weight, [0, 1, 2], red, np.array([5, 5, 5, 5]), 10)
    assert weight == pytest.approx({0: 7.2, 1: 1.2, 2: 7.2})
    _adapt(weight, [0], red, np.array([100, 0, 0, 0]), 10)
    assert weight[0] == pytest.approx(7.2 * 16)  # 10x over: at most 16x at once


def test_extra_usage_is_the_largest_excess_over_the_least_at_any_segment():
    load = np.array([[4, 1], [2, 3], [2, 1]])  # three strategies, two segments
    assert _extra_usage(load).tolist() == [2, 2, 0]
    assert _extra_usage(np.zeros((3, 0), dtype=np.int64)).tolist() == [0, 0, 0]


def test_solve_with_toulbar2_proves_an_optimum_that_fits():
    # The exact search completes on a small instance: the driver reports the optimum as proven.
    problem = parse_problem(json.loads(binding_instance(4)[0]))
    result = solve(problem, SolveOptions(time_limit_s=10, whole_model_limit=0, wcsp_backtracks=100_000))
    assert result.evaluation.cost == brute_force(problem).cost
    assert result.message == "optimal"
    assert result.wcsp_cost == result.evaluation.cost
    assert result.stats["wcsp_solves"] >= 2 and result.stats["wcsp_steps"] >= 1


@pytest.mark.parametrize("exact_nodes", [0, 2000])
def test_toulbar2_phase_is_reproducible_with_backtracks(exact_nodes):
    problem = parse_problem(json.loads(binding_instance(5)[0]))
    options = SolveOptions(time_limit_s=30, whole_model_limit=0, max_rounds=10, wcsp_backtracks=5_000,
                           wcsp_exact_nodes=exact_nodes, seed=2)
    a, b = solve(problem, options), solve(problem, options)
    assert a.strategies == b.strategies and a.wcsp_cost == b.wcsp_cost
    assert a.stats["wcsp_solves"] == b.stats["wcsp_solves"]


def test_without_pytoulbar2_the_neighbourhoods_do_it_alone(monkeypatch):
    import solver.iopddl.driver as driver

    monkeypatch.setattr(driver, "wcsp_available", lambda: False)
    problem = parse_problem(json.loads(binding_instance(1)[0]))
    result = solve(problem, SolveOptions(time_limit_s=5, whole_model_limit=0, max_rounds=60))
    assert result.wcsp_cost is None and "wcsp_solves" not in result.stats
    assert result.evaluation.cost == brute_force(problem).cost


def test_bad_wcsp_options_are_refused():
    with pytest.raises(ValueError, match="wcsp must be"):
        SolveOptions(wcsp="on")
    with pytest.raises(ValueError, match="wcsp_share"):
        SolveOptions(wcsp_share=1.5)


def test_forked_solves_answer_like_sequential_ones():
    # solve_many runs each request in a forked child; bounded by backtracks, each answer is the sequential one.
    problem = parse_problem(json.loads(binding_instance(3)[0]))
    state, free = reduced(problem)
    requests = [{"backtracks": 2_000, "seed": 1}, {"backtracks": 2_000, "seed": 2, "steps": [int(np.argmax(
        state.profile))]}, {"backtracks": 2_000, "penalty": {v: np.arange(len(state.red.kept[v]), dtype=float)
                                                             for v in free}}]
    forked, alone = solve_many(state, free, requests, workers=2), solve_many(state, free, requests, workers=1)
    assert [a.choice.tolist() for a in forked] == [a.choice.tolist() for a in alone]
    assert [a.optimal for a in forked] == [a.optimal for a in alone]


@pytest.mark.parametrize("search", [exact_search, penalty_search])
def test_two_workers_search_side_by_side(search):
    problem = parse_problem(json.loads(binding_instance(0)[0]))
    state, free = reduced(problem)
    best, stats = search(state, free, float("inf"), random.Random(0), seconds=10, backtracks=10_000, workers=2)
    ev = evaluate(problem, best.original())
    assert ev.feasible and ev.cost >= brute_force(problem).cost
    # exact: two seeds every round; prices: one unpriced answer, then the prices and twice them every round
    assert stats.solves % 2 == (0 if search is exact_search else 1)
    if search is exact_search:
        assert ev.cost == brute_force(problem).cost
