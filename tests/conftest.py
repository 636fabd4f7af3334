"""Shared test setup: make tests/ importable (program_gen) and locate examples."""

import gc
import importlib.util
import pathlib
import sys

import pytest

from solver.frontend.cli import GC_THRESHOLDS

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"

sys.path.insert(0, str(TESTS))
# The suite builds, lowers and prices many large programs: collect cycles as the CLI does
# (`solver.frontend.cli._fewer_collections`), not thousands of times over the same acyclic IR.
gc.set_threshold(*GC_THRESHOLDS)


def shardplan(capsys, *argv):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    from solver.frontend import cli

    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def needs(module: str, *, module_level: bool = False) -> None:
    """Skip where `module` is not installed, without importing it: the tests
    that use jax run it in processes of their own (XLA reads its device count
    at the first import), and importing it here cost each worker 1.4 s."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"could not find {module!r}", allow_module_level=module_level)


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the device-local programs under tests/golden/ (keeping each file's leading // comment)",
    )
