"""Keys of a search space's I-classes: I-classes whose codes are the same in
every point of the space share one key.

A key is hash-consed from what decides an I-class's code as a function of
the point (the (group, axis) pairs set, at their levels, and the free
resolution bits), by the rule `ir.sharding.materialize` applies: its color's
group, its sharding by the earlier tactics, per auto axis whether it may
take the axis (FREE), never does (OFF) or already holds it (ON), the bits
that deselect it, which earlier axes it cannot be combined with (its size),
the level its group's decision needs to shard it, the order it takes the
axes in, and the keys of its owner's I-classes that take an axis before it
(`higher`: contention is decided there), and where its group may be set
LATE, the groups whose decisions keep it from the axis then (the space's
LATE rule names groups, so no key depends on a key after it). Repeated layers of a
layer-symmetric space have the same keys.

CP-SAT's model has one set of variables per key and folds its terms by them
(`solver.search.cpsat_terms`); the MCTS prices a plan from one member of
each orbit of the cost table's ops, kernels and uses (`costmodel.table_fold`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from solver.search.space import FREE, SearchSpace


@dataclass(frozen=True, slots=True)
class Key:
    group: int
    base: tuple[str, ...]
    status: tuple[int, ...]  # per auto axis: FREE, OFF, ON
    desel: tuple[tuple[int, int], ...]  # (free class, the bit that deselects it)
    nondiv: tuple[tuple[frozenset[str], ...], ...]  # per auto axis: earlier axes it cannot be combined with
    higher: tuple[int, ...]  # keys of the owner's I-classes that take an axis first
    # Per auto axis: the level its group's decision needs to shard it (solver.search.zero: the
    # narrowest level the space offers that holds its part; WHOLE where none is narrower).
    level: tuple[int, ...] = ()
    order: tuple[str, ...] = ()  # the auto axes in the order it takes them (the space's "Axis order")
    # Per auto axis, where its group may be set LATE there (solver.search.space): what keeps it from the
    # axis then, as (group, level, 0) (that group's early decision reaching the level) and (group, LATE, 1)
    # (that group set LATE); None where its group is never LATE there.
    late: tuple[tuple[tuple[int, int, int], ...] | None, ...] = ()


class IClassKeys:
    """The keys of one space's I-classes: `keys` (key id -> Key), `key_of`
    (I-class -> key id, the sentinel I-class last), `key_members` (key id ->
    its I-classes)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space, self.nda, self.axes = space, space.nda, space.axes
        nda = self.nda
        rank = {c: r for r, c in enumerate(space.priority)}
        position = {k: p for c in range(nda.num_colors) for p, k in enumerate(nda.color_iclasses[c])}
        members: dict[tuple, list[int]] = {}
        for k, ic in enumerate(nda.iclasses):
            members.setdefault(ic.owner[:2], []).append(k)
        self.keys: list[Key] = []
        key_ids: dict[tuple, int] = {}  # a Key's fields -> its id
        self.key_of = [0] * (len(nda.iclasses) + 1)  # the sentinel I-class: a fixed key
        self.key_members: list[list[int]] = []
        self._free_masks: list[int] = []  # per key: the auto axes its I-classes may take, as bits
        self._shapes: dict[tuple, tuple] = {}  # `_shape`'s answers
        self._desel: dict[int, tuple[tuple[int, int], ...]] = {}  # I-class -> (free class, the bit deselecting it)
        for c in space.free_classes:
            for b, side in enumerate(nda.resolutions(c)):
                for k in side:
                    self._desel[k] = (*self._desel.get(k, ()), (c, b))
        late: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for i, a in enumerate(self.axes):
            for k, h, level, flag in space.late_blockers[a]:
                late.setdefault((k, i), []).append((h, level, flag))
        self._late = {ki: tuple(sorted(blockers)) for ki, blockers in late.items()}  # (I-class, axis) -> blockers
        # Per group, the auto axes where it may be set LATE (`_key`'s `late`; None: nowhere).
        self._late_axes: dict[int, tuple[int, ...] | None] = {}
        self._masks: dict[tuple[int, ...], int] = {}  # `_free_mask`'s answers
        # A key is interned by its fields as a tuple (equal keys, equal tuples): the Key is made once a key,
        # not once an I-class (the 100,000 I-classes of an 80-layer step have some 70 to 125 keys).
        sentinel = (-1, (), tuple(1 for _ in self.axes), (), (), (), (), (), ())
        self.key_of[-1] = self._intern(key_ids, sentinel, len(nda.iclasses))
        for owner_members in members.values():
            ordered = sorted(owner_members, key=lambda k: (rank[nda.iclasses[k].color], position[k]))
            above: list[int] = []
            for k in ordered:
                fields = self._key(k, above)
                kid = self._intern(key_ids, fields, k)
                self.key_of[k] = kid
                if FREE in fields[2]:  # its status
                    above.append(kid)

    def representatives(self) -> np.ndarray:
        """Per I-class (the sentinel last), the first I-class of its key (the
        sentinel for the I-classes never sharded, whose key is the sentinel's)."""
        first = np.array([m[0] for m in self.key_members], dtype=np.int64)
        return first[np.array(self.key_of, dtype=np.int64)]

    def _intern(self, ids: dict, fields: tuple, iclass: int) -> int:
        kid = ids.get(fields)
        if kid is None:
            kid = ids[fields] = len(self.keys)
            self.keys.append(Key(*fields))
            self.key_members.append([])
            self._free_masks.append(self._free_mask(fields[2]))
        self.key_members[kid].append(iclass)
        return kid

    def _key(self, k: int, above: list[int]) -> tuple:
        """The fields of I-class k's Key (`_intern`)."""
        space, ic = self.space, self.nda.iclasses[k]
        status = space.status[k]
        base = space.base.axes[k]
        if FREE not in status:
            return (-1, base, status, (), (), (), (), (), ())
        free = self._masks.get(status)
        if free is None:
            free = self._free_mask(status)
        shape = (ic.color, status, base, ic.size, space.part[k])
        known = self._shapes.get(shape)
        if known is None:
            known = self._shapes[shape] = self._shape(*shape)
        group, nondiv, level, order = known
        higher = tuple(sorted({j for j in above if self._free_masks[j] & free}))
        late = ()
        if space.late_variables:
            late_axes = self._late_axes.get(group, ())
            if late_axes == ():
                late_axes = self._late_axes[group] = tuple(
                    i for i, a in enumerate(self.axes) if (group, a) in space.late_pairs) or None
            late = (None,) * len(self.axes) if late_axes is None else \
                tuple(self._late.get((k, i), ()) if i in late_axes else None for i in range(len(self.axes)))
        return (group, base, status, self._desel.get(k, ()), nondiv, higher, level, order, late)

    def _shape(self, color: int, status: tuple[int, ...], base: tuple[str, ...], size: int,
               part: int) -> tuple:
        """What a key reads of its I-class besides its bits and owner: its
        group, non-divisible axis sets, levels and axis order."""
        space = self.space
        held = space.mesh.group_size(base)
        order = space.axis_order(color)
        nondiv = []
        for i, a in enumerate(self.axes):
            earlier = [b for b in order[:order.index(a)] if status[self.axes.index(b)] == FREE]
            sets: list[frozenset[str]] = []
            if status[i] == FREE:
                for n in range(1, len(earlier) + 1):
                    for subset in itertools.combinations(earlier, n):
                        s = frozenset(subset)
                        amount = held * space.mesh.size(a) * math.prod(space.mesh.size(b) for b in s)
                        if size % amount and not any(t <= s for t in sets):
                            sets.append(s)
            nondiv.append(tuple(sets))
        group = space.group_of[color]
        level = tuple(space.level_of(group, a, part) if st == FREE else 0 for a, st in zip(self.axes, status))
        return group, tuple(nondiv), level, order

    def _free_mask(self, status: tuple[int, ...]) -> int:
        """The auto axes an I-class of this status may take, as bits."""
        mask = self._masks.get(status)
        if mask is None:
            mask = self._masks[status] = sum(1 << i for i, st in enumerate(status) if st == FREE)
        return mask
