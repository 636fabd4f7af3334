"""A cost table folded by orbits: the plan priced from one member of each
set of ops, kernels and uses that cost alike in every plan of a search.

A search space decides some I-classes alike in every point: CP-SAT's keys
(`solver.search.keys`) name them, and on a model of repeated layers a few
dozen keys cover 10^5 I-classes. Given such a partition (`iclass_rep`:
per I-class, a representative), an op's compute term depends only on its
signature and its factors' representatives, a kernel's on its signature
and its I-classes' representatives, and a use's resharding on its value's
type, dimensions and the dimensions its op wants, as long as the value is
never a partial sum. Each of those sets (an *orbit*) is priced once and
counted by its size. A use of a value that may hold a partial sum
(`FlowLevels`) also depends on the walk over partial sums (the value's
pending axes, whether its reader lets the sum flow on) and on its value's
other uses (the first active one reduces it, the later ones reshard the
reduced value): such values are grouped by what the walk reads of them
(`_walk_classes`: their ops alike, level by level, as are their operands),
their type and dimensions, and their uses' dimensions and readers, in
order; a use's orbit is its value's group and its place among the value's
uses, represented by the group's first value's use (issue 34: the uses of
mixtral_8x7b's 5,369 ops that may hold a partial sum were 7,873 of its
7,996 orbits, and pricing them a third of a timing).

The fold is exact: for codes that are constant on every I-class orbit
(`holds`, one comparison per evaluation; a plan that is not is priced
whole), `CostTable.timed` adds the same terms with the same counts in the
same order as without it, so its figures are the same to the bit. A
kernel's link is cut where its use's orbit is, and the uses with
collectives, which the peak memory replay reads, are the orbits' members
(`expand`, only for the plans whose peak is replayed: `Walk.unfold`, the
reductions' uses too). The replay's local
bytes are each value's class's (its global bytes and its dimensions'
representatives).
tests/test_table_fold.py checks this on random points of search spaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class KernelOrbits:
    """The fused kernels by orbit: same signature, same representatives of
    their I-classes. `of`: per kernel its orbit; `size`: per orbit its
    kernels; `packing`: the orbits' first kernels, packed (`FusedKernels.pack`)."""

    def __init__(self, kernels: Any, iclass_rep: np.ndarray) -> None:
        ids: dict[tuple, int] = {}
        of, firsts = [], []
        for k, kernel in enumerate(kernels.kernels):
            key = (kernel.signature, *iclass_rep[list(kernel.iclasses)].tolist())
            orbit = ids.setdefault(key, len(ids))
            if orbit == len(firsts):
                firsts.append(k)
            of.append(orbit)
        self.of = np.array(of, dtype=np.int64)
        self.size = np.bincount(self.of, minlength=len(firsts)).astype(np.int64)
        self.packing = kernels.pack(firsts)


class TableFold:
    """One cost table's ops, kernels and uses by orbit under a partition of
    its I-classes (module docstring). Read-only once made, but for the
    answers it keeps: of the walk over partial sums (`partial_memo`) and of
    the ops priced alone (`compute_memo`)."""

    def __init__(self, table: Any, iclass_rep: np.ndarray) -> None:
        t = table
        rep = np.asarray(iclass_rep, dtype=np.int64)
        if rep.shape != (len(t.nda.iclasses) + 1,) or rep[-1] != t._sentinel:
            raise ValueError(f"expected a representative per I-class and the sentinel's own, got shape {rep.shape}")
        self.iclass_rep = rep
        # Ops priced alone (`CostTable._compute`): per factor count, each orbit's first op and its size.
        self.op_groups = []
        for count, members, factors in t.op_groups:
            rows = np.column_stack([t.op_signature[members], rep[factors]])
            _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
            size = np.bincount(inverse.reshape(-1), minlength=len(first))
            self.op_groups.append((count, members[first], factors[first], size))
        self.kernels = KernelOrbits(t.kernels, rep)
        # Uses: by (type, the representatives of the value's and the use's dimensions, how often it runs
        # a step), and of a value that may hold a partial sum, by its group and place (module docstring).
        ev = t.edge_vid
        walk_class = _walk_classes(t, rep)
        partial_orbit, partial_rep, self.value_rep = _partial_orbits(t, rep, walk_class)
        # The walk over partial sums by class: each walked op has its class's first op's answer.
        walked = t.flow_levels
        _, first_row, row_class = np.unique(walk_class[walked.values], return_index=True, return_inverse=True)
        rep_row = first_row[row_class.reshape(-1)]
        self.flow_levels = walked.folded(t, rep_row)
        self.walk_values = walked.values[rep_row]  # per walked value, the value whose answer it has
        self.partial_memo: dict[bytes, tuple] = {}  # `Walk.partial_sums`'s answers with this fold
        self.compute_memo: dict[tuple, tuple] = {}  # `CostTable._compute`'s figures per group and its codes
        rows = np.column_stack([partial_orbit, t.type_id[ev], rep[t.def_ic[ev]], rep[t.use_ic], t.edge_repeat])
        _, first, orbit = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        orbit = orbit.reshape(-1)
        first[orbit[partial_rep]] = partial_rep  # a group's first value's use represents its orbit
        order = np.argsort(first)  # orbits in the order of their representatives
        renumber = np.empty_like(order)
        renumber[order] = np.arange(len(order))
        orbit = renumber[orbit]
        self.edges = first[order]  # each orbit's representative use, ascending
        self.edge_weight = np.zeros(len(ev), dtype=np.int64)  # per use: its orbit's size if it represents it
        self.edge_weight[self.edges] = np.bincount(orbit, minlength=len(order))
        self.edge_orbit = orbit  # per use, its orbit
        self.members = np.argsort(orbit, kind="stable")  # uses by orbit, ascending within each
        self.member_start = np.concatenate([[0], np.cumsum(self.edge_weight[self.edges])])
        self.use_ic = t.use_ic[self.edges]
        # The values whose keys `Walk.communication` reads: the representatives' and, for the reductions
        # after the last op, the results that may be partial sums.
        self.values = np.union1d(ev[self.edges], walked.values[t.result_rank[walked.values] >= 0])
        self.def_ic = t.def_ic[self.values]
        self.link_orbit = orbit[t.kernels.link_edges]  # per use a kernel's link carries, its orbit
        # Values by (global bytes, the representatives of their dimensions): alike in local bytes.
        rows = np.column_stack([t.global_bytes, rep[t.def_ic]])
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        self.value_def_ic, self.value_global_bytes = t.def_ic[first], t.global_bytes[first]
        self.value_class = inverse.reshape(-1)  # per value, the class whose first value it is priced by

    def holds(self, codes: np.ndarray) -> bool:
        """Whether `codes` (with the sentinel) are constant on every I-class orbit."""
        return bool(np.array_equal(codes[self.iclass_rep], codes))

    def expand(self, edges: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The uses of the orbits whose representatives are `edges`, ascending,
        each with the `index` of its orbit's representative."""
        orbits = self.edge_orbit[edges]
        lengths = self.edge_weight[edges]
        starts = np.repeat(self.member_start[orbits], lengths)
        offset = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        members = self.members[starts + offset]
        repeated = np.repeat(index, lengths)
        order = np.argsort(members, kind="stable")
        return members[order], repeated[order]


def _walk_classes(t: Any, rep: np.ndarray) -> np.ndarray:
    """Per value (and the padding past the last), a class such that the walk
    over partial sums (`costmodel.table_walk.Walk.partial_sums`) gives two
    values of one class the same pending axes and combiner, and their ops
    the same answer on whether a sum flows through them, in every plan
    constant on the orbits `rep` gives; -1 for a value never partial. An
    op's answer is read from its signature, its combiner, its reductions'
    I-classes and, from level 1 on, whether it may carry a sum, and per
    operand its value's class, whether the op reads it first, whether it
    has other uses, and the I-classes the op wants it in: those, with the
    I-classes' representatives, level by level."""
    levels = t.flow_levels
    first = t.num_params
    walk_class = np.full(len(t.values) + 1, -1, dtype=np.int64)
    ids: dict[tuple, int] = {}
    for level in levels.levels:
        reductions = rep[levels.reduction_ic[level.rows]]
        combiners = levels.combiner[level.rows]
        for r, i in enumerate(level.ops.tolist()):
            key: tuple = (int(t.op_signature[i]), int(combiners[r]), *reductions[r].tolist())
            if level.operands is not None:
                key += (bool(level.can_flow[r]), *walk_class[level.operands[r]].tolist(),
                        *level.first_use[r].tolist(), *level.shared[r].tolist(),
                        *rep[level.use_ic[r]].ravel().tolist())
            walk_class[first + i] = ids.setdefault(key, len(ids))
    return walk_class


def _partial_orbits(t: Any, rep: np.ndarray, walk_class: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The orbits of the uses of values that may hold a partial sum (module
    docstring): per use, its orbit (-1 for the others' uses); per orbit,
    the use that represents it (its group's first value's); per value, its
    group's first value (itself for the others). `walk_class`: `_walk_classes`'s."""
    op_class = walk_class[t.num_params:-1]
    value_rep = np.arange(len(t.values), dtype=np.int64)
    partial_orbit = np.full(len(t.edge_vid), -1, dtype=np.int64)
    groups: dict[tuple, int] = {}  # a group's key -> its first value
    orbits: dict[tuple[int, int], int] = {}  # (its group's first value, its place) -> a use's orbit
    representative: list[int] = []
    for v in t.flow_levels.values.tolist():
        uses = t.edges_of[v]
        key = (int(walk_class[v]), int(t.type_id[v]), *rep[t.def_ic[v]].tolist(), len(uses),
               *(x for e in uses for x in (*rep[t.use_ic[e]].tolist(), int(op_class[t.edge_op[e]]),
                                           int(t.edge_repeat[e]))))
        value_rep[v] = leader = groups.setdefault(key, v)
        for place, e in enumerate(uses):
            orbit = orbits.setdefault((leader, place), len(representative))
            if orbit == len(representative):
                representative.append(e)
            partial_orbit[e] = orbit
    return partial_orbit, np.array(representative, dtype=np.int64), value_rep
