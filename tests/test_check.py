"""`shardplan check`: expectations met, missed (with a readable diff), and
unusable specs; `--schedule` on plan; ZeRO-2's replicate of results."""

import json

from conftest import ROOT, shardplan

from solver.frontend import cli

MLP = (ROOT / "specs" / "mlp.yaml").read_text()


def write(tmp_path, text: str, name: str = "mlp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_mlp_spec_passes(capsys):
    code, out, err = shardplan(capsys, "check", ROOT / "specs" / "mlp.yaml")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["spec", "schedule", "all_reduce", "all_gather", "reduce_scatter", "fits", "step",
                                "time", "result"]
    assert [line.split()[1] for line in lines[1:4]] == ["BP", "BP+MP", "BP+MP+Z3"]
    assert all(line.split()[-1] == "ok" for line in lines[1:4])
    assert "3 of 3 schedule(s) in 1 spec(s) as expected" in out
    assert "failures" not in out


def test_wrong_expectation_fails_with_a_readable_diff(capsys, tmp_path):
    # BP+MP really has 4 all_reduces and fits; expect 5 and no fit.
    wrong = MLP.replace("      all_reduce: 4\n      fits: true", "      all_reduce: 5\n      fits: false")
    assert wrong != MLP
    path = write(tmp_path, wrong)
    code, out, _ = shardplan(capsys, "check", path)
    assert code == cli.EXIT_CHECK_FAILED == 4
    row = next(line for line in out.splitlines() if " BP+MP " in line)
    assert "4 (expected 5)" in row and "yes (expected no)" in row and row.endswith("FAIL")
    assert "2 of 3 schedule(s) in 1 spec(s) as expected" in out
    failures = out.split("failures:\n", 1)[1].splitlines()
    assert failures == [f"  {path}: schedule BP+MP: all_reduce: expected 5, got 4",
                        f"  {path}: schedule BP+MP: fits: expected does not fit, got fits"]


def test_a_kind_not_listed_is_expected_absent(capsys, tmp_path):
    # Drop BP+MP+Z3's all_gather line: the 3 all_gathers it makes are now a failure.
    without = MLP.replace("      all_gather: 3\n", "")
    assert without != MLP
    code, out, _ = shardplan(capsys, "check", write(tmp_path, without))
    assert code == 4
    assert "schedule BP+MP+Z3: all_gather: expected 0, got 3" in out


def test_json_report(capsys, tmp_path):
    good = ROOT / "specs" / "mlp.yaml"
    bad = write(tmp_path, MLP.replace("      all_reduce: 3 ", "      all_reduce: 7 "), "bad.yaml")
    code, out, _ = shardplan(capsys, "check", good, bad, "--json")
    assert code == 4
    report = json.loads(out)
    assert report["passed"] is False and report["time_s"] > 0
    assert [s["spec"] for s in report["specs"]] == ["mlp", "bad"]
    assert [s["passed"] for s in report["specs"]] == [True, False]
    first = report["specs"][1]["schedules"][0]
    assert first["schedule"] == "BP" and first["passed"] is False and first["error"] is None
    assert first["expected"]["all_reduce"] == 7 and first["got"]["all_reduce"] == 3
    assert first["got"]["fits"] is True and first["step_time_s"] > 0 and first["peak_memory_bytes"] > 0
    assert first["mismatches"] == [{"field": "all_reduce", "expected": 7, "got": 3}]


def test_directory_is_checked_spec_by_spec_and_errors_are_reported(capsys, tmp_path):
    write(tmp_path, MLP, "a.yaml")
    write(tmp_path, "model: {builder: mlpp}\nmesh: {batch: 4}\nhardware: A100-80GB\n", "b.yaml")
    write(tmp_path, MLP.split("schedules:")[0] + "schedule:\n  - manual: {axis: batch, values: {x: 0}}\n", "c.yaml")
    code, out, _ = shardplan(capsys, "check", tmp_path)
    assert code == cli.EXIT_INPUT_ERROR
    assert "3 of 3 schedule(s) in 3 spec(s) as expected" in out
    failures = out.split("failures:\n", 1)[1]
    assert f"{tmp_path / 'b.yaml'}: model.builder: unknown model builder 'mlpp'" in failures
    assert f"{tmp_path / 'c.yaml'}: nothing to check: no schedule under `schedules:` has an `expect:` block" \
        in failures


def test_a_schedule_that_cannot_be_planned_is_an_error_row(capsys, tmp_path):
    broken = MLP.replace("values: {w1: 1}", "values: {w9: 1}")
    code, out, _ = shardplan(capsys, "check", write(tmp_path, broken))
    assert code == 4
    rows = {line.split()[1]: line for line in out.splitlines()[1:4]}
    assert rows["BP"].endswith("ok") and rows["BP+MP"].endswith("ERROR") and rows["BP+MP+Z3"].endswith("ERROR")
    assert "schedule BP+MP: schedule.1.manual: no parameter matches 'w9'" in out


def test_missing_paths_are_input_errors(capsys, tmp_path):
    code, _, err = shardplan(capsys, "check", tmp_path / "nope.yaml")
    assert code == 1 and "nope.yaml: No such file or directory" in err
    code, _, err = shardplan(capsys, "check", tmp_path)
    assert code == 1 and "no *.yaml spec files in this directory" in err


# ------------------------------------------------------------ --schedule


def test_plan_runs_a_named_schedule(capsys):
    spec = ROOT / "specs" / "mlp.yaml"
    _, out, _ = shardplan(capsys, "plan", spec, "--schedule", "BP+MP+Z3", "--json")
    report = json.loads(out)
    assert report["schedule"] == "BP+MP+Z3"
    assert report["collectives"] == dict(all_reduce=2, all_gather=3, reduce_scatter=2, all_to_all=0, all_slice=0,
                                         collective_permute=0)
    _, out, _ = shardplan(capsys, "plan", spec)
    assert out.splitlines()[0].endswith("plan (solver none) on mesh batch=4 x model=2")  # the default `schedule:`
    _, out, _ = shardplan(capsys, "plan", spec, "--schedule", "BP")
    assert "(schedule BP, solver none)" in out.splitlines()[0]


def test_unknown_schedule_is_an_input_error(capsys):
    code, _, err = shardplan(capsys, "lower", ROOT / "specs" / "mlp.yaml", "--schedule", "ZeRO")
    assert code == 1
    assert "no schedule named 'ZeRO'; named schedules: BP, BP+MP, BP+MP+Z3" in err


# ------------------------------------------------------------ replicate results (ZeRO-2)


def test_zero2_keeps_updated_parameters_whole(capsys):
    """transformer.yaml's BP+MP+Z2: the Adam moments are sharded on batch but
    the new parameters (results named by the replicate tactic) are not."""
    _, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "transformer.yaml", "--schedule", "BP+MP+Z2", "--json")
    report = json.loads(out)
    results = {r["name"]: r["sharding"] for r in report["results"]}
    params = {p["name"]: p["sharding"] for p in report["params"]}
    assert all("batch" not in axes for name, dims in results.items() if not name.startswith("opt.")
               for axes in dims)
    assert any("batch" in axes for axes in params["opt.m.layers.0.mlp.w_up"])
    assert all("batch" not in axes for axes in params["layers.0.mlp.w_up"])
