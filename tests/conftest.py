"""Shared test setup: make tests/ importable (program_gen) and locate examples."""

import gc
import pathlib
import sys

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"

sys.path.insert(0, str(TESTS))
# The suite builds, lowers and prices many large programs: collect cycles as the CLI does
# (`solver.frontend.cli._fewer_collections`), not thousands of times over the same acyclic IR.
gc.set_threshold(100_000, 50, 100)


def shardplan(capsys, *argv):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    from solver.frontend import cli

    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the device-local programs under tests/golden/ (keeping each file's leading // comment)",
    )
