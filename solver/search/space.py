"""The search space of an `auto` tactic, shared by the search backends.

A point of the space is one boolean per (color group, mesh axis) -- "shard
this color along this axis" -- or a partial level of it (below), and one bit
per free resolution class. Its plan is the earlier tactics' plan followed by
whole-color decisions, axis by axis (see "Axis order") and, on each axis,
color by color in *priority* order;
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
A color that names no parameter dimension (an *internal* color: GQA's
query heads per key/value head, split off by a reshape inside each layer)
is grouped by its place in the period: its I-classes' structural labels
with the groups of the colors beside them (`_internal_color_keys`). Two
internal colors with the same place are decided together, as every layer's
copy of one is.

Levels (ZeRO, issue 27). With the optimizer state named (`optimizer_state`),
a (group, axis) pair may also be set to a *partial* level that shards only
part of the group's colors (`solver.search.zero`): OPTIMIZER, the optimizer
state and the update computed from it (ZeRO-1/2: the gradient is
reduce_scattered into the state's shard, the update all_gathered before it
is applied, the parameters stay whole), or STORAGE, that and the parameters
and the ops applying the update (ZeRO-3/FSDP: each parameter is gathered
where it is read, and nowhere else is the color sharded). A point's plan
writes a partial level as the schedule would: the whole-color decision,
with the I-classes outside the level's part kept whole along the axis (the
plan's `replicated` pairs). A level is offered only where it differs from
both the narrower levels and the whole color, so each plan is one point.
A whole-color decision along a batch axis is ZeRO-3 too, but it also
shards the weight-only ops between a parameter and its readers (a GQA
reshape of `wo`, read twice, is then gathered twice); STORAGE gathers the
parameter once, as a pinned ZeRO-3 schedule does.

Late data decisions (sequence parallelism). A data group may also be set
on an axis at the LATE level: decided after every other color on that axis,
it takes the axis only at owners where no other color could have taken it
first, i.e. where no other I-class free on the axis belongs to a group the
point sets there (early, at a level reaching it, or late and ranked before
it). With the heads on the tensor axis, the sequence set LATE there is
Megatron's sequence parallelism: the norms, residuals and the loss split the
sequence over the tensor group, the projections and attention keep the
heads. The rule names groups, not the I-classes that end up holding the
axis, so an I-class's key stays a function of its owner's structure
(`solver.search.keys`) and CP-SAT defines it from decision literals alone.
A point's plan writes LATE as a decision after all the others with the
I-classes it does not reach kept whole. A group's late axes come after its
early ones in mesh order, so each I-class still takes its axes in the
order below. LATE is offered where it differs from the whole decision (the
group has an I-class free on the axis beside one of a non-data group) on
the last auto axis: sequence parallelism is a tensor-parallel group's, and
meshes list model axes last (below). On the earlier axes of the Llama 2 70B
long-context spec it found nothing better and grew the CP-SAT model by 60%.

Axis order. Data colors take the axes in mesh order and the other colors in
reverse mesh order (which only matters to an I-class holding two axes, and
to which of them divisibility lets it take). Meshes list the data axes first
(batch, data, fsdp) and model axes last, so a weight dimension sharded by
both keeps the model axis major, as its readers hold it, and the data axis
minor: where a reduce_scatter of its gradient over that axis puts it, and
what an all_gather removes cheaply. In mesh order the gradient was
all_reduced and sliced instead (the MLP's ZeRO-3 schedule: its nearest
point cost 2.04x the schedule).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ir.core import IRError
from ir.nda import NDA
from ir.sharding import Decision, FactorSharding, axis_tuples
from solver.plan import Plan
from solver.search.fast_codes import FastCodes
from solver.search.zero import LATE, OPTIMIZER, STORAGE, WHOLE, parts

FREE, OFF, ON = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Point:
    """One point of the space: the (group, axis) pairs set whole, the resolution
    bits, and the pairs set to another level (a partial one, or LATE; none of
    them also whole)."""

    sharded: frozenset[tuple[int, str]]
    bits: tuple[tuple[int, int], ...]  # (free resolution class, bit), sorted
    partial: frozenset[tuple[int, str, int]] = frozenset()  # (group, axis, OPTIMIZER, STORAGE or LATE)

    def levels(self) -> dict[tuple[int, str], int]:
        """The level of each (group, axis) pair set."""
        out = {(g, a): level for g, a, level in self.partial}
        out.update((pair, WHOLE) for pair in self.sharded)
        return out

    @property
    def size(self) -> int:
        """How many (group, axis) pairs are set."""
        return len(self.sharded) + len(self.partial)

    def at(self, pair: tuple[int, str], level: int) -> Point:
        """This point with the (group, axis) pair set at `level` (whole, partial or LATE), whatever it was."""
        base = self.without(pair)
        if level == WHOLE:
            return Point(base.sharded | {pair}, base.bits, base.partial)
        return Point(base.sharded, base.bits, base.partial | {(*pair, level)})

    def without(self, pair: tuple[int, str]) -> Point:
        """This point with the (group, axis) pair unset, at whatever level it was."""
        return Point(self.sharded - {pair}, self.bits, frozenset(v for v in self.partial if v[:2] != pair))


class SearchSpace:
    """What an auto tactic on `axes` decides after the plan `base` (earlier tactics)."""

    def __init__(self, nda: NDA, base: Plan, axes: Sequence[str], *, fold_layers: bool = True,
                 data_inputs: Sequence[str] = (), optimizer_state: Sequence[str] = ()) -> None:
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
        self.data_colors = frozenset(data)
        self.priority: tuple[int, ...] = tuple(sorted(
            range(nda.num_colors), key=lambda c: (c not in data, -len(nda.color_iclasses[c]), c)))
        # The order of a point's decisions (module docstring, "Axis order"): per axis, priority order.
        self.decision_order: tuple[tuple[str, int], ...] = tuple(
            [(a, c) for a in self.axes for c in self.priority if c in data]
            + [(a, c) for a in reversed(self.axes) for c in self.priority if c not in data])
        self.part = parts(nda, data, optimizer_state)  # per I-class: the narrowest level that shards it
        self.free_classes = self._free_classes()
        self.status = self._statuses()
        live: dict[tuple[int, str], set[int]] = {}  # (group, axis) -> the parts of its I-classes free there
        for k, row in enumerate(self.status):
            for a, st in zip(self.axes, row):
                if st == FREE:
                    live.setdefault((self.group_of[nda.iclasses[k].color], a), set()).add(self.part[k])
        # The variables: (group, axis) pairs some I-class could take, in a fixed order.
        self.variables: tuple[tuple[int, str], ...] = tuple(
            (g, a) for g in range(len(self.groups)) for a in self.axes if (g, a) in live)
        # The partial levels that differ from the narrower ones and from the whole color (module docstring).
        self.partial_variables: tuple[tuple[int, str, int], ...] = tuple(
            (g, a, level) for g, a in self.variables for level in (OPTIMIZER, STORAGE)
            if level in live[(g, a)] and max(live[(g, a)]) > level)
        self.options: dict[tuple[int, str], tuple[int, ...]] = {pair: (WHOLE,) for pair in self.variables}
        for g, a, level in reversed(self.partial_variables):
            self.options[(g, a)] = (level,) + self.options[(g, a)]
        self.late_blockers, self.late_variables = self._late_blockers()
        self.late_pairs = frozenset(self.late_variables)
        for pair in self.late_variables:
            self.options[pair] += (LATE,)
        self._fast = FastCodes(self)

    @property
    def decisions(self) -> int:
        """How many decision variables the space has: (group, axis) pairs, their partial and LATE levels,
        and free resolution bits."""
        return len(self.variables) + len(self.partial_variables) + len(self.late_variables) + len(self.free_classes)

    def axis_order(self, color: int) -> tuple[str, ...]:
        """The auto axes in the order a color takes them (module docstring, "Axis order")."""
        return self.axes if color in self.data_colors else self.axes[::-1]

    def level_of(self, group: int, axis: str, part: int) -> int:
        """The level of the (group, axis) decision that shards an I-class of
        this part: the narrowest offered that holds it."""
        return min(level for level in self.options.get((group, axis), (WHOLE,)) if level >= part)

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
        blocked: dict[int, set[str]] = {}  # I-class -> the axes a replicate tactic keeps it from
        for k, a in self.base_plan.replicated:
            blocked.setdefault(k, set()).add(a)
        owner_axes: dict[tuple, set[str]] = {}
        for k, ic in enumerate(nda.iclasses):
            owner_axes.setdefault(ic.owner[:2], set()).update(base.axes[k])
        owner_taken = {owner: frozenset(axes) for owner, axes in owner_axes.items()}
        no_axes: frozenset[str] = frozenset()
        sizes = {a: mesh.size(a) for a in self.axes}
        # A row depends on these alone, and the 100,000 I-classes of an 80-layer step have a few hundred
        # distinct ones: each row is made once (and kept once).
        made: dict[tuple, tuple[int, ...]] = {}
        rows = []
        for k, ic in enumerate(nda.iclasses):
            held_axes = base.axes[k]
            off = not ic.shardable or k in always_off
            taken = owner_taken[ic.owner[:2]]
            kept_from = frozenset(blocked[k]) if k in blocked else no_axes
            what = (held_axes, off, ic.size, taken, kept_from)
            row = made.get(what)
            if row is None:
                held = mesh.group_size(held_axes)
                row = made[what] = tuple(
                    ON if a in held_axes else
                    OFF if off or a in kept_from or a in taken or ic.size % (held * sizes[a]) else FREE
                    for a in self.axes)
            rows.append(row)
        return tuple(rows)

    def _late_blockers(self) -> tuple[dict[str, list[tuple[int, ...]]], tuple[tuple[int, str], ...]]:
        """Per auto axis, what keeps a data I-class from the axis at the LATE
        level (module docstring): (I-class, group, level, 0) where that
        group's early decision reaching `level` blocks it, (I-class, group,
        LATE, 1) where that group set LATE (a data color ranked before it)
        does; and the (group, axis) pairs offered LATE."""
        nda = self.nda
        rank = {c: r for r, c in enumerate(self.priority)}
        members: dict[tuple, list[int]] = {}
        for k, ic in enumerate(nda.iclasses):
            members.setdefault(ic.owner[:2], []).append(k)
        data_groups = {g for g, colors in enumerate(self.groups) if all(c in self.data_colors for c in colors)}
        found: dict[str, list[tuple[int, ...]]] = {a: [] for a in self.axes}
        offered: set[tuple[int, str]] = set()
        # The last auto axis only: the tensor-parallel one, as meshes list model axes last ("Axis order").
        last = [(len(self.axes) - 1, self.axes[-1])] if self.axes else []
        for owner_members in members.values():
            if not any(self.group_of[nda.iclasses[k].color] in data_groups for k in owner_members):
                continue
            ordered = sorted(owner_members, key=lambda k: (rank[nda.iclasses[k].color], k))
            for i, a in last:
                free = [k for k in ordered if self.status[k][i] == FREE]
                # Per free I-class, its group and the level that group's decision needs to shard it: what
                # keeps each other one of the owner from the axis, made once an I-class, not once a pair.
                needs = [(h := self.group_of[nda.iclasses[j].color], self.level_of(h, a, self.part[j])) for j in free]
                counts = Counter(needs)
                beside_model = any(h not in data_groups for h, _ in needs)
                earlier_data: set[int] = set()  # the data groups of the free I-classes before this one
                for k, own in zip(free, needs):
                    g = own[0]
                    if g in data_groups:
                        rows = {(k, *need, 0) for need, count in counts.items() if count > 1 or need != own}
                        rows.update((k, h, LATE, 1) for h in earlier_data)
                        found[a] += sorted(rows)
                        if beside_model:
                            offered.add((g, a))
                        earlier_data.add(g)
        late = tuple(pair for pair in self.variables if pair in offered)
        # Only the pairs offered LATE: an I-class whose group is never LATE there, or a group that never is.
        kept = {a: [(k, h, level, flag) for k, h, level, flag in rows
                    if (self.group_of[nda.iclasses[k].color], a) in offered and (not flag or (h, a) in offered)]
                for a, rows in found.items()}
        return kept, late

    def late_blocked(self, levels: Mapping[tuple[int, str], int], axis: str) -> list[int]:
        """The I-classes of the groups set LATE on `axis` that the LATE rule
        keeps from it, given the point's levels."""
        out = []
        for k, h, level, late in self.late_blockers[axis]:
            if levels.get((self.group_of[self.nda.iclasses[k].color], axis)) != LATE:
                continue
            held = levels.get((h, axis), 0)
            if (held == LATE) if late else (held != LATE and held >= level):
                out.append(k)
        return sorted(set(out))

    def late_order_ok(self, levels: Mapping[tuple[int, str], int]) -> bool:
        """A group's LATE axes come after its early ones in mesh order (module docstring)."""
        last_early: dict[int, int] = {}
        first_late: dict[int, int] = {}
        for (g, a), level in levels.items():
            i = self.axes.index(a)
            if level == LATE:
                first_late[g] = min(first_late.get(g, i), i)
            else:
                last_early[g] = max(last_early.get(g, i), i)
        return all(first_late[g] > last_early.get(g, -1) for g in first_late)

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
        """The plan of a point (module docstring): a partial level is the
        whole-color decision with what lies outside its part kept whole."""
        levels = point.levels()
        decisions, kept = [], []
        for axis, color in self.decision_order:
            level = levels.get((self.group_of[color], axis))
            if level is None or level == LATE:
                continue
            decisions.append(Decision(axis, color))
            if level < WHOLE:
                i = self.axes.index(axis)
                kept += [(k, axis) for k in self.nda.color_iclasses[color]
                         if self.part[k] > level and self.status[k][i] == FREE]
        for axis in self.axes:  # LATE: after every other decision, what the rule does not reach kept whole
            late = [c for c in self.priority if c in self.data_colors and levels.get((self.group_of[c], axis)) == LATE]
            if late:
                decisions += [Decision(axis, c) for c in late]
                kept += [(k, axis) for k in self.late_blocked(levels, axis)]
        plan = self.base_plan.with_replicated(kept) if kept else self.base_plan
        plan = plan.with_decisions(*decisions)
        return plan.with_resolutions(dict(point.bits)) if point.bits else plan

    def codes(self, point: Point, near: Point | None = None) -> np.ndarray:
        """The factor sharding of a point as codes (numbered as `ir.sharding.axis_tuples`),
        equal to `space.plan(point).materialize(nda)`, about a hundred times faster:
        what a search that evaluates thousands of points calls. `near`: a point
        with the same bits whose decision passes (`FastCodes`) up to the
        first one where they differ are reused (a search's state, for its
        successors: the same codes, fewer passes)."""
        return self._fast(point, near)

    def folded_codes(self, iclass_rep: np.ndarray) -> FastCodes:
        """`codes` (called as it is) for a search that knows which I-classes are
        coded alike in every point (`iclass_rep`: per I-class, the sentinel
        last, a representative; `solver.search.keys`): only the owners of the
        representatives are materialized, a few hundred I-classes where the
        program has 10^5, and every I-class takes its representative's code.
        The materialization rule is per owner, so those owners' codes are
        exact (tests/test_space.py compares them on random points)."""
        return FastCodes(self, iclass_rep)

    def points(self) -> Iterator[Point]:
        """Every point of the space (brute force: per variable, off or one of its levels)."""
        choices = [(0, *self.options[v]) for v in self.variables]
        for levels in itertools.product(*choices):
            if self.late_variables and not self.late_order_ok(
                    {v: level for v, level in zip(self.variables, levels) if level}):
                continue
            sharded = frozenset(v for v, level in zip(self.variables, levels) if level == WHOLE)
            partial = frozenset((*v, level) for v, level in zip(self.variables, levels) if level and level != WHOLE)
            for bits in itertools.product((0, 1), repeat=len(self.free_classes)):
                yield Point(sharded, tuple(zip(self.free_classes, bits)), partial)

    def point_of(self, sharding: FactorSharding, bits: Mapping[int, int] | None = None) -> Point:
        """The point closest to a factor sharding (a hint): a (group, axis)
        pair is set where any I-class of the group's colors holds the axis
        beyond the earlier tactics, at the narrowest level whose part holds
        every such I-class the space could shard; a data group's pair is LATE
        where that agrees with the sharding on more I-classes (Megatron's
        sequence parallelism)."""
        needed: dict[tuple[int, str], int] = {}
        for k, axes in enumerate(sharding.axes):
            for a in axes:
                pair = (self.group_of[self.nda.iclasses[k].color], a)
                if a in self.axes and a not in self.base.axes[k] and pair in self.options:
                    free = self.status[k][self.axes.index(a)] == FREE
                    needed[pair] = max(needed.get(pair, OPTIMIZER), self.part[k] if free else OPTIMIZER)
        levels = {pair: min(level for level in self.options[pair] if level >= least)
                  for pair, least in needed.items()}
        bits = bits or {}
        point = Point(frozenset(pair for pair, level in levels.items() if level == WHOLE),
                      tuple((c, int(bits.get(c, 0))) for c in self.free_classes),
                      frozenset((*pair, level) for pair, level in levels.items() if level < WHOLE))
        if any(pair in point.sharded for pair in self.late_variables):
            code_of = {t: c for c, t in enumerate(axis_tuples(self.mesh))}
            wanted = np.array([code_of[a] for a in sharding.axes], dtype=np.int64)
            agree = int(np.sum(self.codes(point) == wanted))
            for pair in reversed(self.late_variables):  # the last axes first: a group's late axes come last
                if pair not in point.sharded:
                    continue
                late = point.at(pair, LATE)
                if not self.late_order_ok(late.levels()):
                    continue
                n = int(np.sum(self.codes(late) == wanted))
                if n > agree:
                    point, agree = late, n
        return point


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
    named = {nda.def_color(p, d) for p in fn.params for d in range(p.type.rank)}
    key_of: dict[int, tuple] = {c: ("tied", len(nda.color_iclasses[c]), tuple(signature[c]))
                                for c in range(nda.num_colors) if fold and signature[c]}
    if fold:
        key_of.update(_internal_color_keys(nda, key_of, named))
    keys: dict[tuple, int] = {}
    group_of = []
    for c in range(nda.num_colors):
        group_of.append(keys.setdefault(key_of.get(c, ("alone", c)), len(keys)))
    groups: list[list[int]] = [[] for _ in keys]
    for c, g in enumerate(group_of):
        groups[g].append(c)
    return tuple(group_of), tuple(tuple(g) for g in groups)


def _internal_color_keys(nda: NDA, tied: dict[int, tuple], named: set[int]) -> dict[int, tuple]:
    """Group keys of the *internal* colors (they name no parameter dimension:
    a factor that a reshape splits off inside a layer, such as grouped-query
    attention's query heads per key/value head), by their place in the
    period rather than by a parameter: the multiset, over the color's
    I-classes, of the I-class's structural label (op kind, operand types,
    attributes, factor) with the groups of the colors beside it at its owner.
    The same internal color of every repeated layer then has one key and is
    decided once, as its layer's parameters' colors are; one that appears
    once (at a boundary) keeps a key of its own. Without this, each layer's
    internal color was a decision of its own, its I-classes had keys of
    their own, and no term of the layer folded."""
    internal = [c for c in range(nda.num_colors) if c not in named and c not in tied]
    if not internal:
        return {}
    at_owner: dict[tuple, list[int]] = {}
    for ic in nda.iclasses:
        at_owner.setdefault(ic.owner[:2], []).append(ic.color)
    # Two rounds: beside-colors named by their group key where tied, else by their first-round key.
    first = {c: ("internal", len(nda.color_iclasses[c]),
                 tuple(sorted(nda.iclasses[k].label for k in nda.color_iclasses[c]))) for c in internal}
    known = {**tied, **first}
    named_as: dict[int, str] = {}  # per color, its key as text (sortable whatever the keys hold), made once

    def name(c: int) -> str:
        text = named_as.get(c)
        if text is None:
            text = named_as[c] = repr(known.get(c, ("alone", c)))
        return text

    def beside(k: int) -> tuple:
        ic = nda.iclasses[k]
        return tuple(sorted(name(c) for c in at_owner[ic.owner[:2]] if c != ic.color))

    return {c: ("internal", len(nda.color_iclasses[c]),
                tuple(sorted((nda.iclasses[k].label, beside(k)) for k in nda.color_iclasses[c])))
            for c in internal}


def _data_colors(nda: NDA, data_inputs: Sequence[str]) -> set[int]:
    """Colors naming a dimension of a batch input and none of another parameter."""
    named: dict[int, set[bool]] = {}
    for p in nda.function.params:
        for d in range(p.type.rank):
            named.setdefault(nda.def_color(p, d), set()).add(p.name in data_inputs)
    return {c for c, kinds in named.items() if kinds == {True}}
