"""`expect:` blocks: what `shardplan check` asserts of a schedule's plan.

A count is a number or a formula of the program's shape, so that a spec
says why it expects what it does and stays right when a size changes:

    expect:
      all_reduce: 63
      collective_permute: 2 * (P - 1) * K   # one activation and one cotangent per stage boundary and microbatch
      fits: true

Formulas use integers, + - * // and parentheses, and the names:

    L   the program's layers (values layers.<l>.out)
    P   the pipeline stages (the `pipeline` mesh axis; 1 without it)
    K   the microbatches (`pipeline.microbatches`; 1 without a pipeline)
    V   the stages each pipeline device runs (the interleaved schedule's
        `pipeline.chunks`; 1 otherwise), so P * V stages in all

They are checked when the spec is read (syntax and names) and evaluated
when the plan is checked.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

# The collective kinds an expectation counts, as the lowering and the
# pipeline emit them.
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_slice", "collective_permute")
FORMULA_NAMES = {"L": "the program's layers", "P": "the pipeline stages", "K": "the microbatches",
                 "V": "the stages per pipeline device"}
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.FloorDiv: lambda a, b: a // b}


def evaluate_formula(text: str, names: Mapping[str, int]) -> int:
    """The value of a count formula (module docstring); ValueError names what is wrong."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"{text!r} is not a formula of {', '.join(FORMULA_NAMES)}") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in FORMULA_NAMES:
                raise ValueError(f"{text!r}: unknown name {node.id!r}; formulas use "
                                 + ", ".join(f"{n} ({what})" for n, what in FORMULA_NAMES.items()))
            if node.id not in names:
                raise ValueError(f"{text!r}: {node.id} ({FORMULA_NAMES[node.id]}) is not known for this program")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"{text!r}: only integers, {', '.join(FORMULA_NAMES)}, + - * // and parentheses")

    return value(tree.body)


def _count(raw: Any) -> Any:
    """A count: a non-negative int, or a formula checked with every name set to 1."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f"expected a count or a formula of {', '.join(FORMULA_NAMES)}, not {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"a count is at least 0, got {raw}")
        return raw
    evaluate_formula(raw, dict.fromkeys(FORMULA_NAMES, 1))
    return raw


Count = Annotated[int | str, BeforeValidator(_count)]


class Expectation(BaseModel):
    """`expect:` what a schedule must produce: collective counts per kind
    (a kind not listed is expected to be absent) and, if given, whether the
    plan fits the devices' memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    all_reduce: Count = 0
    all_gather: Count = 0
    reduce_scatter: Count = 0
    all_to_all: Count = 0
    all_slice: Count = 0
    collective_permute: Count = 0
    fits: bool | None = None

    def counts(self, names: Mapping[str, int] | None = None) -> dict[str, int | str]:
        """The expected count of each kind; formulas evaluated with `names`
        (left as written without them)."""
        out: dict[str, int | str] = {}
        for kind in COLLECTIVE_KINDS:
            want = getattr(self, kind)
            out[kind] = evaluate_formula(want, names) if isinstance(want, str) and names is not None else want
        return out

