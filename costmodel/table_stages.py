"""A lower bound of a pipelined step's time from the cost table, stage by stage.

A mesh screen prices pipelines by lowering them (a second each at scale)
and skips a mesh whose lower bound says it cannot rank among the best
(`solver.planning.mesh_screen`). The whole step's time over the stages is
such a bound, but a loose one where it matters most: 80 layers over 64
stages put 2 layers on 16 of them and 1 on the rest, and the step waits
for the busiest; and a stage starts only once the first microbatch has
passed the stages before it.

The cost table prices the whole step as a sum of terms (`timed`): each op
alone, each fused kernel (a cut one's pieces), each use's resharding. Each
term of one stage's ops (a kernel whose ops are all that stage's, a
resharding of a value that stage made or holds for an op of it) is work
its devices do in every step, on the whole batch at once: run as K
microbatches it takes at least as long (each term is a roofline or ring
time affine in the batch, with a part that does not shrink: a weight's
read, a latency; `solver.planning.pipelining.choose_microbatches`), and
cut into stages its kernels only split. Terms across stages (a kernel or
resharding at a boundary) are left out, so each stage's sum is a lower
bound of its devices' busy time. The terms of ops over the batch (which
run once per microbatch) of its forward, over K, are at most the first
microbatch's forward there, and of its backward the last one's backward.
A device runs its tasks one after another, its stages' updates last. Its
first task (the first microbatch's forward of its first stage) waits for
that forward on every stage before it; after its last backward (the last
microbatch's, of that stage) that backward still runs on every stage
before it. So the step takes at least, for every device d,

    lead(d) + max(busy(d), per-microbatch(d) + drain(d))

lead and drain being the sums of forward / K and backward / K over the
stages before d. `pipeline_lower_bound` is the most of that over the
devices (an interleaved device's busy time is its chunks' stages'
together; its first and last tasks are its first chunk's). For P equal
stages under 1F1B it is the schedule's own (K + P - 1)(f + b)
(tests/test_table_stages.py, and at most every simulated schedule).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ir.core import Recent

_MEMBERS = Recent(2)  # per program: each kernel's ops flat, and where each kernel's start


def stage_seconds(table: Any, timed: Any, value_stage: np.ndarray, forward_ops: int,
                  over_batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per stage, the table's terms wholly inside it under the plan `timed`
    (`CostTable.timed` without a fold), summed; and of those, the terms of
    ops over the batch (`over_batch`, `CostTable.batch_ops`: they run once
    per microbatch) of the forward, and of the backward. `value_stage`: each
    of the table's values' stage (parameters first, then the ops' results,
    as `CostTable.values`)."""
    run = timed.run
    codes = run.codes
    stages = int(value_stage.max()) + 1
    op_stage = value_stage[table.num_params:]
    op_forward = np.arange(len(table.fn.ops)) < forward_ops
    total, forward, backward = np.zeros(stages), np.zeros(stages), np.zeros(stages)

    def add(stage: np.ndarray, seconds: np.ndarray, repeated: np.ndarray, ahead: np.ndarray) -> None:
        inside = stage >= 0
        total[:] += np.bincount(stage[inside], weights=seconds[inside], minlength=stages)
        for out, part in ((forward, inside & repeated & ahead), (backward, inside & repeated & ~ahead)):
            out[:] += np.bincount(stage[part], weights=seconds[part], minlength=stages)

    add(op_stage, table.op_seconds(codes), over_batch, op_forward)  # a fused op's is its kernel's: 0 here
    kernels = table.kernels
    if kernels.kernels:
        flat, starts = _MEMBERS.get((table.fn, table.nda), None, lambda: _members(kernels))
        lowest = np.minimum.reduceat(op_stage[flat], starts)
        highest = np.maximum.reduceat(op_stage[flat], starts)
        add(np.where(lowest == highest, lowest, -1), kernels.kernel_seconds(codes, run.chain_edges),
            np.logical_and.reduceat(over_batch[flat], starts), np.maximum.reduceat(flat, starts) < forward_ops)
    if run.chains:
        edges = run.chain_edges
        chain_s = np.array([sum(chain.priced.seconds) for chain in run.chains])
        seconds = chain_s[run.chain_index] * table.edge_repeat[edges]
        reader, value = table.edge_op[edges], table.edge_vid[edges]
        stage = np.where(value_stage[value] == op_stage[reader], op_stage[reader], -1)
        add(stage, seconds, over_batch[reader], op_forward[reader])
    if run.end_chains:  # partial results reduced after the last op: on their own stage, once a step
        value = np.array([v for v, _ in run.end_chains], dtype=np.int64)
        once = np.zeros(len(value), dtype=bool)
        add(value_stage[value], np.array([sum(chain.priced.seconds) for _, chain in run.end_chains]), once, once)
    return total, forward, backward


def _members(kernels: Any) -> tuple[np.ndarray, np.ndarray]:
    """`FusedKernels`' kernels' ops flat, and where each kernel's start."""
    flat = np.fromiter((i for k in kernels.kernels for i in k.ops), dtype=np.int64, count=int(kernels.sizes.sum()))
    return flat, np.concatenate([[0], np.cumsum(kernels.sizes)[:-1]])


def pipeline_lower_bound(total: np.ndarray, forward: np.ndarray, backward: np.ndarray, microbatches: int,
                         chunks: int = 1) -> float:
    """The module docstring's bound from `stage_seconds`' sums, device d
    running stages d, d + D, ... (D the stages over `chunks`)."""
    devices = len(total) // chunks
    busy = total.reshape(chunks, devices).sum(axis=0)
    repeated = (forward + backward).reshape(chunks, devices).sum(axis=0)
    lead = np.concatenate([[0.0], np.cumsum(forward[: devices - 1])]) / microbatches
    drain = np.concatenate([[0.0], np.cumsum(backward[: devices - 1])]) / microbatches
    return float((lead + np.maximum(busy, repeated + drain)).max())


__all__ = ["pipeline_lower_bound", "stage_seconds"]
