"""Named Dimension Analysis (TOAST, sections 3 and 4.4).

Every definition (parameter or op result) and every use (operand occurrence
or returned value) gets a fresh name per dimension. Then:

1. Identities I: the names an op's factor rule gives to one factor are
   unified (a dimension carries its *major* factor: block sharding of a
   merged dimension shards its major factor). Each resulting class, an
   *I-class*, is one factor of one op or one parameter dimension (a returned
   value's dims are identified with its definition's: returning imposes
   nothing).
2. Map M: each definition's dimension name is linked to the same dimension
   of every use. *Colors* are the connected components of I-classes under M:
   the dimension sets that one sharding decision shards together.
3. A *conflict* is an unordered pair of different I-classes of one color
   annotating one definition or use (a tensor with two dimensions of one
   color: sharding both on one axis is impossible, so one must be chosen). A
   pair is one conflict however many tensors it annotates.
4. A conflict on a definition and a conflict on a use of it form a *box*:
   M links the two pairs dimension by dimension, so resolving both "the same
   way" needs no resharding between them. Boxes are taken transitively into
   *compatibility sets* with a consistent two-sided orientation (a box that
   would put both members of a conflict on one side is left out): each set
   has two resolutions, "shard side 0" and "shard side 1".
5. Isomorphic compatibility sets (repeated layers) form one *resolution
   class* sharing one bit (exact isomorphism of labelled graphs, with the
   Weisfeiler-Lehman hash only as a bucket key, so there are no false merges).
6. *Parameter groups*: parameters whose uses have the same structure (to a
   fixed depth) are grouped so tactics and search can mirror decisions
   across repeated layers.

`analyze(fn)` returns an immutable `NDA` with O(1) queries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx
import numpy as np

from ir import ops
from ir.core import Function, Op, Value

# ------------------------------------------------------------ components


class ParityUnionFind:
    """Union-find whose members carry a side (0/1) relative to their root.

    `union(a, b, differ)` records that a and b are on different sides
    (differ=1) or the same side (differ=0); it refuses (returns False) a
    constraint that contradicts the ones already recorded.
    """

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.parity: dict[int, int] = {}

    def find(self, x: int) -> tuple[int, int]:
        self.parent.setdefault(x, x)
        self.parity.setdefault(x, 0)
        path = []
        while self.parent[x] != x:
            path.append(x)
            x = self.parent[x]
        # Compress: each node on the path points at the root with its total parity.
        total = 0
        for node in reversed(path):
            total ^= self.parity[node]
            self.parity[node] = total
            self.parent[node] = x
        return x, (self.parity[path[0]] if path else 0)

    def union(self, a: int, b: int, differ: int) -> bool:
        (ra, pa), (rb, pb) = self.find(a), self.find(b)
        if ra == rb:
            return (pa ^ pb) == differ
        if rb < ra:
            ra, rb, pa, pb = rb, ra, pb, pa
        self.parent[rb] = ra
        self.parity[rb] = pa ^ pb ^ differ
        return True


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element of 0..n-1 joined by the edges (a[k], b[k]): the smallest
    element of its component (a union-find's roots, where the smaller root
    always wins), computed in numpy: the analysis joins 10^5 pairs on 80
    layers, and one Python `union` call each took a third of it. Each round
    hooks every edge's larger root onto its smaller, then jumps pointers
    until each label is a root, so every round leaves fewer roots; a label
    is always an element of its component no larger than itself, so at the
    fixed point it is the component's smallest."""
    label = np.arange(n, dtype=np.int64)
    while len(a):
        la, lb = label[a], label[b]
        apart = la != lb
        if not apart.any():
            break
        la, lb = la[apart], lb[apart]
        low = np.minimum(la, lb)
        np.minimum.at(label, np.maximum(la, lb), low)
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
    return label


# ------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class IClass:
    """One factor of one op, or one parameter dimension."""

    id: int
    color: int
    size: int
    owner: tuple  # ("op", op index, factor index) | ("param", parameter index, dim)
    label: str  # structural description, equal for the same factor of identical ops
    # Whether block sharding may split it: not for opaque factors, nor for a
    # factor that is the minor part of a merged dimension somewhere in its op.
    shardable: bool = True


@dataclass(frozen=True, slots=True)
class Conflict:
    id: int
    color: int
    iclasses: tuple[int, int]  # ordered: smaller I-class id first


@dataclass(frozen=True, slots=True)
class CompatSet:
    """Conflicts whose resolutions are tied; `sides[s]` are the I-classes
    sharded when side s is chosen (the others of the set are deselected)."""

    id: int
    conflicts: tuple[int, ...]
    sides: tuple[frozenset[int], frozenset[int]]
    resolution_class: int
    flip: int  # this set's side = class bit XOR flip


@dataclass(frozen=True, slots=True)
class ResolutionClass:
    id: int
    compat_sets: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class NDA:
    """The analysis of one Function. Dimension names are integers: definition
    `def_base[value] + dim` and use `use_base[op][operand] + dim` (returned
    values: `result_base[k] + dim`)."""

    function: Function
    def_base: Mapping[Value, int]  # read-only view
    use_base: tuple[tuple[int, ...], ...]
    result_base: tuple[int, ...]
    name_iclass: np.ndarray  # dimension name -> I-class id
    iclasses: tuple[IClass, ...]
    op_factor_iclass: tuple[tuple[int, ...], ...]  # op -> factor -> I-class (-1: factor carries no dim)
    color_iclasses: tuple[tuple[int, ...], ...]
    color_conflicts: tuple[tuple[int, ...], ...]
    color_names: tuple[int, ...]  # number of dimension names per color
    neighbors: tuple[tuple[int, ...], ...]  # I-class -> I-classes joined to it by map M
    conflicts: tuple[Conflict, ...]
    compat_sets: tuple[CompatSet, ...]
    resolution_classes: tuple[ResolutionClass, ...]
    class_deselected: tuple[tuple[frozenset[int], frozenset[int]], ...]
    param_groups: tuple[tuple[str, ...], ...]

    # -- O(1) queries

    @property
    def num_colors(self) -> int:
        return len(self.color_iclasses)

    def def_iclass(self, value: Value, dim: int) -> int:
        return int(self.name_iclass[self.def_base[value] + dim])

    def def_color(self, value: Value, dim: int) -> int:
        return self.iclasses[self.def_iclass(value, dim)].color

    def use_iclass(self, op_index: int, operand: int, dim: int) -> int:
        return int(self.name_iclass[self.use_base[op_index][operand] + dim])

    def use_color(self, op_index: int, operand: int, dim: int) -> int:
        return self.iclasses[self.use_iclass(op_index, operand, dim)].color

    def resolutions(self, class_id: int) -> tuple[frozenset[int], frozenset[int]]:
        """I-classes deselected (kept unsharded by their color) under bit 0 and bit 1."""
        return self.class_deselected[class_id]

    def describe_iclass(self, iclass: int) -> str:
        owner = self.iclasses[iclass].owner
        fn = self.function
        if owner[0] == "op":
            op = fn.ops[owner[1]]
            factor = ops.factor_rule(op).factors[owner[2]]
            return f"{factor.name} of {op.describe()}"
        return f"%{fn.params[owner[1]].name}[{owner[2]}]"




# ------------------------------------------------------------ the analysis


def analyze(fn: Function, group_params: Sequence[str] | None = None, group_depth: int = 4) -> NDA:
    """Run the Named Dimension Analysis on `fn` (see the module docstring).

    `group_params` limits parameter groups to these parameters (a model's
    trainable ones: optimizer state shares its parameter's colors anyway).
    """
    names = _Names.of(fn)
    rules = _RuleCache()
    name_iclass, owners, op_factor_iclass = _identities(fn, names, rules)
    iclass_color, color_count, neighbors = _colors(fn, names, name_iclass, len(owners))
    iclasses = _iclasses(fn, rules, owners, iclass_color.tolist())
    conflicts, aligned = _conflicts_and_boxes(fn, names, name_iclass, iclass_color)
    compat_sets, classes, deselected = _compatibility(iclasses, conflicts, aligned)
    color_iclasses: list[list[int]] = [[] for _ in range(color_count)]
    for ic in iclasses:
        color_iclasses[ic.color].append(ic.id)
    color_conflicts: list[list[int]] = [[] for _ in range(color_count)]
    for c in conflicts:
        color_conflicts[c.color].append(c.id)
    color_names = np.bincount(iclass_color[name_iclass], minlength=color_count)
    name_iclass.flags.writeable = False
    return NDA(
        fn, MappingProxyType(names.def_base), names.use_base, names.result_base, name_iclass, iclasses,
        op_factor_iclass, tuple(map(tuple, color_iclasses)), tuple(map(tuple, color_conflicts)),
        tuple(int(n) for n in color_names), neighbors, conflicts, compat_sets, classes, deselected,
        _param_groups(fn, group_params, group_depth),
    )


@dataclass(frozen=True, slots=True)
class _Names:
    """Integer dimension names, in program order: parameter definitions, then
    per op its uses and its result definitions, then the returned values."""

    def_base: dict[Value, int]
    use_base: tuple[tuple[int, ...], ...]
    result_base: tuple[int, ...]
    total: int

    @staticmethod
    def of(fn: Function) -> _Names:
        def_base: dict[Value, int] = {}
        next_name = 0
        for p in fn.params:
            def_base[p] = next_name
            next_name += p.type.rank
        use_base = []
        for op in fn.ops:
            bases = []
            for o in op.operands:
                bases.append(next_name)
                next_name += o.type.rank
            use_base.append(tuple(bases))
            for r in op.results:
                def_base[r] = next_name
                next_name += r.type.rank
        result_base = []
        for r in fn.results:
            result_base.append(next_name)
            next_name += r.type.rank
        return _Names(def_base, tuple(use_base), tuple(result_base), next_name)


class _RuleCache:
    """Factor rules by (kind, operand types, attrs), the op's signature:
    repeated layers hit the cache."""

    def __init__(self) -> None:
        self.rules: dict[tuple, tuple[ops.FactorRule, int]] = {}  # signature -> (rule, its number)
        # The same op asks again and again (per factor, per pass): by identity first, its key unhashed.
        self.of_op: dict[int, tuple[Op, ops.FactorRule, int]] = {}

    def __call__(self, op: Op) -> ops.FactorRule:
        return self.signature(op)[1]

    def signature(self, op: Op) -> tuple[Op, ops.FactorRule, int]:
        """The op, its rule and its signature's number (in order of first sight)."""
        known = self.of_op.get(id(op))
        if known is not None and known[0] is op:
            return known
        key = (op.kind, tuple(o.type for o in op.operands), op.attrs)
        rule = self.rules.get(key)
        if rule is None:
            rule = self.rules[key] = (ops.factor_rule(op), len(self.rules))
        known = self.of_op[id(op)] = (op, *rule)  # the op held: its id is not reused while the cache lives
        return known


def _identities(fn: Function, names: _Names, rules: _RuleCache) -> tuple[np.ndarray, list[tuple], tuple]:
    """Unify the names each factor carries (as major factor); number the I-classes."""
    joined: list[int] = []  # pairs of names, flat
    first_names: list[list[int]] = []
    for i, op in enumerate(fn.ops):
        rule = rules(op)
        first = [-1] * len(rule.factors)
        carriers = [(names.use_base[i][j], dims) for j, dims in enumerate(rule.operands)]
        carriers += [(names.def_base[r], dims) for r, dims in zip(op.results, rule.results)]
        for base, dims in carriers:
            for d, factors in enumerate(dims):
                f = factors[0]
                if first[f] < 0:
                    first[f] = base + d
                else:
                    joined += (first[f], base + d)
        first_names.append(first)
    owner_of_name: dict[int, tuple] = {}
    for vi, p in enumerate(fn.params):
        for d in range(p.type.rank):
            owner_of_name[names.def_base[p] + d] = ("param", vi, d)
    for i, first in enumerate(first_names):
        for f, n in enumerate(first):
            if n >= 0:
                owner_of_name[n] = ("op", i, f)
    # A returned value imposes nothing on its dims: its use is identified with
    # its definition, so results add no I-class and no conflict.
    for r, base in zip(fn.results, names.result_base):
        for d in range(r.type.rank):
            joined += (names.def_base[r] + d, base + d)
    pairs = np.array(joined, dtype=np.int64).reshape(-1, 2)
    roots = components(names.total, pairs[:, 0], pairs[:, 1])
    ids, name_iclass = np.unique(roots, return_inverse=True)  # roots ascend: ids in program order
    owners = [owner_of_name[r] for r in ids.tolist()]
    iclass_of = name_iclass.tolist()
    op_factor_iclass = tuple(tuple(iclass_of[n] if n >= 0 else -1 for n in first) for first in first_names)
    return name_iclass.astype(np.int64), owners, op_factor_iclass


def _colors(fn: Function, names: _Names, name_iclass: np.ndarray, count: int):
    """Connect each definition's dims to the same dims of its uses (map M).

    Returns the color of each I-class, the number of colors, and each
    I-class's neighbours along M (for propagation that stops where blocked).
    """
    defined: list[int] = []  # per use of a dimension: the name of its definition, and its own
    used: list[int] = []
    for op, bases in zip(fn.ops, names.use_base):
        for v, base in zip(op.operands, bases):
            rank = v.type.rank
            if rank:
                at = names.def_base[v]
                defined += range(at, at + rank)
                used += range(base, base + rank)
    a = name_iclass[np.array(defined, dtype=np.int64)]
    b = name_iclass[np.array(used, dtype=np.int64)]
    ids, color = np.unique(components(count, a, b), return_inverse=True)
    # Each I-class's neighbours, ascending: the distinct pairs of either direction, sorted.
    apart = a != b
    pairs = np.unique(np.concatenate([a[apart] * count + b[apart], b[apart] * count + a[apart]]))
    ends = np.searchsorted(pairs // count, np.arange(count + 1))
    others = (pairs % count).tolist()
    neighbors = tuple(tuple(others[lo:hi]) for lo, hi in zip(ends[:-1].tolist(), ends[1:].tolist()))
    return color.astype(np.int64).reshape(-1), len(ids), neighbors


def _iclasses(fn: Function, rules: _RuleCache, owners: list[tuple], colors: list[int]) -> tuple[IClass, ...]:
    """Each owner's I-class: its size, its label (what it is, without names
    or positions: equal for the same factor of identical ops in different
    layers) and whether block sharding may split it (not an opaque factor,
    nor the minor part of a merged dimension anywhere in its op). What
    follows from an op's signature (`_RuleCache`) is made once per
    signature: 10^5 owners on 80 layers, a few hundred signatures."""
    per_op: dict[int, tuple] = {}  # op index -> per factor: (size, label, shardable)
    per_signature: dict[int, tuple] = {}  # the op's signature's number (`_RuleCache`) -> the same
    out = []
    for i, owner in enumerate(owners):
        kind, at, f = owner
        if kind != "op":
            param = fn.params[at]
            out.append(IClass(i, colors[i], param.type.shape[f], owner, f"param:{param.type}:{f}", True))
            continue
        factors = per_op.get(at)
        if factors is None:
            op = fn.ops[at]
            _, rule, signature = rules.signature(op)
            factors = per_signature.get(signature)
            if factors is None:
                types = ",".join(str(o.type) for o in op.operands)  # once per signature: a quarter of the analysis
                prefix = f"{op.kind}({types}){dict(op.attrs.items)}"
                minor = {g for tensor in rule.operands + rule.results for dims in tensor for g in dims[1:]}
                factors = per_signature[signature] = tuple(
                    (factor.size, f"{prefix}:{factor.name}",
                     factor.kind is not ops.FactorKind.OPAQUE and g not in minor)
                    for g, factor in enumerate(rule.factors))
            per_op[at] = factors
        size, label, shardable = factors[f]
        out.append(IClass(i, colors[i], size, owner, label, shardable))
    return tuple(out)


def _conflicts_and_boxes(
    fn: Function, names: _Names, name_iclass: np.ndarray, iclass_color: np.ndarray
) -> tuple[tuple[Conflict, ...], list[tuple[int, int]]]:
    """Conflicts in program order, and the (definition I-class, use I-class)
    alignments of every box."""
    finder = _ConflictFinder(names, name_iclass, iclass_color)
    for p in fn.params:
        finder.definition(p)
    for op, bases in zip(fn.ops, names.use_base):
        for v, base in zip(op.operands, bases):
            finder.use(v, base)
        for r in op.results:
            finder.definition(r)
    conflicts = tuple(Conflict(i, int(iclass_color[a]), (a, b)) for (a, b), i in finder.found.items())
    return conflicts, list(finder.aligned)


class _ConflictFinder:
    """Collects conflicts (first occurrence order) and box alignments."""

    def __init__(self, names: _Names, name_iclass: np.ndarray, iclass_color: np.ndarray):
        self.names = names
        # Per dimension name, as lists: read a few at a time, 10^5 times on 80 layers.
        self.iclass_of: list[int] = name_iclass.tolist()
        self.color_of: list[int] = iclass_color[name_iclass].tolist()
        self.found: dict[tuple[int, int], int] = {}
        self.aligned: dict[tuple[int, int], None] = {}

    def record(self, base: int, rank: int) -> set[int]:
        """Record the conflicts on one tensor (its dimension names from
        `base`); return the dims involved."""
        colors = self.color_of[base:base + rank]
        if len(set(colors)) == rank:  # no two dims of one color: most tensors
            return set()
        classes = self.iclass_of[base:base + rank]
        involved = set()
        for d1 in range(rank):
            for d2 in range(d1 + 1, rank):
                a, b = classes[d1], classes[d2]
                if colors[d1] == colors[d2] and a != b:
                    self.found.setdefault((min(a, b), max(a, b)), len(self.found))
                    involved |= {d1, d2}
        return involved

    def definition(self, value: Value) -> None:
        if value.type.rank > 1:
            self.record(self.names.def_base[value], value.type.rank)

    def use(self, value: Value, base: int) -> None:
        """A use's conflicts; each faces the same pair on the definition (M
        links them dim by dim): a box, aligned dimension by dimension."""
        rank = value.type.rank
        if rank < 2:
            return
        involved = self.record(base, rank)
        if involved:
            at_def = self.names.def_base[value]
            for d in sorted(involved):
                self.aligned[(self.iclass_of[at_def + d], self.iclass_of[base + d])] = None


def _compatibility(iclasses: tuple[IClass, ...], conflicts: tuple[Conflict, ...], aligned: list[tuple[int, int]]):
    """Compatibility sets (boxes, transitively, with consistent sides) and
    their grouping into resolution classes."""
    puf = ParityUnionFind()
    for c in conflicts:
        puf.union(*c.iclasses, differ=1)
    boxes = [(x, y) for x, y in aligned if x != y and puf.union(x, y, differ=0)]
    by_root: dict[int, list[int]] = {}
    for c in conflicts:
        by_root.setdefault(puf.find(c.iclasses[0])[0], []).append(c.id)
    box_of_root: dict[int, list[tuple[int, int]]] = {}
    for x, y in boxes:
        box_of_root.setdefault(puf.find(x)[0], []).append((x, y))
    classifier = _IsomorphismClasses(iclasses)
    sets = []
    for set_id, (root, members) in enumerate(by_root.items()):
        nodes = sorted({i for c in members for i in conflicts[c].iclasses})
        parity = {i: puf.find(i)[1] for i in nodes}
        flip_to_min = parity[nodes[0]]  # side 0 holds the set's smallest I-class
        side = {i: p ^ flip_to_min for i, p in parity.items()}
        edges = [(conflicts[c].iclasses, "c") for c in members] + [(b, "b") for b in box_of_root.get(root, [])]
        class_id, flip = classifier.classify(side, edges)
        sides = (frozenset(i for i in nodes if side[i] == 0), frozenset(i for i in nodes if side[i] == 1))
        sets.append(CompatSet(set_id, tuple(members), sides, class_id, flip))
    classes = tuple(ResolutionClass(k, tuple(s.id for s in sets if s.resolution_class == k))
                    for k in range(classifier.count))
    deselected = tuple(_deselected(sets, cls) for cls in classes)
    return tuple(sets), classes, deselected


def _deselected(sets: list[CompatSet], cls: ResolutionClass) -> tuple[frozenset[int], frozenset[int]]:
    off: list[set[int]] = [set(), set()]
    for s in cls.compat_sets:
        for bit in (0, 1):
            off[bit] |= sets[s].sides[1 - (bit ^ sets[s].flip)]
    return frozenset(off[0]), frozenset(off[1])


class _IsomorphismClasses:
    """Groups compatibility sets whose labelled graphs are isomorphic, with
    their sides aligned (possibly flipped). Sets are bucketed by their size
    (nodes, edges of each kind), then by the WL hash, computed only where a
    bucket already holds a class (a program's sets are often one, every
    layer's conflicts tied together: its hash was a seventh of the analysis
    of 80 layers); each match is confirmed by an exact isomorphism test."""

    def __init__(self, iclasses: tuple[IClass, ...]):
        self.iclasses = iclasses
        # size -> per class: its number, its graphs (sides as found, flipped) and their hashes' least
        self.buckets: dict[tuple, list[list]] = {}
        self.count = 0

    def graph(self, side: dict[int, int], edges: list, flip: int) -> nx.Graph:
        g = nx.Graph()
        for i, s in side.items():
            g.add_node(i, label=f"{self.iclasses[i].label}|{s ^ flip}")
        for (a, b), kind in edges:
            g.add_edge(a, b, kind=kind)
        return g

    def classify(self, side: dict[int, int], edges: list) -> tuple[int, int]:
        graphs = [self.graph(side, edges, flip) for flip in (0, 1)]
        size = (len(side), tuple(sorted(Counter(kind for _, kind in edges).items())))
        bucket = self.buckets.setdefault(size, [])
        if bucket:
            key = _least_hash(graphs)
            for known in bucket:
                if known[2] is None:
                    known[2] = _least_hash(known[1])
                if known[2] != key:
                    continue
                for flip, g in enumerate(graphs):
                    if nx.is_isomorphic(g, known[1][0], node_match=_same_label, edge_match=_same_kind):
                        return known[0], flip
        bucket.append([self.count, graphs, None])
        self.count += 1
        return self.count - 1, 0


def _least_hash(graphs: list[nx.Graph]) -> str:
    """The least WL hash of a set's graphs (its sides as found, and flipped): the same for isomorphic sets."""
    return min(nx.weisfeiler_lehman_graph_hash(g, node_attr="label", edge_attr="kind") for g in graphs)


def _same_label(a: dict, b: dict) -> bool:
    return a["label"] == b["label"]


def _same_kind(a: dict, b: dict) -> bool:
    return a["kind"] == b["kind"]


def _param_groups(fn: Function, names: Sequence[str] | None, depth: int) -> tuple[tuple[str, ...], ...]:
    """Parameters (of `names`, default all) whose uses have the same structure,
    in groups of two or more, in program order.

    The structure of a parameter is its type, the multiset of (op kind,
    attributes, result types, operand position) over all its uses, and the
    chain of those labels `depth` steps down along first uses. Following only
    first uses is what lets the last of L repeated layers match the others:
    its output feeds a final norm instead of the next layer, which shows in
    the full set of downstream uses but not in the first-use chain. No names
    are read.
    """
    uses: dict[Value, list[tuple[Op, int]]] = {v: [] for v in fn.values()}
    for op in fn.ops:
        for j, o in enumerate(op.operands):
            uses[o].append((op, j))

    def label(op: Op, j: int) -> tuple:
        return (op.kind, op.attrs, tuple(r.type for r in op.results), j)

    def structure(p: Value) -> tuple:
        direct = sorted(map(repr, (label(op, j) for op, j in uses[p])))
        chain, v = [], p
        for _ in range(depth):
            if not uses[v]:
                break
            op, j = uses[v][0]
            chain.append(label(op, j))
            v = op.results[0]
        return (p.type, tuple(direct), tuple(chain))

    wanted = set(names) if names is not None else None
    groups: dict[tuple, list[str]] = {}
    for p in fn.params:
        if wanted is None or p.name in wanted:
            groups.setdefault(structure(p), []).append(p.name)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)
