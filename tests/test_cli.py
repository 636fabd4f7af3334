"""The command line: help, version, run, and one-line errors on bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import EXAMPLES, ROOT, shardplan

from ir.interpret import random_inputs, run
from ir.text import parse_file
from solver.frontend import cli


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "version" in out
    code, out, _ = shardplan(capsys)  # no command: help, success
    assert code == 0 and "usage: shardplan" in out


def test_version(capsys):
    code, out, _ = shardplan(capsys, "version")
    assert code == 0 and out.startswith("shardplan ")
    code, out, _ = shardplan(capsys, "version", "--json")
    assert json.loads(out)["shardplan"] == cli.version()


def test_run_prints_shapes_and_checksums(capsys):
    code, out, err = shardplan(capsys, "run", str(EXAMPLES / "mlp.ir"), "--seed", "2")
    assert code == 0 and err == ""
    assert out.splitlines()[0] == "@mlp_sgd_step: 4 inputs, 22 ops, seed 2"
    assert "%w1.new" in out and "tensor<8x32xf32>" in out


def test_run_json_checksums_match_the_executor(capsys):
    path = str(EXAMPLES / "mlp.ir")
    code, out, _ = shardplan(capsys, "run", path, "--json")
    report = json.loads(out)
    assert code == 0 and report["function"] == "mlp_sgd_step" and report["mesh"] == {}
    fn = parse_file(path)
    values = run(fn, random_inputs(fn, 0))
    for entry, value in zip(report["outputs"], values):
        assert entry["shape"] == list(value.shape) and entry["dtype"] == "f32"
        assert entry["sum"] == pytest.approx(float(value.astype(np.float64).sum()), rel=1e-9)
        assert entry["abs_sum"] == pytest.approx(float(np.abs(value.astype(np.float64)).sum()), rel=1e-9)


def test_run_device_local_program_on_its_mesh(capsys):
    code, out, _ = shardplan(capsys, "run", str(EXAMPLES / "mlp_bp_mp.ir"), "--json")
    report = json.loads(out)
    assert code == 0 and report["mesh"] == {"batch": 2, "model": 2} and report["devices"] == 4


@pytest.mark.parametrize("text,fragment", [
    ("func @f(%x: tensor<3xf32>) -> (tensor<3xf32>) {\n  %y = nope(%x) : tensor<3xf32>\n  return %y\n}",
     "bad.ir:2:8: unknown op 'nope'"),
    ("func @f(%x: tensor<3xf32>) -> (tensor<3xf32>) {\n  %y = add(%x) : tensor<3xf32>\n  return %y\n}",
     "bad.ir:2:8: add takes 2 operand(s), got 1"),
    ("func @f(%x: tensor<3xf32>, %z: tensor<4xf32>) -> (tensor<3xf32>) {\n  %y = add(%x, %z) : tensor<3xf32>\n"
     "  return %y\n}", "bad.ir:2:8: add: operand shapes differ: tensor<3xf32>, tensor<4xf32>"),
    ("func @f(%x: tensor<3xf32> -> (tensor<3xf32>) {", "bad.ir:1:27: expected ',' or ')', found '->'"),
    ("", "bad.ir:1:1: expected 'func', found end of input"),
])
def test_bad_ir_gives_one_line_error(capsys, tmp_path, text, fragment):
    path = tmp_path / "bad.ir"
    path.write_text(text)
    code, out, err = shardplan(capsys, "run", str(path))
    assert code == cli.EXIT_INPUT_ERROR and out == ""
    assert err.count("\n") == 1 and fragment in err and err.startswith("shardplan: error: ")


def test_programs_too_large_to_execute_are_refused(capsys, tmp_path):
    path = tmp_path / "big.ir"
    path.write_text("func @big(%x: tensor<65536x65536xf32>) -> (tensor<65536x65536xf32>) {\n"
                    "  %y = neg(%x) : tensor<65536x65536xf32>\n  return %y\n}\n")
    code, _, err = shardplan(capsys, "run", str(path))
    assert code == cli.EXIT_INPUT_ERROR
    assert "too large to execute: %x is tensor<65536x65536xf32> (16.0 GiB)" in err


def test_missing_file_is_a_one_line_error(capsys, tmp_path):
    code, _, err = shardplan(capsys, "run", str(tmp_path / "absent.ir"))
    assert code == cli.EXIT_INPUT_ERROR
    assert err.strip() == f"shardplan: error: {tmp_path / 'absent.ir'}: No such file or directory"


def test_console_entry_point_never_prints_a_traceback(tmp_path):
    path = tmp_path / "bad.ir"
    path.write_text("func @f() -> () {\n  %y = full() {shape = [2], value = 1.0} : tensor<2xf32>\n  return\n}")
    proc = subprocess.run([sys.executable, "-m", "solver.frontend.cli", "run", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "missing required attribute 'dtype'" in proc.stderr


def test_commands_run_with_fewer_collections_and_restore_the_thresholds(capsys, monkeypatch):
    """A command runs with the cyclic collector's thresholds raised (a large
    program is millions of acyclic objects it would rescan), and leaves
    them as it found them, after an error too."""
    import gc

    before, seen = gc.get_threshold(), []

    def fake_plan(args):
        seen.append(gc.get_threshold())
        raise cli.IRError("no")

    monkeypatch.setattr(cli, "cmd_plan", fake_plan)
    code, _, err = shardplan(capsys, "plan", "specs/mlp.yaml")
    assert code == 1 and "no" in err
    assert seen == [(100_000, 50, 100)] and gc.get_threshold() == before
    # A process about to end (`cli.run`) leaves them raised: restored, they start a full collection.
    try:
        assert cli.main(["plan", "specs/mlp.yaml"], leaving=True) == 1
        assert gc.get_threshold() == (100_000, 50, 100)
    finally:
        gc.set_threshold(*before)
