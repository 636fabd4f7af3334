"""Op cases of bitwise, integer and extra elementwise ops (and, or, xor,
shifts, abs, sign, is_finite, ...): merged into test_ops.CASES."""

from __future__ import annotations

from op_cases import Case

CASES: list[Case] = []
