"""One evaluation of the tabulated cost model (`costmodel.table`): which
values are partial sums, the collectives of every active use, and the peak
memory of the device-local program's positions, for one plan's codes.

Issue 27: this is what the MCTS calls thousands of times, so it works on
whole arrays (issue 34 levelled the walk over partial sums, `FlowLevels`): the
active uses' resharding keys are made distinct with numpy and each distinct
key is looked up (or priced) once, and the positions, live ranges and the
peak are array expressions over the uses, in place of a Python loop over
every active use and touched value (a 32-layer step has about 850 of each
per plan, and some 30 distinct keys). The rules are the ones the loop
had, which tests/test_table.py checks against the lowered program.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
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


# The partial-sum walks a table keeps (`Walk.partial_sums`): about this many bytes of answers (a byte
# per op for its mask, its combiner and whether a sum flows through it; masks of up to 8 axes).
_PARTIAL_BYTES = 64 << 20
# Levels of at most this many ops are walked op by op in Python (`Walk._walk_small`): cheaper than numpy calls.
_SMALL_LEVEL = 2


def _union(masks: np.ndarray) -> np.ndarray:
    """The bitwise or of each row (columns or-ed one by one: faster than `np.bitwise_or.reduce` on short rows)."""
    out = masks[:, 0].copy()
    for j in range(1, masks.shape[1]):
        out |= masks[:, j]
    return out


def _union_3d(masks: np.ndarray) -> np.ndarray:
    """The bitwise or over the last axis."""
    out = masks[..., 0].copy()
    for j in range(1, masks.shape[-1]):
        out |= masks[..., j]
    return out


@dataclass(frozen=True, slots=True)
class Level:
    """Ops of one level of `FlowLevels`, with what their flows read: per op,
    its operands (value ids, padded with a value that is never partial),
    which of them it reads first, which have other uses, and the I-classes
    of each use's dimensions (padded with the never-sharded one)."""

    ops: np.ndarray
    rows: np.ndarray  # their rows in `FlowLevels.ops`
    operands: np.ndarray | None  # None on level 0: nothing flows into its ops
    first_use: np.ndarray | None
    shared: np.ndarray | None
    can_flow: np.ndarray | None
    use_ic: np.ndarray | None
    signature: np.ndarray | None
    # A level of at most _SMALL_LEVEL ops, walked in Python (`Walk._walk_small`): per op (op, row,
    # operands, first use, shared, can flow, each operand's use's I-classes); else None.
    small: tuple | None = None


class FlowLevels:
    """The ops of a program that may ever hold a partial sum, whatever the
    sharding: those with a reduction factor, and those that may carry one
    (`ir.lower.FLOWING_KINDS`) read first and only by them from such an op.
    They are levelled so that an op's partial operands come from lower
    levels: level 0 has none, an op's level is one more than its feeders'
    highest. A walk in level order therefore sees every op after what it
    reads, as the lowering's program order does, and each level is one
    array step (issue 34: the op-by-op walk was a third of an MCTS
    evaluation on 80 layers)."""

    def __init__(self, t: Any) -> None:
        first, n = t.num_params, len(t.fn.ops)
        has_reduction = (t.reduction_ic != t._sentinel).any(axis=1).tolist()
        level = [-1] * n  # -1: never partial
        for i in range(n):
            feeders = [v - first for v in t.op_vids[i] if v >= first and t.first_user[v] == i and level[v - first] >= 0]
            carries = t.can_flow[i] and any(t.use_count_of[p + first] == 1 for p in feeders)
            if has_reduction[i] or carries:
                level[i] = 1 + max((level[p] for p in feeders), default=-1)
        levels = np.array(level, dtype=np.int64)
        self.ops = np.flatnonzero(levels >= 0)
        self.reduction_ic = t.reduction_ic[self.ops]
        self.values = t.num_params + self.ops
        self.combiner = np.array([t.combiner_id[t.op_combiner[i]] for i in self.ops.tolist()], dtype=np.int64)
        padding, never = len(t.values), t._sentinel
        width = t.use_ic.shape[1]
        first_user = np.append(np.array(t.first_user, dtype=np.int64), -1)
        use_count = np.append(t.use_count, 1)
        self.levels: list[Level] = []
        for d in range(int(levels.max(initial=-1)) + 1):
            rows = np.flatnonzero(levels[self.ops] == d)
            ops_here = self.ops[rows]
            if d == 0:
                self.levels.append(Level(ops_here, rows, None, None, None, None, None, None))
                continue
            slots = max(len(t.op_edges[i]) for i in ops_here.tolist())
            operands = np.full((len(ops_here), slots), padding, dtype=np.int64)
            use_ic = np.full((len(ops_here), slots, width), never, dtype=np.int64)
            for r, i in enumerate(ops_here.tolist()):
                edges = t.op_edges[i]
                operands[r, : len(edges)] = t.op_vids[i]
                use_ic[r, : len(edges)] = t.use_ic[edges.start: edges.stop]
            self.levels.append(_with_small(t, Level(
                ops_here, rows, operands, first_user[operands] == ops_here[:, None], use_count[operands] != 1,
                np.array([t.can_flow[i] for i in ops_here.tolist()], dtype=bool), use_ic, t.op_signature[ops_here])))
        self._read_iclasses()

    def _read_iclasses(self) -> None:
        """Every I-class the walk reads the code of: its answer is a function of their codes alone."""
        self.iclasses = np.unique(np.concatenate([self.reduction_ic.ravel()] + [
            level.use_ic.ravel() for level in self.levels if level.use_ic is not None]))

    def folded(self, t: Any, rep_row: np.ndarray) -> FlowLevels:
        """These levels with only the ops that stand for others (`rep_row`:
        per row, the row of the op whose answer it has, in every plan a fold
        holds for: `costmodel.table_fold`), each operand read at the value
        standing for it."""
        keep = np.flatnonzero(rep_row == np.arange(len(self.ops)))
        new_row = np.full(len(self.ops), -1, dtype=np.int64)
        new_row[keep] = np.arange(len(keep))
        read = np.arange(len(t.values) + 1, dtype=np.int64)  # the padding operand last: never partial
        read[self.values] = self.values[rep_row]
        out = object.__new__(FlowLevels)
        out.ops, out.reduction_ic, out.values = self.ops[keep], self.reduction_ic[keep], self.values[keep]
        out.combiner = self.combiner[keep]
        out.levels = []
        for level in self.levels:
            mine = rep_row[level.rows] == level.rows
            if not mine.any():
                continue
            if level.operands is None:
                out.levels.append(Level(level.ops[mine], new_row[level.rows[mine]], None, None, None, None, None, None))
                continue
            out.levels.append(_with_small(t, Level(
                level.ops[mine], new_row[level.rows[mine]], read[level.operands[mine]], level.first_use[mine],
                level.shared[mine], level.can_flow[mine], level.use_ic[mine], level.signature[mine])))
        out._read_iclasses()
        return out


def _with_small(t: Any, level: Level) -> Level:
    """The level, with its ops as Python rows where they are few (`Level.small`)."""
    if len(level.ops) > _SMALL_LEVEL:
        return level
    n = [len(t.op_edges[i]) for i in level.ops.tolist()]
    return dataclasses.replace(level, small=tuple(
        (int(level.ops[r]), int(level.rows[r]), level.operands[r, : n[r]].tolist(), level.first_use[r, : n[r]].tolist(),
         level.shared[r, : n[r]].tolist(), bool(level.can_flow[r]), level.use_ic[r, : n[r]].tolist())
        for r in range(len(level.ops))))


class Walk:
    """One evaluation's dynamic state: partial sums, active uses, positions.
    `t` is the `costmodel.table.CostTable` (typed Any: that module imports
    this one)."""

    def __init__(self, table: Any, codes: np.ndarray) -> None:
        self.t, self.codes = table, codes
        # Per value (and one more, never partial, for padding): the pending partial axes (a bit mask)
        # and the combiner's id (`CostTable.combiner_id`, where the mask is not 0); per op: whether a
        # partial operand flows through it.
        self.mask = np.zeros(len(table.values) + 1, dtype=np.int64)
        self.combiner_id = np.zeros(len(table.values) + 1, dtype=np.int64)
        self.flowing = np.zeros(len(table.fn.ops), dtype=bool)
        self.counts: Counter[str] = Counter()
        self.steps = 0  # collectives (all_slice included) the lowering emits
        self.folded = None  # the fold `communication` priced by, until `unfold`

    @property
    def partial(self) -> dict[int, int]:
        """The partial sums: value id -> pending partial axes (bit mask)."""
        vids = np.flatnonzero(self.mask[:-1])
        return dict(zip(vids.tolist(), self.mask[vids].tolist()))

    # ------------------------------------------------------------ partial sums

    def partial_sums(self, fold: Any = None) -> None:
        """Which values are partial sums, by the lowering's rules: an op's
        result is partial over the axes that shard its reductions, and over
        those a partial operand carries through it (`ir.lower.flowing_partial`:
        every partial operand read here first and only here, a kind that may
        carry it, no use sharding a partial axis). The ops that may ever hold
        a partial sum are walked level by level (`FlowLevels`), each level at
        once, and each distinct case of a flow is decided once. With `fold`
        (`costmodel.table_fold.TableFold`, its orbits holding): only the ops
        standing for others are walked (`TableFold.flow_levels`), and every
        other op has its stand-in's answer (mixtral_8x7b: 176 of 5,369)."""
        t, codes = self.t, self.codes
        levels: FlowLevels = t.flow_levels if fold is None else fold.flow_levels
        memo = t._partial_memo if fold is None else fold.partial_memo
        # The walk's answer follows from the codes of the I-classes it reads: a search meets the same
        # ones again and again (an action on colors no reduction reads), so it is kept per those codes.
        key = codes[levels.iclasses].astype(t.code_dtype).tobytes()
        known = memo.get(key)
        if known is not None:
            self.mask[levels.values], self.combiner_id[levels.values], self.flowing[levels.ops] = known
        else:
            try:
                self._walk_levels(levels)
            except LoweringError:
                if fold is None:
                    raise
                self.mask[:], self.combiner_id[:], self.flowing[:] = 0, 0, False
                self.partial_sums()  # raises the error as the whole walk names it: the first op in program order
            if len(memo) >= max(64, _PARTIAL_BYTES // (3 * len(levels.ops) + 1)):
                del memo[next(iter(memo))]
            memo[key] = (self.mask[levels.values].astype(np.uint8), self.combiner_id[levels.values].astype(np.uint8),
                         self.flowing[levels.ops])
        if fold is not None:
            whole = t.flow_levels
            for out in (self.mask, self.combiner_id):
                out[whole.values] = out[fold.walk_values]
            self.flowing[whole.ops] = self.flowing[fold.walk_values - t.num_params]

    def _walk_levels(self, levels: FlowLevels) -> None:
        t, codes = self.t, self.codes
        own = _union(t.code_mask[codes[levels.reduction_ic]])
        sum_id = t.combiner_id["sum"]
        mask, combiner_id, first = self.mask, self.combiner_id, t.num_params
        wrong: list[int] = []
        seen = False  # a partial sum so far: without one, nothing flows into the levels above
        for level in levels.levels:
            if level.small is not None:
                seen = self._walk_small(level, own, levels.combiner, seen, wrong) or seen
                continue
            mine = own[level.rows]
            flow = self._flows(level) if level.operands is not None and seen else 0
            total = mine | flow
            if not total.any():
                continue
            seen = True
            ops_here = level.ops
            if level.operands is not None:
                self.flowing[ops_here] = flow != 0
                bad = (flow != 0) & (mine != 0) & (levels.combiner[level.rows] != sum_id)
                wrong += ops_here[bad].tolist()
            mask[first + ops_here] = total
            combiner_id[first + ops_here] = np.where(mine != 0, levels.combiner[level.rows], sum_id)
        if wrong:
            i = min(wrong)
            raise LoweringError(f"{t.fn.ops[i].describe()}: cannot combine a flowing sum with a "
                                f"{t.op_combiner[i]} reduction")

    def _walk_small(self, level: Level, own: np.ndarray, combiner: np.ndarray, seen: bool, wrong: list[int]) -> bool:
        """`_walk_levels`'s step for a level of a few ops, op by op in Python
        (mixtral_8x7b's walk has 30 levels of one op: their numpy calls were
        half of it); whether one of them holds a partial sum."""
        t, codes, mask = self.t, self.codes, self.mask
        sum_id = t.combiner_id["sum"]
        any_partial = False
        for i, row, operands, first_use, shared, can_flow, use_ic in level.small:
            mine = int(own[row])
            flow = 0
            if seen and can_flow:
                held = [int(mask[v]) for v in operands]
                read = [h if f else 0 for h, f in zip(held, first_use)]
                if any(read) and not any(r and s for r, s in zip(read, shared)):
                    combiners = [int(self.combiner_id[v]) if h else sum_id for v, h in zip(operands, held)]
                    wanted = []
                    for row_ic in use_ic:
                        m = 0
                        for ic in row_ic:
                            m |= int(t.code_mask[codes[ic]])
                        wanted.append(m)
                    flow = self._flowing_of(i, read, combiners, wanted)
            total = mine | flow
            if not total:
                continue
            any_partial = True
            self.flowing[i] = flow != 0
            if flow and mine and combiner[row] != sum_id:
                wrong.append(i)
            mask[t.num_params + i] = total
            self.combiner_id[t.num_params + i] = combiner[row] if mine else sum_id
        return any_partial

    def _flows(self, level: Level) -> np.ndarray:
        """The partial axes (masks) flowing through the ops of one level, given
        the earlier levels' partial sums."""
        t, mask = self.t, self.mask
        held = mask[level.operands]  # per operand slot: its value's pending axes
        read = np.where(level.first_use, held, 0)  # a partial operand read earlier was reduced there
        flows = level.can_flow & (read != 0).any(axis=1) & ~((read != 0) & level.shared).any(axis=1)
        out = np.zeros(len(level.ops), dtype=np.int64)
        rows = np.flatnonzero(flows)
        if not len(rows):
            return out
        sum_id = t.combiner_id["sum"]
        read = read[rows]
        combiners = np.where(held[rows] != 0, self.combiner_id[level.operands[rows]], sum_id)
        wanted = _union_3d(t.code_mask[self.codes[level.use_ic[rows]]])
        radix, names = len(t.mask_axes), len(t.combiner_names)
        columns = [(level.signature[rows], t.num_signatures)]
        columns += [(read[:, j], radix) for j in range(read.shape[1])]
        columns += [(combiners[:, j], names) for j in range(read.shape[1])]
        columns += [(wanted[:, j], radix) for j in range(read.shape[1])]
        first, inverse = distinct_rows(columns)
        found = np.empty(len(first), dtype=np.int64)
        for n, r in enumerate(first.tolist()):
            found[n] = self._flowing(int(level.ops[rows[r]]), read[r], combiners[r], wanted[r])
        out[rows] = found[inverse]
        return out

    def _flowing(self, i: int, read: np.ndarray, combiners: np.ndarray, wanted: np.ndarray) -> int:
        """The partial axes (mask) flowing through op i with its operands'
        pending axes `read`, their combiners' ids and the axes each use wants
        (padded past its operands); decided by the lowering's
        `flowing_partial`, memoized on what it looks at."""
        n = len(self.t.op_edges[i])
        return self._flowing_of(i, read[:n].tolist(), combiners[:n].tolist(), wanted[:n].tolist())

    def _flowing_of(self, i: int, read: list[int], combiners: list[int], wanted: list[int]) -> int:
        """`_flowing` with one entry per operand, as Python ints."""
        t = self.t
        names = tuple(t.combiner_names[c] for c in combiners)
        key = (t.op_signature_of[i], tuple(read), names, tuple(wanted))
        flowing = t._flow_memo.get(key)
        if flowing is None:
            wants = [t.want_dims(e, self.codes) for e in t.op_edges[i]]
            axes = flowing_partial(t.fn.ops[i], [t.mask_axes[m] for m in key[1]], names, wants)
            flowing = t._flow_memo[key] = sum(t.axis_bit[a] for a in axes)
        return flowing

    # ------------------------------------------------------------ communication

    def communication(self, by_kind: Counter[str], fold: Any = None) -> None:
        """Price the collectives of every active use (a use whose wanted
        sharding differs from its value's, or of a partial sum). A partial
        sum is reduced at its first use by an op it does not flow through
        (the lowering reduces once); its later uses reshard the reduced value.
        Shardings are packed into one integer per value or use
        (`CostTable.pack`), so repeated layers share a key. `fold`
        (`costmodel.table_fold.TableFold`, its orbits holding): only each
        orbit's representative use is looked at, counted for the orbit."""
        t, codes = self.t, self.codes
        ev = t.edge_vid
        nvalues = len(t.values)
        mask_of, combiner_of = self.mask[:nvalues], self.combiner_id[:nvalues]
        if fold is None:
            def_key = t.pack(codes[t.def_ic])
            want_key = t.pack(codes[t.use_ic])
            active = np.flatnonzero((def_key[ev] != want_key) | (mask_of[ev] != 0))
            weight = t.edge_repeat
        else:  # the keys of the values and uses the orbits' first uses read; nothing else is read
            def_key = np.zeros(nvalues, dtype=np.int64)
            def_key[fold.values] = t.pack(codes[fold.def_ic])
            want_key = np.zeros(len(ev), dtype=np.int64)
            want_key[fold.edges] = t.pack(codes[fold.use_ic])
            firsts = fold.edges
            active = firsts[(def_key[ev[firsts]] != want_key[firsts]) | (mask_of[ev[firsts]] != 0)]
            weight = t.edge_repeat * fold.edge_weight
        reducing = active[(mask_of[ev[active]] != 0) & ~self.flowing[t.edge_op[active]]]
        self.reduced_vids, first = np.unique(ev[reducing], return_index=True)
        self.reducing = reducing[first]  # per reduced value, in value order: the use that reduces it
        v = ev[self.reducing]
        red_chains, red_index = self._reshardings(v, def_key[v], mask_of[v], combiner_of[v], want_key[self.reducing])
        reduced_key = def_key.copy()
        reduced_key[self.reduced_vids] = np.array([c.reduced for c in red_chains], dtype=np.int64)[red_index]
        # Other active uses: of the reduced value after the reducing use, else of the value as defined.
        self.reduced_at = np.full(nvalues, len(t.edge_op_of), dtype=np.int64)
        self.reduced_at[self.reduced_vids] = self.reducing
        self.is_reducing = is_reducing = np.zeros(len(t.edge_op_of), dtype=bool)
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
        counts = np.bincount(index, weights=weight[edges], minlength=len(chains)).astype(np.int64)
        for chain, count in zip(chains, counts.tolist()):
            self._tally(chain.priced, count, by_kind)
        lengths = np.array([len(c.priced.kinds) for c in chains], dtype=np.int64)
        has = lengths[index] > 0
        # With a fold, the orbits' first uses: every use of an orbit has its first use's chain (`unfold`).
        self.chain_edges, self.chain_index, self.chains = edges[has], index[has], chains
        self.folded, self.chain_lengths = fold, lengths
        self.chain_steps = lengths[self.chain_index]
        # Partial results never reduced by a use are reduced after the last op (with a fold, a value is
        # reduced where its group's first value is: `TableFold.value_rep`).
        self.end_chains: list[tuple[int, Any]] = []  # (vid, its _Resharding)
        results = t.results_by_rank  # the program's results that are values, in the order returned
        reduced = np.zeros(nvalues, dtype=bool)
        reduced[self.reduced_vids] = True
        at = results if fold is None else fold.value_rep[results]
        for v in results[(mask_of[results] != 0) & ~reduced[at]].tolist():
            chain = t.resharding(v, int(def_key[v]), int(mask_of[v]), t.combiner_names[combiner_of[v]],
                                 int(def_key[v]))
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

    def unfold(self) -> None:
        """The uses with collectives one by one, and the uses that reduce a
        partial sum, where `communication` had a fold."""
        fold = self.folded
        if fold is None:
            return
        self.chain_edges, self.chain_index = fold.expand(self.chain_edges, self.chain_index)
        self.chain_steps = self.chain_lengths[self.chain_index]
        reducing, _ = fold.expand(self.reducing, np.zeros(len(self.reducing), dtype=np.int64))
        t = self.t
        self.reduced_vids, first = np.unique(t.edge_vid[reducing], return_index=True)
        self.reducing = reducing[first]
        self.reduced_at = np.full(len(t.values), len(t.edge_op_of), dtype=np.int64)
        self.reduced_at[self.reduced_vids] = self.reducing
        self.is_reducing = np.zeros(len(t.edge_op_of), dtype=bool)
        self.is_reducing[self.reducing] = True
        self.folded = None

    def first_step_bytes(self) -> dict[int, int]:
        """Per use with collectives in front of it: the local bytes of the first one's result."""
        self.unfold()
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
        value_bytes = t.value_bytes(self.codes, self.folded)
        self.unfold()
        if not n:
            return int(value_bytes[: t.num_params].sum())
        steps, chain_op = self.chain_steps, t.edge_op[self.chain_edges]
        # Per distinct chain: how many of its steps reduce a partial sum, and the reduced value's bytes.
        reduce_count = np.array([c.reduce_count for c in self.chains], dtype=np.int64)
        reduced_bytes = np.array([c.priced.result_bytes[c.reduce_count - 1] if c.priced.result_bytes else 0
                                  for c in self.chains], dtype=np.int64)
        # A chain that only reduces a partial sum sits right after the sum's op (`ir.lower`), first
        # among the chains emitted there; the others right before their op, in program order.
        hoisted = (reduce_count[self.chain_index] == steps) & self.is_reducing[self.chain_edges]
        insert = np.where(hoisted, t.edge_vid[self.chain_edges] - t.num_params + 1, chain_op)
        order = np.lexsort((~hoisted, insert))
        before = np.empty_like(steps)
        before[order] = np.cumsum(steps[order]) - steps[order]  # steps of the chains placed before each
        emitted = np.bincount(insert, weights=steps, minlength=n).astype(np.int64)
        op_pos = np.arange(n, dtype=np.int64) + np.cumsum(emitted)
        start = insert + before  # position of each chain's first step
        end_steps = [len(c.priced.kinds) for _, c in self.end_chains]
        end = int(op_pos[-1]) + 1 + sum(end_steps)
        # Where each value is last read: its last reader's position, but for the values a chain reads or a
        # use reduces (`_last_reads`), whose uses are looked at one by one.
        own_last = np.where(t.last_user >= 0, op_pos[t.last_user], -1)
        reduced_last = np.full(len(t.values), -1, dtype=np.int64)
        self._last_reads(op_pos, start, own_last, reduced_last)
        spans = [_temporaries(self.chains, self.chain_index, start, np.cumsum(steps) - steps, op_pos[chain_op]),
                 self._reduced(start, op_pos, reduced_last, end, reduce_count, reduced_bytes)]
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
        sizes = np.concatenate([value_bytes[t.num_params:]] + [b for _, _, b in spans]).astype(np.float64)
        delta = np.bincount(starts, weights=sizes, minlength=end + 1)[: end + 1]
        delta -= np.bincount(ends + 1, weights=sizes, minlength=end + 2)[: end + 1]
        resident = int(value_bytes[: t.num_params].sum())
        return resident + int(np.cumsum(delta[:end]).max())

    def _last_reads(self, op_pos: np.ndarray, start: np.ndarray, own_last: np.ndarray,
                    reduced_last: np.ndarray) -> None:
        """Set the last reads of the values a chain reads or a use reduces: a
        use reads its value at its chain's first step (`start`, per chain
        use), else at its op; a reduced value's own (partial) form is read up
        to its reducing use, the reduced form after it. Every other value is
        last read by its last reader's op (a chain sits before its op, after
        the op before). Only these values' uses are looked at: on 80 layers
        the replay looked at all 56,000."""
        t = self.t
        marked = np.zeros(len(t.values), dtype=bool)
        marked[t.edge_vid[self.chain_edges]] = True
        marked[self.reduced_vids] = True
        touched = np.flatnonzero(marked)
        if not len(touched):
            return
        begin, count = t.value_use_start[touched], t.value_use_start[touched + 1] - t.value_use_start[touched]
        offsets = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        uses = t.uses_by_value[np.repeat(begin, count) + offsets]
        read_at = op_pos[t.edge_op]  # per use, where it reads: its op, or its chain's first step
        read_at[self.chain_edges] = start
        read = read_at[uses]
        after = uses > self.reduced_at[t.edge_vid[uses]]
        segments = np.cumsum(count) - count
        own_last[touched] = np.maximum.reduceat(np.where(after, -1, read), segments)
        reduced_last[touched] = np.maximum.reduceat(np.where(after, read, -1), segments)

    def _reduced(self, start: np.ndarray, op_pos: np.ndarray, reduced_last: np.ndarray, end: int,
                 reduce_count: np.ndarray, reduced_bytes: np.ndarray):
        """(starts, lasts, bytes) of the partial sums reduced at a use: from
        the step that reduces them to their last read (the end for results).
        `reduce_count`, `reduced_bytes`: per distinct chain."""
        t = self.t
        at = np.searchsorted(self.chain_edges, self.reducing)
        chain_ids = self.chain_index[at]
        k, size = reduce_count[chain_ids], reduced_bytes[chain_ids]
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
