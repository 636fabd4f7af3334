"""A search space's codes, fast: `ir.sharding.materialize` specialised to
the whole-color decisions a point of `solver.search.space` appends to the
earlier tactics' plan, vectorised over each color's I-classes (what a
search that evaluates thousands of points calls: `SearchSpace.codes`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ir.sharding import axis_tuples
from solver.search.zero import LATE

# The space and its points are `solver.search.space`'s, which imports this module: typed Any here.
SearchSpace = Point = Any

_DATA, _OTHER, _LATE = 0, 1, 2  # the kinds of a pass of `FastCodes`


class FastCodes:
    """`materialize` specialised to the whole-color decisions a point appends
    to the earlier plan, vectorised over each color's I-classes. The rule is
    the same: in decision order, an I-class takes the axis unless it is
    unshardable, kept whole (by the earlier tactics, or outside the part of a
    partial level), deselected, its owner already uses the axis, or the axis
    does not divide it. Within one decision, several I-classes of one owner
    may qualify; the first (in color order) takes the axis and blocks the
    others, as in the sequential rule."""

    def __init__(self, space: SearchSpace, iclass_rep: np.ndarray | None = None) -> None:
        nda, mesh, base = space.nda, space.mesh, space.base
        self.space = space
        tuples = axis_tuples(mesh)
        code_of = {t: c for c, t in enumerate(tuples)}
        self.axis_index = {a: j for j, a in enumerate(mesh.names)}
        # next_code[code, axis]: the code after appending the axis (-1 where it is already there)
        self.next_code = np.array([[code_of.get(t + (a,), -1) for a in mesh.names] for t in tuples], dtype=np.int64)
        owners: dict[tuple, int] = {}
        self.owner = np.array([owners.setdefault(ic.owner[:2], len(owners)) for ic in nda.iclasses], dtype=np.int64)
        self.size = np.array([ic.size for ic in nda.iclasses], dtype=np.int64)
        self.base_codes = np.array([code_of[a] for a in base.axes], dtype=np.int64)
        self.base_held = np.array([mesh.group_size(a) for a in base.axes], dtype=np.int64)
        self.base_owner_mask = np.zeros(len(owners), dtype=np.int64)
        for k, a in enumerate(base.axes):
            for axis in a:
                self.base_owner_mask[self.owner[k]] |= 1 << self.axis_index[axis]
        shardable = np.array([ic.shardable for ic in nda.iclasses], dtype=bool)
        self.allowed = {a: shardable.copy() for a in space.axes}  # not unshardable, not kept whole
        for k, a in space.base_plan.replicated:
            if a in self.allowed:
                self.allowed[a][k] = False
        fixed = dict(space.base_plan.resolutions)
        self.fixed_desel = np.zeros(len(nda.iclasses), dtype=bool)
        for cls in range(len(nda.resolution_classes)):
            if cls not in space.free_classes:
                self.fixed_desel[sorted(nda.resolutions(cls)[fixed.get(cls, 0)])] = True
        self.class_desel = {cls: tuple(np.array(sorted(side), dtype=np.int64) for side in nda.resolutions(cls))
                            for cls in space.free_classes}
        # How many reasons deselect each I-class with every free bit 0; a point's bits that are 1 move
        # their class's reason from side 0 to side 1 (few per point, where the classes are many).
        self.desel_count = self.fixed_desel.astype(np.int64)
        for side0, _ in self.class_desel.values():
            self.desel_count[side0] += 1
        self.color_members = [np.array(m, dtype=np.int64) for m in nda.color_iclasses]
        self.part = np.array(space.part, dtype=np.int64)
        rank = {c: r for r, c in enumerate(space.priority)}
        # Per group and kind of color (data or not): its colors' I-classes in decision order, each with
        # its color's rank, so a pass over several groups is one stable sort by rank.
        self.group_members: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = {}
        for g, colors in enumerate(space.groups):
            for data_pass in (True, False):
                chosen = sorted((c for c in colors if (c in space.data_colors) == data_pass), key=rank.__getitem__)
                if chosen:
                    self.group_members[(g, data_pass)] = (
                        np.concatenate([self.color_members[c] for c in chosen]),
                        np.concatenate([np.full(len(self.color_members[c]), rank[c], dtype=np.int64)
                                        for c in chosen]))
        # The space's decision order as passes of one axis and one kind of decision: data colors, the
        # others, then data groups set LATE (with what keeps their I-classes from the axis, as arrays).
        self.passes = ([(a, _DATA) for a in space.axes] + [(a, _OTHER) for a in reversed(space.axes)]
                       + [(a, _LATE) for a in space.axes if any(b == a for _, b in space.late_variables)])
        self.late_rows = {a: tuple(np.ascontiguousarray(col) for col in np.array(rows, dtype=np.int64).reshape(-1, 4).T)
                          for a, rows in space.late_blockers.items()}
        # The last `near` point's passes: (point, its (group, level) pairs per pass, its state after each).
        self._recorded: tuple[Point, list, list] | None = None
        self.expand: np.ndarray | None = None  # per I-class (the sentinel last), its code's place (`_keep`)
        if iclass_rep is not None:
            self._keep(np.asarray(iclass_rep, dtype=np.int64))
            # The places some I-class reads: a point's codes there (`few`) determine all of them (`whole`).
            self.places, self.read = np.unique(self.expand[:-1], return_inverse=True)

    def _keep(self, iclass_rep: np.ndarray) -> None:
        """Materialize only the I-classes of the owners of the representatives
        (`SearchSpace.folded_codes`); the others' codes are their representatives'."""
        n = len(self.size)
        reps = np.unique(iclass_rep[:n])
        reps = reps[reps < n]  # the sentinel's key: never sharded
        keep = np.flatnonzero(np.isin(self.owner, np.unique(self.owner[reps])))
        place = np.full(n + 1, len(keep), dtype=np.int64)  # the sentinel: the code 0 appended after the kept
        place[keep] = np.arange(len(keep))
        self.expand = place[iclass_rep]
        old_owners, self.owner = np.unique(self.owner[keep], return_inverse=True)
        self.owner = self.owner.reshape(-1)
        self.base_owner_mask = self.base_owner_mask[old_owners]
        self.size, self.part = self.size[keep], self.part[keep]
        self.base_codes, self.base_held = self.base_codes[keep], self.base_held[keep]
        self.desel_count = self.desel_count[keep]
        self.allowed = {a: allowed[keep] for a, allowed in self.allowed.items()}

        def placed(ks: np.ndarray) -> np.ndarray:
            at = place[ks]
            return at[at < len(keep)]

        self.class_desel = {cls: tuple(placed(side) for side in sides) for cls, sides in self.class_desel.items()}
        for a, (ks, groups, levels, flags) in self.late_rows.items():
            at = place[ks]
            here = at < len(keep)
            self.late_rows[a] = (at[here], groups[here], levels[here], flags[here])
        for key, (members, ranks) in self.group_members.items():
            at = place[members]
            self.group_members[key] = (at[at < len(keep)], ranks[at < len(keep)])

    def __call__(self, point: Point, near: Point | None = None) -> np.ndarray:
        return self._codes(point, near) if self.expand is None else self.whole(self.few(point, near))

    def few(self, point: Point, near: Point | None = None) -> np.ndarray:
        """With representatives (`SearchSpace.folded_codes`): the point's codes
        at the places the I-classes read, one per key; equal for two points
        exactly when their codes are (`whole` gives those)."""
        return np.append(self._codes(point, near), 0)[self.places]

    def whole(self, few: np.ndarray) -> np.ndarray:
        """Every I-class's code from `few`."""
        return few[self.read.reshape(-1)]

    def _codes(self, point: Point, near: Point | None) -> np.ndarray:
        chosen = self._chosen(point)
        start, state = 0, None
        if near is not None and near.bits == point.bits:
            if self._recorded is None or self._recorded[0] != near:
                self._recorded = (near, self._chosen(near), [])
                self._run(near, self._recorded[1], 0, None, self._recorded[2])
            recorded_chosen, states = self._recorded[1], self._recorded[2]
            while start < len(chosen) and chosen[start] == recorded_chosen[start]:
                start += 1
            if start == len(chosen):
                return states[-1][0].copy()
            state = states[start - 1] if start else None
        return self._run(point, chosen, start, state, None)

    def _chosen(self, point: Point) -> list[tuple[tuple[int, int], ...]]:
        """Per pass, the (group, level) pairs it decides, sorted."""
        levels = point.levels()
        return [tuple(sorted((g, level) for (g, a), level in levels.items()
                             if a == axis and (g, kind != _OTHER) in self.group_members
                             and (level == LATE) == (kind == _LATE)))
                for axis, kind in self.passes]

    def _late_blocked(self, point: Point, axis: str) -> np.ndarray:
        """Per I-class, whether the LATE rule keeps it from `axis` (`SearchSpace.late_blocked`)."""
        ks, groups, levels, flags = self.late_rows[axis]
        held = np.zeros(len(self.space.groups), dtype=np.int64)
        for (g, a), level in point.levels().items():
            if a == axis:
                held[g] = level
        at = held[groups]
        hit = np.where(flags == 1, at == LATE, (at != LATE) & (at >= levels))
        blocked = np.zeros(len(self.size), dtype=bool)
        blocked[ks[hit]] = True
        return blocked

    def _run(self, point: Point, chosen_by_pass: list, start: int, state: tuple | None,
             record: list | None) -> np.ndarray:
        """The passes from `start` on, from `state` (codes, held, owner mask
        before that pass; None: the base plan's), keeping each pass's result
        in `record` where given."""
        if state is None:
            codes, held, owner_mask = self.base_codes.copy(), self.base_held.copy(), self.base_owner_mask.copy()
        else:
            codes, held, owner_mask = (a.copy() for a in state)
        count = self.desel_count
        for cls, bit in point.bits:
            if bit and cls in self.class_desel:
                if count is self.desel_count:
                    count = count.copy()
                side0, side1 = self.class_desel[cls]
                count[side0] -= 1
                count[side1] += 1
        desel = count > 0
        for k in range(start, len(self.passes)):
            axis, kind = self.passes[k]
            chosen = [(self.group_members[(g, kind != _OTHER)], level) for g, level in chosen_by_pass[k]]
            if chosen:
                blocked = desel | self._late_blocked(point, axis) if kind == _LATE else desel
                self._pass(axis, chosen, blocked, codes, held, owner_mask)
            if record is not None:
                record.append((codes.copy(), held.copy(), owner_mask.copy()))
        return codes

    def _pass(self, axis: str, chosen: list, desel: np.ndarray, codes: np.ndarray, held: np.ndarray,
              owner_mask: np.ndarray) -> None:
        """One pass: the `chosen` groups' colors (members, ranks) at their
        levels take `axis` where the sequential rule lets them, in place."""
        bit, size, j = 1 << self.axis_index[axis], self.space.mesh.size(axis), self.axis_index[axis]
        # The pass's colors at once, in decision order: a color's I-classes are no other's, so what
        # an earlier color takes changes a later one's test only through the owner, and the first
        # candidate of each owner in color order is the one the sequential rule gives the axis.
        if len(chosen) == 1:
            (ks, _), level = chosen[0]
            levels_of = np.full(len(ks), level, dtype=np.int64)
        else:
            order = np.argsort(np.concatenate([ranks for (_, ranks), _ in chosen]), kind="stable")
            ks = np.concatenate([members for (members, _), _ in chosen])[order]
            levels_of = np.repeat([level for _, level in chosen], [len(m) for (m, _), _ in chosen])[order]
        ok = self.allowed[axis][ks] & ~desel[ks] & (owner_mask[self.owner[ks]] & bit == 0) \
            & (self.size[ks] % (held[ks] * size) == 0) & (self.part[ks] <= levels_of)
        cand = ks[ok]
        if len(cand):
            _, first = np.unique(self.owner[cand], return_index=True)
            take = cand[first]
            codes[take] = self.next_code[codes[take], j]
            held[take] *= size
            owner_mask[self.owner[take]] |= bit
