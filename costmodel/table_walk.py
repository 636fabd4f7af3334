"""One evaluation of the tabulated cost model (`costmodel.table`): which
values are partial sums, the collectives of every active use, and the peak
memory of the device-local program's positions, for one plan's codes.

Issue 27: this is what the MCTS calls thousands of times, so apart from the
walk over the ops that touch a partial sum it works on whole arrays: the
active uses' resharding keys are made distinct with numpy and each distinct
key is looked up (or priced) once, and the positions, live ranges and the
peak are array expressions over the uses, in place of a Python loop over
every active use and touched value (a 32-layer step has about 850 of each
per plan, and some 30 distinct keys). The rules are the ones the loop
had, which tests/test_table.py checks against the lowered program.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from costmodel.evaluate import COMMUNICATION
from ir.lower import LoweringError, flowing_partial

_KEY_LIMIT = 1 << 62  # packed integer keys stay below this (int64, with room to spare)


def distinct_rows(columns: Sequence[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of integer columns, each column below its radix:
    (the index of each distinct row's first occurrence, each row's distinct
    id), as `np.unique(..., axis=0)` gives them but by packing the columns one
    after another into a dense id, re-densified before a product could
    overflow int64 (2-D unique sorts structured rows and is several times slower)."""
    ids = np.zeros(len(columns[0][0]), dtype=np.int64)
    bound = 1
    for column, radix in columns:
        if radix >= _KEY_LIMIT // max(len(ids), 1):  # a wide column: its own dense ids first
            _, column = np.unique(column, return_inverse=True)
            column, radix = column.reshape(-1), len(ids)
        if bound * radix >= _KEY_LIMIT:
            _, ids = np.unique(ids, return_inverse=True)
            ids, bound = ids.reshape(-1), len(ids)
        ids, bound = ids * radix + column, bound * radix
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _union(masks: np.ndarray) -> np.ndarray:
    """The bitwise or of each row (columns or-ed one by one: faster than `np.bitwise_or.reduce` on short rows)."""
    out = masks[:, 0].copy()
    for j in range(1, masks.shape[1]):
        out |= masks[:, j]
    return out


class Walk:
    """One evaluation's dynamic state: partial sums, active uses, positions.
    `t` is the `costmodel.table.CostTable` (typed Any: that module imports
    this one)."""

    def __init__(self, table: Any, codes: np.ndarray, value_bytes: np.ndarray) -> None:
        self.t, self.codes, self.value_bytes = table, codes, value_bytes
        self.partial: dict[int, int] = {}  # vid -> pending partial axes (bit mask)
        self.combiner: dict[int, str] = {}
        self.flowing_ops: set[int] = set()  # ops a partial operand flows through
        self.counts: Counter[str] = Counter()
        self.steps = 0  # collectives (all_slice included) the lowering emits

    # ------------------------------------------------------------ partial sums

    def partial_sums(self) -> None:
        """Which values are partial sums: walk, in program order, only the ops
        that own a sharded reduction or consume a partial value. Partial axes
        are bit masks over the mesh axes here."""
        t, codes = self.t, self.codes
        own = _union(t.code_mask[codes[t.reduction_ic]])
        heap = np.flatnonzero(own).tolist()
        queued = set(heap)
        own = own.tolist()
        can_flow, flow_users, combiner_of, first = t.can_flow, t.flow_users, t.op_combiner, t.num_params
        while heap:
            i = heapq.heappop(heap)
            flowing = self._flowing(i) if can_flow[i] else 0
            if flowing and own[i] and combiner_of[i] != "sum":
                raise LoweringError(f"{t.fn.ops[i].describe()}: cannot combine a flowing sum with a "
                                    f"{combiner_of[i]} reduction")
            mask = flowing | own[i]
            if mask:
                vid = first + i
                self.partial[vid] = mask
                self.combiner[vid] = combiner_of[i] if own[i] else "sum"
                for user in flow_users[vid]:
                    if user not in queued:
                        queued.add(user)
                        heapq.heappush(heap, user)

    def _flowing(self, i: int) -> int:
        """The partial axes (mask) flowing through op i; decided by the
        lowering's `flowing_partial`, memoized on what it looks at."""
        t = self.t
        vids = t.op_vids[i]
        # A partial operand with an earlier use was reduced there (the lowering reduces once).
        masks = tuple(self.partial.get(v, 0) if t.first_user[v] == i else 0 for v in vids)
        if not any(masks) or any(m and t.use_count_of[v] != 1 for v, m in zip(vids, masks)):
            return 0
        edges = t.op_edges[i]
        combiners = tuple(self.combiner.get(v, "sum") for v in vids)
        wanted = tuple(int(np.bitwise_or.reduce(m)) for m in t.code_mask[self.codes[t.use_ic[list(edges)]]])
        key = (t.op_signature_of[i], masks, combiners, wanted)
        flowing = t._flow_memo.get(key)
        if flowing is None:
            wants = [t.want_dims(e, self.codes) for e in edges]
            axes = flowing_partial(t.fn.ops[i], [t.mask_axes[m] for m in masks], combiners, wants)
            flowing = t._flow_memo[key] = sum(t.axis_bit[a] for a in axes)
        if flowing:
            self.flowing_ops.add(i)
        return flowing

    # ------------------------------------------------------------ communication

    def communication(self, by_kind: Counter[str]) -> None:
        """Price the collectives of every active use (a use whose wanted
        sharding differs from its value's, or of a partial sum). A partial
        sum is reduced at its first use by an op it does not flow through
        (the lowering reduces once); its later uses reshard the reduced value.
        Shardings are packed into one integer per value or use
        (`CostTable.pack`), so repeated layers share a key."""
        t, codes = self.t, self.codes
        def_key = t.pack(codes[t.def_ic])
        want_key = t.pack(codes[t.use_ic])
        ev = t.edge_vid
        nvalues = len(t.values)
        partial_vids = np.fromiter(self.partial, dtype=np.int64, count=len(self.partial))
        mask_of = np.zeros(nvalues, dtype=np.int64)
        mask_of[partial_vids] = np.fromiter(self.partial.values(), dtype=np.int64, count=len(self.partial))
        combiner_of = np.zeros(nvalues, dtype=np.int64)
        combiner_of[partial_vids] = [t.combiner_id[self.combiner[v]] for v in self.partial]
        active = np.flatnonzero((def_key[ev] != want_key) | (mask_of[ev] != 0))
        flowing = np.zeros(len(t.fn.ops), dtype=bool)
        flowing[list(self.flowing_ops)] = True
        reducing = active[(mask_of[ev[active]] != 0) & ~flowing[t.edge_op[active]]]
        self.reduced_vids, first = np.unique(ev[reducing], return_index=True)
        self.reducing = reducing[first]  # per reduced value, in value order: the use that reduces it
        v = ev[self.reducing]
        red_chains, red_index = self._reshardings(v, def_key[v], mask_of[v], combiner_of[v], want_key[self.reducing])
        reduced_key = def_key.copy()
        reduced_key[self.reduced_vids] = np.array([c.reduced for c in red_chains], dtype=np.int64)[red_index]
        # Other active uses: of the reduced value after the reducing use, else of the value as defined.
        self.reduced_at = np.full(nvalues, len(t.edge_op_of), dtype=np.int64)
        self.reduced_at[self.reduced_vids] = self.reducing
        is_reducing = np.zeros(len(t.edge_op_of), dtype=bool)
        is_reducing[self.reducing] = True
        rest = active[~is_reducing[active]]
        v = ev[rest]
        state = np.where(rest > self.reduced_at[v], reduced_key[v], def_key[v])
        zeros = np.zeros(len(rest), dtype=np.int64)
        rest_chains, rest_index = self._reshardings(v, state, zeros, zeros, want_key[rest])
        # Every active use's chain, in program order; those with collectives are the chains.
        chains = red_chains + rest_chains
        index = np.concatenate([red_index, rest_index + len(red_chains)])
        edges = np.concatenate([self.reducing, rest])
        order = np.argsort(edges, kind="stable")
        edges, index = edges[order], index[order]
        counts = np.bincount(index, weights=t.edge_repeat[edges], minlength=len(chains)).astype(np.int64)
        for chain, count in zip(chains, counts.tolist()):
            self._tally(chain.priced, count, by_kind)
        lengths = np.array([len(c.priced.kinds) for c in chains], dtype=np.int64)
        has = lengths[index] > 0
        self.chain_edges, self.chain_index, self.chains = edges[has], index[has], chains
        self.chain_steps = lengths[self.chain_index]
        # Partial results never reduced by a use are reduced after the last op.
        self.end_chains: list[tuple[int, Any]] = []  # (vid, its _Resharding)
        unreduced = set(self.partial).difference(self.reduced_vids.tolist())
        for v in sorted(unreduced.intersection(t.result_order), key=t.result_order.__getitem__):
            chain = t.resharding(v, int(def_key[v]), self.partial[v], self.combiner[v], int(def_key[v]))
            self._tally(chain.priced, 1, by_kind)
            self.end_chains.append((v, chain))

    def _reshardings(self, vids: np.ndarray, states: np.ndarray, masks: np.ndarray, combiners: np.ndarray,
                     wants: np.ndarray) -> tuple[list[Any], np.ndarray]:
        """The distinct reshardings of these uses, each looked up once
        (`CostTable.resharding`), and each use's index among them."""
        if not len(vids):
            return [], np.zeros(0, dtype=np.int64)
        t = self.t
        radix = len(t.axis_tuples) ** t.def_ic.shape[1]
        first, inverse = distinct_rows([(t.type_id[vids], t.num_types), (states, radix), (wants, radix),
                                        (masks * len(t.combiner_names) + combiners,
                                         len(t.mask_axes) * len(t.combiner_names))])
        rows = zip(vids[first].tolist(), states[first].tolist(), masks[first].tolist(), combiners[first].tolist(),
                   wants[first].tolist())
        return [t.resharding(v, s, m, t.combiner_names[c], w) for v, s, m, c, w in rows], inverse

    def _tally(self, priced: Any, count: int, by_kind: Counter[str]) -> None:
        """Add `count` uses' worth of a priced chain to the totals."""
        if not count:
            return
        self.steps += len(priced.kinds) * count
        for kind, seconds in zip(priced.kinds, priced.seconds):
            by_kind[kind] += seconds * count
            if kind in COMMUNICATION:
                self.counts[kind] += count

    def first_step_bytes(self) -> dict[int, int]:
        """Per use with collectives in front of it: the local bytes of the first one's result."""
        return {e: self.chains[k].priced.result_bytes[0]
                for e, k in zip(self.chain_edges.tolist(), self.chain_index.tolist())}

    # ------------------------------------------------------------ memory

    def peak_memory_bytes(self) -> int:
        """Replay the device-local program's positions: op i sits after the
        collectives of its operands' chains (in operand order), a chain that
        only reduces a partial sum right after the sum's op; the partial
        results' reductions follow the last op. Every local value lives from
        its definition to its last read: op results, the reduced value of a
        partial sum (from the step that reduces it), and each collective's
        result (to the next step, the last one to its consumer)."""
        t = self.t
        n = len(t.fn.ops)
        if not n:
            return int(self.value_bytes[: t.num_params].sum())
        steps, chain_op = self.chain_steps, t.edge_op[self.chain_edges]
        # A chain that only reduces a partial sum sits right after the sum's op (`ir.lower`), first
        # among the chains emitted there; the others right before their op, in program order.
        reduces = np.array([c.reduce_count for c in self.chains], dtype=np.int64)[self.chain_index] == steps
        hoisted = reduces & np.isin(self.chain_edges, self.reducing)
        insert = np.where(hoisted, t.edge_vid[self.chain_edges] - t.num_params + 1, chain_op)
        order = np.lexsort((~hoisted, insert))
        before = np.empty_like(steps)
        before[order] = np.cumsum(steps[order]) - steps[order]  # steps of the chains placed before each
        emitted = np.bincount(insert, weights=steps, minlength=n).astype(np.int64)
        op_pos = np.arange(n, dtype=np.int64) + np.cumsum(emitted)
        start = insert + before  # position of each chain's first step
        end_steps = [len(c.priced.kinds) for _, c in self.end_chains]
        end = int(op_pos[-1]) + 1 + sum(end_steps)
        # Where each use reads its value: its chain's first step, or its op.
        read = op_pos[t.edge_op]
        read[self.chain_edges] = start
        # A reduced value's own (partial) form is read up to its reducing use, the reduced form after it.
        grouped = t.edges_by_value
        after = grouped > self.reduced_at[t.edge_vid[grouped]]
        own_last = np.full(len(t.values), -1, dtype=np.int64)
        reduced_last = np.full(len(t.values), -1, dtype=np.int64)
        if len(grouped):
            read = read[grouped]
            own_last[t.used_values] = np.maximum.reduceat(np.where(after, -1, read), t.first_use_of)
            reduced_last[t.used_values] = np.maximum.reduceat(np.where(after, read, -1), t.first_use_of)
        spans = [_temporaries(self.chains, self.chain_index, start, np.cumsum(steps) - steps, op_pos[chain_op]),
                 self._reduced(start, op_pos, reduced_last, end)]
        pos = int(op_pos[-1]) + 1
        for (v, chain), count in zip(self.end_chains, end_steps):
            spans.append(_temporaries([chain], np.zeros(1, np.int64), np.array([pos]), np.zeros(1, np.int64),
                                      np.array([end - 1])))
            spans.append((np.array([pos + chain.reduce_count - 1]), np.array([end - 1]),
                          np.array([chain.priced.result_bytes[-1]])))
            own_last[v] = max(own_last[v], pos)
            pos += count
        # Results live to the end, but a reduced one's own form only to its reduction.
        whole = t.is_result[t.num_params:] & (self.reduced_at[t.num_params:] == len(t.edge_op_of))
        whole[[v - t.num_params for v, _ in self.end_chains if v >= t.num_params]] = False
        lasts = np.where(whole, end - 1, np.maximum(own_last[t.num_params:], op_pos))
        starts = np.concatenate([op_pos] + [s for s, _, _ in spans])
        ends = np.concatenate([lasts] + [e for _, e, _ in spans])
        sizes = np.concatenate([self.value_bytes[t.num_params:]] + [b for _, _, b in spans]).astype(np.float64)
        delta = np.bincount(starts, weights=sizes, minlength=end + 1)[: end + 1]
        delta -= np.bincount(ends + 1, weights=sizes, minlength=end + 2)[: end + 1]
        resident = int(self.value_bytes[: t.num_params].sum())
        return resident + int(np.cumsum(delta[:end]).max())

    def _reduced(self, start: np.ndarray, op_pos: np.ndarray, reduced_last: np.ndarray, end: int):
        """(starts, lasts, bytes) of the partial sums reduced at a use: from
        the step that reduces them to their last read (the end for results)."""
        t = self.t
        at = np.searchsorted(self.chain_edges, self.reducing)
        chain_ids = self.chain_index[at].tolist()
        k = np.array([self.chains[c].reduce_count for c in chain_ids], dtype=np.int64)
        size = np.array([self.chains[c].priced.result_bytes[r - 1] for c, r in zip(chain_ids, k.tolist())],
                        dtype=np.int64)
        first = start[at]
        reduced_at = first + k - 1
        # The reducing chain's later steps read the reduced value; if it has none, its op does.
        own_read = np.where(k < self.chain_steps[at], first + k, op_pos[t.edge_op[self.reducing]])
        vids = self.reduced_vids
        last = np.maximum(np.maximum(reduced_last[vids], own_read), reduced_at)
        return reduced_at, np.where(t.is_result[vids], end - 1, last), size


def _temporaries(chains: Sequence[Any], index: np.ndarray, start: np.ndarray, before: np.ndarray,
                 consumer: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lasts, bytes) of the collective results of the uses whose
    chain is `chains[index[c]]`, first step at `start[c]`: step k's result
    lives to step k + 1, the last one's to the consumer; the step that
    yields a reduced partial sum is not a temporary (`Walk._reduced`).
    `before[c]`: the steps of the uses before c (where c's steps begin in the
    flattened array)."""
    lengths = np.array([len(c.priced.kinds) for c in chains], dtype=np.int64)
    flat = np.array([b for c in chains for b in c.priced.result_bytes], dtype=np.int64)
    offset = np.cumsum(lengths) - lengths
    reduce_count = np.array([c.reduce_count for c in chains], dtype=np.int64)
    steps = lengths[index]
    use = np.repeat(np.arange(len(index)), steps)
    k = np.arange(len(use), dtype=np.int64) - before[use]
    chain = index[use]
    keep = k != reduce_count[chain] - 1
    use, k, chain = use[keep], k[keep], chain[keep]
    at = start[use] + k
    return at, np.where(k + 1 < steps[use], at + 1, consumer[use]), flat[offset[chain] + k]
