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
what lets the CP-SAT model fold repeated layers by multiplicity.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ir.core import IRError
from ir.nda import NDA
from ir.sharding import Decision, FactorSharding
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


def _color_groups(nda: NDA, fold: bool) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Per color its group id, and the groups' colors (module docstring)."""
    group_index = {name: g for g, names in enumerate(nda.param_groups) for name in names}
    signature: dict[int, list] = {c: [] for c in range(nda.num_colors)}
    fn = nda.function
    for p in fn.params:
        g = group_index.get(p.name)  # optimizer state follows its parameter's colors anyway
        for d in range(p.type.rank if g is not None else 0):
            signature[nda.def_color(p, d)].append((g, d))
    keys: dict[tuple, int] = {}
    group_of = []
    for c in range(nda.num_colors):
        sig = tuple(sorted(signature[c]))
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
