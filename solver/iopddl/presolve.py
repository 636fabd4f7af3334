"""Presolve: forbidden and dominated strategies dropped, parallel edges summed, fixed
nodes folded, nodes a neighbour determines absorbed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from solver.iopddl.problem import INFINITE, IopddlError, Problem

# ------------------------------------------------------------------ presolve


@dataclass
class _Reduced:
    """The problem after presolve. Every node keeps `kept[v]` (original
    strategy indices) with `cost[v]` over them; a node with one kept
    strategy is fixed (its edges were folded into its neighbours' costs).
    `edges[(u, v)]` (u < v, both free) is the merged cost matrix over kept
    strategies, INFINITE where forbidden; `adjacent[v]` lists (neighbour,
    key).

    A node's memory is piecewise constant in time: `load[v][s, k]` is its
    usage at strategy s over steps [bounds[v][k], bounds[v][k+1]) and
    nothing outside them. A node of the input has one such segment (its
    interval, or none when the interval is empty); a node that absorbed the
    nodes it determines (`_merge_determined`) carries all of theirs.
    `merged` lists (v, u, choice) in the order v was absorbed into u: v
    takes original strategy choice[k] when u takes original strategy k."""

    kept: list[np.ndarray]
    cost: list[np.ndarray]
    bounds: list[np.ndarray]
    load: list[np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]
    adjacent: list[list[tuple[int, tuple[int, int]]]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    merged: list[tuple[int, int, np.ndarray]] = field(default_factory=list)

    def free(self, v: int) -> bool:
        return len(self.kept[v]) > 1

    def matrix(self, v: int, key: tuple[int, int]) -> np.ndarray:
        """The edge's matrix with v's strategies as rows."""
        m = self.edges[key]
        return m if key[0] == v else m.T

    def original(self, choice: np.ndarray) -> np.ndarray:
        """Original strategy indices of `choice` (positions in `kept`); an
        absorbed node follows the node that absorbed it."""
        chosen = np.array([self.kept[v][c] for v, c in enumerate(choice.tolist())], dtype=np.int64)
        for v, u, follows in reversed(self.merged):  # u is decided before v: it was absorbed later, or never
            chosen[v] = follows[chosen[u]]
        return chosen


def presolve(problem: Problem) -> _Reduced:
    """Forbidden and dominated strategies dropped, parallel edges merged,
    nodes with a single strategy folded into their neighbours."""
    n = problem.num_nodes
    kept = [np.nonzero(c < INFINITE)[0] for c in problem.node_costs]
    empty = [v for v in range(n) if len(kept[v]) == 0]
    if empty:
        raise IopddlError(f"node {empty[0]} has only forbidden strategies: the problem has no solution")
    live = problem.intervals[:, 0] < problem.intervals[:, 1]
    red = _Reduced(kept, [problem.node_costs[v][kept[v]].copy() for v in range(n)],
                   [problem.intervals[v] if live[v] else np.zeros(0, dtype=np.int64) for v in range(n)],
                   [problem.node_usages[v][kept[v]].reshape(-1, 1) if live[v] else
                    np.zeros((len(kept[v]), 0), dtype=np.int64) for v in range(n)], {})
    red.stats = {"strategies": sum(len(c) for c in problem.node_costs), "edges": problem.num_edges}
    for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs):
        m = m[np.ix_(red.kept[u], red.kept[v])]
        if u == v:  # a self-edge only ever takes its diagonal
            red.cost[u] = np.minimum(red.cost[u] + np.diagonal(m), INFINITE)
            continue
        key, m = ((u, v), m) if u < v else ((v, u), m.T)
        red.edges[key] = red.edges[key] + m if key in red.edges else m.astype(np.int64)
    red.edges = {k: np.minimum(m, INFINITE) for k, m in red.edges.items()}  # sums of forbidden stay forbidden
    red.stats["merged_edges"] = len(red.edges)
    _rebuild_adjacency(red)
    for v in range(n):  # a forbidden self-edge diagonal forbids that strategy
        allowed = np.nonzero(red.cost[v] < INFINITE)[0]
        if len(allowed) == 0:
            raise IopddlError(f"node {v} has only forbidden strategies: the problem has no solution")
        if len(allowed) < len(red.kept[v]):
            _keep(red, v, allowed)
    _drop_dominated(red)
    _fold_fixed(red)
    red.stats["merged"] = 0  # nodes absorbed by `_merge_determined`, later
    _count_free(red)
    return red


def _rebuild_adjacency(red: _Reduced) -> None:
    red.adjacent = [[] for _ in red.kept]
    for key in red.edges:
        red.adjacent[key[0]].append((key[1], key))
        red.adjacent[key[1]].append((key[0], key))


def _keep(red: _Reduced, v: int, rows: np.ndarray) -> None:
    """Restrict node v to its kept strategies at positions `rows`."""
    red.kept[v], red.cost[v], red.load[v] = red.kept[v][rows], red.cost[v][rows], red.load[v][rows]
    for _, key in red.adjacent[v]:
        red.edges[key] = red.edges[key][rows, :] if key[0] == v else red.edges[key][:, rows]


# Dominance compares every pair of a node's strategies on all its features;
# skip nodes where that would be slow (hundreds of strategies, many edges).
_DOMINANCE_BUDGET = 4_000_000


def _drop_dominated(red: _Reduced) -> None:
    """Drop s when another strategy is no worse in cost, load and every
    edge row (identical ones: keep the first). Forbidden pairs count as
    the largest cost, so a strategy free of them can dominate."""
    dropped = 0
    for v in range(len(red.kept)):
        s = len(red.kept[v])
        if s < 2:
            continue
        rows = [red.cost[v][:, None], red.load[v]] + [red.matrix(v, k) for _, k in red.adjacent[v]]
        features = np.concatenate(rows, axis=1)
        if s * s * features.shape[1] > _DOMINANCE_BUDGET:
            continue
        no_worse = (features[:, None, :] <= features[None, :, :]).all(axis=2)  # [a, b]: a no worse than b
        equal = no_worse & no_worse.T
        strictly = no_worse & ~equal
        earlier_equal = np.triu(equal, k=1)  # a < b and identical: b is dropped
        dominated = strictly.any(axis=0) | earlier_equal.any(axis=0)
        if dominated.any():
            dropped += int(dominated.sum())
            _keep(red, v, np.nonzero(~dominated)[0])
    red.stats["dominated"] = red.stats.get("dominated", 0) + dropped  # presolve's, then again after absorbing


def _fold_fixed(red: _Reduced) -> None:
    """Fold every edge with a single-strategy end into the other end's
    costs; repeat while folding leaves new single-strategy nodes (a row of
    only forbidden entries drops that strategy)."""
    queue = [v for v in range(len(red.kept)) if len(red.kept[v]) == 1]
    while queue:
        v = queue.pop()
        for w, key in list(red.adjacent[v]):
            column = red.matrix(w, key)[:, 0]
            red.cost[w] = np.minimum(red.cost[w] + column, INFINITE)
            del red.edges[key]
            red.adjacent[w] = [(x, k) for x, k in red.adjacent[w] if k != key]
            allowed = np.nonzero(red.cost[w] < INFINITE)[0]
            if len(allowed) == 0:
                raise IopddlError(f"node {w} has no strategy compatible with its fixed neighbours: no solution")
            if len(allowed) < len(red.kept[w]):
                _keep(red, w, allowed)
            if len(red.kept[w]) == 1 and red.adjacent[w]:
                queue.append(w)
        red.adjacent[v] = []


def _determined(m: np.ndarray) -> np.ndarray | None:
    """When every row of `m` allows at most one column (the rest forbidden),
    that column per row, -1 where a row allows none; else None."""
    allowed = m < INFINITE
    count = allowed.sum(axis=1)
    if (count > 1).any():
        return None
    return np.where(count == 1, allowed.argmax(axis=1), -1)


def _merge_determined(problem: Problem, red: _Reduced) -> _Reduced:
    """Absorb every node that a neighbour determines: when each strategy of
    u allows exactly one strategy of v on their edge (every other pair is
    forbidden), v follows u in any solution of finite cost, so v's cost,
    the edge's allowed entries and v's other edges (their rows reordered by
    u's strategies) move to u, and v's memory joins u's. Repeated until no
    edge determines an end; a strategy of u that allows none of v's is
    dropped. Exact for every solution without a forbidden choice.

    The instances are full of such edges (a reshape or a copy whose layout
    is fixed by its operand's): A's 28,071 free nodes become 284, C's
    22,239 become 236, P's 48,480 become 197. The search then moves a
    whole chain of operations at once, which single-node moves and
    neighbourhoods of a few hundred nodes could not (a chain with a
    forbidden pair at every step only changes all together)."""
    n = len(red.kept)
    absorber = _Absorber(problem, red)
    absorber.run()
    kept, cost, adjacent, merged = absorber.kept, absorber.cost, absorber.adjacent, absorber.merged
    absorbed = {v for v, _, _ in merged}
    bounds, load = list(red.bounds), list(red.load)
    for v in absorbed:
        bounds[v], load[v] = np.zeros(0, dtype=np.int64), np.zeros((1, 0), dtype=np.int64)
    for u, members in _members(merged, kept, absorbed).items():
        bounds[u], load[u] = _combined_load(problem, members)
    out = _Reduced(kept, cost, bounds, load, {(u, v): m for u in range(n) for v, m in adjacent[u].items() if u < v},
                   stats=dict(red.stats), merged=merged)
    _rebuild_adjacency(out)
    _drop_dominated(out)  # absorbed costs and loads add up: more strategies are now dominated
    _fold_fixed(out)
    out.stats["merged"] = len(merged)
    _count_free(out)
    return out


class _Absorber:
    """The work of `_merge_determined`: a queue of directed edges (u, v) to
    check whether u determines v, re-queued whenever their matrix changes."""

    def __init__(self, problem: Problem, red: _Reduced):
        self.problem = problem
        self.kept, self.cost = list(red.kept), list(red.cost)
        self.adjacent: list[dict[int, np.ndarray]] = [{} for _ in red.kept]  # [u][v]: u's strategies as rows
        for (u, v), m in red.edges.items():
            self.adjacent[u][v], self.adjacent[v][u] = m, m.T
        self.merged = list(red.merged)
        self.work = [(u, v) for u in range(len(red.kept)) for v in self.adjacent[u]]
        self.queued = set(self.work)  # each directed edge waits at most once

    def recheck(self, u: int, w: int) -> None:
        for pair in ((u, w), (w, u)):
            if pair not in self.queued:
                self.queued.add(pair)
                self.work.append(pair)

    def run(self) -> None:
        while self.work:
            u, v = self.work.pop()
            self.queued.discard((u, v))
            m = self.adjacent[u].get(v)
            follows = None if m is None else _determined(m)
            if follows is None:
                continue
            if len(self.adjacent[u]) < len(self.adjacent[v]):
                # When each determines the other, the one with fewer edges moves:
                # otherwise a chain walks a hub's edges along from node to node.
                back = _determined(m.T)
                if back is not None and (back >= 0).all():
                    u, v, follows = v, u, back
            if (follows < 0).any():
                rows = np.nonzero(follows >= 0)[0]
                if not len(rows):
                    raise IopddlError(f"node {u} has no strategy compatible with node {v}: no solution")
                self.restrict(u, rows)
                follows = follows[rows]
            self.absorb(u, v, follows)

    def restrict(self, u: int, rows: np.ndarray) -> None:
        """Keep u's strategies at positions `rows` only."""
        self.kept[u], self.cost[u] = self.kept[u][rows], self.cost[u][rows]
        for w in self.adjacent[u]:
            self.adjacent[u][w] = self.adjacent[u][w][rows]
            self.adjacent[w][u] = self.adjacent[u][w].T
            self.recheck(u, w)

    def absorb(self, u: int, v: int, follows: np.ndarray) -> None:
        """v takes strategy follows[i] whenever u takes i."""
        adjacent, m = self.adjacent, self.adjacent[u][v]
        self.cost[u] = np.minimum(self.cost[u] + self.cost[v][follows] + m[np.arange(len(follows)), follows],
                                  INFINITE)
        full = np.full(len(self.problem.node_costs[u]), -1, dtype=np.int64)
        full[self.kept[u]] = self.kept[v][follows]
        self.merged.append((v, u, full))
        del adjacent[u][v], adjacent[v][u]
        for w, row in adjacent[v].items():
            del adjacent[w][v]
            row = row[follows]
            adjacent[u][w] = np.minimum(adjacent[u][w] + row, INFINITE) if w in adjacent[u] else row
            adjacent[w][u] = adjacent[u][w].T
            self.recheck(u, w)
        adjacent[v] = {}
        self.kept[v], self.cost[v] = self.kept[v][:1], np.zeros(1, dtype=np.int64)  # decided by `merged`


def _count_free(red: _Reduced) -> None:
    red.stats["free_nodes"] = sum(red.free(v) for v in range(len(red.kept)))
    red.stats["free_strategies"] = sum(len(k) for k in red.kept if len(k) > 1)
    red.stats["free_edges"] = len(red.edges)


def _members(merged: list, kept: list[np.ndarray], absorbed: set[int]) -> dict[int, list[tuple[int, np.ndarray]]]:
    """Per node that absorbed others: itself and every node it decides, each
    with its original strategy at each of the node's kept strategies."""
    children: dict[int, list[tuple[int, np.ndarray]]] = {}
    for v, u, full in merged:
        children.setdefault(u, []).append((v, full))
    out = {}
    for root in children:
        if root in absorbed:
            continue
        members = [(root, kept[root])]
        stack = [(root, kept[root])]
        while stack:
            u, chosen = stack.pop()
            for v, full in children.get(u, ()):
                members.append((v, full[chosen]))
                stack.append((v, full[chosen]))
        out[root] = members
    return out


def _combined_load(problem: Problem, members: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Bounds and load (see `_Reduced`) of the members' usages added up,
    adjacent segments with the same load joined."""
    live = [(v, chosen) for v, chosen in members if problem.intervals[v, 0] < problem.intervals[v, 1]]
    strategies = len(members[0][1])
    if not live:
        return np.zeros(0, dtype=np.int64), np.zeros((strategies, 0), dtype=np.int64)
    starts = np.array([problem.intervals[v, 0] for v, _ in live])
    ends = np.array([problem.intervals[v, 1] for v, _ in live])
    bounds = np.unique(np.concatenate([starts, ends]))
    usages = np.stack([problem.node_usages[v][chosen] for v, chosen in live])  # [members, strategies]
    delta = np.zeros((len(bounds), strategies), dtype=np.int64)
    np.add.at(delta, np.searchsorted(bounds, starts), usages)
    np.add.at(delta, np.searchsorted(bounds, ends), -usages)
    load = np.cumsum(delta, axis=0)[:-1].T
    same = np.concatenate([[False], (load[:, 1:] == load[:, :-1]).all(axis=0), [False]])
    return bounds[~same], load[:, ~same[:-1]]
