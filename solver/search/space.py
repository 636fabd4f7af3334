"""The search space of an `auto` tactic, shared by the search backends.

A point of the space is one boolean per (color group, mesh axis) -- "shard
this color along this axis" -- and one bit per free resolution class. Its
plan is the earlier tactics' plan followed by whole-color decisions, axis by
axis in mesh order and, on each axis, color by color in *priority* order;
`ir.sharding.materialize` turns that into the factor sharding with its usual
rule that the earlier decision wins where an owner (op or parameter) is
contended. So a point determines its factor sharding exactly, and every
backend (and the brute-force test) evaluates the same plans.

Priority: first the *data* colors (they name a dimension of a batch input
and no dimension of any other parameter: batch, sequence), then the others
by decreasing number of I-classes, ties by color id. Data colors then win
the ops they share with a weight's color on the same axis, which is what
makes ZeRO-3 / FSDP expressible: a weight dimension sharded along the batch
axis keeps its storage and optimizer update sharded, and the weight is
gathered where the batch dimension takes the axis.

Color groups (`fold_layers`): colors whose parameter dimensions are the same
dimensions of the same parameter groups (`NDA.param_groups`: the repeated
layers) and that have as many I-classes are one group, decided together.
This makes the search layer-symmetric (every layer sharded alike), which is
what lets the CP-SAT model fold repeated layers by multiplicity. Where one
color names two dimensions of one parameter group (a deep MLP: layer i's
output dimension is layer i+1's input), the repeated unit is two layers:
the colors are told apart by the parity of the layer (its position in the
group, in program order), so even and odd layers are decided apart and
Megatron's alternating column and row sharding is a point of the space.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ir.core import IRError
from ir.nda import NDA
from ir.sharding import Decision, FactorSharding, axis_tuples
from solver.plan import Plan

FREE, OFF, ON = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Point:
    """One point of the space: the (group, axis) pairs set, and the resolution bits."""

    sharded: frozenset[tuple[int, str]]
    bits: tuple[tuple[int, int], ...]  # (free resolution class, bit), sorted


class SearchSpace:
    """What an auto tactic on `axes` decides after the plan `base` (earlier tactics)."""

    def __init__(self, nda: NDA, base: Plan, axes: Sequence[str], *, fold_layers: bool = True,
                 data_inputs: Sequence[str] = ()) -> None:
        mesh = base.mesh
        unknown = [a for a in axes if a not in mesh.names]
        if unknown:
            raise IRError(f"auto: unknown mesh axes {unknown}; mesh axes: {', '.join(mesh.names)}")
        self.nda, self.base_plan, self.mesh = nda, base, mesh
        self.axes: tuple[str, ...] = tuple(a for a in mesh.names if a in axes)  # mesh order
        self.base: FactorSharding = base.materialize(nda)
        self.fold_layers = fold_layers
        self.group_of, self.groups = _color_groups(nda, fold_layers)
        data = _data_colors(nda, data_inputs)
        self.priority: tuple[int, ...] = tuple(sorted(
            range(nda.num_colors), key=lambda c: (c not in data, -len(nda.color_iclasses[c]), c)))
        self.free_classes = self._free_classes()
        self.status = self._statuses()
        live = {(self.group_of[nda.iclasses[k].color], a)
                for k, row in enumerate(self.status) for a, st in zip(self.axes, row) if st == FREE}
        # The variables: (group, axis) pairs some I-class could take, in a fixed order.
        self.variables: tuple[tuple[int, str], ...] = tuple(
            (g, a) for g in range(len(self.groups)) for a in self.axes if (g, a) in live)
        self._fast = _FastMaterialize(self)

    def _statuses(self) -> tuple[tuple[int, ...], ...]:
        """Per I-class and auto axis: ON (the earlier tactics gave it the
        axis), OFF (it can never take it: unshardable, owner already uses the
        axis, kept whole by a replicate tactic, not divisible, deselected
        whatever the search does) or FREE."""
        nda, mesh, base = self.nda, self.mesh, self.base
        fixed_bits = dict(self.base_plan.resolutions)
        always_off: set[int] = set()
        for cls in range(len(nda.resolution_classes)):
            sides = nda.resolutions(cls)
            if cls in self.free_classes:
                always_off |= sides[0] & sides[1]
            else:
                always_off |= sides[fixed_bits.get(cls, 0)]
        blocked = set(self.base_plan.replicated)
        owner_axes: dict[tuple, set[str]] = {}
        for k, ic in enumerate(nda.iclasses):
            owner_axes.setdefault(ic.owner[:2], set()).update(base.axes[k])
        rows = []
        for k, ic in enumerate(nda.iclasses):
            held = mesh.group_size(base.axes[k])
            row = []
            for a in self.axes:
                if a in base.axes[k]:
                    row.append(ON)
                elif (not ic.shardable or k in always_off or (k, a) in blocked
                      or a in owner_axes[ic.owner[:2]] or ic.size % (held * mesh.size(a))):
                    row.append(OFF)
                else:
                    row.append(FREE)
            rows.append(tuple(row))
        return tuple(rows)

    def _free_classes(self) -> tuple[int, ...]:
        """Resolution classes the search may set: those the earlier tactics did
        not set and whose bit does not change the earlier decisions' sharding
        (earlier tactics are never undone)."""
        fixed = dict(self.base_plan.resolutions)
        free = []
        for cls in range(len(self.nda.resolution_classes)):
            if cls in fixed:
                continue
            flipped = self.base_plan.with_resolutions({cls: 1}).materialize(self.nda)
            if flipped == self.base:
                free.append(cls)
        return tuple(free)

    def plan(self, point: Point) -> Plan:
        """The plan of a point (module docstring)."""
        decisions = [Decision(axis, color) for axis in self.axes for color in self.priority
                     if (self.group_of[color], axis) in point.sharded]
        plan = self.base_plan.with_decisions(*decisions)
        return plan.with_resolutions(dict(point.bits)) if point.bits else plan

    def codes(self, point: Point) -> np.ndarray:
        """The factor sharding of a point as codes (numbered as `ir.sharding.axis_tuples`),
        equal to `space.plan(point).materialize(nda)`, about a hundred times faster:
        what a search that evaluates thousands of points calls."""
        return self._fast(point)

    def points(self) -> Iterator[Point]:
        """Every point of the space (brute force: 2**n of them)."""
        for xs in itertools.product((0, 1), repeat=len(self.variables)):
            sharded = frozenset(v for v, on in zip(self.variables, xs) if on)
            for bits in itertools.product((0, 1), repeat=len(self.free_classes)):
                yield Point(sharded, tuple(zip(self.free_classes, bits)))

    def point_of(self, sharding: FactorSharding, bits: Mapping[int, int] | None = None) -> Point:
        """The point closest to a factor sharding (a hint): a (group, axis)
        pair is set where any I-class of the group's colors holds the axis
        beyond the earlier tactics."""
        sharded = set()
        for k, axes in enumerate(sharding.axes):
            for a in axes:
                pair = (self.group_of[self.nda.iclasses[k].color], a)
                if a in self.axes and a not in self.base.axes[k] and pair in self.variables:
                    sharded.add(pair)
        bits = bits or {}
        return Point(frozenset(sharded), tuple((c, int(bits.get(c, 0))) for c in self.free_classes))


class _FastMaterialize:
    """`materialize` specialised to the whole-color decisions a point appends
    to the earlier plan, vectorised over each color's I-classes. The rule is
    the same: in decision order, an I-class takes the axis unless it is
    unshardable, kept whole, deselected, its owner already uses the axis, or
    the axis does not divide it. Within one decision, several I-classes of
    one owner may qualify; the first (in color order) takes the axis and
    blocks the others, as in the sequential rule."""

    def __init__(self, space: SearchSpace) -> None:
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
        self.color_members = [np.array(m, dtype=np.int64) for m in nda.color_iclasses]
        rank = {c: r for r, c in enumerate(space.priority)}
        self.group_colors = [sorted(colors, key=rank.__getitem__) for colors in space.groups]
        self.rank = rank

    def __call__(self, point: Point) -> np.ndarray:
        codes, held, owner_mask = self.base_codes.copy(), self.base_held.copy(), self.base_owner_mask.copy()
        desel = self.fixed_desel.copy()
        bits = dict(point.bits)
        for cls, sides in self.class_desel.items():
            desel[sides[bits.get(cls, 0)]] = True
        mesh = self.space.mesh
        for axis in self.space.axes:
            colors = sorted((c for g, a in point.sharded if a == axis for c in self.group_colors[g]),
                            key=self.rank.__getitem__)
            bit, size, j = 1 << self.axis_index[axis], mesh.size(axis), self.axis_index[axis]
            allowed = self.allowed[axis]
            for c in colors:
                ks = self.color_members[c]
                ok = allowed[ks] & ~desel[ks] & (owner_mask[self.owner[ks]] & bit == 0) \
                    & (self.size[ks] % (held[ks] * size) == 0)
                cand = ks[ok]
                if not len(cand):
                    continue
                _, first = np.unique(self.owner[cand], return_index=True)
                take = cand[first]
                codes[take] = self.next_code[codes[take], j]
                held[take] *= size
                owner_mask[self.owner[take]] |= bit
        return codes


def _color_groups(nda: NDA, fold: bool) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Per color its group id, and the groups' colors (module docstring)."""
    group_index = {name: g for g, names in enumerate(nda.param_groups) for name in names}
    position = {name: j for names in nda.param_groups for j, name in enumerate(names)}
    fn = nda.function
    dims: dict[int, list[tuple[int, int, str]]] = {c: [] for c in range(nda.num_colors)}
    for p in fn.params:
        g = group_index.get(p.name)  # optimizer state follows its parameter's colors anyway
        for d in range(p.type.rank if g is not None else 0):
            dims[nda.def_color(p, d)].append((g, d, p.name))
    # A group is *chained* when one color names two different dimensions of it: layer i's output is
    # layer i+1's input (a deep MLP). Sharding that color decides both layers, so a unit of one layer
    # cannot alternate (Megatron: even layers by column, odd by row); the unit is two layers, and
    # its colors are told apart by the layer's parity (its position in the group, in program order).
    chained = {g for entries in dims.values() for g in {g for g, _, _ in entries}
               if len({d for h, d, _ in entries if h == g}) > 1}
    signature = {c: sorted((g, d, position[name] % 2 if g in chained else 0) for g, d, name in entries)
                 for c, entries in dims.items()}
    keys: dict[tuple, int] = {}
    group_of = []
    for c in range(nda.num_colors):
        sig = tuple(signature[c])
        key = ("tied", len(nda.color_iclasses[c]), sig) if fold and sig else ("alone", c)
        group_of.append(keys.setdefault(key, len(keys)))
    groups: list[list[int]] = [[] for _ in keys]
    for c, g in enumerate(group_of):
        groups[g].append(c)
    return tuple(group_of), tuple(tuple(g) for g in groups)


def _data_colors(nda: NDA, data_inputs: Sequence[str]) -> set[int]:
    """Colors naming a dimension of a batch input and none of another parameter."""
    named: dict[int, set[bool]] = {}
    for p in nda.function.params:
        for d in range(p.type.rank):
            named.setdefault(nda.def_color(p, d), set()).add(p.name in data_inputs)
    return {c for c, kinds in named.items() if kinds == {True}}
