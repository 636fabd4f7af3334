"""The tabulated cost model: a plan's cost from its factor sharding alone,
without building the device-local program. This is what the search
backends evaluate (MCTS thousands of times; CP-SAT reads the same terms).

A factor sharding is given as one small integer per I-class, its *code*: the
index of its tuple of mesh axes among all ordered tuples of distinct axes
(`CostTable.axis_tuples`; code 0 is unsharded). Then:

  - ops the device-local program would fuse are priced as kernels
    (`costmodel.table_kernels`: the global program's kernels, cut where a
    collective sits on a use); every other op's compute time depends only on its kind, types and attributes
    (its *signature*) and the codes of its factors: ops are keyed by
    (signature, factor codes) with numpy, and each distinct key is priced
    once by the registry's cost function on the local types and memoized,
    so repeated layers cost one lookup;
  - a value's local bytes are its global bytes over the product of the
    group sizes of its dimensions' codes;
  - communication happens only on *active* edges: uses whose wanted
    sharding differs from the value's definition, and uses of partial sums.
    Which values are partial, where a partial sum flows through a linear
    op and where it is reduced is decided by walking only the ops that
    touch a partial sum, with the lowering's own rules
    (`ir.lower.flowing_partial`); each active edge's collectives are the
    lowering's own steps (`ir.lower.reduce_steps`, `redistribute_steps`),
    priced by `costmodel.evaluate.op_time_s` and memoized;
  - peak memory replays the device-local program's positions: each op
    preceded by the collectives of its active edges, every local value
    (results, reduced partial sums, collective temporaries) live from its
    definition to its last use, as `costmodel.evaluate.peak_memory_bytes`
    counts them on the lowered program.

The contract (tests/test_table.py): for any factor sharding of the
program, `CostTable.evaluate` equals `evaluate(lower(...).function)` (times
up to float rounding of the summation order, peak memory exactly).
Modelled lowering: the default `LowerOptions()` (resharding at each use).
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.evaluate import COMMUNICATION, Cost, make_cost, op_time_s
from costmodel.hardware import Hardware
from costmodel.table_kernels import FusedKernels
from ir import ops
from ir.core import Function, IRError, Mesh, TensorType
from ir.lower import FLOWING_KINDS, LoweringError, Step, flowing_partial, redistribute_steps, reduce_steps
from ir.nda import NDA
from ir.sharding import DimAxes, FactorSharding, axis_tuples, local_type

# Combined integer keys must stay below this (int64, with room to spare).
_KEY_LIMIT = 1 << 62


@dataclass(frozen=True, slots=True)
class _ChainCost:
    """The priced steps of one resharding: per step its kind, time and result bytes."""

    kinds: tuple[str, ...]
    seconds: tuple[float, ...]
    result_bytes: tuple[int, ...]


class CostTable:
    """Per-op and per-edge cost terms of one global program on one mesh and
    hardware, evaluated for any factor sharding (see the module docstring).

    Not a frozen value: it memoizes the terms it has priced, which is the
    point of it. Evaluations are deterministic and independent of the order
    in which plans are evaluated."""

    def __init__(self, fn: Function, nda: NDA, mesh: Mesh, hardware: Hardware) -> None:
        if nda.function is not fn:
            raise IRError("the NDA was computed for a different function")
        for op in fn.ops:
            if ops.get(op.kind).is_collective or len(op.results) != 1:
                raise IRError(f"{op.describe()}: the cost table needs a global program of single-result ops")
        self.fn, self.nda, self.mesh, self.hardware = fn, nda, mesh, hardware
        self.axis_tuples = axis_tuples(mesh)
        self.code_of = {t: c for c, t in enumerate(self.axis_tuples)}
        self.code_size = np.array([mesh.group_size(t) for t in self.axis_tuples], dtype=np.int64)
        bit = {a: 1 << k for k, a in enumerate(mesh.names)}
        self.code_mask = np.array([sum(bit[a] for a in t) for t in self.axis_tuples], dtype=np.int64)
        self.mask_axes = {m: tuple(a for a in mesh.names if m & bit[a]) for m in range(1 << len(mesh.axes))}
        self._sentinel = len(nda.iclasses)  # an extra I-class that is never sharded
        self._index_values()
        self._index_edges()
        self.op_signature_of: list[int] = []
        self._index_ops()
        self._op_memo: dict[tuple, tuple[float, str, int]] = {}
        self._chain_memo: dict[tuple, _Resharding] = {}
        self._flow_memo: dict[tuple, int] = {}
        # Plain lists for the Python walks (numpy scalars are slow to index one by one).
        self.axis_bit = bit
        self.edge_vid_of = self.edge_vid.tolist()
        self.edge_op_of = self.edge_op.tolist()
        self.op_vids = [[self.edge_vid_of[e] for e in es] for es in self.op_edges]
        self.first_user = [us[0] if us else -1 for us in self.users]
        self.use_count_of = self.use_count.tolist()
        # The user a partial sum can flow through: its only use, of a kind that may carry it. At any
        # other user (or with several uses) it is reduced, which `communication` finds.
        self.can_flow = [op.kind in FLOWING_KINDS for op in fn.ops]
        self.flow_users = [us if len(us) == 1 and count == 1 and self.can_flow[us[0]] else []
                           for us, count in zip(self.users, self.use_count_of)]
        self.kernels = FusedKernels(self)
        # Ops a kernel fuses are priced with it, not alone.
        self.op_groups = [(count, members[keep], factors[keep]) for count, members, factors in self.op_groups
                          if (keep := ~self.kernels.fused[members]).any()]
        types: dict[TensorType, int] = {}
        self.type_id_of = [types.setdefault(v.type, len(types)) for v in self.values]
        if len(self.axis_tuples) ** self.def_ic.shape[1] >= _KEY_LIMIT:
            raise NotImplementedError(f"the cost table packs a tensor's sharding into one integer: a mesh of "
                                      f"{len(mesh.axes)} axes with tensors of rank {self.def_ic.shape[1]} is too large")
        self._powers = np.array([len(self.axis_tuples) ** d for d in range(self.def_ic.shape[1])], dtype=np.int64)

    # ------------------------------------------------------------ static structure

    def _index_values(self) -> None:
        fn, nda = self.fn, self.nda
        self.values = list(fn.params) + [op.results[0] for op in fn.ops]
        self.vid = {v: k for k, v in enumerate(self.values)}
        self.num_params = len(fn.params)
        rank = max((v.type.rank for v in self.values), default=0)
        self.def_ic = np.full((len(self.values), max(rank, 1)), self._sentinel, dtype=np.int64)
        for k, v in enumerate(self.values):
            base = nda.def_base[v]
            self.def_ic[k, : v.type.rank] = nda.name_iclass[base: base + v.type.rank]
        self.global_bytes = np.array([v.type.num_bytes for v in self.values], dtype=np.int64)
        self.result_vids = [self.vid[r] for r in fn.results]

    def _index_edges(self) -> None:
        fn, nda = self.fn, self.nda
        edge_op, edge_vid, rows = [], [], []
        self.op_edges: list[range] = []
        width = self.def_ic.shape[1]
        for i, op in enumerate(fn.ops):
            first = len(edge_op)
            for j, o in enumerate(op.operands):
                edge_op.append(i)
                edge_vid.append(self.vid[o])
                row = [self._sentinel] * width
                base = nda.use_base[i][j]
                row[: o.type.rank] = nda.name_iclass[base: base + o.type.rank]
                rows.append(row)
            self.op_edges.append(range(first, len(edge_op)))
        self.edge_op = np.array(edge_op, dtype=np.int64)
        self.edge_vid = np.array(edge_vid, dtype=np.int64)
        self.use_ic = np.array(rows, dtype=np.int64).reshape(len(edge_op), width)
        self.edges_of: list[list[int]] = [[] for _ in self.values]
        for e, v in enumerate(edge_vid):
            self.edges_of[v].append(e)
        self.use_count = np.bincount(self.edge_vid, minlength=len(self.values))
        self.is_result = np.zeros(len(self.values), dtype=bool)
        self.is_result[self.result_vids] = True
        self.use_count = self.use_count + np.bincount(self.result_vids, minlength=len(self.values))
        self.users = [sorted({edge_op[e] for e in es}) for es in self.edges_of]
        last_user = np.full(len(self.values), -1, dtype=np.int64)
        np.maximum.at(last_user, self.edge_vid, self.edge_op)
        self.last_user = last_user

    def _index_ops(self) -> None:
        fn, nda = self.fn, self.nda
        signatures: dict[tuple, int] = {}
        self.op_signature = np.zeros(len(fn.ops), dtype=np.int64)
        by_count: dict[int, list[int]] = defaultdict(list)
        reductions: list[list[int]] = []
        self.op_combiner: list[str] = []
        for i, op in enumerate(fn.ops):
            key = (op.kind, op.attrs, tuple(v.type for v in op.operands), op.results[0].type)
            self.op_signature[i] = signatures.setdefault(key, len(signatures))
            factors = nda.op_factor_iclass[i]
            by_count[len(factors)].append(i)
            rule = ops.factor_rule(op)
            red = [k if k >= 0 else self._sentinel
                   for f, k in zip(rule.factors, factors) if f.kind is ops.FactorKind.REDUCTION]
            reductions.append(red)
            combiners = [f.combiner or "sum" for f in rule.factors if f.kind is ops.FactorKind.REDUCTION]
            self.op_combiner.append(combiners[-1] if combiners else "sum")
        self.num_signatures = len(signatures)
        self.op_signature_of = self.op_signature.tolist()
        self.op_groups = []  # (factor count, op indices, factor I-classes)
        for count in sorted(by_count):
            members = np.array(by_count[count], dtype=np.int64)
            factors = np.array([[k if k >= 0 else self._sentinel for k in nda.op_factor_iclass[i]]
                                for i in members], dtype=np.int64).reshape(len(members), count)
            self.op_groups.append((count, members, factors))
        width = max((len(r) for r in reductions), default=0)
        self.reduction_ic = np.full((len(fn.ops), max(width, 1)), self._sentinel, dtype=np.int64)
        for i, red in enumerate(reductions):
            self.reduction_ic[i, : len(red)] = red

    # ------------------------------------------------------------ packed shardings

    def pack(self, row_codes: np.ndarray) -> np.ndarray:
        """Rows of per-dimension codes (padded with 0) as one integer each."""
        return row_codes @ self._powers

    def pack_dims(self, dims: DimAxes) -> int:
        return sum(self.code_of[a] * int(p) for a, p in zip(dims, self._powers))

    def unpack(self, key: int, rank: int) -> DimAxes:
        base = len(self.axis_tuples)
        return tuple(self.axis_tuples[(key // base ** d) % base] for d in range(rank))

    # ------------------------------------------------------------ plans

    def codes(self, sharding: FactorSharding) -> np.ndarray:
        """A factor sharding as codes, one per I-class."""
        if sharding.mesh != self.mesh:
            raise IRError(f"the sharding is over {sharding.mesh}, the table over {self.mesh}")
        return np.fromiter(map(self.code_of.__getitem__, sharding.axes), dtype=np.int64, count=len(sharding.axes))

    def sharding(self, codes: np.ndarray) -> FactorSharding:
        return FactorSharding(self.mesh, tuple(self.axis_tuples[c] for c in codes))

    def evaluate(self, plan: FactorSharding | np.ndarray) -> Cost:
        """The cost of the program partitioned by `plan` (a FactorSharding or its codes)."""
        codes = self.codes(plan) if isinstance(plan, FactorSharding) else np.asarray(plan, dtype=np.int64)
        if codes.shape != (len(self.nda.iclasses),):
            raise IRError(f"expected {len(self.nda.iclasses)} I-class codes, got shape {codes.shape}")
        codes = np.append(codes, 0)  # the sentinel I-class
        by_kind: Counter[str] = Counter()
        flops = self._compute(codes, by_kind)
        value_bytes = self.global_bytes // np.prod(self.code_size[codes[self.def_ic]], axis=1)
        run = _Run(self, codes, value_bytes)
        run.partial_sums()
        run.communication(by_kind)
        cut = [c.edge for chains in run.chains.values() for c in chains]
        fused_flops, fused_kernels, fused_ops = self.kernels.evaluate(codes, cut, by_kind)
        kernels = int(len(self.fn.ops) - self.kernels.fused.sum()) + fused_kernels + run.steps
        peak = run.peak_memory_bytes()
        return make_cost(by_kind, peak, flops + fused_flops, run.counts, self.hardware, kernels, fused_ops)

    def partial_masks(self, codes: np.ndarray) -> dict[int, int]:
        """Which values of the plan `codes` (with the sentinel) are partial sums:
        value id -> the mesh axes pending (a bit mask, `mask_axes`)."""
        return dict(self._walk(codes, communication=False).partial)

    def first_step_bytes(self, codes: np.ndarray) -> dict[int, int]:
        """Per use (edge) with collectives in front of it under the plan `codes`
        (with the sentinel): the local bytes of the first one's result."""
        run = self._walk(codes, communication=True)
        return {c.edge: c.priced.result_bytes[0] for chains in run.chains.values() for c in chains}

    def _walk(self, codes: np.ndarray, communication: bool) -> _Run:
        value_bytes = self.global_bytes // np.prod(self.code_size[codes[self.def_ic]], axis=1)
        run = _Run(self, codes, value_bytes)
        run.partial_sums()
        if communication:
            run.communication(Counter())
        return run

    # ------------------------------------------------------------ compute terms

    def _compute(self, codes: np.ndarray, by_kind: Counter[str]) -> int:
        """Add every op's roofline time to `by_kind`; return the flops per device."""
        base = len(self.axis_tuples)
        flops = 0
        for count, members, factors in self.op_groups:
            local = codes[factors]
            if self.num_signatures * base ** count < _KEY_LIMIT:
                keys = self.op_signature[members] * base ** count
                for f in range(count):
                    keys = keys + local[:, f] * base ** f
                uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            else:  # a large mesh: compare rows instead of packing them into one integer
                rows = np.column_stack([self.op_signature[members], local])
                uniq, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
                uniq = [tuple(r) for r in uniq]
            multiplicity = np.bincount(inverse.reshape(-1), minlength=len(first))
            for key, rep, times in zip(uniq, first, multiplicity):
                memo_key = (count, key if isinstance(key, tuple) else int(key))
                term = self._op_memo.get(memo_key)
                if term is None:
                    term = self._op_memo[memo_key] = self.price_op(int(members[rep]), codes)
                seconds, kind, op_flops = term
                by_kind[kind] += seconds * int(times)
                flops += op_flops * int(times)
        return flops

    def _dims(self, row: np.ndarray, rank: int, codes: np.ndarray) -> DimAxes:
        return tuple(self.axis_tuples[c] for c in codes[row[:rank]])

    def def_dims(self, vid: int, codes: np.ndarray) -> DimAxes:
        return self._dims(self.def_ic[vid], self.values[vid].type.rank, codes)

    def want_dims(self, edge: int, codes: np.ndarray) -> DimAxes:
        return self._dims(self.use_ic[edge], self.values[self.edge_vid[edge]].type.rank, codes)

    def price_op(self, i: int, codes: np.ndarray) -> tuple[float, str, int]:
        """Roofline time, kind and flops of op i on the local types `codes` give it."""
        op = self.fn.ops[i]
        operands = tuple(local_type(self.values[self.edge_vid[e]].type, self.want_dims(e, codes), self.mesh)
                         for e in self.op_edges[i])
        result = local_type(op.results[0].type, self.def_dims(self.num_params + i, codes), self.mesh)
        opdef = ops.get(op.kind)
        attrs = opdef.localize(op.attrs, operands, (result,))
        seconds, flops = op_time_s(op.kind, attrs, operands, (result,), self.mesh, self.hardware)
        return seconds, op.kind, flops

    def resharding(self, v: int, state: int, mask: int, combiner: str, want: int) -> _Resharding:
        """The lowering's collectives for value `v` from packed sharding `state`
        (with pending partial axes `mask`, reduced first) to packed `want`,
        priced and memoized."""
        key = (self.type_id_of[v], state, mask, combiner, want)
        chain = self._chain_memo.get(key)
        if chain is None:
            ty = self.values[v].type
            dims, wanted = self.unpack(state, ty.rank), self.unpack(want, ty.rank)
            steps = reduce_steps(dims, self.mask_axes[mask], combiner, wanted) if mask else []
            reduce_count = len(steps)
            after = steps[-1].dims if steps else dims
            if after != wanted:
                steps += redistribute_steps(after, wanted)
            chain = _Resharding(self.price_chain(ty, dims, steps), reduce_count, self.pack_dims(after))
            self._chain_memo[key] = chain
        return chain

    def price_chain(self, ty: TensorType, dims: DimAxes, steps: Sequence[Step]) -> _ChainCost:
        """Time and result bytes of each collective of a resharding of a value of type `ty`."""
        kinds, seconds, sizes = [], [], []
        before = local_type(ty, dims, self.mesh)
        for step in steps:
            after = local_type(ty, step.dims, self.mesh)
            attrs = ops.normalize_attrs(step.kind, dict(step.attrs))
            t, _ = op_time_s(step.kind, attrs, (before,), (after,), self.mesh, self.hardware)
            kinds.append(step.kind)
            seconds.append(t)
            sizes.append(after.num_bytes)
            before = after
        return _ChainCost(tuple(kinds), tuple(seconds), tuple(sizes))


class _Run:
    """One evaluation's dynamic state: partial sums, active edges, positions."""

    def __init__(self, table: CostTable, codes: np.ndarray, value_bytes: np.ndarray) -> None:
        self.t, self.codes, self.value_bytes = table, codes, value_bytes
        self.partial: dict[int, int] = {}  # vid -> pending partial axes (bit mask)
        self.combiner: dict[int, str] = {}
        self.flowing_ops: set[int] = set()  # ops a partial operand flows through
        self.counts: Counter[str] = Counter()
        self.steps = 0  # collectives (all_slice included) the lowering emits

    def partial_sums(self) -> None:
        """Which values are partial sums: walk, in program order, only the ops
        that own a sharded reduction or consume a partial value. Partial axes
        are bit masks over the mesh axes here."""
        t, codes = self.t, self.codes
        own = np.bitwise_or.reduce(t.code_mask[codes[t.reduction_ic]], axis=1)
        self.want_mask = np.bitwise_or.reduce(t.code_mask[codes[t.use_ic]], axis=1).tolist()
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
        key = (t.op_signature_of[i], masks, combiners, tuple(self.want_mask[e] for e in edges))
        flowing = t._flow_memo.get(key)
        if flowing is None:
            wants = [t.want_dims(e, self.codes) for e in edges]
            axes = flowing_partial(t.fn.ops[i], [t.mask_axes[m] for m in masks], combiners, wants)
            flowing = t._flow_memo[key] = sum(t.axis_bit[a] for a in axes)
        if flowing:
            self.flowing_ops.add(i)
        return flowing

    def communication(self, by_kind: Counter[str]) -> None:
        """Price the collectives of every active edge, in program order.
        Shardings are packed into one integer per value or use here
        (`CostTable.pack`), so repeated layers hit the memo."""
        t, codes = self.t, self.codes
        def_key = t.pack(codes[t.def_ic])
        want_key = t.pack(codes[t.use_ic])
        partial = np.zeros(len(t.values), dtype=bool)
        partial[list(self.partial)] = True
        active = np.flatnonzero((def_key[t.edge_vid] != want_key) | partial[t.edge_vid]).tolist()
        def_key, want_key = def_key.tolist(), want_key.tolist()
        self.chains: dict[int, list[_Chain]] = defaultdict(list)  # op -> its operands' chains, in order
        self.reduced: dict[int, tuple[int, int]] = {}  # vid -> (packed dims once reduced, reducing edge or -1)
        uses: dict[int, list] = {}  # id of a priced chain -> [the chain, how many uses it serves]
        for e in active:
            v, i = t.edge_vid_of[e], t.edge_op_of[e]
            if v in self.reduced:
                state, mask, combiner = self.reduced[v][0], 0, "sum"
            elif v in self.partial and i not in self.flowing_ops:
                state, mask, combiner = def_key[v], self.partial[v], self.combiner[v]
            else:  # not partial, or flowing through op i unreduced
                state, mask, combiner = def_key[v], 0, "sum"
            chain = t.resharding(v, state, mask, combiner, want_key[e])
            if mask:
                self.reduced[v] = (chain.reduced, e)
            if chain.priced.kinds:
                entry = uses.setdefault(id(chain.priced), [chain.priced, 0])
                entry[1] += 1
                self.chains[i].append(_Chain(e, v, chain.priced, chain.reduce_count))
        for priced, count in uses.values():
            self._tally(priced, count, by_kind)
        self.end_chains: list[_Chain] = []  # partial results reduced after the last op
        for v in t.result_vids:
            if v in self.partial and v not in self.reduced:
                state = def_key[v]
                chain = t.resharding(v, state, self.partial[v], self.combiner[v], state)
                self.reduced[v] = (chain.reduced, -1)
                self._tally(chain.priced, 1, by_kind)
                self.end_chains.append(_Chain(-1, v, chain.priced, chain.reduce_count))

    def _tally(self, priced: _ChainCost, count: int, by_kind: Counter[str]) -> None:
        """Add `count` uses' worth of a priced chain to the totals."""
        self.steps += len(priced.kinds) * count
        for kind, seconds in zip(priced.kinds, priced.seconds):
            by_kind[kind] += seconds * count
            if kind in COMMUNICATION:
                self.counts[kind] += count

    # ------------------------------------------------------------ memory

    def peak_memory_bytes(self) -> int:
        """Replay the device-local program's positions (module docstring):
        op i sits after the collectives of its operands' chains; the partial
        results' reductions follow the last op."""
        t = self.t
        n = len(t.fn.ops)
        emitted = np.zeros(n, dtype=np.int64)
        for i, chains in self.chains.items():
            emitted[i] = sum(len(c.priced.kinds) for c in chains)
        op_pos = np.arange(n, dtype=np.int64) + np.cumsum(emitted)
        end = (int(op_pos[-1]) + 1 if n else 0) + sum(len(c.priced.kinds) for c in self.end_chains)
        # Untouched values: from their op to their last user's op, or to the end.
        lasts = np.where(t.last_user[t.num_params:] >= 0, op_pos[np.maximum(t.last_user[t.num_params:], 0)], op_pos)
        lasts = np.where(t.is_result[t.num_params:], end - 1, lasts)
        spans = _Spans()
        position = op_pos.tolist()
        chain_at: dict[int, tuple[int, _Chain]] = {}  # edge -> (position of its first step, chain)
        for i in sorted(self.chains):
            pos = position[i] - int(emitted[i])
            for c in self.chains[i]:
                chain_at[c.edge] = (pos, c)
                spans.temporaries(pos, c, position[i])
                pos += len(c.priced.kinds)
        pos = position[-1] + 1 if n else 0
        end_at: dict[int, tuple[int, _Chain]] = {}  # vid -> (position of its first step, chain)
        for c in self.end_chains:
            end_at[c.value] = (pos, c)
            spans.temporaries(pos, c, end - 1)
            pos += len(c.priced.kinds)
        touched = {c.value for chains in self.chains.values() for c in chains} | set(self.reduced)
        for v in sorted(touched):
            own_last, reduced = self._reads(v, position, chain_at, end_at)
            if reduced is not None:
                at, last, size = reduced
                spans.add(at, end - 1 if t.is_result[v] else last, size)
            elif t.is_result[v]:
                own_last = end - 1
            if v >= t.num_params:
                row = v - t.num_params
                lasts[row] = max(own_last, position[row])
        resident = int(self.value_bytes[: t.num_params].sum())
        return resident + spans.peak(op_pos, lasts, self.value_bytes[t.num_params:], end)

    def _reads(self, v: int, position: list[int], chain_at: dict, end_at: dict):
        """Last read of value v's own local value and, if v is a reduced
        partial sum, (definition, last read, bytes) of its reduced value."""
        t = self.t
        reducing = self.reduced[v][1] if v in self.reduced else None
        own_last, reduced_at, reduced_last, reduced_size = -1, -1, -1, 0
        for e in t.edges_of[v]:
            i = t.edge_op_of[e]
            start, c = chain_at.get(e, (position[i], None))
            if reducing is not None and 0 <= reducing < e:
                reduced_last = max(reduced_last, start)  # a later use reads the reduced value
            elif e == reducing:
                own_last = max(own_last, start)
                k = c.reduce_count
                reduced_at, reduced_size = start + k - 1, c.priced.result_bytes[k - 1]
                reduced_last = max(reduced_last, start + k if k < len(c.priced.kinds) else position[i])
            else:
                own_last = max(own_last, start)
        if reducing == -1:
            start, c = end_at[v]
            own_last = max(own_last, start)
            reduced_at = start + c.reduce_count - 1
            reduced_size = c.priced.result_bytes[-1]
        if reducing is None:
            return own_last, None
        return own_last, (reduced_at, max(reduced_last, reduced_at), reduced_size)


@dataclass(frozen=True, slots=True)
class _Resharding:
    """A memoized resharding: its priced steps, how many of them reduce a
    partial sum, and the packed sharding once reduced."""

    priced: _ChainCost
    reduce_count: int
    reduced: int


@dataclass(frozen=True, slots=True)
class _Chain:
    """The collectives in front of one use (edge) of value `value`; the
    first `reduce_count` of them reduce its partial sum."""

    edge: int
    value: int
    priced: _ChainCost
    reduce_count: int


class _Spans:
    """Live ranges of the local values the tabulated walk creates (reduced
    partial sums and collective temporaries), merged with the op results'."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.lasts: list[int] = []
        self.sizes: list[int] = []

    def add(self, start: int, last: int, size: int) -> None:
        self.starts.append(start)
        self.lasts.append(last)
        self.sizes.append(size)

    def temporaries(self, pos: int, chain: _Chain, consumer: int) -> None:
        """Each step's result lives to the next step, the last one to its
        consumer; the step that yields a reduced partial sum is not a
        temporary (the caller records that value)."""
        count = len(chain.priced.kinds)
        for k, size in enumerate(chain.priced.result_bytes):
            if chain.reduce_count and k == chain.reduce_count - 1:
                continue
            self.add(pos + k, pos + k + 1 if k + 1 < count else consumer, size)

    def peak(self, op_pos: np.ndarray, op_lasts: np.ndarray, op_sizes: np.ndarray, end: int) -> int:
        if not end:
            return 0
        starts = np.concatenate([op_pos, np.array(self.starts, dtype=np.int64)])
        lasts = np.concatenate([op_lasts, np.array(self.lasts, dtype=np.int64)])
        sizes = np.concatenate([op_sizes, np.array(self.sizes, dtype=np.int64)]).astype(np.float64)
        delta = np.bincount(starts, weights=sizes, minlength=end + 1)[: end + 1]
        delta -= np.bincount(lasts + 1, weights=sizes, minlength=end + 2)[: end + 1]
        return int(np.cumsum(delta[:end]).max())
