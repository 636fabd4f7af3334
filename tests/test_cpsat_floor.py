"""CP-SAT with a floor (`CpSatOptions.floor_s`): the planner answers the
expert floor's plan unless a searched one is faster, so the model keeps only
the plans that may be, and a search that finds none proves it and stops
(deepseek_v3_moe, whose expert parallelism is outside the space: 57 s of
CP-SAT to a plan slower than the expert's, 11 s with the floor)."""

from __future__ import annotations

import pytest
from test_cpsat import MEMORY_CASE, ZERO_CASES, _all_priced, setup, slow_hardware
from test_floor import HP4

import solver.search.cpsat as cpsat
from solver.planning.planner import plan_spec, prepare
from solver.planning.spec import parse_spec
from solver.search.cpsat import CpSatOptions, solve


@pytest.fixture(scope="module")
def priced_space():
    """The memory case's space and table, and its plans that fit by step time (a brute force)."""
    name, kwargs, mesh = MEMORY_CASE
    _, _, table, space = setup(name, kwargs, mesh, slow_hardware(mesh))
    fitting = sorted(((p, c) for p, c in _all_priced(space, table) if c.fits), key=lambda pc: pc[1].step_time_s)
    return space, table, fitting


@pytest.mark.parametrize("name,kwargs,mesh", ZERO_CASES, ids=["mlp", "deep-mlp", "mlp-2d"])
def test_a_floor_keeps_every_plan_that_may_beat_it(name, kwargs, mesh):
    _, _, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=True)
    optimum = solve(space, table, CpSatOptions(time_limit_s=60)).cost.step_time_s
    # At the optimum's own step time, a tie the model's rounding must not cut (on these three it would
    # without `_Cp.beat`'s allowance for it), and above it.
    for floor_s in (optimum, optimum * 1.5):
        result = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s))
        assert result.report.status == "optimal", floor_s
        assert result.cost.step_time_s == pytest.approx(optimum, rel=1e-12)


@pytest.mark.parametrize("below", [2e-3, 0.5])
def test_a_floor_no_plan_beats_is_proven_and_said(priced_space, below):
    space, table, fitting = priced_space
    floor_s = fitting[0][1].step_time_s * (1 - below)  # below the optimum by more than the model's rounding
    alone = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s))
    assert alone.report.status == "floor" and alone.report.bound_s >= floor_s
    assert "no plan of the space that fits is faster than" in alone.report.message
    # The solve stops where its bound passes the floor, with the best plan found so far if it has one.
    assert alone.plan is None or alone.cost.step_time_s >= floor_s
    # A hint that fits is still the search's answer where nothing it found is faster.
    point, cost = fitting[len(fitting) // 2]
    hinted = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s), hint=point)
    assert hinted.report.status == "floor" and hinted.report.bound_s >= floor_s * (1 - 1e-12)
    assert floor_s <= hinted.cost.step_time_s <= cost.step_time_s * (1 + 1e-12)
    assert "step time" in hinted.report.message.rsplit(";", 1)[1]


def test_the_planner_hands_the_expert_floor_to_cpsat(monkeypatch):
    seen = []
    real = cpsat.solve

    def solve_seen(space, table, options, hint=None, progress=None):
        seen.append(options.floor_s)
        return real(space, table, options, hint, progress)

    monkeypatch.setattr(cpsat, "solve", solve_seen)
    spec = parse_spec(HP4, "hp4.yaml")
    planned = plan_spec(spec, "cpsat", prepared=prepare(spec))
    # HP4 is a point of the space: the search reaches it (the tie the rounding keeps) and is answered.
    assert seen == [planned.floor.best.step_time_s] and not planned.floor_kept
    assert planned.assessment.cost.step_time_s <= planned.floor.best.step_time_s * (1 + 1e-9)
    seen.clear()
    plan_spec(spec, "cpsat", prepared=prepare(spec), floor=False)
    assert seen == [None]
