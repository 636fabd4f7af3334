"""The parts of a training step that ZeRO shards, found from the program:
which I-classes a partial decision of the search space reaches
(`solver.search.space`).

ZeRO shards the optimizer side of a training step along an axis that the
batch takes everywhere else, and leaves the forward and backward as they are:

  OPTIMIZER (ZeRO-1/2)  the optimizer state and the update computed from
                        it: each gradient is reduce_scattered into its
                        state's shard, the update is all_gathered before it
                        is applied, the parameters stay whole;
  STORAGE (ZeRO-3/FSDP) that, and the parameters the update applies to and
                        the ops applying it: each parameter is all_gathered
                        where it is read;
  WHOLE                 everything of the color (a whole-color decision).

Each level's part contains the narrower ones. The *optimizer region* (the
OPTIMIZER part) is what a walk along map M reaches from the dimensions of
the optimizer state through I-classes of ops that carry no data dimension
and read no parameter other than optimizer state. A gradient's producer
contracts the batch (a data dimension), so the walk stops where the
gradient arrives, a partial sum the region's first op reduce_scatters; the
op that applies the update reads the parameter, so ZeRO-1/2 keeps it, and
the parameter, whole. The STORAGE part adds the ops reading a parameter and
a value of the region (those applying the update) and the dimensions of the
parameters they read. Names play no part: the model says which parameters
are optimizer state and which are data inputs.
"""

from __future__ import annotations

from collections.abc import Collection

from ir.nda import NDA

OPTIMIZER, STORAGE, WHOLE = 1, 2, 3
LATE = WHOLE + 1  # not ZeRO's: a data group decided after every other color (`solver.search.space`)
LEVEL_NAMES = {OPTIMIZER: "optimizer", STORAGE: "storage", WHOLE: "whole", LATE: "late"}


def parts(nda: NDA, data_colors: Collection[int], optimizer_state: Collection[str]) -> tuple[int, ...]:
    """Per I-class, the narrowest level whose decision shards it (module
    docstring). WHOLE everywhere when the program has no optimizer state or
    no data dimension: without the batch, the walk could not tell where the
    gradient arrives."""
    fn = nda.function
    level = [WHOLE] * len(nda.iclasses)
    state = {i for i, p in enumerate(fn.params) if p.name in optimizer_state}
    if not state or not data_colors:
        return tuple(level)
    param_index = {p: i for i, p in enumerate(fn.params)}
    reads = [[param_index[v] for v in op.operands if v in param_index] for op in fn.ops]
    region = _optimizer_region(nda, data_colors, state, reads)
    for k in region:
        level[k] = OPTIMIZER

    def in_region(value) -> bool:
        rank = value.type.rank
        return rank > 0 and value not in param_index and all(nda.def_iclass(value, d) in region for d in range(rank))

    updated, update_ops = set(), set()
    for i, op in enumerate(fn.ops):
        params = [p for p in reads[i] if p not in state]
        if params and any(in_region(v) for v in op.operands):
            updated.update(params)
            update_ops.add(i)
    for k, ic in enumerate(nda.iclasses):
        kind, index = ic.owner[:2]
        if (kind == "param" and index in updated) or (kind == "op" and index in update_ops):
            level[k] = STORAGE
    return tuple(level)


def _optimizer_region(nda: NDA, data_colors: Collection[int], state: set[int], reads: list[list[int]]) -> set[int]:
    """The I-classes a walk along map M reaches from the optimizer state's
    dimensions through ops with no data dimension that read no parameter but
    optimizer state (`reads`: per op, the parameters it reads)."""
    data_op = [False] * len(nda.function.ops)
    for ic in nda.iclasses:
        if ic.owner[0] == "op" and ic.color in data_colors:
            data_op[ic.owner[1]] = True

    def passable(k: int) -> bool:
        kind, index = nda.iclasses[k].owner[:2]
        if kind == "param":
            return index in state
        return not data_op[index] and all(p in state for p in reads[index])

    region = {k for k, ic in enumerate(nda.iclasses) if ic.owner[0] == "param" and ic.owner[1] in state}
    frontier = list(region)
    while frontier:
        k = frontier.pop()
        for n in nda.neighbors[k]:
            if n not in region and passable(n):
                region.add(n)
                frontier.append(n)
    return region
