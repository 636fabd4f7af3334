"""The tabulated form of fusion (`costmodel.fusion`): the fused kernels of a
device-local program, priced from the factor sharding alone.

The device-local program's kernels are the global program's kernels cut
where the plan puts a collective: a producer stays fused to its consumer
exactly when none of its uses carries a collective (a collective reads it,
so it is written to HBM and its consumer reads what the collective made).
Both sides use the same rule, `fuse`, so the kernels agree.

Per evaluation:

  - kernels with no collective inside (nearly all of them) are priced as a
    whole: a kernel's time depends only on its *signature* (its ops'
    signatures, which operand slots are internal and from which member,
    which results leave it, and which of its dimensions share an I-class)
    and the codes of its I-classes. numpy finds the distinct (signature,
    codes) rows and each is priced once and memoized, as `CostTable` does
    for single ops;
  - a kernel a collective cuts is split into its pieces (connected
    components of the links no collective touches), each priced alone: a
    piece of one op as the op alone, a piece of several as a fusion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.fusion import FUSION, FusedOp, components, fuse, fused_time_s
from costmodel.table_walk import distinct_rows
from ir import ops
from ir.sharding import local_type

_KEY_LIMIT = 1 << 62  # packed integer keys stay below this (int64, with room to spare)
_MAX_CHUNKS = 64  # chunks of a kernel's I-classes' codes (`FusedKernels.row_ids`)
# Kernels cut by collectives up to which `_evaluate_cut` loops over them rather than grouping them.
_FEW_CUT = 24


@dataclass(frozen=True, slots=True)
class _Packing:
    """Some kernels' I-classes flat, in chunks (`FusedKernels.pack`)."""

    kernels: np.ndarray  # the kernels packed, in this order
    flat_ic: np.ndarray
    flat_weight: np.ndarray
    segment_starts: np.ndarray
    chunk_scale: int
    by_chunk: list[tuple[np.ndarray, np.ndarray]]  # per chunk: positions of the kernels with it, their segments
    chunks: np.ndarray  # per position, the kernel's chunks (its segments from by_chunk[0]'s on)


@dataclass(frozen=True, slots=True)
class _Kernel:
    """A kernel of several ops of the global program."""

    ops: tuple[int, ...]
    links: tuple[tuple[int, int, tuple[int, ...]], ...]  # (producer, consumer, the producer's edges)
    exported: tuple[bool, ...]  # per member: its result leaves the kernel in the global program
    iclasses: tuple[int, ...]  # every I-class its operands and results read, sorted
    signature: int


def _use_rows(t: Any, i: int) -> list[np.ndarray]:
    """The I-classes of each operand of op i as it reads it, in the table `t`."""
    return [t.use_ic[e][: t.values[t.edge_vid_of[e]].type.rank] for e in t.op_edges[i]]


def _def_row(t: Any, i: int) -> np.ndarray:
    """The I-classes of op i's result, in the table `t`."""
    return t.def_ic[t.num_params + i][: t.values[t.num_params + i].type.rank]


def _kernel(t: Any, members: tuple[int, ...], signatures: dict[tuple, int]) -> _Kernel:
    """One kernel of several ops of the table `t`'s program."""
    at = {i: n for n, i in enumerate(members)}
    links: dict[tuple[int, int], tuple[int, ...]] = {}  # (producer, consumer) -> the producer's edges
    slots = []
    for i in members:
        for e in t.op_edges[i]:
            v = t.edge_vid_of[e]
            p = v - t.num_params
            inside = p >= 0 and p in at
            slots.append(at[p] if inside else -1)
            if inside:
                links.setdefault((p, i), tuple(t.edges_of[v]))
    exported = []
    for i in members:
        v = t.num_params + i
        exported.append(bool(t.is_result[v]) or any(u not in at for u in t.users[v]))
    rows = [row for i in members for row in _use_rows(t, i)] + [_def_row(t, i) for i in members]
    iclasses = sorted({int(k) for row in rows for k in row})
    position = {k: n for n, k in enumerate(iclasses)}
    pattern = tuple(tuple(position[int(k)] for k in row) for row in rows)
    key = (tuple(t.op_signature_of[i] for i in members), tuple(slots), tuple(exported), pattern)
    signature = signatures.setdefault(key, len(signatures))
    return _Kernel(members, tuple((at[p], at[c], edges) for (p, c), edges in links.items()), tuple(exported),
                   tuple(iclasses) or (t._sentinel,), signature)


def kernel_structure(table: Any) -> tuple[np.ndarray, list[_Kernel]]:
    """Which ops of the table's program a kernel of several fuses, and those
    kernels: what `FusedKernels` reads of the program whatever the mesh.
    `table` is the `costmodel.table.CostTable` (typed Any: that module
    imports this one, and the graph stays acyclic), its program's indexes made."""
    fused = np.zeros(len(table.fn.ops), dtype=bool)
    kernels: list[_Kernel] = []
    signatures: dict[tuple, int] = {}
    for members in fuse(table.fn).kernels:
        if len(members) < 2:
            continue
        fused[list(members)] = True
        kernels.append(_kernel(table, members, signatures))
    return fused, kernels


class FusedKernels:
    """The global program's kernels of several ops, for one CostTable."""

    def __init__(self, table: Any, structure: tuple[np.ndarray, list[_Kernel]],
                 layouts: dict[int, dict[str, Any]] | None = None) -> None:
        """`table` is the `costmodel.table.CostTable` these kernels belong to,
        `structure` its program's `kernel_structure`; `layouts`: the arrays
        below by the count of codes (they follow from the program and that
        count alone), shared by the program's tables on other meshes of as
        many axes (a mesh screen makes one per mesh)."""
        self.t = table
        self.fused, self.kernels = structure
        self.base = max(len(table.axis_tuples), 2)
        layout = None if layouts is None else layouts.get(self.base)
        if layout is None:
            layout = self._layout()
            if layouts is not None:
                layouts[self.base] = layout
        vars(self).update(layout)
        self._cut_memo: dict[tuple, tuple] = {}  # `_cut_term`
        self._memo: dict[tuple, tuple[float, int]] = {}
        # A cut kernel's piece (`price_pieces`): by (signature, piece), the links inside it and the places
        # of the I-classes it reads among its kernel's; its time by what it reads alone (`_piece_key`).
        self._pieces: dict[tuple, tuple[frozenset[int], np.ndarray]] = {}
        self._lone_memo: dict[tuple, tuple[float, str, int]] = {}
        # An uncut kernel's term by its row packed (`_rows`: an integer per chunk, the signature in the
        # first; a tuple of them for a kernel of several chunks): what `_memo` holds under the row's tuple,
        # looked up without making that tuple from the codes (~70 distinct rows a timing on mixtral_8x7b).
        self._row_memo: dict[int | tuple[int, ...], tuple[float, int]] = {}

    def _layout(self) -> dict[str, Any]:
        """The kernels' arrays for this count of codes (`__init__`)."""
        before = set(vars(self))
        self.chunk = 1
        while _MAX_CHUNKS * (len(self.kernels) + 1) * self.base ** (self.chunk + 1) < _KEY_LIMIT:
            self.chunk += 1
        self.signatures = np.array([k.signature for k in self.kernels], dtype=np.int64)
        self.iclass_list = [np.array(k.iclasses, dtype=np.int64) for k in self.kernels]
        self.packing = self.pack(range(len(self.kernels)))
        self.sizes = np.array([len(k.ops) for k in self.kernels], dtype=np.int64)
        # Every link's edges flat, each with its link's number; per link its kernel and position: which
        # links a plan's collectives break is one gather (`evaluate`), not a scan per cut kernel.
        link_edges: list[int] = []
        link_ids: list[int] = []
        at: list[tuple[int, int]] = []
        for k, kernel in enumerate(self.kernels):
            for n, (_, _, edges) in enumerate(kernel.links):
                link_edges += edges
                link_ids += [len(at)] * len(edges)
                at.append((k, n))
        self.link_edges = np.array(link_edges, dtype=np.int64)
        self.link_ids = np.array(link_ids, dtype=np.int64)
        # Per link its kernel and its position there; links are numbered kernel by kernel, position by
        # position, so sorted links list the cut kernels in order, each one's positions ascending.
        self.link_kernel = np.array([k for k, _ in at], dtype=np.int64)
        self.link_position = np.array([n for _, n in at], dtype=np.int64)
        return {name: value for name, value in vars(self).items() if name not in before}

    # ------------------------------------------------------------ evaluation

    def evaluate(self, codes: np.ndarray, cut_edges: np.ndarray, by_kind: Counter[str],
                 fold: Any = None) -> tuple[int, int, int]:
        """Add every kernel's time to `by_kind`; return (flops, kernels, fused ops):
        the pieces' count and how many ops run inside a piece of several.
        `fold` (`costmodel.table_fold.TableFold`, its orbits holding): the
        kernels that no collective cuts are counted per orbit, each orbit
        priced from one member, and `cut_edges` are the use orbits' first uses."""
        if not self.kernels:
            return 0, 0, 0
        cut_links, cut, first_link, links_cut = self._cut(cut_edges, fold)
        reps, weights, inverse, terms = self._uncut_terms(codes, cut, fold)
        times = np.bincount(inverse, weights=weights, minlength=len(terms)).astype(np.int64)
        flops = 0
        for (seconds, kernel_flops), count in zip(terms, times.tolist()):
            by_kind[FUSION] += seconds * count
            flops += kernel_flops * count
        kernels, fused_ops = int(times.sum()), int((self.sizes[reps] * (1 if weights is None else weights)).sum())
        if len(cut):
            f, n, fused = self._evaluate_cut(cut, first_link, links_cut, self.link_position[cut_links], codes,
                                             by_kind, fold)
            flops, kernels, fused_ops = flops + f, kernels + n, fused_ops + fused
        return flops, kernels, fused_ops

    def _uncut_terms(self, codes: np.ndarray, cut: np.ndarray, fold: Any) -> tuple:
        """The kernels no collective cuts (`cut`: those it does), or with
        `fold` one per orbit: them, their weights (None: one each; else the
        orbit's uncut kernels), each one's term's index and the distinct terms
        (time, flops), each priced once and memoized."""
        if fold is None:
            keep = np.ones(len(self.kernels), dtype=bool)
            keep[cut] = False
            live = np.flatnonzero(keep)  # the default packing's positions are the kernels
            packing, weights = self.packing, None
        else:  # an orbit's kernels have its first member's row: count the uncut ones
            orbits = fold.kernels
            uncut = orbits.size - np.bincount(orbits.of[cut], minlength=len(orbits.size))
            live = np.flatnonzero(uncut)
            packing, weights = orbits.packing, uncut[live]
        reps = packing.kernels[live]
        ids, first_chunk, packed = self._rows(codes, packing)
        _, first, inverse = np.unique(ids[live], return_index=True, return_inverse=True)
        terms = []
        memo = self._row_memo
        for k, key in zip(reps[first].tolist(), self.row_keys(packing, live[first], first_chunk, packed)):
            term = memo.get(key)
            if term is None:
                row = codes[self.iclass_list[k]].tolist()
                term = memo[key] = self._price(k, (int(self.signatures[k]), *row), (), codes)
            terms.append(term)
        return reps, weights, inverse.reshape(-1), terms

    @staticmethod
    def row_keys(packing: _Packing, positions: np.ndarray, first_chunk: np.ndarray,
                 packed: np.ndarray) -> list[int | tuple[int, ...]]:
        """The rows of the kernels at `positions` of `packing` as keys (of
        `_rows`' figures): the first chunk's integer, with the further chunks'
        a tuple (a kernel's segments are consecutive); equal exactly where
        the signature and the codes are."""
        values = packed.tolist()
        return [key if chunks == 1 else (key, *values[start + 1: start + chunks]) for key, start, chunks in zip(
            first_chunk[positions].tolist(), packing.by_chunk[0][1][positions].tolist(),
            packing.chunks[positions].tolist())]

    def _cut(self, cut_edges: np.ndarray, fold: Any = None) -> tuple[np.ndarray, ...]:
        """The links the collectives on `cut_edges` break; the kernels they cut
        (ascending), each one's first among those links and how many."""
        if fold is None:
            is_cut = np.zeros(len(self.t.edge_op_of), dtype=bool)
            is_cut[cut_edges] = True  # the uses with collectives in front: their values leave the kernel
            link_cut = is_cut[self.link_edges]
        else:  # a use is cut where its orbit's first use is
            is_cut = np.zeros(len(fold.edges), dtype=bool)
            is_cut[fold.edge_orbit[cut_edges]] = True
            link_cut = is_cut[fold.link_orbit]
        cut_links = np.unique(self.link_ids[link_cut])
        cut, first_link, links_cut = np.unique(self.link_kernel[cut_links], return_index=True, return_counts=True)
        return cut_links, cut, first_link, links_cut

    def kernel_seconds(self, codes: np.ndarray, cut_edges: np.ndarray) -> np.ndarray:
        """Each kernel's time under `codes` (with the sentinel), a cut one's
        pieces together, as `evaluate` (without a fold) adds them: from its
        memoized terms where it has priced them."""
        out = np.zeros(len(self.kernels))
        if not self.kernels:
            return out
        cut_links, cut, first_link, links_cut = self._cut(cut_edges)
        reps, _, inverse, terms = self._uncut_terms(codes, cut, None)
        out[reps] = np.array([seconds for seconds, _ in terms])[inverse]
        positions = self.link_position[cut_links]
        for c, k in enumerate(cut.tolist()):
            broken = tuple(positions[first_link[c]: first_link[c] + links_cut[c]].tolist())
            out[k] = sum(self._cut_term(k, broken, codes)[1])
        return out

    def pack(self, kernels: Sequence[int]) -> _Packing:
        """The I-classes of `kernels` flat, in chunks of columns whose
        codes pack into one integer (a row's dense id so far times base**chunk
        stays below the limit): per evaluation one gather, one segmented sum
        and a 1-D np.unique per chunk over the kernels that have it, rather
        than a matrix padded to the widest kernel (a 60-column matrix for a
        mean of 15 on 80 layers)."""
        base, chunk = self.base, self.chunk
        flat_ic: list[int] = []
        flat_weight: list[int] = []
        starts: list[int] = []
        by_chunk: list[tuple[list[int], list[int]]] = []  # per chunk: (kernels' positions, their segments)
        for position, k in enumerate(kernels):
            iclasses = self.kernels[k].iclasses
            for c in range(0, len(iclasses), chunk):
                if c // chunk == len(by_chunk):
                    by_chunk.append(([], []))
                by_chunk[c // chunk][0].append(position)
                by_chunk[c // chunk][1].append(len(starts))
                starts.append(len(flat_ic))
                columns = iclasses[c: c + chunk]
                flat_ic += columns
                flat_weight += [base ** j for j in range(len(columns))]
        if len(by_chunk) >= _MAX_CHUNKS:
            raise NotImplementedError(f"a fused kernel reads {max(len(k.iclasses) for k in self.kernels)} I-classes: "
                                      f"the cost table packs at most {(_MAX_CHUNKS - 1) * chunk}")
        chunks = np.zeros(len(kernels), dtype=np.int64)
        for positions, _ in by_chunk:
            chunks[positions] += 1
        return _Packing(np.array(kernels, dtype=np.int64), np.array(flat_ic, dtype=np.int64),
                        np.array(flat_weight, dtype=np.int64), np.array(starts, dtype=np.int64), base ** chunk,
                        [(np.array(ks, dtype=np.int64), np.array(segs, dtype=np.int64)) for ks, segs in by_chunk],
                        chunks)

    def row_ids(self, codes: np.ndarray, packing: _Packing | None = None) -> np.ndarray:
        """Per kernel (of `packing`: every kernel by default), an id equal for
        two kernels exactly when they have the same signature and their
        I-classes the same codes; the ids of distinct rows are in the same
        order whichever kernels are packed."""
        return self._rows(codes, packing)[0]

    def _rows(self, codes: np.ndarray, packing: _Packing | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`row_ids`, each kernel's signature and first chunk packed into one
        integer, and every chunk packed (per segment): a kernel's row is its
        first integer and its further chunks' (`row_keys`)."""
        p = packing or self.packing
        if not len(p.kernels):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        packed = np.add.reduceat(codes[p.flat_ic] * p.flat_weight, p.segment_starts)
        segments = p.by_chunk[0][1]  # every kernel has a first chunk, in kernel order
        first_chunk = self.signatures[p.kernels] * p.chunk_scale + packed[segments]
        _, ids = np.unique(first_chunk, return_inverse=True)
        ids = ids.reshape(-1)
        for kernels, segments in p.by_chunk[1:]:
            # Kernels with this chunk get fresh ids, above every id so far (ids stay below _MAX_CHUNKS
            # times the kernels): the others keep theirs, and no two kernels of different widths share a
            # signature.
            _, fresh = np.unique(ids[kernels] * p.chunk_scale + packed[segments], return_inverse=True)
            ids[kernels] = ids.max() + 1 + fresh.reshape(-1)
        return ids, first_chunk, packed

    def _evaluate_cut(self, cut: np.ndarray, first_link: np.ndarray, links_cut: np.ndarray,
                      positions: np.ndarray, codes: np.ndarray, by_kind: Counter[str],
                      fold: Any) -> tuple[int, int, int]:
        """The kernels `cut` (ascending), each with its links at `positions`
        from `first_link` on (`links_cut` of them) broken: each distinct case
        (the kernel's orbit, or the kernel itself without a fold, and the
        positions broken) priced once (`_cut_term`), and the pieces' times
        added to `by_kind` one by one in kernel order, as a loop over the
        kernels would (a running sum per kind: the same floats to the bit)."""
        if len(cut) <= _FEW_CUT:  # the loop itself: cheaper than the arrays below for a few kernels
            flops = kernels = fused_ops = 0
            for c, k in enumerate(cut.tolist()):
                broken = tuple(positions[first_link[c]: first_link[c] + links_cut[c]].tolist())
                kinds, seconds, term_flops, pieces, fused = self._cut_term(k, broken, codes)
                for kind, s in zip(kinds, seconds):
                    by_kind[kind] += s
                flops, kernels, fused_ops = flops + term_flops, kernels + pieces, fused_ops + fused
            return flops, kernels, fused_ops
        # A case's row: its kernel (or orbit), then its positions broken, 0 past the last (positions + 1).
        width = int(links_cut.max())
        cases = np.zeros((len(cut), width), dtype=np.int64)
        column = np.arange(len(positions)) - np.repeat(first_link, links_cut)
        cases[np.repeat(np.arange(len(cut)), links_cut), column] = positions + 1
        owner = (cut, len(self.kernels)) if fold is None else (fold.kernels.of[cut], len(fold.kernels.size))
        radix = int(positions.max()) + 2
        case_first, case_of = distinct_rows([owner] + [(cases[:, j], radix) for j in range(width)])
        terms = []
        for c in case_first.tolist():
            k = int(cut[c])
            broken = tuple(positions[first_link[c]: first_link[c] + links_cut[c]].tolist())
            terms.append(self._cut_term(k, broken, codes))
        counts = np.bincount(case_of, minlength=len(terms))
        flops = kernels = fused_ops = 0
        for (_, _, term_flops, pieces, fused), count in zip(terms, counts.tolist()):
            flops, kernels, fused_ops = flops + term_flops * count, kernels + pieces * count, fused_ops + fused * count
        # Every cut kernel's pieces in order: per kind, the times it adds, summed left to right.
        lengths = np.array([len(kinds) for kinds, _, _, _, _ in terms], dtype=np.int64)
        flat_kinds = [kind for kinds, _, _, _, _ in terms for kind in kinds]
        flat_seconds = np.array([s for _, seconds, _, _, _ in terms for s in seconds], dtype=np.float64)
        offset = np.cumsum(lengths) - lengths
        steps = lengths[case_of]
        order = np.repeat(offset[case_of] - (np.cumsum(steps) - steps), steps) + np.arange(int(steps.sum()))
        kind_ids = {kind: j for j, kind in enumerate(dict.fromkeys(flat_kinds))}
        of_kind = np.array([kind_ids[kind] for kind in flat_kinds], dtype=np.int64)[order]
        seconds = flat_seconds[order]
        for kind, j in kind_ids.items():
            running = np.concatenate(([by_kind[kind]], seconds[of_kind == j]))
            by_kind[kind] = float(np.add.accumulate(running)[-1])
        return flops, kernels, fused_ops

    def _cut_term(self, k: int, broken: tuple[int, ...], codes: np.ndarray) -> tuple:
        """Kernel k with its links `broken` cut: its pieces' kinds and times,
        flops, pieces and ops fused, memoized on its signature, the links cut
        and its I-classes' codes (a kernel of a repeated layer is cut alike in
        every layer)."""
        key = (self.kernels[k].signature, broken, *codes[self.iclass_list[k]].tolist())
        term = self._cut_memo.get(key)
        if term is None:
            pieces = self.price_pieces(k, codes, broken)
            term = self._cut_memo[key] = (tuple(kind for kind, _, _, _ in pieces),
                                          tuple(seconds for _, seconds, _, _ in pieces),
                                          sum(f for _, _, f, _ in pieces), len(pieces),
                                          sum(n for kind, _, _, n in pieces if kind == FUSION))
        return term

    def price_pieces(self, k: int, codes: np.ndarray, broken: tuple[int, ...]) -> list[tuple[str, float, int, int]]:
        """Kernel k with its links `broken` (positions in `links`) cut: per piece,
        its kind (the op's, or fusion), time, flops and op count."""
        kernel = self.kernels[k]
        pieces = components(len(kernel.ops), ((p, c) for n, (p, c, _) in enumerate(kernel.links) if n not in broken))
        out = []
        for piece in pieces:
            key = self._piece_key(k, tuple(piece), broken, codes)
            if len(piece) == 1:
                term = self._lone_memo.get(key)
                if term is None:
                    term = self._lone_memo[key] = self.t.price_op(kernel.ops[piece[0]], codes)
                seconds, kind, flops = term
                out.append((kind, seconds, flops, 1))
            else:
                seconds, flops = self._price(k, key, broken, codes, piece)
                out.append((FUSION, seconds, flops, len(piece)))
        return out

    def _piece_key(self, k: int, piece: tuple[int, ...], broken: tuple[int, ...], codes: np.ndarray) -> tuple:
        """What one piece of kernel k's time depends on: the kernel's
        signature, the piece, which of the links inside it are cut, and the
        codes of the I-classes its ops read. A link with an end outside the
        piece is cut however `broken` holds it (`members`), and a kernel cut
        alike in several states is mostly cut in pieces alike: a CP-SAT
        kernel term prices each piece once, not per state of the kernel's
        other links and I-classes (gemma_train's: 36,388 pieces, 2,721 of
        them distinct)."""
        kernel = self.kernels[k]
        layout = self._pieces.get((kernel.signature, piece))
        if layout is None:
            inside = set(piece)
            internal = frozenset(n for n, (p, c, _) in enumerate(kernel.links) if p in inside and c in inside)
            ops_read = [kernel.ops[m] for m in piece]
            read = {int(ic) for i in ops_read for row in _use_rows(self.t, i) + [_def_row(self.t, i)] for ic in row}
            places = np.array([n for n, ic in enumerate(kernel.iclasses) if ic in read], dtype=np.int64)
            layout = self._pieces[(kernel.signature, piece)] = (internal, places)
        internal, places = layout
        return (kernel.signature, piece, tuple(n for n in broken if n in internal),
                *codes[self.iclass_list[k][places]].tolist())

    def _price(self, k: int, key: tuple, broken: tuple[int, ...], codes: np.ndarray,
               piece: list[int] | None = None) -> tuple[float, int]:
        """Time and flops of kernel k (or of one piece of it, its links `broken`
        cut) on the local types `codes` give; memoized on `key`."""
        term = self._memo.get(key)
        if term is None:
            term = self._memo[key] = fused_time_s(self.members(k, codes, broken, piece), self.t.hardware)
        return term

    def members(self, k: int, codes: np.ndarray, broken: tuple[int, ...] = (),
                piece: list[int] | None = None) -> list[FusedOp]:
        """The FusedOps of kernel k (or of `piece`, positions in it) under `codes`."""
        t, kernel = self.t, self.kernels[k]
        chosen = list(range(len(kernel.ops))) if piece is None else piece
        inside = set(chosen)
        kept = {(p, c) for n, (p, c, _) in enumerate(kernel.links) if n not in broken and p in inside and c in inside}
        leaves = {p for p, c, _ in kernel.links if (p, c) not in kept}
        at = {i: n for n, i in enumerate(kernel.ops)}
        out = []
        for m in chosen:
            i = kernel.ops[m]
            op = t.fn.ops[i]
            operands, external = [], []
            for e in t.op_edges[i]:
                v = t.edge_vid_of[e]
                operands.append(local_type(t.values[v].type, t.want_dims(e, codes), t.mesh))
                p = at.get(v - t.num_params) if v >= t.num_params else None
                external.append(p is None or (p, m) not in kept)
            result = local_type(op.results[0].type, t.def_dims(t.num_params + i, codes), t.mesh)
            attrs = ops.get(op.kind).localize(op.attrs, tuple(operands), (result,))
            out.append(FusedOp(op.kind, attrs, tuple(operands), result, tuple(external),
                               kernel.exported[m] or m in leaves))
        return out
