"""`shardplan explain`: report, JSON schema, DOT output and errors."""

import json

import pytest
from conftest import ROOT, shardplan

from solver.frontend import cli

SPECS = sorted((ROOT / "specs").glob("*.yaml"))




@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_explain_works_on_every_bundled_spec(capsys, spec):
    code, out, err = shardplan(capsys, "explain", spec, "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    for key in ("conflicts", "compat_sets", "resolution_classes", "param_groups", "time_s"):
        assert isinstance(report[key], (int, float))
    program = report["program"]
    assert program["ops"] > 0 and program["params"] > 0 and program["parameter_elements"] > 0
    assert all({"id", "size", "dims"} <= set(c) for c in report["colors"])
    dims = [c["dims"] for c in report["colors"]]
    assert dims == sorted(dims, reverse=True)
    assert report["conflicts"] == len(report["details"]["conflicts"])


def test_explain_text_report_of_the_simplified_attention(capsys):
    code, out, _ = shardplan(capsys, "explain", ROOT / "specs" / "simplified_attention.yaml")
    assert code == 0
    assert "analysis: 4 colors, 5 conflicts, 1 compatibility sets, 1 resolution classes" in out
    assert "m0 of '%a = dot_general(%k, %qt)'  vs  n0 of '%a = dot_general(%k, %qt)'" in out


def test_explain_mlp_json_counts(capsys):
    _, out, _ = shardplan(capsys, "explain", ROOT / "specs" / "mlp.yaml", "--json")
    report = json.loads(out)
    assert len(report["colors"]) == 4 and report["conflicts"] == 0
    assert report["program"]["parameter_elements"] == 32 * 128 + 128 * 32
    assert report["program"]["state"] == 5  # m and v of w1 and w2, and the step count


def test_explain_transformer_groups(capsys):
    _, out, _ = shardplan(capsys, "explain", ROOT / "specs" / "transformer.yaml", "--json")
    groups = json.loads(out)["details"]["param_groups"]
    assert groups and all(len(g) == 4 for g in groups)  # the spec has 4 layers


def test_dot_output_of_one_color(capsys):
    code, out, _ = shardplan(capsys, "explain", ROOT / "specs" / "simplified_attention.yaml", "--dot", "0")
    assert code == 0 and out.startswith("digraph color0 {") and out.rstrip().endswith("}")
    assert out.count("style=dashed, color=red") == 5  # the five conflicts of the sequence color
    assert 'label="m0 of \'%a = dot_general(%k, %qt)\'"' in out


def test_dot_of_unknown_color_is_an_error(capsys):
    code, _, err = shardplan(capsys, "explain", ROOT / "specs" / "mlp.yaml", "--dot", "99")
    assert code == cli.EXIT_INPUT_ERROR and "no color #99; colors are #0..#3" in err


def test_malformed_spec_is_a_one_line_error_naming_the_field(capsys, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("model: {builder: mlp, args: {hiden: 3}}\nmesh: {batch: 2}\nhardware: A100-80GB\n")
    code, out, err = shardplan(capsys, "explain", spec)
    assert code == cli.EXIT_INPUT_ERROR and out == ""
    assert err.count("\n") == 1 and f"{spec}: model.args:" in err and "hiden" in err


def test_hardware_is_shown_by_name(capsys, tmp_path):
    spec = tmp_path / "inline.yaml"
    spec.write_text(
        "model: {builder: mlp}\nmesh: {batch: 2}\nhardware:\n"
        "  device: {name: my-chip, peak_flops: {f32: 50TFLOP/s}, memory: 64GiB, memory_bandwidth: 2TB/s}\n"
        "  links: {batch: {bandwidth: 25GB/s, latency: 10us}}\n"
    )
    _, out, _ = shardplan(capsys, "explain", spec, "--json")
    assert json.loads(out)["hardware"] == "my-chip"
    _, out, _ = shardplan(capsys, "explain", spec)
    assert out.splitlines()[0].endswith("mesh batch=2, my-chip")
    _, out, _ = shardplan(capsys, "explain", ROOT / "specs" / "chinchilla_32l.yaml", "--json")
    assert json.loads(out)["hardware"] == "A100-80GB"  # a preset with links per axis: the preset's name
