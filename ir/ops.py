"""The op registry: one record per op kind, holding everything about it.

Each `OpDef` declares, in one place:
  - arity and attribute schema (validated, defaults filled);
  - `infer`: the shape rule, operand types + attrs -> result types;
  - `factors`: the factor (sharding) rule, an einsum-like map of every
    operand and result dimension to factors, each factor parallel,
    reduction (with its combiner), broadcast (result-only) or opaque;
  - `cost`: flops and bytes accessed;
  - `impl`: numpy semantics on one device, or `spmd_impl` for the
    collectives, whose semantics are defined across the simulated mesh.
    An impl may return any numpy dtype that holds its values exactly (a
    `full` returns float64); the executors round every result to the
    execution dtype of its declared type, so one impl serves f32 runs and
    the float64 runs of gradient checks;
  - `localize`: how attributes that spell out a shape change when the op
    runs on a shard (`reshape`'s target shape, `full`'s shape, ...);
  - `vjp`: the reverse-mode rule (filled in by the autodiff work).

Everything about sharding downstream (NDA identities, lowering, costs) is
derived from the factor rules, never written again per op.

The op kinds themselves live in `ir/opset/`, grouped by family; importing
this module registers all of them.
"""

from ir.opdef import *  # noqa: F403 (the records and queries, re-exported: see ir/opdef.py)
from ir.opdef import REGISTRY, REQUIRED  # noqa: F401 (named for readers and type checkers)

# Register every op kind.
from ir.opset import (  # noqa: E402,F401
    attention,
    bitwise,
    collectives,
    contraction,
    conv_general,
    convolution,
    elementwise,
    indexing,
    layout,
    reduction,
    sorting,
    windows,
)
