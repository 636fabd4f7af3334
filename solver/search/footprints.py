"""Which MCTS actions change disjoint parts of a plan's step time
(`solver.search.mcts_pricing`, module docstring "Deltas").

The step time the cost table gives (`costmodel.table.CostTable.timed`) is a
sum of terms: per op alone its compute, per use its collectives, per fused
kernel its time (whole or as the pieces its cut links leave), per partial
result never reduced by a use its reduction after the last op. Each term is
a function of the codes of a few I-classes: an op's factors; a use's
value's and its own dimensions, and, for a value that may hold a partial
sum, the walk over partial sums (`costmodel.table_walk.FlowLevels`) and
every use of that value (the first active one reduces it); a kernel's
I-classes and the uses its links carry.

An action's *footprint* is every term whose value the action can change,
from any state: the I-classes it can recode are its group's colors', those
of both sides of each resolution class whose bit it fixes, and, since an
op never uses one mesh axis twice (`solver.search.fast_codes`: an I-class
that takes an axis blocks the op's others from it, and the LATE rule is
per op too), every I-class owned by the op (or parameter) that owns one of
those. From there: the ops, uses, kernels and partial results that read
one of them, and those of every value whose partial sum the walk may then
change, or whose first reader's (`Footprints.walked`).

A decision of a state whose footprint is disjoint from an action's
changes none of the terms the action changes, nor how the action recodes
its I-classes, so the action's delta T(s + a) - T(s) depends only on the
decisions of s whose footprints meet its own (`Footprints.key`): two states
that agree on those give it the same delta, up to the rounding of the sum,
and the same recoding (`mcts._Mcts.children` patches a child's codes by it).
tests/test_mcts_deltas.py checks both on random walks through small spaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Footprints:
    """The footprints (module docstring) of a search space's decisions, per
    group and per resolution class, as packed bits, and per MCTS action
    (`solver.search.mcts_actions.Action`) the key of its delta."""

    def __init__(self, space: Any, table: Any) -> None:
        self.space, self.t = space, table
        nda, t = space.nda, table
        n_ic = len(nda.iclasses)
        owners: dict[tuple, int] = {}
        self.owner = np.array([owners.setdefault(ic.owner[:2], len(owners)) for ic in nda.iclasses], dtype=np.int64)
        self.num_owners = len(owners)
        # Per op, its factors' I-classes (the never-sharded sentinel past the last I-class for padding).
        width = max((len(f) for f in nda.op_factor_iclass), default=0)
        self.op_factors = np.full((len(nda.op_factor_iclass), max(width, 1)), n_ic, dtype=np.int64)
        for i, factors in enumerate(nda.op_factor_iclass):
            self.op_factors[i, : len(factors)] = [k if k >= 0 else n_ic for k in factors]
        self.may_be_partial = t.may_be_partial
        kernels = t.kernels.kernels
        self.kernel_of_ic = np.repeat(np.arange(len(kernels), dtype=np.int64), [len(k.iclasses) for k in kernels])
        self.kernel_ic = np.array([k for kernel in kernels for k in kernel.iclasses], dtype=np.int64)
        self.num_kernels = len(kernels)
        self._bits: dict[tuple[str, int], np.ndarray] = {}  # per group or resolution class, its footprint
        self._related: dict[Any, tuple[frozenset[int], frozenset[int]]] = {}
        self._keys: dict[tuple[Any, Any], tuple] = {}  # per (point, action): `key`'s, read by a step twice

    def iclasses(self, direct: list[int]) -> np.ndarray:
        """The I-classes a decision on the I-classes `direct` can recode (module
        docstring: every I-class of their ops), as a mask with the sentinel's slot (False)."""
        touched_owners = np.zeros(self.num_owners, dtype=bool)
        touched_owners[self.owner[np.array(direct, dtype=np.int64)]] = True
        return np.append(touched_owners[self.owner], False)

    def of_group(self, g: int) -> np.ndarray:
        """The footprint of a decision on group g, whatever its axis and level (packed bits)."""
        key = ("group", g)
        if key not in self._bits:
            colors = self.space.groups[g]
            self._bits[key] = self._terms(self.iclasses([k for c in colors for k in self.space.nda.color_iclasses[c]]))
        return self._bits[key]

    def of_class(self, cls: int) -> np.ndarray:
        """The footprint of fixing resolution class cls's bit (packed bits)."""
        key = ("class", cls)
        if key not in self._bits:
            self._bits[key] = self._terms(self.iclasses([k for side in self.space.nda.resolutions(cls) for k in side]))
        return self._bits[key]

    def footprint(self, action: Any) -> np.ndarray:
        """The action's footprint (packed bits): its group's and its bits' classes'."""
        out = self.of_group(action.group)
        for cls, _ in action.bits:
            out = out | self.of_class(cls)
        return out

    def _terms(self, ic: np.ndarray) -> np.ndarray:
        """The footprint of recoding the I-classes `ic`, packed: I-classes, ops, uses, kernels, partial results."""
        t = self.t
        ops = ic[self.op_factors].any(axis=1)
        defined = ic[t.def_ic].any(axis=1)  # per value: one of its dimensions
        used = ic[t.use_ic].any(axis=1)  # per use: one of the dimensions it wants
        edges = defined[t.edge_vid] | used
        # A value that may be partial: any change to it or one of its uses moves its reduction, and so
        # does a change the walk over partial sums makes to it or to the op that reads it first.
        touched = defined | self.walked(ic)
        touched[t.edge_vid[used]] = True
        partial = touched & self.may_be_partial
        edges |= partial[t.edge_vid]
        kernels = np.zeros(self.num_kernels, dtype=bool)
        if self.num_kernels:
            kernels[self.kernel_of_ic[ic[self.kernel_ic]]] = True
            fk = t.kernels
            kernels[fk.link_kernel[fk.link_ids[edges[fk.link_edges]]]] = True
        return np.packbits(np.concatenate([ic, ops, edges, kernels, partial]))

    def walked(self, ic: np.ndarray) -> np.ndarray:
        """Per value, whether the walk over partial sums (`FlowLevels`) may
        give it another mask, or another answer for the op that reads it
        first, when the I-classes `ic` are recoded: an op's own partial axes
        follow from its reductions' I-classes, what flows through it from
        the uses' I-classes and the masks of the operands it reads first,
        level by level."""
        t = self.t
        levels = t.flow_levels
        first = t.num_params
        direct = ic[levels.reduction_ic].any(axis=1)  # per walked op (row)
        changed = np.zeros(len(t.values) + 1, dtype=bool)  # the last: the padding operand, never partial
        for level in levels.levels:
            here = direct[level.rows]
            if level.operands is not None:
                here = here | (level.can_flow & (ic[level.use_ic].any(axis=(1, 2))
                                                 | (changed[level.operands] & level.first_use).any(axis=1)))
                # An op whose answer changes moves the reduction of a partial operand it reads first.
                changed[level.operands[here][level.first_use[here]]] = True
            changed[first + level.ops] |= here
        return changed[:-1]

    def related(self, action: Any) -> tuple[frozenset[int], frozenset[int]]:
        """The groups and the resolution classes whose decisions' footprints
        meet the action's: the only decisions of a state its delta depends on."""
        known = self._related.get(action)
        if known is None:
            mine = self.footprint(action)
            groups = frozenset(g for g in range(len(self.space.groups))
                               if np.bitwise_and(mine, self.of_group(g)).any())
            classes = frozenset(c for c in self.space.free_classes if np.bitwise_and(mine, self.of_class(c)).any())
            known = self._related[action] = (groups, classes)
        return known

    def key(self, point: Any, action: Any) -> tuple:
        """What the action's delta from `point`, T(point + action) - T(point),
        depends on: the action, and the point's decisions on the groups and
        classes related to it (`related`). Two states with the same key have
        the same delta (module docstring)."""
        known = self._keys.get((point, action))
        if known is None:
            groups, classes = self.related(action)
            known = self._keys[(point, action)] = (
                action, tuple(sorted((pair, level) for pair, level in point.levels().items() if pair[0] in groups)),
                tuple((c, b) for c, b in point.bits if c in classes))
        return known


__all__ = ["Footprints"]
