"""Op cases of general gather and scatter, dynamic slices, argmax, reverse: merged into test_ops.CASES."""

from __future__ import annotations

from op_cases import Case

CASES: list[Case] = []
