"""CP-SAT's memory cuts (`solver.search.cpsat`): a lower bound of a plan's
live bytes at each point of its device-local program, written as a sum of
the CP-SAT model's terms, so that a plan that overflows yields a linear
constraint every plan that fits satisfies.

The bound replays the positions of `costmodel.table`'s memory walk with what
every lowering keeps live there, whatever the sharding:

  - parameters, resident throughout;
  - an op's result from its op until its last reader, if it can never be a
    partial sum;
  - one that may be a partial sum: whole at its op, then its reduced value
    until its last reader (the lowering reduces it at its first reader, or
    right after its op where the reduction is all that reader's resharding
    does), at its size over the axes it was partial over (a reduce_scatter
    splits it over those at most): the `held_bytes` of its op term;
  - at an op, each operand it reads for the last time, at the size the op
    reads it (the value itself, or its resharding's last result): the op
    term's `use_bytes`;
  - between two ops, where the resharding of such an operand starts: what
    crosses the gap, the operands already resharded (as the op reads them),
    the one being resharded (its own value and its first collective's
    result: the edge term's `first_step_bytes`) and the ones still waiting
    (their own values).

Each part is a (term, measure) pair: the term's bytes under the combination
that holds. Measured on chinchilla_32l_a100 with every other layer
rematerialized, the bound equals the true peak of the plans the loop prices;
without the last two kinds it missed up to 0.73 GiB, and the loop spent its
time excluding plans one by one.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from solver.search.cpsat_terms import TermModel

CUTS_PER_ROUND = 8  # memory cuts added per round at most: the largest overflows, spread over the program


class LiveBound:
    """The lower bound of one plan (`codes`, with the sentinel I-class), per
    position: `at_op[i]` where op i runs, `before_op[i]` where the resharding
    of its operands starts (0 where none is resharded)."""

    def __init__(self, m: TermModel, codes: np.ndarray) -> None:
        t = self.t = m.t
        self.m = m
        n = self.n = len(t.fn.ops)
        value_bytes, use_bytes = t.value_bytes(codes), t.use_bytes(codes).tolist()
        partial = t.partial_masks(codes)
        first_step = t.first_step_bytes(codes)
        self.resident = int(value_bytes[: t.num_params].sum())
        self.spans: list[tuple[int, int, int, str, int]] = []  # (op, first, last, measure, bytes)
        own: dict[int, tuple[int, str, int]] = {}  # value -> (op, measure, bytes) of its span ending at its last reader
        for i in range(n):
            v = t.num_params + i
            size = int(value_bytes[v])
            last = n - 1 if t.is_result[v] else max(i, int(t.last_user[v]) - 1)
            if m.value_partial[v] is None or t.first_user[v] < 0:
                self._span(own, v, i, i, last, "result_bytes", size)
                continue
            held = size // math.prod(t.mesh.size(a) for a in t.mask_axes[partial.get(v, 0)])
            # Whole where its op makes it; a reduction that only reduces it follows at once (`ir.lower`),
            # else at its first reader: at least the held bytes from the next op on.
            self._span(own, v, i, i, i, "result_bytes", size)
            self._span(own, v, i, i + 1, last, "held_bytes", held)
        delta = np.zeros(n + 1, dtype=np.int64)
        ending = np.zeros(n + 1, dtype=np.int64)
        for _, first, last, _, size in self.spans:
            delta[first] += size
            delta[last + 1] -= size
            ending[last] += size
        core = self.resident + np.cumsum(delta[:n])
        # Per op: the operands it reads for the last time (op results, each once), as
        # (operand index, edge, own part, use bytes, first collective's bytes or 0).
        self.last_reads: list[list[tuple]] = []
        self.at_op = core.copy()
        self.before_op = np.zeros(n, dtype=np.int64)
        self.chosen = [-1] * n  # the operand whose resharding `before_op` is at
        for i in range(n):
            reads = []
            for j, e in enumerate(t.op_edges[i]):
                v = t.edge_vid_of[e]
                if v >= t.num_params and t.last_user[v] == i and not t.is_result[v] and v not in t.op_vids[i][:j]:
                    reads.append((j, e, own.get(v), use_bytes[e], first_step.get(e, 0)))
            self.last_reads.append(reads)
            self.at_op[i] += sum(r[3] for r in reads)
            if i and any(r[4] for r in reads):
                crossing = int(core[i - 1] - ending[i - 1])
                best = max((self._before(reads, k), k) for k, r in enumerate(reads) if r[4])
                self.before_op[i], self.chosen[i] = crossing + best[0], best[1]

    def _span(self, own: dict, v: int, i: int, first: int, last: int, measure: str, size: int) -> None:
        if last >= first:
            self.spans.append((i, first, last, measure, size))
            own[v] = (i, measure, size)

    @staticmethod
    def _before(reads: list[tuple], k: int) -> int:
        """The operands' part of the bound where operand k's resharding starts."""
        done = sum(r[3] for r in reads[:k])
        waiting = sum(r[2][2] for r in reads[k:] if r[2] is not None)
        return done + waiting + reads[k][4]

    def max(self) -> int:
        return int(max(self.at_op.max(initial=0), self.before_op.max(initial=0), self.resident))

    def parts(self, kind: str, i: int) -> Counter:
        """The (term, measure) pairs, with their counts, that make up the bound at
        a position: ("at", i) where op i runs, ("before", i) before it."""
        m, t = self.m, self.t
        counts: Counter = Counter((m.param_term(p), "result_bytes") for p in range(t.num_params))
        reads = self.last_reads[i]
        if kind == "at":
            counts.update((m.terms[m.op_term[op]], measure) for op, first, last, measure, _ in self.spans
                          if first <= i <= last)
            counts.update((m.terms[m.op_term[i]], ("use_bytes", r[0])) for r in reads)
            return counts
        k = self.chosen[i]
        counts.update((m.terms[m.op_term[op]], measure) for op, first, last, measure, _ in self.spans
                      if first <= i - 1 and last >= i)
        counts.update((m.terms[m.op_term[i]], ("use_bytes", r[0])) for r in reads[:k])
        counts.update((m.terms[m.op_term[r[2][0]]], r[2][1]) for r in reads[k:] if r[2] is not None)
        counts[(m.terms[m.edge_term[reads[k][1]]], "first_step_bytes")] += 1
        return counts


def memory_cuts(m: TermModel, codes: np.ndarray, capacity: int, at_most: int = CUTS_PER_ROUND) -> list[Counter]:
    """The positions where the bound of the plan `codes` exceeds the capacity
    (the largest first, spread over the program), each as its parts."""
    bound = LiveBound(m, codes)
    n = bound.n
    positions = [(int(v), "at", i) for i, v in enumerate(bound.at_op)] + \
                [(int(v), "before", i) for i, v in enumerate(bound.before_op) if v]
    over = sorted((p for p in positions if p[0] > capacity), key=lambda p: (-p[0], p[2], p[1]))
    chosen: list[tuple[int, str, int]] = []
    for p in over:
        if all(abs(p[2] - q[2]) > n // (4 * at_most) for q in chosen):
            chosen.append(p)
        if len(chosen) == at_most:
            break
    return [bound.parts(kind, i) for _, kind, i in chosen]
