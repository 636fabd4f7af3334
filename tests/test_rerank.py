"""Re-ranking CP-SAT's best plans by the two-stream simulator: the solve
goes on after the optimum until it holds the K best distinct plans (checked
against brute force), and the plan kept is the one with the shortest
simulated makespan (checked by lowering and simulating it again)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from test_cpsat import setup, slow_hardware, write_spec

from costmodel.simulate import simulate
from ir.core import Mesh
from ir.lower import LoweringError, lower
from solver.search.cpsat import CpSatOptions, solve

CASES = [  # small programs with many distinct plans and links slow enough that overlap matters
    ("mlp", dict(batch=64, d_in=64, hidden=128, d_out=64), Mesh.of(batch=2, model=2)),
    ("deep_mlp", dict(layers=4, d_model=64, batch=256), Mesh.of(x=4)),
    ("transformer", dict(layers=1), Mesh.of(x=4)),
]
IDS = ["mlp-2d", "deep-mlp", "transformer"]


def serial_costs(space, table) -> list[float]:
    """The serial step time of every distinct sharding of the space that lowers and fits, best first
    (points that materialize alike are one plan)."""
    costs = {}
    for point in space.points():
        sharding = space.plan(point).materialize(space.nda)
        if sharding in costs:
            continue
        try:
            cost = table.evaluate(sharding)
        except LoweringError:
            continue
        if cost.fits:
            costs[sharding] = cost.step_time_s
    return sorted(costs.values())


@pytest.mark.parametrize("name,kwargs,mesh", CASES, ids=IDS)
def test_the_plans_compared_are_the_k_best_and_the_kept_one_has_the_shortest_makespan(name, kwargs, mesh):
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh))
    k = 4
    result = solve(space, table, CpSatOptions(time_limit_s=60, rerank=k))
    report = result.report
    assert report.status == "optimal"
    assert report.rerank_objectives_s == pytest.approx(serial_costs(space, table)[:k], rel=1e-3)
    assert len(report.rerank_makespans_s) == k
    assert report.rerank_makespans_s[report.rerank_winner] == min(report.rerank_makespans_s)
    # The kept plan is the one simulated: lowered and simulated again, it has that makespan and that serial time.
    timeline = simulate(lower(model.function, nda, result.sharding).function, table.hardware)
    assert timeline.makespan_s == pytest.approx(report.rerank_makespans_s[report.rerank_winner], rel=1e-12)
    assert result.cost.step_time_s == pytest.approx(report.rerank_objectives_s[report.rerank_winner], rel=1e-3)
    assert report.objective_s == pytest.approx(result.cost.step_time_s, rel=1e-3)
    # What the solver proved is about the optimum, whichever plan is kept.
    plain = solve(space, table, CpSatOptions(time_limit_s=60))
    assert report.bound_s == pytest.approx(plain.report.bound_s, rel=1e-9)
    assert report.rerank_objectives_s[0] == pytest.approx(plain.report.objective_s, rel=1e-9)
    assert ("re-ranked the 4 best plans" in report.message)


def test_rerank_one_keeps_the_optimum_and_simulates_nothing():
    _, _, table, space = setup(*CASES[0], slow_hardware(CASES[0][2]))
    plain = solve(space, table, CpSatOptions(time_limit_s=60))
    one = solve(space, table, CpSatOptions(time_limit_s=60, rerank=1))
    assert one.sharding == plain.sharding and one.report.objective_s == plain.report.objective_s
    assert one.report.rerank_makespans_s == () and "re-ranked" not in one.report.message


def test_a_rerank_where_no_plan_fits_under_the_score_says_so_and_keeps_the_optimum():
    """A pipelined spec's score is infinite for a plan that does not fit
    memory at any count of microbatches: where every plan compared is so,
    the optimum is kept and the report says why (its makespans null in
    JSON, which has no infinity)."""
    _, _, table, space = setup(*CASES[0], slow_hardware(CASES[0][2]))
    plain = solve(space, table, CpSatOptions(time_limit_s=60))
    unfit = solve(space, table, CpSatOptions(time_limit_s=60, rerank=3, score=lambda plan, sharding: float("inf"),
                                             score_name="the pipeline schedule"))
    assert unfit.sharding == plain.sharding and unfit.report.rerank_winner == 0
    assert unfit.report.message.endswith("none of them fits memory under the pipeline schedule: the optimum is kept")
    assert "inf" not in unfit.report.message.replace("infeasible", "")
    assert json.loads(json.dumps(unfit.report.to_json(), allow_nan=False))["rerank_makespans_s"] == [None] * 3


def test_rerank_stops_when_the_space_has_fewer_plans():
    """Asking for more plans than the space holds compares every plan that fits."""
    _, _, table, space = setup("mlp", dict(batch=64, d_in=64, hidden=128, d_out=64), Mesh.of(x=2),
                               slow_hardware(Mesh.of(x=2)))
    everything = len(serial_costs(space, table))
    result = solve(space, table, CpSatOptions(time_limit_s=60, rerank=everything + 5))
    assert len(result.report.rerank_objectives_s) == everything
    assert result.report.status == "optimal"


def test_cli_rerank(capsys, tmp_path):
    from conftest import shardplan

    spec = write_spec(tmp_path, "hardware: A100-80GB\n")
    code, out, err = shardplan(capsys, "plan", str(spec), "--solver", "cpsat", "--rerank", "3", "--json")
    assert code == 0, err
    report = json.loads(out)
    (search,) = report["search"]
    assert len(search["rerank_makespans_s"]) == 3 and len(search["rerank_objectives_s"]) == 3
    winner = search["rerank_winner"]
    assert report["simulated"]["makespan_s"] == pytest.approx(search["rerank_makespans_s"][winner], rel=1e-9)
    assert report["cost"]["step_time_s"] == pytest.approx(search["rerank_objectives_s"][winner], rel=1e-3)
    with pytest.raises(SystemExit) as exit_:
        shardplan(capsys, "plan", str(spec), "--solver", "cpsat", "--rerank", "0")
    assert exit_.value.code == 2 and "--rerank: must be at least 1" in capsys.readouterr().err


def test_an_auto_tactic_sets_rerank(capsys, tmp_path):
    from conftest import shardplan

    spec = write_spec(tmp_path, "hardware: A100-80GB\nschedule:\n  - auto: {axes: [batch, model], rerank: 2}\n")
    code, out, err = shardplan(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    assert len(json.loads(out)["search"][0]["rerank_makespans_s"]) == 2
    bad = write_spec(tmp_path, "hardware: A100-80GB\nschedule:\n  - auto: {axes: [batch], rerank: 0}\n")
    code, _, err = shardplan(capsys, "plan", str(bad))
    assert code == 1 and "rerank" in err


@pytest.mark.parametrize("microbatches, shared", [(4, (4, 2)), ("auto", (3, 2))])
def test_the_plans_a_pipeline_reranks_are_scored_alike_in_processes(monkeypatch, microbatches, shared):
    # `--jobs 2`: the plans are scored in two processes, this one among them; under `microbatches: auto`
    # the optimum first, here (it chooses the count the others run). The scores and the plan are those of
    # one process.
    import solver.search.cpsat as cpsat
    from solver.planning.planner import SearchOverrides, plan_spec
    from solver.planning.spec import parse_spec
    from solver.search.forked import Helpers

    text = (ROOT / "specs" / "transformer_pipeline.yaml").read_text()
    if microbatches == "auto":
        text = text.replace("pipeline: {microbatches: 4, schedule: 1f1b}",
                            "microbatches: auto\npipeline: {schedule: 1f1b}")
    spec = parse_spec(text, "transformer_pipeline.yaml")
    assert spec.microbatches_auto == (microbatches == "auto")
    forked = []

    class Recorded(Helpers):
        def map(self, items):
            forked.append((len(items), self.processes))
            return super().map(items)

    monkeypatch.setattr(cpsat, "Helpers", Recorded)
    answers = [plan_spec(spec, "cpsat", overrides=SearchOverrides(time_limit_s=20, jobs=jobs), floor=False)
               for jobs in (1, 2)]
    assert forked == [shared]
    one, two = (a.search[-1] for a in answers)
    assert len(one.rerank_makespans_s) == 4 and None not in one.rerank_makespans_s
    assert two.rerank_makespans_s == one.rerank_makespans_s
    assert answers[1].plan == answers[0].plan and answers[1].assessment.cost == answers[0].assessment.cost
