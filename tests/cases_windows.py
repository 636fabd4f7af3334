"""Op cases of general convolution, reduce_window, select_and_scatter: merged into test_ops.CASES."""

from __future__ import annotations

from op_cases import Case

CASES: list[Case] = []
