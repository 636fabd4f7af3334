"""Factor shardings and their materialization from sharding decisions.

A `FactorSharding` says, for every I-class of a program's NDA, which mesh
axes shard it (major to minor). It is the one currency between planning,
lowering and costing: a tensor dimension is sharded by the axes of the
I-class of its name (a definition by its producer's factor, a use by its
consumer's).

`materialize` turns ordered decisions into a factor sharding (DESIGN.md):

  - a decision (color, axis) shards every I-class of the color with the axis,
    except where the I-class's owner (its op, or its parameter) already uses
    that axis for another factor: earlier decisions win, which is PartIR's
    incremental priority and what makes ZeRO-3 parameter all_gathers appear;
  - except I-classes its conflicts' resolution bits deselect;
  - except where the factor size is not divisible by the devices it would
    be split over, and except I-classes that block sharding cannot split
    (opaque factors, minor parts of merged dimensions);
  - except (I-class, axis) pairs a `replicate` tactic keeps whole;
  - a decision may name a single I-class (`only`): how a manual tactic pins
    the parameter dimensions it names; with `spread`, the sharding then
    propagates from that I-class along map M and stops at every I-class it
    cannot shard (owner already using the axis, blocked, not divisible,
    unsplittable); deselected I-classes stay unsharded but are passed
    through. That is how manual tactics propagate: a whole-color decision
    would also reach I-classes only connected through blocked ones (ZeRO-3
    on `first_divisible` dims: wq's d_model and wo's heads share the Adam
    ops' factors colorwise, and the first color to claim the axis would
    reshard every other parameter's optimizer update).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ir.core import IRError, Mesh, Recent, TensorType, Value
from ir.nda import NDA

DimAxes = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """Shard `color` along mesh `axis`; or, with `only`, just that I-class; or,
    with `only` and `spread`, that I-class and what it reaches along map M
    without crossing an I-class the axis cannot shard (PartIR's propagation)."""

    axis: str
    color: int
    only: int | None = None
    spread: bool = False


@dataclass(frozen=True, slots=True)
class FactorSharding:
    mesh: Mesh
    axes: tuple[tuple[str, ...], ...]  # per I-class, major to minor

    def of(self, iclass: int) -> tuple[str, ...]:
        """Axes of an I-class; -1 (a factor that names no dimension) is unsharded."""
        return () if iclass < 0 else self.axes[iclass]

    def def_dims(self, nda: NDA, value: Value) -> DimAxes:
        """How a definition is sharded: per dimension, its axes."""
        return tuple(self.axes[nda.def_iclass(value, d)] for d in range(value.type.rank))

    def use_dims(self, nda: NDA, op_index: int, operand: int) -> DimAxes:
        """How an op wants one of its operands sharded."""
        rank = nda.function.ops[op_index].operands[operand].type.rank
        return tuple(self.axes[nda.use_iclass(op_index, operand, d)] for d in range(rank))


def axis_tuples(mesh: Mesh) -> list[tuple[str, ...]]:
    """Every ordered tuple of distinct mesh axes, shortest first: the numbering
    of a sharding's *codes* (code 0 is unsharded), shared by the cost table
    and the search space."""
    return [t for r in range(len(mesh.axes) + 1) for t in itertools.permutations(mesh.names, r)]


@functools.lru_cache(maxsize=1 << 16)
def local_type(ty: TensorType, dims: DimAxes, mesh: Mesh) -> TensorType:
    """The per-device type of a tensor sharded as `dims` (memoized: the cost
    model asks the same few again and again)."""
    shape = []
    for size, axes in zip(ty.shape, dims):
        k = mesh.group_size(axes)
        if size % k:
            raise IRError(f"dimension of size {size} in {ty} cannot be split over axes {list(axes)} ({k} devices)")
        shape.append(size // k)
    return ty.with_shape(tuple(shape))


@dataclass(frozen=True, slots=True)
class _Facts:
    """What `materialize` reads of each I-class, as flat lists: its size,
    whether block sharding may split it, and its owner (op or parameter) as
    a number. Made once per analysis: a large program has 100,000s of
    I-classes, and a mesh search materializes hundreds of plans of it."""

    sizes: list[int]
    unshardable: frozenset[int]
    owners: list[int]


_FACTS = Recent(4)
_SIZELESS = Recent(8)  # the last few decision lists applied, a few meshes' answers each, by analysis identity
# Answers kept per decision list: a mesh search meets one plan on meshes that cut it differently (GPT 310.1B's
# screen: six ways for the published split; with 4 kept, 127 plans were materialized afresh in its run, with 16, 73).
_VARIANTS = 16


def _facts(nda: NDA) -> _Facts:
    def make() -> _Facts:
        numbers: dict[tuple, int] = {}
        owners = [numbers.setdefault(ic.owner[:2], len(numbers)) for ic in nda.iclasses]
        return _Facts([ic.size for ic in nda.iclasses],
                      frozenset(k for k, ic in enumerate(nda.iclasses) if not ic.shardable), owners)

    return _FACTS.get((nda,), None, make)


def materialize(
    nda: NDA,
    mesh: Mesh,
    decisions: Sequence[Decision],
    resolutions: Mapping[int, int] | None = None,
    replicated: Iterable[tuple[int, str]] = (),
) -> FactorSharding:
    """Apply decisions in order (see the module docstring); deterministic.

    The sizes of the mesh's axes only ever decide a claim where a factor
    would not divide. The same decisions on another mesh make every claim
    the same way, so claim the same, where its sizes divide every I-class
    by the devices it took here (a product that divides a size makes each
    of its prefixes divide it) and still refuse each claim refused here for
    a size that did not divide: the last few answers are kept per decision
    list and read there (a mesh search meets one plan on hundreds of
    meshes, and at 2,520 devices nearly every mesh refuses some claim)."""
    resolutions = dict(resolutions or {})
    replicated = tuple(replicated)
    key = (tuple(decisions), tuple(sorted(resolutions.items())), replicated)
    known: tuple[_Claimed, ...] = _SIZELESS.find((nda,), key) or ()
    if known:
        for decision in decisions:
            mesh.size(decision.axis)  # an axis the mesh lacks is an error, as applying the decision would raise
        for claimed in known:
            if claimed.holds(mesh):
                return FactorSharding(mesh, claimed.axes)
    claimed = _Claimed.of(nda, mesh, decisions, resolutions, replicated)
    _SIZELESS.put((nda,), key, (claimed, *known[:_VARIANTS - 1]))
    return FactorSharding(mesh, claimed.axes)


@dataclass(frozen=True, slots=True)
class _Claimed:
    """Decisions applied: each I-class's axes, and per distinct sharded
    assignment the greatest common divisor of its I-classes' sizes (what
    `holds` checks another mesh's devices against)."""

    axes: tuple[tuple[str, ...], ...]
    groups: tuple[tuple[tuple[str, ...], int], ...]
    # The claims refused for a size that did not divide, each distinct one once: (its size, the axes it would
    # have split over: those it had, then the axis refused). Repeated layers refuse alike: a few distinct.
    refused: tuple[tuple[int, tuple[str, ...]], ...]

    @staticmethod
    def of(nda: NDA, mesh: Mesh, decisions: Sequence[Decision], resolutions: Mapping[int, int],
           replicated: tuple[tuple[int, str], ...]) -> _Claimed:
        """The decisions applied on `mesh`."""
        deselected: set[int] = set()
        for cls in range(len(nda.resolution_classes)):
            deselected |= nda.resolutions(cls)[resolutions.get(cls, 0)]
        state = _Claims(nda, deselected, set(replicated))
        for decision in decisions:
            claim = state.on(decision.axis, mesh.size(decision.axis))
            if decision.only is None:
                for k in nda.color_iclasses[decision.color]:
                    claim(k)
            elif decision.spread:
                state.spread(decision.only, decision.axis, claim)
            else:
                claim(decision.only)
        # One tuple per distinct assignment, shared by its I-classes: a large program's shardings are kept
        # (the planner's caches), and most of its I-classes are unsharded or take the same one or two axes.
        shared: dict[tuple[str, ...], list[int]] = {}
        axes: list[tuple[str, ...]] = [()] * len(nda.iclasses)
        for k, taken in state.axes.items():
            key = tuple(taken)
            members = shared.setdefault(key, [])
            members.append(k)
            axes[k] = key if len(members) == 1 else axes[members[0]]
        sizes = state.sizes
        return _Claimed(tuple(axes), tuple((key, math.gcd(*(sizes[k] for k in members)))
                                           for key, members in shared.items()), tuple(state.refused))

    def holds(self, mesh: Mesh) -> bool:
        """Whether the decisions claim the same on `mesh` (`materialize`):
        every I-class's size divides by the devices its axes split it over
        there, and every claim refused for its size is refused there too."""
        devices: dict[tuple[str, ...], int] = {}  # each tuple of axes' devices, once (a check is one number)

        def split(axes: tuple[str, ...]) -> int:
            n = devices.get(axes)
            if n is None:
                n = devices[axes] = mesh.group_size(axes)
            return n

        if any(common % split(key) for key, common in self.groups):
            return False
        return all(size % split(axes) for size, axes in self.refused)


class _Claims:
    """`materialize`'s state: the axes of each I-class taken so far (most
    take none) and the devices it is split over, and each axis's owners (an
    owner uses an axis once)."""

    def __init__(self, nda: NDA, deselected: set[int], blocked: set[tuple[int, str]]) -> None:
        facts = _facts(nda)
        self.sizes, self.owners, self.neighbors = facts.sizes, facts.owners, nda.neighbors
        self.deselected, self.blocked = deselected, blocked
        self.stopped = facts.unshardable | deselected  # never taken
        self.axes: dict[int, list[str]] = {}
        self.split = [1] * len(nda.iclasses)
        self.used: dict[str, set[int]] = {}
        self.refused: dict[tuple[int, tuple[str, ...]], None] = {}  # claims refused for a size, once (`_Claimed`)

    def on(self, axis: str, size: int) -> Callable[[int], bool]:
        """Shard an I-class along `axis` (of `size` devices) if the rules allow it."""
        sizes, owners, stopped, blocked, axes, split = (self.sizes, self.owners, self.stopped, self.blocked,
                                                        self.axes, self.split)
        on_axis = self.used.setdefault(axis, set())

        def take(k: int) -> bool:
            if k in stopped or (k, axis) in blocked or owners[k] in on_axis:
                return False
            if sizes[k] % (split[k] * size):
                self.refused[(sizes[k], (*axes.get(k, ()), axis))] = None
                return False
            axes.setdefault(k, []).append(axis)
            split[k] *= size
            on_axis.add(owners[k])
            return True

        return take

    def spread(self, start: int, axis: str, take: Callable[[int], bool]) -> None:
        """Breadth-first from `start` along map M, through the I-classes the
        axis shards. Deselected I-classes are passed through, not stopped at:
        a resolution unshards one side of a conflict, not the rest of the
        color beyond it."""
        axes, deselected, neighbors = self.axes, self.deselected, self.neighbors
        if not (axis in axes.get(start, ()) or start in deselected or take(start)):
            return
        frontier, seen = [start], {start}
        while frontier:
            reached = []
            for k in frontier:
                for n in neighbors[k]:
                    if n not in seen:
                        seen.add(n)
                        if axis in axes.get(n, ()) or n in deselected or take(n):
                            reached.append(n)
            frontier = reached
