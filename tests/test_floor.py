"""The expert floor (solver.planning.floor): a search prices the spec's named
schedules first, starts from the fastest that fits, and never answers worse."""

import json

import pytest
from conftest import ROOT, shardplan

from solver.planning.floor import expert_floor, manual_schedules
from solver.planning.plan_json import plan_report
from solver.planning.plan_text import format_floor
from solver.planning.planner import plan_spec, prepare
from solver.planning.spec import load_spec, parse_spec
from solver.search.forked import forks

# Megatron on a deep MLP over both axes: even layers by column, odd ones by row (a period of two layers).
HP4 = """\
model: {builder: deep_mlp, args: {layers: 8, d_model: 4096, batch: 16, dtype: f16}, step: train, optimizer: sgd}
mesh: {batch: 2, model: 2}
hardware: V100-32GB
schedules:
  HP4:
    tactics:
      - {manual: {axis: model, values: {"layers.*[02468].w": 1}}}
      - {manual: {axis: batch, values: {"layers.*[02468].w": 1}}}
  DP:
    tactics:
      - {manual: {axis: batch, values: {x: 0}}}
      - {manual: {axis: model, values: {x: 0}}}
  SEARCHED:
    tactics:
      - {auto: {axes: [batch]}}
"""


def test_the_floor_prices_every_manual_schedule_as_planned():
    spec = parse_spec(HP4, "hp4.yaml")
    assert manual_schedules(spec) == ["HP4", "DP"]  # SEARCHED has an auto tactic: not an expert's plan
    prepared = prepare(spec)
    floor = expert_floor(spec, lambda remat: prepared)
    for expert in floor.experts:
        planned = plan_spec(spec, schedule=expert.schedule, prepared=prepared)
        assert expert.step_time_s == pytest.approx(planned.assessment.cost.step_time_s, rel=1e-9)
        assert expert.peak_memory_bytes == planned.assessment.cost.peak_memory_bytes
        assert expert.fits == planned.assessment.cost.fits
    assert floor.best.step_time_s == min(e.step_time_s for e in floor.experts if e.fits)


@pytest.mark.skipif(not forks(2, 2), reason="the platform does not fork")
def test_schedules_planned_beside_the_cost_table_price_the_same(monkeypatch):
    """With two jobs the schedules are planned, and their plans materialized,
    in a forked child while the table is made: the same floor, and the
    plans' shardings adopted here (a later `materialize` reads them, not
    makes them)."""
    from solver import plan

    # A schedule that cannot be planned (a layer the model lacks) is no floor, beside or not; the others are.
    bad = "  BAD:\n    tactics:\n      - {manual: {axis: model, values: {\"layers.99.w\": 1}}}\n"
    spec = parse_spec(HP4.replace("  DP:\n", bad + "  DP:\n"), "hp4.yaml")
    prepared = prepare(spec)
    one = expert_floor(spec, lambda remat: prepared)
    prepared = prepare(spec)  # a new program: nothing of it materialized yet
    two = expert_floor(spec, lambda remat: prepared, jobs=2)
    assert two == one
    assert [e.schedule for e in two.experts] == ["HP4", "BAD", "DP"]
    assert "layers.99.w" in two.experts[1].error and two.experts[1].step_time_s is None
    assert two.experts[0].fits and two.experts[2].fits
    monkeypatch.setattr(plan, "materialize", lambda *a, **k: pytest.fail("materialized again"))
    for expert in (two.experts[0], two.experts[2]):
        assert expert.plan.materialize(prepared.nda) is not None


@pytest.mark.parametrize("solver", ["cpsat", "mcts"])
def test_no_searched_plan_beats_the_expert_so_the_expert_is_kept(solver):
    # A pipelined spec: the search prices the whole step, the floor the pipelined schedule, where
    # hand-written PP+BP is faster than any plan of the whole step's search.
    spec = load_spec(ROOT / "specs" / "transformer_pipeline.yaml")
    prepared = prepare(spec)
    alone = plan_spec(spec, solver, prepared=prepared, floor=False)
    floored = plan_spec(spec, solver, prepared=prepared)
    best = floored.floor.best
    assert alone.assessment.cost.step_time_s > best.step_time_s and alone.floor is None
    # With the floor the answer is the expert's plan, priced as when it runs as written ...
    assert floored.floor_kept and floored.schedule == best.schedule
    assert floored.assessment.cost.step_time_s == pytest.approx(best.step_time_s, rel=1e-9)
    assert floored.searched_step_s == pytest.approx(alone.assessment.cost.step_time_s, rel=1e-9)
    assert floored.search  # ... the search ran, and its report is kept
    report = plan_report(floored, solver)
    assert report["expert_floor"]["kept"] and report["expert_floor"]["best"] == best.schedule
    assert "no searched plan was faster" in format_floor(report["expert_floor"], report["cost"]["step_time_s"])


@pytest.mark.parametrize("solver", ["cpsat", "mcts"])
def test_the_search_finds_megatron_on_a_deep_mlp_itself(solver):
    # HP4 alternates column and row sharding; the space holds it (a two-layer unit), so the search
    # needs no floor to match it.
    spec = parse_spec(HP4, "hp4.yaml")
    planned = plan_spec(spec, solver, prepared=prepare(spec))
    assert not planned.floor_kept and planned.floor.best.schedule == "HP4"
    assert planned.assessment.cost.step_time_s <= planned.floor.best.step_time_s * (1 + 1e-9)


def test_a_searched_plan_that_beats_the_floor_is_kept(capsys):
    spec = ROOT / "specs" / "deep_mlp_8192x16.yaml"
    code, out, _ = shardplan(capsys, "plan", spec, "--solver", "cpsat", "--json", "--quiet")
    assert code == 0
    report = json.loads(out)
    floor = report["expert_floor"]
    assert not floor["kept"] and floor["best"] is not None
    assert report["cost"]["step_time_s"] <= floor["best_step_time_s"]
    assert {e["schedule"] for e in floor["schedules"]} == {"DP", "HP", "DP+HP"}
    code, text, _ = shardplan(capsys, "plan", spec, "--solver", "cpsat", "--quiet")
    assert f"expert floor: schedule {floor['best']} " in text and "faster" in text
    code, out, _ = shardplan(capsys, "plan", spec, "--solver", "cpsat", "--json", "--quiet", "--no-floor")
    assert json.loads(out)["expert_floor"] is None



def test_a_searched_plan_that_does_not_fit_never_beats_a_floor_that_does(monkeypatch):
    # Make every searched plan look faster than the floor but too big: the floor is the answer.
    import dataclasses

    import solver.planning.planner as planner

    real = planner._plan

    def too_big(spec, solver, *args, **kwargs):
        planned = real(spec, solver, *args, **kwargs)
        if solver == "none":
            return planned
        cost = dataclasses.replace(planned.assessment.cost, step_time_s=planned.assessment.cost.step_time_s / 100,
                                   peak_memory_bytes=int(planned.assessment.cost.capacity_bytes) + 1)
        return dataclasses.replace(planned, assessment=dataclasses.replace(planned.assessment, cost=cost))

    monkeypatch.setattr(planner, "_plan", too_big)
    planned = plan_spec(load_spec(ROOT / "specs" / "deep_mlp_8192x16.yaml"), "cpsat")
    assert planned.floor_kept and planned.assessment.cost.fits
    assert planned.assessment.cost.step_time_s == pytest.approx(planned.floor.best.step_time_s, rel=1e-9)
