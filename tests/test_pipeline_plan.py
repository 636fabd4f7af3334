"""A `pipeline` mesh axis through the planner and the CLI: the spec's
`pipeline:` block and its errors, `plan` / `lower` / `check` / `export` on a
pipelined spec, count formulas in `expect:`, the mesh search with a
pipeline axis, and DistIR's grid (`plan --grid`)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, shardplan

from costmodel.hardware import preset_hardware
from costmodel.pipeline import pipeline_cost
from ir.autodiff import SGD, training_step
from ir.core import Mesh
from ir.models.mlp import deep_mlp
from ir.nda import analyze
from ir.pipeline import pipeline_step
from ir.text import parse
from solver.frontend.cli import _int_list
from solver.planning.expect import evaluate_formula
from solver.planning.grid import plan_grid
from solver.planning.meshes import concrete_data
from solver.planning.pipelining import pipelined, pipelined_cost, with_schedule
from solver.planning.planner import plan_spec
from solver.planning.spec import SpecError, load_spec, parse_spec, validate_spec

PIPELINED = ROOT / "specs" / "transformer_pipeline.yaml"
GRID = ROOT / "specs" / "mesh_search" / "deep_mlp_8192x16.yaml"

SMALL = """
model:
  builder: deep_mlp
  args: {layers: 4, d_model: 64, batch: 64}
  step: train
  optimizer: sgd
devices: 8
hardware: V100-32GB
"""


# ------------------------------------------------------------------- specs


@pytest.mark.parametrize("text, expected", [
    ("mesh: {batch: 8}\npipeline: {microbatches: 4}",
     "pipeline: needs a 'pipeline' mesh axis, its size the number of stages, e.g. mesh: {pipeline: 4, batch: 8}"),
    ("mesh: {pipeline: 2, batch: 4}\npipeline: {schedule: zigzag}",
     "pipeline.schedule: Input should be 'gpipe', '1f1b' or 'interleaved'"),
    ("mesh: {pipeline: 2, batch: 4}\npipeline: {microbatches: 0}",
     "pipeline.microbatches: Input should be greater than 0"),
    ("mesh: {pipeline: 2, batch: 4}\nschedule: [{manual: {axis: pipeline, values: {x: 0}}}]",
     "schedule.0: the pipeline axis splits the layers into stages; tactics shard each stage over the other "
     "axes (batch)"),
])
def test_pipeline_spec_errors_name_the_field(text, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(SMALL + text, "p.yaml")
    assert str(info.value) == f"p.yaml: {expected}"


def test_forward_programs_have_no_stages():
    text = SMALL.replace("step: train\n  optimizer: sgd", "step: forward") + "mesh: {pipeline: 2, batch: 4}"
    with pytest.raises(SpecError, match="mesh.pipeline: pipeline stages split a training step's forward and "
                                        "backward; it needs model.step: train"):
        parse_spec(text, "p.yaml")


def test_pipeline_defaults_and_the_stages_mesh():
    spec = parse_spec(SMALL + "mesh: {pipeline: 2, batch: 4}", "p.yaml")
    assert (spec.stages, spec.microbatch_count, spec.pipeline_schedule) == (2, 8, None)  # 4 per stage, the planner's
    assert spec.sharding_mesh().axes == (("batch", 4),)
    plain = parse_spec(SMALL + "mesh: {batch: 8}", "p.yaml")
    assert (plain.stages, plain.microbatch_count) == (1, 1)


def test_a_microbatch_count_that_does_not_split_the_batch_is_an_error():
    spec = parse_spec(SMALL + "mesh: {pipeline: 2, batch: 4}\npipeline: {microbatches: 3}", "p.yaml")
    with pytest.raises(SpecError, match="p.yaml: pipeline.microbatches: the batch of %x .64. does not split into 3 "
                                        "microbatches"):
        plan_spec(spec, "cpsat")


# ---------------------------------------------------------------- formulas


def test_count_formulas():
    names = {"L": 8, "P": 4, "K": 3}
    assert evaluate_formula("2 * (P - 1) * K", names) == 18
    assert evaluate_formula("4 * L * K + 3 + 8 * L + 1", names) == 164
    assert evaluate_formula("L // P - -1", names) == 3
    with pytest.raises(ValueError, match="L .the program's layers. is not known for this program"):
        evaluate_formula("L + 1", {"P": 1, "K": 1})


def test_check_evaluates_formulas_and_shows_them_on_a_mismatch(capsys, tmp_path):
    data = yaml.safe_load(PIPELINED.read_text())
    data["schedules"]["PP+BP"]["expect"]["collective_permute"] = "2 * (P - 1) * K + 1"
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, _ = shardplan(capsys, "check", path)
    assert code == 4
    assert "24 (expected 25 = 2 * (P - 1) * K + 1)" in out
    assert "schedule PP+BP: collective_permute: expected 25, got 24" in out


def test_the_bundled_pipeline_spec_checks(capsys):
    code, out, err = shardplan(capsys, "check", PIPELINED, "--json")
    assert code == 0, err
    report = json.loads(out)["specs"][0]
    got = {s["schedule"]: s["got"] for s in report["schedules"]}
    # L = 8 layers, P = 4 stages, K = 4 microbatches.
    assert got["PP+BP"]["collective_permute"] == 2 * 3 * 4
    assert got["PP+BP+MP"]["all_reduce"] == 4 * 8 * 4 + 3 + 8 * 8 + 1


# --------------------------------------------------------------------- CLI


def test_plan_reports_the_stages_and_the_schedule(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, out, err = shardplan(capsys, "plan", PIPELINED, "--schedule", "PP+BP+MP", "--trace", trace)
    assert code == 0, err
    assert "on mesh pipeline=4 x batch=2 x model=2" in out.splitlines()[0]
    assert "pipeline: 4 stages x 4 microbatches, 1f1b; bubble" in out
    for s, layers in enumerate(("0-1", "2-3", "4-5", "6-7")):
        assert f"stage {s}: layers {layers}" in out
    tracks = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {"stage 0", "stage 1", "stage 2", "stage 3"}
    code, out, _ = shardplan(capsys, "plan", PIPELINED, "--json")
    report = json.loads(out)
    assert report["simulated"] is None and report["pipeline"]["stages"] == 4
    assert report["cost"]["step_time_s"] == report["pipeline"]["step_time_s"]
    assert report["mesh"] == {"pipeline": 4, "batch": 2, "model": 2} and report["plan"]["mesh"] == {"batch": 2,
                                                                                                   "model": 2}


def test_lower_prints_each_stage_program_and_the_transfers(capsys):
    code, out, err = shardplan(capsys, "lower", PIPELINED)
    assert code == 0, err
    planned = plan_spec(load_spec(PIPELINED))
    *stages, transfers = [parse("func @" + b.split("\n}\n")[0] + "\n}\n") for b in out.split("func @")[1:]]
    # Every stage's task prints and parses back as the function the executor runs.
    assert [f.name for f in stages] == [t.function.name for t in planned.pipeline.tasks]
    assert [len(f.ops) for f in stages] == [len(t.function.ops) for t in planned.pipeline.tasks]
    # The transfers: a program of collective_permutes on the whole mesh, forward (shift 1) and backward
    # (shift -1) across each of the 3 stage boundaries.
    assert transfers.mesh.names == ("pipeline", "batch", "model")
    assert sorted(op.attrs["shift"] for op in transfers.ops if op.kind == "collective_permute") == [-1] * 3 + [1] * 3


def test_int_lists():
    assert _int_list("1,2,4") == (1, 2, 4)
    assert _int_list("1-4,8") == (1, 2, 3, 4, 8)
    assert _int_list("2-3,3") == (2, 3)


def test_grid_usage_errors(capsys):
    code, _, err = shardplan(capsys, "plan", PIPELINED, "--solver", "cpsat", "--grid")
    assert code == 1 and "--grid needs a mesh search" in err
    code, _, err = shardplan(capsys, "plan", GRID, "--grid")
    assert code == 1 and "add --solver cpsat" in err
    code, _, err = shardplan(capsys, "plan", GRID, "--solver", "cpsat", "--grid", "--schedule", "DP")
    assert code == 1 and "takes no --schedule" in err
    with pytest.raises(SystemExit):
        shardplan(capsys, "plan", GRID, "--grid", "--stages", "4-2")


# -------------------------------------------------------- mesh search, grid


def test_a_candidate_without_stages_drops_the_pipeline_block():
    data = {"model": {"builder": "mlp"}, "devices": 8, "mesh": {"pipeline": "auto", "batch": "auto"},
            "pipeline": {"microbatches": 4}, "hardware": "A100-80GB"}
    assert "pipeline" not in concrete_data(data, (("batch", 8),))
    assert concrete_data(data, (("pipeline", 2), ("batch", 4)))["pipeline"] == {"microbatches": 4}


def test_the_grid_prices_each_mesh_plan_with_every_microbatch_count():
    data = yaml.safe_load(GRID.read_text())
    data["model"]["args"].update(layers=4, d_model=256, batch=256)
    rows = plan_grid("small", "cpsat", stages=(1, 2), microbatches=(1, 2, 4), data=data)
    fitting = [r.step_time_s for r in rows if r.fits]
    assert fitting == sorted(fitting) and len(fitting) == len(rows)
    assert {(r.stages, r.microbatches) for r in rows} == {(p, k) for p in (1, 2) for k in (1, 2, 4)}
    assert all(r.data * r.tensor * r.stages == 16 for r in rows)
    # A row with stages is the mesh's plan pipelined with that K: priced again from scratch, the same.
    row = next(r for r in rows if r.stages == 2 and r.microbatches == 4)
    concrete = concrete_data({**data, "mesh": {"pipeline": "auto", "batch": "auto", "model": "auto"}}, row.mesh)
    spec = validate_spec({**concrete, "pipeline": {"microbatches": 4, "schedule": row.schedule}}, "small")
    planned = plan_spec(spec, "cpsat")
    again = pipeline_cost(pipeline_step(planned.model, planned.nda, spec.sharding_mesh(), planned.plan.decisions,
                                        stages=2, microbatches=4, schedule=row.schedule,
                                        resolutions=dict(planned.plan.resolutions),
                                        replicated=planned.plan.replicated), spec.hardware_obj())
    assert again.step_time_s == pytest.approx(row.step_time_s) == pytest.approx(planned.assessment.cost.step_time_s)


def test_grid_json(capsys):
    code, out, err = shardplan(capsys, "plan", GRID, "--solver", "cpsat", "--grid", "--stages", "1,4",
                               "--microbatches", "1,8", "--json")
    assert code == 0, err
    grid = json.loads(out)["grid"]
    assert {r["stages"] for r in grid} == {1, 4} and {r["microbatches"] for r in grid} == {1, 8}
    code, out, _ = shardplan(capsys, "plan", GRID, "--solver", "cpsat", "--grid", "--stages", "1,4",
                             "--microbatches", "1,8")
    assert f"grid of {len(grid)} configurations" in out.splitlines()[0]


def test_the_schedule_is_gpipe_unless_only_1f1b_fits():
    model = training_step(deep_mlp(layers=4, d_model=32, batch=512), optimizer=SGD())
    pipeline = pipeline_step(model, analyze(model.function), Mesh.of(batch=2), [], stages=2, microbatches=8)
    hardware = preset_hardware("V100-32GB", ["pipeline", "batch"])
    gpipe = max(pipeline_cost(pipeline, hardware).peak_memory_bytes)
    one_f = max(with_schedule(pipeline, hardware, "1f1b")[1].peak_memory_bytes)
    assert one_f < gpipe

    def sized(capacity: int):
        return hardware.model_copy(update={"device": hardware.device.model_copy(update={"memory": capacity})})

    assert with_schedule(pipeline, sized(gpipe), None)[0].schedule == "gpipe"
    chosen, cost = with_schedule(pipeline, sized((gpipe + one_f) // 2), None)
    assert chosen.schedule == "1f1b" and cost.fits
    assert with_schedule(pipeline, sized(one_f - 1), None)[1].fits is False  # neither fits: 1F1B, reported


def test_cpsat_best_plans_are_reranked_by_the_pipeline_schedule(monkeypatch):
    """The search prices the whole step; the pipeline's own step time picks
    among its best plans. The expert floor prices the named schedules by
    their pipelined step time too: hand-written PP+BP pipelines faster than
    any plan of the whole step's search, so it is kept (one search: the
    report and the searched step time stay beside the floor's answer)."""
    import solver.planning.floor
    import solver.planning.pipelining
    import solver.planning.planner

    priced, made = [], []  # the plans priced (the floor's, the re-ranked); those made whole (the answer)
    for module in (solver.planning.floor, solver.planning.planner):
        monkeypatch.setattr(module, "pipelined_cost", lambda spec, model, nda, plan, *rest, **kw:
                            priced.append(plan) or pipelined_cost(spec, model, nda, plan, *rest, **kw))
    monkeypatch.setattr(solver.planning.planner, "pipelined", lambda spec, model, nda, plan, *rest, **kw:
                        made.append(plan) or pipelined(spec, model, nda, plan, *rest, **kw))
    floored = plan_spec(load_spec(PIPELINED), "cpsat")
    (report,) = floored.search
    assert "the pipeline schedule re-ranked the 4 best plans" in report.message
    scores = report.rerank_makespans_s
    assert len(scores) == 4 and scores[report.rerank_winner] == min(scores)
    assert floored.searched_step_s == pytest.approx(scores[report.rerank_winner])
    assert len(priced) == len(set(priced)) and floored.plan in priced  # each once, the answer's included
    # Made whole: the search's answer and the floor's that replaced it, once each; the other
    # re-ranked plans are priced folded (`ir.pipeline_fold`) and never made.
    assert len(made) == len(set(made)) == 2 and floored.plan in made and len(set(priced) - set(made)) >= 3
    assert floored.floor_kept and floored.schedule == floored.floor.best.schedule
    assert floored.assessment.cost.step_time_s == pytest.approx(floored.floor.best.step_time_s, rel=1e-9)
    assert floored.assessment.cost.step_time_s < floored.searched_step_s
