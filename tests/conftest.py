"""Shared test setup: make tests/ importable (program_gen) and locate examples."""

import pathlib
import sys

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"

sys.path.insert(0, str(TESTS))
