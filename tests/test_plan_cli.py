"""`shardplan plan` and `shardplan lower` on every bundled spec (and what `shardplan export` makes of
each plan), and their errors."""

import json

import pytest
from conftest import ROOT, shardplan
from test_export import check_export_of

from ir.text import parse_file
from solver.frontend import cli
from solver.planning.expect import COLLECTIVE_KINDS

SPECS = sorted((ROOT / "specs").glob("*.yaml"))




@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_plan_json_on_every_bundled_spec(capsys, spec):
    code, out, err = shardplan(capsys, "plan", spec, "--solver", "none", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert set(report["collectives"]) == set(COLLECTIVE_KINDS)
    assert report["plan"]["decisions"] and report["solver"] == "none"
    # One list of axes per dimension (a type's rank is its number of "x" separators).
    assert all(len(p["sharding"]) == p["type"].count("x") for p in report["params"])
    cost = report["cost"]
    if report["pipeline"] is None:
        assert cost["step_time_s"] == pytest.approx(cost["compute_s"] + cost["communication_s"])
    elif report["pipeline"]["stages"] == 1:  # accumulation: one stage's tasks back to back, nothing waits
        assert cost["step_time_s"] == report["pipeline"]["step_time_s"]
        assert cost["step_time_s"] == pytest.approx(cost["compute_s"] + cost["communication_s"])
    else:  # the schedule's: the busiest stage's work, its bubble and the transfers it waits for
        assert cost["step_time_s"] == report["pipeline"]["step_time_s"] > cost["compute_s"] + cost["communication_s"]
    assert cost["communication_s"] == pytest.approx(sum(cost["communication_by_kind_s"].values()))
    assert cost["fits"] == (cost["peak_memory_bytes"] <= cost["capacity_bytes"])
    assert cost["efficiency"] == pytest.approx(cost["ideal_step_time_s"] / cost["step_time_s"])
    assert 0 < cost["ideal_step_time_s"] < cost["step_time_s"]
    assert cost["relative_cost"] >= cost["step_time_s"] / cost["unpartitioned_step_time_s"] * (1 - 1e-12)
    assert cost["peak_memory_bytes"] < cost["unpartitioned_peak_memory_bytes"]
    if spec.stem in ("gemma_2b", "chinchilla_32l"):
        # At full size partitioning must pay off; the toy specs are latency-bound and do not gain.
        assert cost["step_time_s"] < cost["unpartitioned_step_time_s"] / 8
    if report["pipeline"] is None or report["pipeline"]["stages"] == 1:  # one SPMD program: what export hands jax
        check_export_of(report, spec)


@pytest.mark.parametrize("spec", ["mlp", "simplified_attention", "transformer"])
def test_lower_writes_a_verified_device_local_program(capsys, tmp_path, spec):
    out_file = tmp_path / "local.ir"
    code, out, _ = shardplan(capsys, "lower", ROOT / "specs" / f"{spec}.yaml", "-o", out_file)
    assert code == 0 and out == ""
    fn = parse_file(str(out_file))  # parses and verifies
    assert fn.mesh


def test_plan_cost_is_the_evaluation_of_the_lowered_program(capsys, tmp_path):
    from costmodel.evaluate import evaluate
    from solver.planning.spec import load_spec

    spec = ROOT / "specs" / "transformer.yaml"
    _, out, _ = shardplan(capsys, "plan", spec, "--json")
    cost = json.loads(out)["cost"]
    shardplan(capsys, "lower", spec, "-o", tmp_path / "local.ir")
    want = evaluate(parse_file(str(tmp_path / "local.ir")), load_spec(spec).hardware_obj())
    assert cost["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-12)
    assert cost["peak_memory_bytes"] == want.peak_memory_bytes
    assert cost["communication_by_kind_s"]["all_reduce"] == pytest.approx(want.seconds_by_kind["all_reduce"])


def test_mlp_plan_counts(capsys):
    _, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "mlp.yaml", "--json")
    report = json.loads(out)
    # BP + Megatron on the MLP's Adam step: loss and two weight gradients over
    # batch, the second matmul's partial sum over model.
    assert report["collectives"]["all_reduce"] == 4
    assert report["collectives"]["all_gather"] == 0
    w1 = next(p for p in report["params"] if p["name"] == "w1")
    assert w1["sharding"] == [[], ["model"]] and w1["local_type"] == "tensor<32x64xf32>"


def test_text_plan_report(capsys):
    code, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "simplified_attention.yaml")
    assert code == 0
    assert "collectives: 1 all_reduce, 1 all_gather, 1 reduce_scatter" in out
    assert "resolutions: class 0 -> 1" in out
    assert "cost per device on A100-80GB:" in out
    assert "communication " in out and "peak memory " in out and ": fits" in out and "efficiency " in out


def write_spec(tmp_path, schedule):
    path = tmp_path / "s.yaml"
    path.write_text("model: {builder: mlp}\nmesh: {batch: 2, model: 2}\nhardware: A100-80GB\n" + schedule)
    return path


def test_schedule_naming_an_unknown_parameter(capsys, tmp_path):
    path = write_spec(tmp_path, "schedule:\n  - manual: {axis: batch, values: {w9: 0}}\n")
    code, _, err = shardplan(capsys, "plan", path)
    assert code == cli.EXIT_INPUT_ERROR and err.count("\n") == 1
    assert "schedule.0.manual: no parameter matches 'w9'; parameters: x, target, w1, w2, opt.m.w1" in err


def test_schedule_naming_an_unknown_dimension(capsys, tmp_path):
    path = write_spec(tmp_path, "schedule:\n  - manual: {axis: batch, values: {w1: 5}}\n")
    code, _, err = shardplan(capsys, "lower", path)
    assert code == cli.EXIT_INPUT_ERROR and "dimension 5 is not one of 0..1" in err


def test_spec_without_schedule_needs_a_solver(capsys, tmp_path):
    code, _, err = shardplan(capsys, "plan", write_spec(tmp_path, ""))
    assert code == cli.EXIT_INPUT_ERROR and "no schedule: add tactics" in err
    code, out, err = shardplan(capsys, "plan", write_spec(tmp_path, ""), "--solver", "mcts", "--iterations", "20")
    assert code == 0 and "search (mcts on " in out, err


def test_text_report_prints_a_repeated_layer_decision_once(capsys):
    code, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "transformer.yaml")
    assert code == 0
    decisions = out.split("decisions:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    # The manual Megatron tactic pins wq and w_up of each of the 4 layers, then spreads each pin.
    assert decisions[2:] == [
        "     model: %layers.*.attn.wq[1] (4 dimensions, one per layer)",
        "     model: %layers.*.mlp.w_up[1] (4 dimensions, one per layer)",
        "     model: %layers.*.attn.wq[1] and onward (4 dimensions, one per layer)",
        "     model: %layers.*.mlp.w_up[1] and onward (4 dimensions, one per layer)",
    ]
    code, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "transformer.yaml", "--json")
    listed = json.loads(out)["plan"]["decisions"]
    assert len(listed) == 2 + 4 * 4  # the JSON still lists every decision
    assert {d["pattern"] for d in listed if d["axis"] == "model"} == {
        "%layers.*.attn.wq[1]", "%layers.*.mlp.w_up[1]", "%layers.*.attn.wq[1] and onward",
        "%layers.*.mlp.w_up[1] and onward"}


def test_whole_color_decisions_of_repeated_layers_group_by_pattern():
    from solver.planning.plan_text import _grouped

    decisions = [{"axis": "model", "color": c, "what": f"color #{c} (...)", "pattern": "layers.*.mlp.w_up[1]"}
                 for c in (7, 11, 15)] + [{"axis": "model", "color": 2, "what": "color #2 (%embed[0])",
                                            "pattern": "embed[0]"}]
    assert _grouped(decisions) == [("model", "layers.*.mlp.w_up[1]: 3 colors (#7, #11, #15)"),
                                   ("model", "color #2 (%embed[0])")]
