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
    (`ir.lower.flowing_partial`), and kept per the codes the walk reads;
    each active edge's collectives are the lowering's own steps
    (`ir.lower.reduce_steps`, `redistribute_steps`), priced by
    `costmodel.evaluate.op_time_s` and memoized;
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

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.evaluate import Cost, evaluate, make_cost, op_time_s
from costmodel.hardware import Hardware
from costmodel.table_fold import TableFold
from costmodel.table_kernels import FusedKernels, kernel_structure
from costmodel.table_walk import FlowLevels, Walk
from ir import ops
from ir.core import Function, IRError, Mesh, Recent, TensorType
from ir.lower import FLOWING_KINDS, Step, redistribute_steps, reduce_steps
from ir.nda import NDA
from ir.sharding import DimAxes, FactorSharding, axis_tuples, local_type

# Combined integer keys must stay below this (int64, with room to spare).
_KEY_LIMIT = 1 << 62
_INDEXES = Recent(2)  # per (program, analysis): `CostTable._program_index`
_CODES = Recent(8)  # per tuple of I-class axes and the mesh's axis names: `CostTable.codes`
_BATCH_OPS = Recent(2)  # per (program, analysis) and batch inputs: `CostTable.batch_ops`
_COMPUTE_MEMO_ENTRIES = 1 << 16  # groups' figures a fold keeps (`CostTable._compute`), the oldest dropped first


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

    def __init__(self, fn: Function, nda: NDA, mesh: Mesh, hardware: Hardware,
                 microbatches: tuple[Sequence[str], int] | None = None, baseline: Cost | None = None) -> None:
        """`microbatches`: (the batch inputs, K) when the step runs as K
        microbatches (`repeats_per_microbatch`); None: once, as written.
        `baseline`: `evaluate(fn, hardware)` where the caller has it (`baseline`)."""
        if nda.function is not fn:
            raise IRError("the NDA was computed for a different function")
        self.fn, self.nda, self.mesh, self.hardware = fn, nda, mesh, hardware
        self.axis_tuples = axis_tuples(mesh)
        self.code_of = {t: c for c, t in enumerate(self.axis_tuples)}
        self.code_size = np.array([mesh.group_size(t) for t in self.axis_tuples], dtype=np.int64)
        bit = {a: 1 << k for k, a in enumerate(mesh.names)}
        self.code_mask = np.array([sum(bit[a] for a in t) for t in self.axis_tuples], dtype=np.int64)
        self.mask_axes = {m: tuple(a for a in mesh.names if m & bit[a]) for m in range(1 << len(mesh.axes))}
        self._sentinel = len(nda.iclasses)  # an extra I-class that is never sharded
        self.axis_bit = bit
        # What follows from the program alone is made once and shared by its tables on other meshes (a
        # mesh search builds one per searched mesh): read-only once made (`_program_index`).
        index = _INDEXES.find((fn, nda), None)
        if index is None:
            for op in fn.ops:
                if ops.get(op.kind).is_collective or len(op.results) != 1:
                    raise IRError(f"{op.describe()}: the cost table needs a global program of single-result ops")
            index = self._program_index()
            _INDEXES.put((fn, nda), None, index)
        vars(self).update(index)
        # How often a use's resharding runs in a step (`microbatch_repeats`).
        self.edge_repeat = np.ones(len(self.edge_op), dtype=np.int64) if microbatches is None else \
            self.microbatch_repeats(*microbatches)
        self._op_memo: dict[tuple, tuple[float, str, int]] = {}
        self._chain_memo: dict[tuple, _Resharding] = {}
        self._step_memo: dict[tuple, tuple[float, int]] = {}  # `price_chain`
        self._steps_memo: dict[tuple, tuple[DimAxes, tuple[Step, ...], int, int]] = {}  # `resharding`, by rank
        self._flow_memo: dict[tuple, int] = {}
        self._partial_memo: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # `Walk.partial_sums`
        self._ended = np.zeros(len(fn.ops) + 1, dtype=np.int64)  # `_live_bound`'s, made once a table
        self._baseline = baseline
        if len(mesh.axes) > 8:
            raise NotImplementedError(f"the cost table keeps a partial sum's pending axes in a byte: "
                                      f"{len(mesh.axes)} mesh axes are more than 8")
        self.code_dtype = np.min_scalar_type(len(self.axis_tuples) - 1)
        self.kernels = FusedKernels(self, self.kernel_structure, self.kernel_layouts)
        if len(self.axis_tuples) ** self.def_ic.shape[1] >= _KEY_LIMIT:
            raise NotImplementedError(f"the cost table packs a tensor's sharding into one integer: a mesh of "
                                      f"{len(mesh.axes)} axes with tensors of rank {self.def_ic.shape[1]} is too large")
        self._powers = np.array([len(self.axis_tuples) ** d for d in range(self.def_ic.shape[1])], dtype=np.int64)
        self._py_powers = self._powers.tolist()

    def _program_index(self) -> dict[str, Any]:
        """The table's structure that follows from the program and its analysis
        alone (values, uses, ops, fused kernels, the levels of partial sums),
        as attributes to share: made here on this table, and returned."""
        before = set(vars(self))
        fn = self.fn
        self._index_values()
        self._index_edges()
        self.op_signature_of: list[int] = []
        self._index_ops()
        # Plain lists for the Python walks (numpy scalars are slow to index one by one).
        self.edge_vid_of = self.edge_vid.tolist()
        self.edge_op_of = self.edge_op.tolist()
        self.op_vids = [[self.edge_vid_of[e] for e in es] for es in self.op_edges]
        self.first_user = [us[0] if us else -1 for us in self.users]
        self.use_count_of = self.use_count.tolist()
        # Ops a partial sum may flow through, if it is their only use (`FlowLevels`). At any other user
        # (or with several uses) it is reduced, which `communication` finds.
        self.can_flow = [op.kind in FLOWING_KINDS for op in fn.ops]
        self.kernel_structure = kernel_structure(self)
        self.kernel_layouts: dict[int, dict[str, Any]] = {}  # `FusedKernels`: filled by the tables made
        # Ops a kernel fuses are priced with it, not alone.
        fused = self.kernel_structure[0]
        self.op_groups = [(count, members[keep], factors[keep]) for count, members, factors in self.op_groups
                          if (keep := ~fused[members]).any()]
        types: dict[TensorType, int] = {}
        self.type_id_of = [types.setdefault(v.type, len(types)) for v in self.values]
        self.type_id, self.num_types = np.array(self.type_id_of, dtype=np.int64), len(types)
        self.combiner_names = sorted({"sum", *self.op_combiner})
        self.combiner_id = {c: k for k, c in enumerate(self.combiner_names)}
        self.flow_levels = FlowLevels(self)
        # Per value: whether it may hold a partial sum under some plan (an op result the walk may reach:
        # `rough_peak_bound`, `solver.search.footprints`).
        self.may_be_partial = np.zeros(len(self.values), dtype=bool)
        self.may_be_partial[self.num_params + self.flow_levels.ops] = True
        self.surely_whole = ~self.may_be_partial[self.num_params:]  # per op result: `rough_peak_bound`'s
        return {name: value for name, value in vars(self).items() if name not in before}

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
        # Per value, its first position among the results (-1: not a result).
        self.result_rank = np.full(len(self.values), -1, dtype=np.int64)
        returned, first = np.unique(np.array(self.result_vids, dtype=np.int64), return_index=True)
        self.result_rank[returned] = first
        self.results_by_rank = returned[np.argsort(first)]  # each result value once, in its first place's order

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
        # The uses grouped by value, in use order within each (`Walk.peak_memory_bytes`).
        self.uses_by_value = np.argsort(self.edge_vid, kind="stable")
        # Per op result: the last op it is surely live at (`peak_lower_bound`): the op before its last
        # reader, the last op for a result, its own op where nothing reads it.
        own = np.arange(len(fn.ops), dtype=np.int64)
        read_to = np.maximum(last_user[self.num_params:] - 1, own)
        self.live_to = np.where(self.is_result[self.num_params:], max(len(fn.ops) - 1, 0), read_to)
        # The op results by that op, and per op how many are live to an op before it.
        self.by_live_to = np.argsort(self.live_to, kind="stable")
        self.ended_before = np.searchsorted(self.live_to[self.by_live_to], own, side="left")
        self.value_use_start = np.concatenate([[0], np.cumsum(np.bincount(self.edge_vid, minlength=len(self.values)))])

    def microbatch_repeats(self, inputs: Sequence[str], microbatches: int) -> np.ndarray:
        """Per use, how often its resharding runs when the step runs as
        `microbatches` (`ir.pipeline`'s placement). An op over the batch (a
        factor of the batch inputs' color, kept or reduced) runs K times, one
        made from weights and constants alone as often as its first reader,
        the rest (the update, after the sums) once. A use of what is the same
        in every microbatch (a weight) is resharded again each time its op
        runs; a microbatch's own values are K times smaller, K times: once."""
        over_batch, varying = self.batch_ops(inputs)
        first = self.num_params
        per_op = np.ones(len(self.fn.ops), dtype=np.int64)
        for i in reversed(range(len(self.fn.ops))):
            readers = self.users[first + i]
            if over_batch[i]:
                per_op[i] = microbatches
            elif not varying[first + i] and readers:
                per_op[i] = per_op[readers[0]]
        return np.where(varying[self.edge_vid], 1, per_op[self.edge_op])

    def batch_ops(self, inputs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per op, whether it is over the batch (a factor of the batch inputs'
        color, kept or reduced: it runs once per microbatch); per value,
        whether it varies with the batch inputs. Kept per program."""
        return _BATCH_OPS.get((self.fn, self.nda), tuple(inputs), lambda: self._batch_ops(inputs))

    def _batch_ops(self, inputs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        from ir.pipeline import microbatch_decision

        batch = microbatch_decision(self.nda, inputs).color
        first = self.num_params
        varying = np.zeros(len(self.values), dtype=bool)
        varying[[self.vid[self.fn.param(name)] for name in inputs]] = True
        for i, edges in enumerate(self.op_edges):
            varying[first + i] = varying[self.edge_vid[edges.start:edges.stop]].any()
        over_batch = np.array([any(k >= 0 and self.nda.iclasses[k].color == batch for k in factors)
                               for factors in self.nda.op_factor_iclass], dtype=bool)
        return over_batch, varying

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
        return self.pack_codes([self.code_of[a] for a in dims])

    def pack_codes(self, codes: Sequence[int]) -> int:
        """A tensor's dimensions' codes (Python ints) as one integer, as `pack` packs a row."""
        return sum(c * p for c, p in zip(codes, self._py_powers))

    def unpack(self, key: int, rank: int) -> DimAxes:
        base = len(self.axis_tuples)
        return tuple(self.axis_tuples[(key // base ** d) % base] for d in range(rank))

    # ------------------------------------------------------------ plans

    def codes(self, sharding: FactorSharding) -> np.ndarray:
        """A factor sharding as codes, one per I-class. A code names a tuple
        of the mesh's axes, whatever their sizes, and `ir.sharding.materialize`
        answers one plan on many meshes with the same tuple of axes: the
        codes are kept per that tuple and the axis names (a mesh screen
        bounds one plan on hundreds of meshes; 100,000 I-classes at scale)."""
        if sharding.mesh != self.mesh:
            raise IRError(f"the sharding is over {sharding.mesh}, the table over {self.mesh}")
        codes = _CODES.get((sharding.axes,), self.mesh.names, lambda: np.fromiter(
            map(self.code_of.__getitem__, sharding.axes), dtype=np.int64, count=len(sharding.axes)))
        return codes.copy()

    def sharding(self, codes: np.ndarray) -> FactorSharding:
        return FactorSharding(self.mesh, tuple(self.axis_tuples[c] for c in codes))

    def baseline(self) -> Cost:
        """The unpartitioned program's cost on one device of this hardware
        (`costmodel.evaluate.evaluate`: the MCTS's yardstick), made once, or
        given (the planner's: llama2_70b's takes 0.8 s)."""
        if self._baseline is None:
            self._baseline = evaluate(self.fn, self.hardware)
        return self._baseline

    def evaluate(self, plan: FactorSharding | np.ndarray, fold: TableFold | None = None) -> Cost:
        """The cost of the program partitioned by `plan` (a FactorSharding or its codes)."""
        return self.timed(plan, fold).cost()

    def timed(self, plan: FactorSharding | np.ndarray, fold: TableFold | None = None, *,
              held: bool = False) -> TimedPlan:
        """The plan's times, its peak memory still to replay (`TimedPlan.cost`):
        a search that needs only to know the plan is no faster than one it
        has skips the replay, a quarter to a third of an evaluation. With a
        `fold` (made by `fold`), priced by orbit where the plan's codes are
        constant on its I-class orbits: the same figures
        (`costmodel.table_fold`). `held`: `plan` is int64 codes with the
        sentinel's, made constant on the fold's orbits (the MCTS's,
        `solver.search.mcts_pricing.Pricing.work`), taken as they are: the
        copy and the check cost a sixth of a timing on 80 layers."""
        codes, fold = (plan, fold) if held else self._plan_codes(plan, fold)
        by_kind: Counter[str] = Counter()
        flops = self._compute(codes, by_kind, fold)
        run = Walk(self, codes)
        run.partial_sums(fold)
        run.communication(by_kind, fold)
        fused_flops, fused_kernels, fused_ops = self.kernels.evaluate(codes, run.chain_edges, by_kind, fold)
        kernels = int(len(self.fn.ops) - self.kernels.fused.sum()) + fused_kernels + run.steps
        return TimedPlan(make_cost(by_kind, 0, flops + fused_flops, run.counts, self.hardware, kernels, fused_ops), run)

    def peak_bytes(self, plan: FactorSharding | np.ndarray, fold: TableFold | None = None, *,
                   held: bool = False) -> int:
        """The plan's peak memory alone (`timed(plan, fold).cost()`'s), its
        compute and kernels not priced: what a search that knows the plan's
        times already needs (`solver.search.mcts_pricing`, "Deltas");
        `held` as `timed`'s."""
        codes, fold = (plan, fold) if held else self._plan_codes(plan, fold)
        return self._walk(codes, True, fold).peak_memory_bytes()

    def peak_lower_bound(self, plan: FactorSharding | np.ndarray, fold: TableFold | None = None, *,
                         held: bool = False) -> int:
        """A lower bound of `peak_bytes` at a third of its work, without the
        collectives: the parameters, and at the most of any op of the global
        program the op results live there, each from its op to the op before
        its last reader (to the last op for a result), a partial sum only at
        its op (its reduction may follow at once, `ir.lower`). The replay
        keeps the program's order and puts a use's collectives after the op
        before its reader, so each of these values is live at its op's place
        there too, among others (the collectives' results, a reduced sum):
        the bound is at most the peak. What a search that only ranks plans
        by their peak needs to skip most replays
        (`solver.search.mcts_pricing`, "Bounds"); `held` as `timed`'s."""
        codes, fold = (plan, fold) if held else self._plan_codes(plan, fold)
        value_bytes = self.value_bytes(codes, fold)
        if not len(self.fn.ops):
            return int(value_bytes.sum())
        return self._live_bound(value_bytes, self._walk(codes, False, fold).mask[self.num_params:-1] == 0)

    def rough_peak_bound(self, plan: FactorSharding | np.ndarray, fold: TableFold | None = None, *,
                         held: bool = False) -> int:
        """A lower bound of `peak_lower_bound` without its walk over partial
        sums (a seventh of its work where that walk misses its memo,
        deepseek_v3_moe; two thirds on llama2_70b): the same, with every
        result that may hold a partial sum under some plan (`FlowLevels`: a
        reduction's, or one a partial sum may flow through) taken as
        partial, live at its op alone, so that no walk decides which are. A
        result taken partial that is whole is live at its op and after; one
        that is partial is live at its op in both, so each op's live bytes
        here are at most the bound's. What ranks a descent step's
        candidates first (`solver.search.mcts_pricing`, "Bounds"). `held`
        as `timed`'s."""
        codes, fold = (plan, fold) if held else self._plan_codes(plan, fold)
        value_bytes = self.value_bytes(codes, fold)
        if not len(self.fn.ops):
            return int(value_bytes.sum())
        return self._live_bound(value_bytes, self.surely_whole)

    def _live_bound(self, value_bytes: np.ndarray, whole: np.ndarray) -> int:
        """`peak_lower_bound`'s figure from the values' local bytes and which
        op results count as whole values, not partial sums (per op). In
        place where it can: the searches bound thousands of plans, and the
        temporaries were a fifth to two fifths of a bound (llama2_70b's
        program as written 0.24 -> 0.19 ms, mixtral_8x7b's 0.12 -> 0.07 ms)."""
        first = self.num_params
        # Live at op q: the whole values made at or before it, less those live only to an op before it
        # (`ended_before`, in `by_live_to`'s order), and the partial sum made there.
        sizes = value_bytes[first:]
        whole_bytes = sizes * whole
        ended = self._ended  # [0, then the sums of the whole values in the order their lives end]
        np.cumsum(whole_bytes[self.by_live_to], out=ended[1:])
        live = np.cumsum(whole_bytes)
        live -= ended[self.ended_before]
        live += sizes
        live -= whole_bytes  # the partial sums', at their op
        return int(value_bytes[:first].sum()) + int(live.max())

    def _plan_codes(self, plan: FactorSharding | np.ndarray, fold: TableFold | None) -> tuple[np.ndarray, Any]:
        """A plan's codes with the sentinel I-class's, and the fold where it holds for them (else None)."""
        codes = self.codes(plan) if isinstance(plan, FactorSharding) else np.asarray(plan, dtype=np.int64)
        if codes.shape != (len(self.nda.iclasses),):
            raise IRError(f"expected {len(self.nda.iclasses)} I-class codes, got shape {codes.shape}")
        codes = np.append(codes, 0)  # the sentinel I-class
        return codes, fold if fold is not None and fold.holds(codes) else None

    def fold(self, iclass_rep: np.ndarray) -> TableFold:
        """This table's ops, kernels and uses by orbit, for plans whose codes
        are constant on the I-class orbits `iclass_rep` gives (per I-class a
        representative, the sentinel's own last: `costmodel.table_fold`)."""
        return TableFold(self, iclass_rep)

    def partial_masks(self, codes: np.ndarray) -> dict[int, int]:
        """Which values of the plan `codes` (with the sentinel) are partial sums:
        value id -> the mesh axes pending (a bit mask, `mask_axes`)."""
        return self._walk(codes, communication=False).partial

    def first_step_bytes(self, codes: np.ndarray) -> dict[int, int]:
        """Per use (edge) with collectives in front of it under the plan `codes`
        (with the sentinel): the local bytes of the first one's result."""
        return self._walk(codes, communication=True).first_step_bytes()

    def use_bytes(self, codes: np.ndarray) -> np.ndarray:
        """Each use's local bytes as its op reads it: its operand's global
        bytes over the group sizes of the sharding the op wants."""
        return self.global_bytes[self.edge_vid] // self._group_sizes(codes, self.use_ic)

    def value_bytes(self, codes: np.ndarray, fold: TableFold | None = None) -> np.ndarray:
        """Each value's local bytes: its global bytes over its dimensions' group
        sizes. With a `fold` that holds for the codes: each class of values
        alike (`TableFold.value_class`) computed once."""
        def_ic, global_bytes = (self.def_ic, self.global_bytes) if fold is None else \
            (fold.value_def_ic, fold.value_global_bytes)
        local = global_bytes // self._group_sizes(codes, def_ic)
        return local if fold is None else local[fold.value_class]

    def _group_sizes(self, codes: np.ndarray, dims_ic: np.ndarray) -> np.ndarray:
        """Per row of `dims_ic` (a tensor's dimensions' I-classes, the sentinel
        past its rank), the devices its sharding under `codes` splits it over."""
        sizes = self.code_size[codes[dims_ic]]
        groups = sizes[:, 0].copy()
        for d in range(1, sizes.shape[1]):
            groups *= sizes[:, d]
        return groups

    def _walk(self, codes: np.ndarray, communication: bool, fold: TableFold | None = None) -> Walk:
        run = Walk(self, codes)
        run.partial_sums(fold)
        if communication:
            run.communication(Counter(), fold)
        return run

    # ------------------------------------------------------------ compute terms

    def _compute(self, codes: np.ndarray, by_kind: Counter[str], fold: TableFold | None = None) -> int:
        """Add every op's roofline time to `by_kind`; return the flops per device.
        With `fold`, each orbit's first op counts for its orbit, and a group's
        figures are kept per its ops' codes (`TableFold.compute_memo`): a
        search's next state recodes a few groups, and the rest are added as
        they were, in the same order, so to the same sums."""
        flops, memo = 0, fold.compute_memo if fold is not None else None
        for g, (count, members, factors, size) in enumerate(self._groups(fold)):
            if memo is None:
                figures = _group_figures(size, *self._group_terms(codes, count, members, factors))
            else:
                key = (g, codes[factors].astype(self.code_dtype).tobytes())
                figures = memo.get(key)
                if figures is None:
                    if len(memo) >= _COMPUTE_MEMO_ENTRIES:
                        del memo[next(iter(memo))]
                    figures = memo[key] = _group_figures(size, *self._group_terms(codes, count, members, factors))
            for kind, seconds, op_flops in figures:
                by_kind[kind] += seconds
                flops += op_flops
        return flops

    def op_seconds(self, codes: np.ndarray) -> np.ndarray:
        """Each op's time alone under `codes` (with the sentinel), as `timed`
        adds it; 0 for an op a kernel fuses (`FusedKernels.kernel_seconds`)."""
        out = np.zeros(len(self.fn.ops))
        for members, _, inverse, terms in self._op_terms(codes, None):
            out[members] = np.array([seconds for seconds, _, _ in terms])[inverse]
        return out

    def _op_terms(self, codes: np.ndarray, fold: TableFold | None) -> Iterator[tuple]:
        """Per group of ops alone (or orbits, with `fold`): its ops, their
        weights (None: one each), each op's term's index and the distinct
        terms (time, kind, flops), each priced once and memoized."""
        for count, members, factors, size in self._groups(fold):
            yield (members, size, *self._group_terms(codes, count, members, factors))

    def _groups(self, fold: TableFold | None) -> list[tuple]:
        """The groups of ops priced alone: (factor count, ops, their factors'
        I-classes, their weights: None, or with `fold` its orbits' sizes)."""
        return fold.op_groups if fold is not None else [(*group, None) for group in self.op_groups]

    def _group_terms(self, codes: np.ndarray, count: int, members: np.ndarray,
                     factors: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
        """One group of `_op_terms`: each op's term's index and the distinct terms."""
        base = len(self.axis_tuples)
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
        terms = []
        for key, rep in zip(uniq, first):
            memo_key = (count, key if isinstance(key, tuple) else int(key))
            term = self._op_memo.get(memo_key)
            if term is None:
                term = self._op_memo[memo_key] = self.price_op(int(members[rep]), codes)
            terms.append(term)
        return inverse.reshape(-1), terms

    def _dims(self, row: np.ndarray, rank: int, codes: np.ndarray) -> DimAxes:
        return tuple(map(self.axis_tuples.__getitem__, codes[row[:rank]].tolist()))

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
            # The steps follow from the shardings alone, shared by every type of the rank (llama2_70b's
            # CP-SAT terms: 28,599 chains, 17,013 distinct step lists); their prices follow the type.
            moves = self._steps_memo.get((ty.rank, state, mask, combiner, want))
            if moves is None:
                dims, wanted = self.unpack(state, ty.rank), self.unpack(want, ty.rank)
                steps = reduce_steps(dims, self.mask_axes[mask], combiner, wanted) if mask else []
                reduce_count = len(steps)
                after = steps[-1].dims if steps else dims
                if after != wanted:
                    steps += redistribute_steps(after, wanted)
                moves = self._steps_memo[(ty.rank, state, mask, combiner, want)] = (
                    dims, tuple(steps), reduce_count, self.pack_dims(after))
            dims, steps, reduce_count, reduced = moves
            chain = _Resharding(self.price_chain(ty, dims, steps), reduce_count, reduced)
            self._chain_memo[key] = chain
        return chain

    def price_chain(self, ty: TensorType, dims: DimAxes, steps: Sequence[Step]) -> _ChainCost:
        """Time and result bytes of each collective of a resharding of a value of type `ty`."""
        kinds, seconds, sizes = [], [], []
        for step in steps:
            # Each step kept by what it reads: chains from other shardings share most of their steps
            # (CP-SAT's edge terms price every combination of a use's shardings: mixtral_8x7b's 166,650
            # chains, 57,245 of them distinct, are mostly the same all-gathers and all-reduces).
            key = (ty, dims, step)
            priced = self._step_memo.get(key)
            if priced is None:
                before, after = local_type(ty, dims, self.mesh), local_type(ty, step.dims, self.mesh)
                attrs = ops.normalize_attrs(step.kind, dict(step.attrs))
                t, _ = op_time_s(step.kind, attrs, (before,), (after,), self.mesh, self.hardware)
                priced = self._step_memo[key] = (t, after.num_bytes)
            kinds.append(step.kind)
            seconds.append(priced[0])
            sizes.append(priced[1])
            dims = step.dims
        return _ChainCost(tuple(kinds), tuple(seconds), tuple(sizes))


def _group_figures(size: np.ndarray | None, inverse: np.ndarray,
                   terms: list[tuple]) -> tuple[tuple[str, float, int], ...]:
    """One group of ops' figures as `CostTable._compute` adds them, term by
    term: (kind, seconds, flops), each term times its ops (or orbits' ops)."""
    multiplicity = np.bincount(inverse, weights=size, minlength=len(terms)).astype(np.int64)
    return tuple((kind, seconds * int(times), op_flops * int(times))
                 for (seconds, kind, op_flops), times in zip(terms, multiplicity))


@dataclass(frozen=True, slots=True)
class TimedPlan:
    """A plan's cost before its peak memory is replayed (`CostTable.timed`)."""

    without_peak: Cost  # the plan's cost with a peak of 0
    run: Walk

    @property
    def step_time_s(self) -> float:
        return self.without_peak.step_time_s

    def cost(self) -> Cost:
        """The whole cost: the times with the peak memory replayed."""
        return dataclasses.replace(self.without_peak, peak_memory_bytes=self.run.peak_memory_bytes())


@dataclass(frozen=True, slots=True)
class _Resharding:
    """A memoized resharding: its priced steps, how many of them reduce a
    partial sum, and the packed sharding once reduced."""

    priced: _ChainCost
    reduce_count: int
    reduced: int
