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
counted by its size. Uses of values that may hold a partial sum
(`FlowLevels`) stay one by one: whether a partial sum reaches them, and
where it is reduced, follows from the plan's walk.

The fold is exact: for codes that are constant on every I-class orbit
(`holds`, one comparison per evaluation; a plan that is not is priced
whole), `CostTable.timed` adds the same terms with the same counts in the
same order as without it, so its figures are the same to the bit. A
kernel's link is cut where its use's orbit is, and the uses with
collectives, which the peak memory replay reads, are the orbits' members
(`expand`, only for the plans whose peak is replayed). The replay's local
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
    its I-classes (module docstring). Read-only once made."""

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
        # Uses: of a value that may hold a partial sum, each its own orbit; the others by (type, the
        # representatives of the value's and the use's dimensions, how often it runs a step).
        ev = t.edge_vid
        may_be_partial = np.zeros(len(t.values), dtype=bool)
        may_be_partial[t.num_params + t.flow_levels.ops] = True
        alone = np.where(may_be_partial[ev], np.arange(len(ev)), -1)
        rows = np.column_stack([alone, t.type_id[ev], rep[t.def_ic[ev]], rep[t.use_ic], t.edge_repeat])
        _, first, orbit = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        orbit = orbit.reshape(-1)
        order = np.argsort(first)  # orbits in the order of their first use
        renumber = np.empty_like(order)
        renumber[order] = np.arange(len(order))
        orbit = renumber[orbit]
        self.edges = first[order]  # each orbit's first use, ascending
        self.edge_weight = np.zeros(len(ev), dtype=np.int64)  # per use: its orbit's size if it is the first
        self.edge_weight[self.edges] = np.bincount(orbit, minlength=len(order))
        self.edge_orbit = orbit  # per use, its orbit
        self.members = np.argsort(orbit, kind="stable")  # uses by orbit, ascending within each
        self.member_start = np.concatenate([[0], np.cumsum(self.edge_weight[self.edges])])
        self.use_ic = t.use_ic[self.edges]
        self.values = np.union1d(ev[self.edges], t.num_params + t.flow_levels.ops)
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
        """The uses of the orbits whose first uses are `edges`, ascending, each
        with the `index` of its orbit's first use."""
        orbits = self.edge_orbit[edges]
        lengths = self.edge_weight[edges]
        starts = np.repeat(self.member_start[orbits], lengths)
        offset = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        members = self.members[starts + offset]
        repeated = np.repeat(index, lengths)
        order = np.argsort(members, kind="stable")
        return members[order], repeated[order]
