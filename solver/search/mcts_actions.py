"""The MCTS's actions (`solver.search.mcts`, module docstring, "Actions"):
each shards a color group along a mesh axis up to a level and fixes the
bits of the resolution classes in its colors; what a point becomes after
one, and whether one is statically valid there."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from solver.search.space import Point, SearchSpace
from solver.search.zero import WHOLE

# An action fixes the bits of at most this many resolution classes (2**this variants).
_RESOLVED_CLASSES = 3


@dataclass(frozen=True, slots=True)
class Action:
    """Shard the colors of `group` along `axis` up to `level`, fixing the resolution `bits` (class, bit)."""

    group: int
    axis: str
    bits: tuple[tuple[int, int], ...]
    level: int = WHOLE


STOP = None  # the stop action


def actions(space: SearchSpace, min_dims: int) -> tuple[list[Action], int]:
    """Every action of the space, and how many were pruned (module docstring)."""
    nda = space.nda
    touching: dict[int, list[int]] = {g: [] for g in range(len(space.groups))}
    for cls in space.free_classes:
        colors = {nda.iclasses[k].color for side in nda.resolutions(cls) for k in side}
        for g in sorted({space.group_of[c] for c in colors}):
            touching[g].append(cls)
    actions, pruned = [], 0
    for g, axis in space.variables:
        classes = touching[g][:_RESOLVED_CLASSES]
        variants = [tuple(zip(classes, bits)) for bits in itertools.product((0, 1), repeat=len(classes))]
        if sum(nda.color_names[c] for c in space.groups[g]) < min_dims:
            pruned += len(variants) * len(space.options[(g, axis)])
            continue
        actions += [Action(g, axis, bits, level) for level in space.options[(g, axis)]
                    for bits in variants]
    return actions, pruned


def successor(point: Point, action: Action) -> Point:
    """The point after a statically valid action (`statically_valid`)."""
    bits = dict(point.bits)
    bits.update(action.bits)
    after = point.at((action.group, action.axis), action.level)  # the pair was unset or at a narrower level
    return Point(after.sharded, tuple(sorted(bits.items())), after.partial)


def statically_valid(point: Point, action: Action, space: SearchSpace | None = None) -> bool:
    """Statically valid: the (group, axis) is unset, or set to a narrower
    partial level that the action widens (LATE is set only on an unset pair);
    the bits agree with the fixed ones; and, given the space, a group's LATE
    axes stay after its early ones (`SearchSpace.late_order_ok`)."""
    pair = (action.group, action.axis)
    levels = point.levels()
    current = levels.get(pair, 0)
    if current and not (action.level <= WHOLE and current < action.level):
        return False
    fixed = dict(point.bits)
    if not all(fixed.get(c, b) == b for c, b in action.bits):
        return False
    return space is None or not space.late_variables or space.late_order_ok({**levels, pair: action.level})


__all__ = ["STOP", "Action", "actions", "successor", "statically_valid"]
