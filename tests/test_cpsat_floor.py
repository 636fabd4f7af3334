"""CP-SAT with a floor (`CpSatOptions.floor_s`): the planner answers the
expert floor's plan unless a searched one is faster, so CP-SAT proves, where
it can, that no plan of its space is, and stops
(deepseek_v3_moe, whose expert parallelism is outside the space: 57 s of
CP-SAT to a plan slower than the expert's; now 1.5 s prove it)."""

from __future__ import annotations

import dataclasses

import pytest
from test_cpsat import MEMORY_CASE, ZERO_CASES, _all_priced, setup, slow_hardware
from test_floor import HP4

import solver.search.cpsat as cpsat
from solver.planning.planner import plan_spec, prepare
from solver.planning.spec import parse_spec
from solver.search.cpsat import CpSatOptions, solve
from solver.search.cpsat_model import CpSatModel


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
    # without `CpSatModel._floor_units`' allowance for it), and above it.
    for floor_s in (optimum, optimum * 1.5):
        result = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s))
        assert result.report.status == "optimal", floor_s
        assert result.cost.step_time_s == pytest.approx(optimum, rel=1e-12)


@pytest.mark.parametrize("below", [2e-3, 0.5])
def test_a_floor_no_plan_beats_is_proven_and_said(priced_space, below):
    space, table, fitting = priced_space
    floor_s = fitting[0][1].step_time_s * (1 - below)  # below the optimum by more than the model's rounding
    # Without a hint, or with one slower than the floor, a copy of the model bounded by it is infeasible:
    # no solve runs.
    alone = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s))
    assert alone.plan is None and alone.report.status == "floor" and alone.report.rounds == 0
    assert alone.report.bound_s == floor_s
    assert "no plan of the space that fits is faster than" in alone.report.message
    point, cost = fitting[len(fitting) // 2]
    hinted = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s), hint=point)
    assert hinted.report.status == "floor" and hinted.report.rounds == 0
    assert hinted.cost.step_time_s == cost.step_time_s and hinted.report.bound_s == pytest.approx(floor_s)
    assert hinted.report.message.endswith(f"the hint's step time {cost.step_time_s:.6g} s")


def test_a_solve_stops_where_its_bound_passes_the_floor(priced_space, monkeypatch):
    """Where the bounded copy proves nothing in its share of the time, the
    solve stops once its own bound passes the floor."""
    space, table, fitting = priced_space
    floor_s = fitting[0][1].step_time_s * 0.9
    monkeypatch.setattr(CpSatModel, "beats_floor", lambda self, seconds, options: True)
    result = solve(space, table, CpSatOptions(time_limit_s=60, floor_s=floor_s))
    assert result.report.status == "floor" and result.report.rounds == 1 and result.report.bound_s >= floor_s
    assert result.plan is None or result.cost.step_time_s >= floor_s
    assert "proven in 1 solves" in result.report.message


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


def test_after_a_proof_no_program_that_recomputes_more_is_searched(monkeypatch):
    """The remat search (tests/test_remat.py's program, 2.5 MB: only a
    rematerialized program fits) after CP-SAT proves, on every other layer
    recomputed, that no plan beats the floor (the proof taken as given
    here): every layer recomputed only adds compute, so it is not searched,
    and the answer is the floor's plan, with the search's report."""
    from test_remat import FALLBACK

    text = FALLBACK.replace("MEMORY", "2.5MB") + """schedules:
  BP:
    tactics:
      - {manual: {axis: x, values: {batch.tokens: 0}}}
  BP+R:
    tactics:
      - {manual: {axis: x, values: {batch.tokens: 0}}}
      - remat: {values: ["layers.*"]}
"""
    searched = []
    real = cpsat.solve

    def solve_shaped(space, table, options, hint=None, progress=None):
        searched.append(len(space.nda.function.ops))
        result = real(space, table, options, hint, progress)  # memory taken as shaping its plan
        return dataclasses.replace(result, report=dataclasses.replace(result.report, memory_cuts=1))

    monkeypatch.setattr(cpsat, "solve", solve_shaped)
    spec = parse_spec(text, "fallback.yaml")
    free = plan_spec(spec, "cpsat")
    # BP does not fit: the program as written is not searched, both rematerialized ones are.
    assert len(searched) == 2 and free.floor.best.schedule == "BP+R" and not free.floor_kept
    searched.clear()

    def solve_proven(space, table, options, hint=None, progress=None):
        searched.append(len(space.nda.function.ops))
        report = dataclasses.replace(real(space, table, options, hint, progress).report, status="floor")
        return cpsat.AutoResult(None, None, None, report)

    monkeypatch.setattr(cpsat, "solve", solve_proven)
    proven = plan_spec(spec, "cpsat")
    assert len(searched) == 1 and proven.floor_kept and proven.schedule == "BP+R"
    assert [r.status for r in proven.search] == ["floor"]
