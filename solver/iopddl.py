"""The IOPDDL intra-operator parallelism problem (ASPLOS/EuroSys 2025
contest; instances in ../shared/iopddl/): read it, evaluate a solution
exactly, and solve it under a time limit.

A problem: nodes, each with strategies (a cost and a memory usage each) and
a live interval [start, end) of time steps; edges between two nodes, each
with a cost per pair of their strategies; a memory limit. A solution picks
one strategy per node; its cost is the chosen node costs plus the chosen
edge entries, and it is feasible when at every time step the usages of the
live nodes sum to at most the limit. 10^18 marks a forbidden choice.

Solver (`solve`):
  1. presolve: drop forbidden and dominated strategies, fold nodes left
     with one strategy into their neighbours, merge parallel edges;
  2. a feasible start: every node at its least-usage strategy (the limit
     is about 1.1x that peak in every instance), then greedy descent:
     each node to its cheapest strategy that keeps memory feasible;
  3. unless the problem is small enough for one tight model, nodes a
     neighbour determines (each of its strategies allows one of theirs,
     every other pair forbidden) absorbed into it, exactly: tens of
     thousands of free nodes become a few hundred on most instances,
     whose memory is then piecewise constant in time; greedy again;
  4. a small reduced problem: its LP relaxation (the local polytope,
     memory rows added as the LP overfills them) solved by GLOP, rounded
     along the edges, repaired to fit memory and improved greedily,
     replaces the incumbent when cheaper; then one CP-SAT model, hinted
     with the incumbent, solved for the rest of the time. A large one gets
     large-neighbourhood search: CP-SAT re-solves a neighbourhood (grown in
     the graph from one of the most expensive nodes together with its whole
     star, a random node, or the nodes live at a step near the memory peak)
     with everything else fixed at the incumbent, which hints it; an
     improvement of the exact cost is kept. The memory of a model is one
     constraint per segment of time over which its nodes' usages are
     constant (the others' usage enters as the segment's peak), only where
     the model could exceed the limit and no neighbouring segment implies
     it; written as explicit sums, or as a running sweep when those sums
     would be large.
Costs are summed in Python ints (they overflow int64); CP-SAT sees costs
relative to each node's and edge's minimum, which fit.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ir.core import IRError

INFINITE = 10**18  # the instances' "forbidden" cost


class IopddlError(IRError):
    """A malformed problem or solution file; the message names the file and field."""


# ------------------------------------------------------------------ problems


@dataclass(frozen=True, slots=True)
class Problem:
    """An instance in numpy form. `node_costs[v]`, `node_usages[v]`: int64
    per strategy of node v; `edge_costs[e]`: int64 [|S_u|, |S_v|] for edge
    e = (u, v) = `edges[e]`; intervals [start, end) per node."""

    name: str
    intervals: np.ndarray  # [n, 2] int64
    node_costs: tuple[np.ndarray, ...]
    node_usages: tuple[np.ndarray, ...]
    edges: np.ndarray  # [m, 2] int64
    edge_costs: tuple[np.ndarray, ...]
    usage_limit: int

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    @property
    def num_edges(self) -> int:
        return len(self.edge_costs)

    @property
    def horizon(self) -> int:
        """One past the last time step any node is live at."""
        return int(self.intervals[:, 1].max(initial=0))


def read_problem(path: str | os.PathLike[str]) -> Problem:
    """Read a `.json` or `.json.gz` instance; IopddlError names what is wrong."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise IopddlError(f"{path}: not a JSON instance: {exc}") from exc
    return parse_problem(data, path)


def parse_problem(data: Any, where: str = "<problem>") -> Problem:
    """Validate the instance object (`{"problem": {...}}`) and convert it."""
    problem = _field(data, "problem", dict, where)
    nodes = _field(problem, "nodes", dict, f"{where}: problem")
    edges = _field(problem, "edges", dict, f"{where}: problem")
    intervals = _field(nodes, "intervals", list, f"{where}: problem.nodes")
    costs = _field(nodes, "costs", list, f"{where}: problem.nodes")
    usages = _field(nodes, "usages", list, f"{where}: problem.nodes")
    if not len(intervals) == len(costs) == len(usages):
        raise IopddlError(f"{where}: problem.nodes: intervals, costs and usages have different lengths "
                          f"({len(intervals)}, {len(costs)}, {len(usages)})")
    node_costs = tuple(_ints(c, f"{where}: problem.nodes.costs[{v}]") for v, c in enumerate(costs))
    node_usages = tuple(_ints(u, f"{where}: problem.nodes.usages[{v}]") for v, u in enumerate(usages))
    for v, (c, u) in enumerate(zip(node_costs, node_usages)):
        if len(c) == 0 or len(c) != len(u):
            raise IopddlError(f"{where}: problem.nodes: node {v} has {len(c)} costs and {len(u)} usages "
                              "(need the same positive number)")
        if (u < 0).any():
            raise IopddlError(f"{where}: problem.nodes.usages[{v}]: negative usage {int(u.min())}")
    iv = _interval_array(intervals, where)
    pairs = _field(edges, "nodes", list, f"{where}: problem.edges")
    edge_lists = _field(edges, "costs", list, f"{where}: problem.edges")
    if len(pairs) != len(edge_lists):
        raise IopddlError(f"{where}: problem.edges: {len(pairs)} node pairs but {len(edge_lists)} cost lists")
    e = _edge_array(pairs, len(node_costs), where)
    edge_costs = []
    for k, (u, v) in enumerate(e):
        flat = _ints(edge_lists[k], f"{where}: problem.edges.costs[{k}]")
        su, sv = len(node_costs[u]), len(node_costs[v])
        if len(flat) != su * sv:
            raise IopddlError(f"{where}: problem.edges.costs[{k}]: {len(flat)} costs for nodes {u} and {v} with "
                              f"{su} x {sv} strategies")
        edge_costs.append(flat.reshape(su, sv))
    limit = problem.get("usage_limit")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise IopddlError(f"{where}: problem.usage_limit: expected a non-negative integer, got {limit!r}")
    return Problem(str(problem.get("name", where)), iv, node_costs, node_usages, e, tuple(edge_costs), limit)


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise IopddlError(f"{where}: missing key {key!r}")
    if not isinstance(obj[key], kind):
        raise IopddlError(f"{where}.{key}: expected a {kind.__name__}, got {type(obj[key]).__name__}")
    return obj[key]


def _ints(values: Any, where: str) -> np.ndarray:
    if not isinstance(values, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        raise IopddlError(f"{where}: expected a list of integers")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise IopddlError(f"{where}: a value does not fit in 64 bits") from None


def _interval_array(intervals: list, where: str) -> np.ndarray:
    if not all(isinstance(iv, list) and len(iv) == 2 for iv in intervals):
        raise IopddlError(f"{where}: problem.nodes.intervals: each interval is a pair [start, end]")
    iv = _ints([x for pair in intervals for x in pair], f"{where}: problem.nodes.intervals").reshape(-1, 2)
    bad = np.nonzero((iv[:, 0] < 0) | (iv[:, 1] < iv[:, 0]))[0]
    if len(bad):
        raise IopddlError(f"{where}: problem.nodes.intervals[{bad[0]}]: {iv[bad[0]].tolist()} is not "
                          "0 <= start <= end")
    return iv


def _edge_array(pairs: list, n: int, where: str) -> np.ndarray:
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise IopddlError(f"{where}: problem.edges.nodes: each edge is a pair [u, v]")
    e = _ints([x for p in pairs for x in p], f"{where}: problem.edges.nodes").reshape(-1, 2)
    bad = np.nonzero((e < 0).any(axis=1) | (e >= n).any(axis=1))[0]
    if len(bad):
        raise IopddlError(f"{where}: problem.edges.nodes[{bad[0]}]: {e[bad[0]].tolist()} names a node outside "
                          f"0..{n - 1}")
    return e


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The exact cost (Python int), the memory peak, and feasibility: no
    forbidden choice and usage within the limit at every step; otherwise
    the first step over the limit (None if memory is fine)."""

    cost: int
    peak: int
    feasible: bool
    forbidden: int  # chosen node or edge entries at the forbidden cost
    first_violation: int | None

    def to_json(self) -> dict[str, Any]:
        return {"cost": self.cost, "peak_usage": self.peak, "feasible": self.feasible,
                "forbidden_choices": self.forbidden, "first_violated_step": self.first_violation}


def usage_profile(problem: Problem, strategies: np.ndarray) -> np.ndarray:
    """Usage summed over the live nodes at every time step (int64: usages
    are far below the int64 range; one node's at most about 10^11)."""
    horizon = problem.horizon
    delta = np.zeros(horizon + 1, dtype=np.int64)
    chosen = np.array([problem.node_usages[v][s] for v, s in enumerate(strategies)], dtype=np.int64)
    np.add.at(delta, problem.intervals[:, 0], chosen)
    np.add.at(delta, problem.intervals[:, 1], -chosen)
    return np.cumsum(delta[:-1])


def evaluate(problem: Problem, strategies: Sequence[int]) -> Evaluation:
    """Cost, peak and feasibility of `strategies` (one index per node)."""
    s = np.asarray(strategies, dtype=np.int64)
    if s.shape != (problem.num_nodes,):
        raise IopddlError(f"a solution needs {problem.num_nodes} strategies, got {len(strategies)}")
    for v, k in enumerate(s):
        if not 0 <= k < len(problem.node_costs[v]):
            raise IopddlError(f"strategy {int(k)} of node {v} is not one of 0..{len(problem.node_costs[v]) - 1}")
    chosen = [int(problem.node_costs[v][k]) for v, k in enumerate(s)]
    chosen += [int(m[s[u], s[v]]) for (u, v), m in zip(problem.edges, problem.edge_costs)]
    profile = usage_profile(problem, s)
    over = np.nonzero(profile > problem.usage_limit)[0]
    forbidden = sum(c >= INFINITE for c in chosen)
    return Evaluation(sum(chosen), int(profile.max(initial=0)), not len(over) and not forbidden, forbidden,
                      int(over[0]) if len(over) else None)


def read_solution(path: str | os.PathLike[str]) -> list[int]:
    """A solution file: a JSON list of strategy indices, or an object with
    one under "strategies" (what `shardplan iopddl solve --out` writes)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IopddlError(f"{path}: not JSON: {exc}") from exc
    if isinstance(data, dict):
        data = data.get("strategies")
    if not isinstance(data, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in data):
        raise IopddlError(f"{path}: expected a list of strategy indices (or {{\"strategies\": [...]}})")
    return data


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


# ------------------------------------------------------------------ search state


class _State:
    """An assignment of the reduced problem (`choice[v]`: a position in
    `kept[v]`) with its usage profile, kept up to date by `move`."""

    def __init__(self, problem: Problem, red: _Reduced, choice: np.ndarray):
        self.problem, self.red, self.choice = problem, red, choice
        self.profile = usage_profile(problem, self.original())

    def original(self) -> np.ndarray:
        """Strategy indices of the original problem."""
        return self.red.original(self.choice)

    def costs_of(self, v: int) -> np.ndarray:
        """v's cost at every strategy given the neighbours' choices (int64, capped)."""
        total = self.red.cost[v].astype(np.int64).copy()
        for w, key in self.red.adjacent[v]:
            total = np.minimum(total + self.red.matrix(v, key)[:, self.choice[w]], INFINITE)
        return total

    def fits(self, v: int) -> np.ndarray:
        """Per strategy of v, whether moving v to it keeps memory within the
        limit wherever it adds usage."""
        bounds, load = self.red.bounds[v], self.red.load[v]
        if not len(bounds):
            return np.ones(len(load), dtype=bool)
        peak = np.maximum.reduceat(self.profile[bounds[0]:bounds[-1]], bounds[:-1] - bounds[0])
        extra = load - load[self.choice[v]]
        return ((extra <= 0) | (peak + extra <= self.problem.usage_limit)).all(axis=1)

    def move(self, v: int, s: int) -> None:
        bounds, load = self.red.bounds[v], self.red.load[v]
        if len(bounds):
            delta = load[s] - load[self.choice[v]]
            if len(delta) == 1:
                self.profile[bounds[0]:bounds[1]] += delta[0]
            elif delta.any():
                self.profile[bounds[0]:bounds[-1]] += np.repeat(delta, np.diff(bounds))
        self.choice[v] = s


def _start(problem: Problem, red: _Reduced) -> _State:
    """Least usage everywhere (cheapest among ties): feasible whenever any
    assignment is, unless forbidden pairs get in the way (greedy fixes those)."""
    choice = np.array([int(np.lexsort((c, u[k]))[0]) for c, u, k in zip(red.cost, problem.node_usages, red.kept)],
                      dtype=np.int64)
    return _State(problem, red, choice)


def _merged_state(problem: Problem, state: _State) -> _State | None:
    """The incumbent on the problem with determined nodes absorbed
    (`_merge_determined`). Without a forbidden choice it follows every
    determining edge and carries over exactly; otherwise a node whose
    strategy no longer exists takes its least memory (its load summed over
    time), and if memory then breaks, every node does. None when that too
    breaks memory."""
    red = _merge_determined(problem, state.red)
    chosen = state.original()
    least = np.zeros(problem.num_nodes, dtype=np.int64)
    choice = np.zeros(problem.num_nodes, dtype=np.int64)
    for v in range(problem.num_nodes):
        if len(red.kept[v]) > 1:
            least[v] = int(np.lexsort((red.cost[v], red.load[v] @ np.diff(red.bounds[v])))[0])
            at = int(np.searchsorted(red.kept[v], chosen[v]))
            choice[v] = at if at < len(red.kept[v]) and red.kept[v][at] == chosen[v] else least[v]
    for start in (choice, least):
        merged = _State(problem, red, start)
        if merged.profile.max(initial=0) <= problem.usage_limit:
            return merged
    return None


def _greedy_sweeps(state: _State, order: list[int], rng: random.Random, deadline: float, later: float) -> None:
    """Greedy sweeps in random orders until nothing moves: the first until
    `deadline` (it repairs most forbidden choices), later ones until `later`."""
    for sweep in range(5):
        rng.shuffle(order)
        if not _greedy(state, order, deadline if sweep == 0 else later):
            break


def _greedy(state: _State, order: Sequence[int], deadline: float) -> int:
    """One sweep: each node to its cheapest strategy that fits in memory.
    Returns how many nodes moved."""
    moved = 0
    for v in order:
        if time.perf_counter() > deadline:
            break
        costs = np.where(state.fits(v), state.costs_of(v), INFINITE + 1)
        current = state.choice[v]
        best = int(np.argmin(costs))
        if costs[best] < costs[current]:
            state.move(v, best)
            moved += 1
    return moved


# ------------------------------------------------------------------ large-neighbourhood search


def _whole_model(red: _Reduced, free: list[int], limit: int) -> str | None:
    """Whether one CP-SAT model of everything beats our neighbourhoods, and
    in which edge encoding: "tight" when it has at most `limit` literals
    (B, G: proven optimal, where as rows B ended at 3.76e6 against 532,843);
    "rows" up to 4x that when its edges are small tables, at most 16 pairs
    on average (P, 48,480 free nodes with 2.8 strategies and 1.1M tight
    literals: 856e9 as rows, 976e9 and 1,165e9 tight, 1,094e9 by
    neighbourhoods); else None (V, 767 nodes with 1,300 pairs per edge:
    9.6e6 as one model of rows in 120 s, 3.3e6 by neighbourhoods in 300 s)."""
    pairs = sum(m.size for m in red.edges.values())
    size = sum(len(red.kept[v]) for v in free) + pairs  # literals of the tight form
    if size <= limit:
        return "tight"
    if size <= 4 * limit and pairs <= 16 * max(len(red.edges), 1):
        return "rows"
    return None


def _hot_nodes(state: _State, free: list[int], tried: set[int]) -> tuple[list[int], int]:
    """The 16 free nodes whose terms cost most under the incumbent (a
    mismatched pair on an edge that only a chain of changes can fix), and
    whether they touch forbidden choices, less the `tried` ones (seeds
    whose neighbourhood brought nothing: A's hardest star, 9,962
    strategies, took 5 s a time, four times, to no gain). Among forbidden
    ones the first in node order come first: successive neighbourhoods
    then repair one region, a chain of matching constraints step by step,
    where seeds scattered over all of them repaired far fewer (K: 27 left
    against none after 180 s). Returns them and how many nodes touch a
    forbidden choice."""
    red, choice = state.red, state.choice.tolist()
    local = {v: int(red.cost[v][choice[v]]) for v in free}  # Python ints: sums of 10^18 overflow int64
    for (u, v), m in red.edges.items():
        entry = int(m[choice[u], choice[v]])
        local[u] += entry
        local[v] += entry
    local = np.array([min(local[v], INFINITE) for v in free], dtype=np.int64)
    forbidden = int((local >= INFINITE).sum())
    order = [i for i in np.argsort(-local, kind="stable") if free[i] not in tried][:16]
    return [free[i] for i in order] or free, forbidden


# A star (a hot node, its most expensive neighbour, and every neighbour of
# both) may exceed the budget up to this many strategies.
_STAR_CAP = 20_000


def _neighbourhood(state: _State, rng: random.Random, budget: int, free: list[int],
                   hot: tuple[list[int], int]) -> tuple[list[int], int | None]:
    """Free nodes grown breadth-first in the graph from seeds, up to `budget`
    strategies: one of the nodes touching a forbidden choice while any
    remain (most of the time), else one of the most expensive nodes (half
    the time), a random node, or the nodes live at a random time step near
    the memory peak (the ones that must trade memory with each other).
    Returns them and the expensive seed if there was one.

    An expensive seed comes with its star, whatever the budget: the seed,
    its most expensive neighbour and all neighbours of both. The costliest
    terms sit on hubs (a weight read by hundreds of operations, C's node 76
    with 222 neighbours) where every neighbour must change with the hub;
    C's first star re-solved in 2.4 s took its cost from 3.26e12 to
    1.98e12, below what 60 s of budget-limited neighbourhoods reached."""
    red = state.red
    kind = rng.random()
    hot, repairing = hot
    star: set[int] = set()
    seed = None
    if kind < 0.5 or (kind < 0.9 and repairing > 0):  # repairs of forbidden choices come first
        seed = rng.choice(hot)
        seeds = [seed]
        if not repairing and red.adjacent[seed]:  # a repair walks along a chain: no stars (K repaired slower)
            worst = max(red.adjacent[seed], key=lambda a: int(red.matrix(seed, a[1])[state.choice[seed],
                                                                                      state.choice[a[0]]]))[0]
            seeds.append(worst)
            star = {seed, worst} | {w for v in (seed, worst) for w, _ in red.adjacent[v]}
    elif kind < 0.75:
        seeds = [rng.choice(free)]
    else:
        steps = np.nonzero(state.profile >= np.quantile(state.profile, 0.9))[0] if len(state.profile) else []
        t = int(rng.choice(list(steps))) if len(steps) else 0
        seeds = [v for v in free if len(red.bounds[v]) and red.bounds[v][0] <= t < red.bounds[v][-1]]
        rng.shuffle(seeds)
    chosen: list[int] = []
    seen = set()
    size = 0
    queue = list(seeds)
    while queue and (size < budget or (queue[0] in star and size < _STAR_CAP)):
        v = queue.pop(0)
        if v in seen:
            continue
        seen.add(v)
        chosen.append(v)
        size += len(red.kept[v])
        neighbours = [w for w, _ in red.adjacent[v] if w not in seen]
        rng.shuffle(neighbours)
        queue.extend(neighbours)
    return chosen, seed


def _lp_roundings(state: _State, nodes: list[int], deadline: float, rows_per_round: int = 5) -> list[np.ndarray]:
    """Assignments of `nodes` (positions in `kept`, everything else fixed
    at the incumbent) rounded from an optimal solution of the LP
    relaxation (`_Relaxation`): along the edges (`_round_along_edges`)
    and node by node. Empty when the LP was not solved by `deadline`. The
    roundings may overfill memory (see `_repair_memory`).

    Memory rows are added lazily, the `rows_per_round` segments the LP
    solution overfills most at a time: C needs about 20 of its 21,849
    segments. Each row is dense, and the rows change the LP's difficulty
    more than its size: 5 at a time solved C's LP in 12 s and D's in 12 s,
    10 at a time in 10 s and 28 s, 50 at a time C's in 31 s, all of
    C's segments at once took more than 5 minutes."""
    from ortools.linear_solver import pywraplp

    relaxation = _Relaxation(state, nodes)
    lp, limit = relaxation.lp, state.problem.usage_limit
    pieces = _memory_pieces(state, nodes)
    added: set[int] = set()
    while True:
        lp.SetTimeLimit(max(int(min(deadline - time.perf_counter(), 1e6) * 1000), 1))  # ms
        if lp.Solve() != pywraplp.Solver.OPTIMAL or time.perf_counter() > deadline:
            return []
        values = {v: np.array([var.solution_value() for var in relaxation.weight[v]]) for v in nodes}
        if pieces is None:
            break
        owner, column, first, stop, room = pieces
        used = np.array([state.red.load[v][:, k] @ values[v] for v, k in zip(owner, column)])
        over = _segment_sums(first, stop, used, len(room)) - room
        worst = [k for k in np.argsort(-over, kind="stable")[:rows_per_round].tolist()
                 if over[k] > 1e-7 * limit and k not in added]
        if not worst:
            break
        added.update(worst)
        for k in worst:
            live = np.nonzero((first <= k) & (k < stop))[0].tolist()
            relaxation.add_memory_row([(owner[i], state.red.load[owner[i]][:, column[i]]) for i in live],
                                      float(room[k]) / limit, limit)
    along = _round_along_edges(state.red, nodes, values, relaxation.pair_values())
    return [np.array([along[v] for v in nodes], dtype=np.int64),
            np.array([int(np.argmax(values[v])) for v in nodes], dtype=np.int64)]


class _Relaxation:
    """The LP relaxation (GLOP) of re-choosing `nodes` with every other
    node fixed, memory rows added by `add_memory_row`: the local polytope, a weight per
    strategy and per allowed pair of an edge, each node's weights summing
    to 1 and each edge's pair weights to its two nodes' weights. It is
    exact on a tree and tight on these graphs: C's absorbed problem
    without memory comes out integral in a second (80.2e9, where CP-SAT
    stalled at 112e9). Dual simplex: 1.4 s there against 12 s with
    GLOP's default primal."""

    def __init__(self, state: _State, nodes: list[int]):
        from ortools.linear_solver import pywraplp

        red, choice = state.red, state.choice
        self.red = red
        self.lp = lp = pywraplp.Solver.CreateSolver("GLOP")
        lp.SetSolverSpecificParametersAsString("use_dual_simplex: true")
        inside = set(nodes)
        unary = {}
        for v in nodes:
            unary[v] = red.cost[v].astype(np.int64).copy()
            for w, key in red.adjacent[v]:
                if w not in inside:
                    unary[v] = np.minimum(unary[v] + red.matrix(v, key)[:, choice[w]], INFINITE)
            unary[v] -= unary[v][unary[v] < INFINITE].min(initial=0)
        pairs = {key: m for key, m in red.edges.items() if key[0] in inside and key[1] in inside}
        relative = {key: np.where(m >= INFINITE, 0, m - m[m < INFINITE].min(initial=0)) for key, m in pairs.items()}
        # Costs relative to each node's and edge's least, scaled so that the
        # incumbent's weigh about 10^6: GLOP's tolerances are absolute.
        now = sum(int(unary[v][choice[v]]) for v in nodes if unary[v][choice[v]] < INFINITE)
        now += sum(int(relative[key][choice[key[0]], choice[key[1]]]) for key in pairs)
        scale = 1e6 / max(now, 1)
        objective = lp.Objective()
        self.weight = {}
        for v in nodes:
            self.weight[v] = [lp.NumVar(0.0, 1.0 if c < INFINITE else 0.0, "") for c in unary[v].tolist()]
            one = lp.Constraint(1.0, 1.0)
            for var, c in zip(self.weight[v], unary[v].tolist()):
                one.SetCoefficient(var, 1.0)
                if 0 < c < INFINITE:
                    objective.SetCoefficient(var, c * scale)
        self.joint: dict[tuple[int, int], list] = {}
        for (u, v), m in pairs.items():
            rows = [lp.Constraint(0.0, 0.0) for _ in range(m.shape[0])]
            cols = [lp.Constraint(0.0, 0.0) for _ in range(m.shape[1])]
            for row, var in zip(rows, self.weight[u]):
                row.SetCoefficient(var, -1.0)
            for col, var in zip(cols, self.weight[v]):
                col.SetCoefficient(var, -1.0)
            self.joint[(u, v)] = []
            for i, j in zip(*np.nonzero(m < INFINITE)):
                var = lp.NumVar(0.0, 1.0, "")
                rows[i].SetCoefficient(var, 1.0)
                cols[j].SetCoefficient(var, 1.0)
                if relative[(u, v)][i, j]:
                    objective.SetCoefficient(var, float(relative[(u, v)][i, j]) * scale)
                self.joint[(u, v)].append((int(i), int(j), var))
        objective.SetMinimization()

    def add_memory_row(self, loads: list[tuple[int, np.ndarray]], room: float, unit: float) -> None:
        """sum over (v, usage per strategy) of usage . weight[v] <= room,
        usages in `unit`s."""
        row = self.lp.Constraint(-self.lp.infinity(), room)
        for v, usage in loads:
            for var, u in zip(self.weight[v], usage.tolist()):
                if u:
                    row.SetCoefficient(var, u / unit)

    def pair_values(self) -> dict[tuple[int, int], np.ndarray]:
        """The solution's pair weights, one matrix per edge."""
        pair = {}
        for (u, v), entries in self.joint.items():
            pair[(u, v)] = np.zeros((len(self.red.kept[u]), len(self.red.kept[v])))
            for i, j, var in entries:
                pair[(u, v)][i, j] = var.solution_value()
        return pair


def _lp_start(state: _State, free: list[int], lp_deadline: float, deadline: float,
              rng: random.Random) -> tuple[_State, int | None]:
    """The incumbent or, when cheaper, one of the LP's roundings
    (`_lp_roundings`) made to fit memory and improved greedily; and the
    cheapest such rounding's cost (None: the LP was not solved in time or
    no rounding fit memory)."""
    problem = state.problem
    best, best_cost = state, evaluate(problem, state.original()).cost
    lp_cost = None
    for rounded in _lp_roundings(state, free, lp_deadline):
        choice = state.choice.copy()
        choice[free] = rounded
        candidate = _State(problem, state.red, choice)
        if not _repair_memory(candidate, free, deadline):
            continue
        _greedy_sweeps(candidate, list(free), rng, deadline, deadline)
        cost = evaluate(problem, candidate.original()).cost
        lp_cost = cost if lp_cost is None else min(lp_cost, cost)
        if cost < best_cost:
            best, best_cost = candidate, cost
    return best, lp_cost


def _repair_memory(state: _State, nodes: list[int], deadline: float = math.inf) -> bool:
    """Moves among `nodes` until memory fits, each at the most overfilled
    step: the strategy change that frees usage there at the least added
    cost per unit freed. Returns whether memory fits (it may not: a move
    can add usage elsewhere, and the moves are bounded in number and
    time)."""
    red, limit = state.red, state.problem.usage_limit
    for _ in range(4 * len(nodes) + 16):
        if time.perf_counter() > deadline:
            break
        if state.profile.max(initial=0) <= limit:
            return True
        t = int(np.argmax(state.profile))
        best = None
        for v in nodes:
            bounds = red.bounds[v]
            if not len(bounds) or not bounds[0] <= t < bounds[-1]:
                continue
            at = red.load[v][:, int(np.searchsorted(bounds, t, side="right")) - 1]
            freed = at[state.choice[v]] - at
            costs = state.costs_of(v)
            allowed = (freed > 0) & (costs < INFINITE)
            if allowed.any():
                added = np.where(allowed, (costs - costs[state.choice[v]]) / np.maximum(freed, 1), np.inf)
                s = int(np.argmin(added))
                if best is None or added[s] < best[0]:
                    best = (added[s], v, s)
        if best is None:
            return False
        state.move(best[1], best[2])
    return state.profile.max(initial=0) <= limit


def _round_along_edges(red: _Reduced, nodes: list[int], values: dict[int, np.ndarray],
                       pair: dict[tuple[int, int], np.ndarray]) -> dict[int, int]:
    """A strategy per node from an LP solution (`values[v]` per strategy,
    `pair[(u, v)]` per pair of an edge inside): breadth-first from the most
    certain node, each next node by its own weights plus, per neighbour
    already rounded, the LP's weights conditional on that neighbour's
    choice. A fractional LP solution is often a mixture of consistent
    assignments, which rounding each node alone mixes up (C: 307e9
    against 92.9e9 from the same LP solution)."""
    inside = set(nodes)
    rounded: dict[int, int] = {}
    for root in sorted(nodes, key=lambda v: -values[v].max()):
        if root in rounded:
            continue
        queue, seen = [root], {root}
        while queue:
            v = queue.pop(0)
            score = values[v].copy()
            for w, key in red.adjacent[v]:
                if w in rounded and w in inside:
                    mass = (pair[key] if key[0] == w else pair[key].T)[rounded[w]]
                    if mass.sum() > 1e-9:
                        score += mass / mass.sum()
            rounded[v] = int(np.argmax(score))
            for w, _ in red.adjacent[v]:
                if w in inside and w not in seen:
                    seen.add(w)
                    queue.append(w)
    return rounded


def _memory_pieces(state: _State, nodes: list[int]) -> tuple | None:
    """The pieces of `nodes`' load: a piece is one segment of one node's
    load where its strategies differ (a constant one is as good as fixed:
    it stays in the profile). Returns their owners, their columns in
    `load`, the segments of time each is live in, [first, stop), and per
    segment the limit less the fixed usage's peak there; None when no
    piece varies."""
    red = state.red
    owner, column, starts, ends = [], [], [], []
    fixed = state.profile.copy()
    for v in nodes:
        bounds, load = red.bounds[v], red.load[v]
        if not len(bounds):
            continue
        differ = load.max(axis=0) > load.min(axis=0)
        varies = np.nonzero(differ)[0]
        if not len(varies):
            continue
        fixed[bounds[0]:bounds[-1]] -= np.repeat(np.where(differ, load[state.choice[v]], 0), np.diff(bounds))
        owner += [v] * len(varies)
        column += varies.tolist()
        starts.append(bounds[varies])
        ends.append(bounds[varies + 1])
    if not owner:
        return None
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    bounds = np.unique(np.concatenate([starts, ends]))
    segments = len(bounds) - 1
    first, stop = np.searchsorted(bounds, starts), np.searchsorted(bounds, ends)
    # The fixed usage's peak over each segment [bounds[k], bounds[k+1]); the
    # sentinel lets the last segment end at the horizon.
    peak = np.maximum.reduceat(np.append(fixed, 0), bounds)[:segments]
    return owner, column, first, stop, state.problem.usage_limit - peak


def _local_cost(state: _State, nodes: Sequence[int], choice: np.ndarray) -> int:
    """Exact cost of the terms touching `nodes` under `choice` (Python ints)."""
    inside = set(nodes)
    total = 0
    for v in nodes:
        total += int(state.red.cost[v][choice[v]])
        for w, key in state.red.adjacent[v]:
            if w not in inside or v < w:
                total += int(state.red.matrix(v, key)[choice[v], choice[w]])
    return total


@dataclass
class _SubModel:
    model: Any
    x: dict[int, list[Any]]


def _build_submodel(state: _State, nodes: list[int], tight: bool = False, soft: bool = False,
                    memory: str = "auto") -> _SubModel:
    """CP-SAT model of re-choosing `nodes` with every other node fixed."""
    from ortools.sat.python import cp_model

    red, choice = state.red, state.choice
    inside = {v: i for i, v in enumerate(nodes)}
    model = cp_model.CpModel()
    x = {v: [model.new_bool_var(f"x{v}_{s}") for s in range(len(red.kept[v]))] for v in nodes}
    unary = {v: red.cost[v].astype(np.int64).copy() for v in nodes}
    terms: list[tuple[int, Any]] = []
    for v in nodes:
        model.add_exactly_one(x[v])
        model.add_hint(x[v][choice[v]], 1)
        for s, lit in enumerate(x[v]):
            if s != choice[v]:
                model.add_hint(lit, 0)
        for w, key in red.adjacent[v]:
            if w not in inside:
                unary[v] = np.minimum(unary[v] + red.matrix(v, key)[:, choice[w]], INFINITE)
            elif v < w:
                _pair_terms(model, x, v, w, red.edges[key], unary, terms, choice, tight)
    # A strategy forbidden by a fixed neighbour is ruled out, or with `soft`
    # penalised: at the end of a chain of matching constraints that leaves
    # the neighbourhood, ruling it out makes the model infeasible and no
    # neighbourhood would ever repair the chain (L). The penalty outweighs
    # any real cost, and the exact cost counts each forbidden choice at
    # 10^18, so a kept solution never has more of them.
    forbidden = sum(int((unary[v] >= INFINITE).sum()) for v in nodes)
    penalty = min(10**14, (1 << 61) // max(forbidden, 1))
    for v in nodes:
        finite = unary[v] < INFINITE
        low = int(unary[v][finite].min()) if finite.any() else 0
        for s, lit in enumerate(x[v]):
            if not finite[s]:
                if soft:
                    terms.append((penalty, lit))
                else:
                    model.add(lit == 0)
            elif unary[v][s] > low:
                terms.append((int(unary[v][s] - low), lit))
    _memory_constraints(state, model, x, nodes, memory)
    model.minimize(cp_model.LinearExpr.weighted_sum([lit for _, lit in terms], [c for c, _ in terms]))
    return _SubModel(model, x)


def _pair_terms(model, x, u: int, v: int, m: np.ndarray, unary: dict, terms: list, choice: np.ndarray,
                tight: bool) -> None:
    """Edge (u, v) inside the neighbourhood: its matrix less its row and
    column minima (moved into the two nodes' costs), then either (tight)
    one literal z_ij per allowed pair with sum_j z_ij = x_ui and sum_i z_ij
    = x_vj, whose LP relaxation is exact on the edge, or (see `_row_terms`)
    one integer for the edge's cost, bounded below row by row."""
    forbidden = m >= INFINITE
    finite = np.where(forbidden, np.iinfo(np.int64).max, m)
    rows = finite.min(axis=1)
    rows = np.where(rows == np.iinfo(np.int64).max, 0, rows)
    rest = np.where(forbidden, 0, m - rows[:, None])
    cols = np.where(forbidden, np.iinfo(np.int64).max, rest).min(axis=0)
    cols = np.where(cols == np.iinfo(np.int64).max, 0, cols)
    rest = np.where(forbidden, 0, rest - cols[None, :])
    unary[u] = np.minimum(unary[u] + rows, INFINITE)
    unary[v] = np.minimum(unary[v] + cols, INFINITE)
    if not tight:
        now = int(rest[choice[u], choice[v]])
        if len(x[u]) <= len(x[v]):
            _row_terms(model, x[u], x[v], rest, forbidden, terms, now)
        else:
            _row_terms(model, x[v], x[u], rest.T, forbidden.T, terms, now)
        return
    z = {}
    for i, j in zip(*np.nonzero(~forbidden)):
        z[i, j] = model.new_bool_var("")
        model.add_hint(z[i, j], int(choice[u] == i and choice[v] == j))
        if rest[i, j] > 0:
            terms.append((int(rest[i, j]), z[i, j]))
    for i in range(m.shape[0]):
        model.add(sum(z[i, j] for j in range(m.shape[1]) if (i, j) in z) == x[u][i])
    for j in range(m.shape[1]):
        model.add(sum(z[i, j] for i in range(m.shape[0]) if (i, j) in z) == x[v][j])


def _row_terms(model, xu: list, xv: list, rest: np.ndarray, forbidden: np.ndarray, terms: list, now: int) -> None:
    """The edge's cost as one integer e >= sum_j rest[i, j] * x_vj, enforced
    by x_ui, and its forbidden pairs as x_ui => sum_j x_vj = 0 over them: a
    constraint per row of the smaller side, written straight into the proto.
    It replaced one literal per positive entry (y_ij >= x_ui + x_vj - 1):
    on the same 30 neighbourhoods of 1,000 strategies, CP-SAT closed 26
    instead of 21 of C's in 16.5 s instead of 28.5 s, 27 instead of 22 of
    D's in 10.5 s instead of 25.5 s, A's in half the time; and C's model
    building, which took more time than its solving, fell from 30 s to 13 s
    a minute."""
    column = np.array([lit.index for lit in xv], dtype=np.int64)
    top = int(rest.max()) if rest.size else 0
    edge = None
    if top > 0:
        edge = model.new_int_var(0, top, "")
        model.add_hint(edge, now)
        terms.append((1, edge))
    for i, lit in enumerate(xu):
        where = np.nonzero(forbidden[i])[0]
        if len(where):
            _add_linear(model, column[where].tolist(), [1] * len(where), 0, 0, enforced_by=lit.index)
        where = np.nonzero(rest[i] > 0)[0]
        if len(where):
            _add_linear(model, [edge.index] + column[where].tolist(), [1] + (-rest[i, where]).tolist(), 0, top,
                        enforced_by=lit.index)


def _add_linear(model, variables: list[int], coefficients: list[int], low: int, high: int,
                enforced_by: int | None = None) -> None:
    """low <= sum(coefficients * variables) <= high (variables by proto
    index), enforced by a literal if given: one proto constraint filled by
    whole lists, where `LinearExpr` costs a Python object per term."""
    constraint = model.proto.constraints.add()
    if enforced_by is not None:
        constraint.enforcement_literal.append(enforced_by)
    constraint.linear.vars.extend(variables)
    constraint.linear.coeffs.extend(coefficients)
    constraint.linear.domain.extend([low, high])


# Explicit memory sums above this many terms become a sweep. Below it the
# sums build in seconds and CP-SAT does better with them: B's whole model
# (33,354 terms) as a sweep ended at 1,285,250 against 690,222 with
# sums, G's at 1,397,293 against its optimum 217,039; C's absorbed whole
# model (3.5M terms) reached 113.5e9 in 60 s with sums, 461e9 as a sweep.
_SWEEP_TERMS = 10_000_000


def _memory_constraints(state: _State, model, x, nodes: list[int], encoding: str = "auto") -> None:
    """Usage of the neighbourhood within the room the fixed nodes leave, per
    segment of time over which its nodes' usages are constant, only in
    segments where it could exceed that room and no neighbouring segment
    implies it (`_implied_segments`). Written as one sum per such
    segment while those sums stay small; past that as a sweep (see
    `_sweep_constraints`), whose size grows with the nodes, not with
    nodes times segments: the explicit sums of P's whole model held tens
    of millions of terms (10 s to write, 1 s as a sweep). `encoding`
    "sums" or "sweep" forces one of the two."""
    red = state.red
    pieces = _memory_pieces(state, nodes)
    if pieces is None:
        return
    owner, column, first, stop, capacity = pieces
    segments = len(capacity)
    usages = [red.load[v][:, k] for v, k in zip(owner, column)]
    low = np.array([int(u.min()) for u in usages], dtype=np.int64)
    spread_v = np.array([int(u.max()) for u in usages], dtype=np.int64) - low
    room = capacity - _segment_sums(first, stop, low, segments)
    spread = _segment_sums(first, stop, spread_v, segments)
    terms = [[(lit, int(u - low[i])) for u, lit in zip(usages[i], x[v]) if u > low[i]]
             for i, v in enumerate(owner)]
    per_piece = np.array([len(t) for t in terms], dtype=np.int64)
    needed = (spread > room) & ~_implied_segments(owner, usages, low, first, stop, capacity)
    explicit_terms = int(_segment_sums(first, stop, per_piece, segments)[needed].sum())
    if encoding == "sweep" or (encoding == "auto" and explicit_terms > _SWEEP_TERMS):
        _sweep_constraints(model, terms, first, stop, np.minimum(room, spread))
    else:
        _segment_constraints(model, terms, per_piece, first, stop, room, needed)


def _implied_segments(owner: list[int], usages: list[np.ndarray], low: np.ndarray, first: np.ndarray,
                      stop: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Segments whose memory constraint follows from a neighbouring one's.
    Pieces live in segments [first, stop) with usage `usages[i]` per
    strategy of node `owner[i]`, at least `low[i]`; `capacity[k]` is what
    the fixed nodes leave in segment k. Segment k-1 follows from k when
    every piece leaving at k is followed by a piece of the same node using
    no less at every strategy, and k has no more capacity, less what the
    other pieces arriving at k use at least: memory that only grows into k.
    Symmetrically k follows from k-1 (memory only shrinks); that one is
    dropped only when k-1 is kept, so two segments never excuse each other.

    A node that absorbed others (`_merge_determined`) changes its load at
    every start and end of theirs; without this a piece of a node leaving
    counted as a departure and C's whole model carried 24,832 sums and
    6.1M terms (CP-SAT's presolve took 12 s to find what is redundant)."""
    segments = len(capacity)
    arriving: dict[int, dict[int, int]] = {}
    leaving: dict[int, dict[int, int]] = {}
    for i, (v, a, b) in enumerate(zip(owner, first.tolist(), stop.tolist())):
        arriving.setdefault(a, {})[v] = i
        leaving.setdefault(b, {})[v] = i
    grows = np.zeros(segments, dtype=bool)  # segment k follows from k+1
    shrinks = np.zeros(segments, dtype=bool)  # segment k follows from k-1
    for k in range(1, segments):
        arrive, leave = arriving.get(k, {}), leaving.get(k, {})
        if all(v in arrive and (usages[arrive[v]] >= usages[i]).all() for v, i in leave.items()):
            new = sum(int(low[i]) for v, i in arrive.items() if v not in leave)
            grows[k - 1] = capacity[k] - new <= capacity[k - 1]
        if all(v in leave and (usages[i] <= usages[leave[v]]).all() for v, i in arrive.items()):
            gone = sum(int(low[i]) for v, i in leave.items() if v not in arrive)
            shrinks[k] = capacity[k - 1] - gone <= capacity[k]
    implied = grows.copy()
    for k in range(1, segments):
        implied[k] |= shrinks[k] and not implied[k - 1]
    return implied


def _segment_constraints(model, terms: list, counts: np.ndarray, first: np.ndarray, stop: np.ndarray,
                         room: np.ndarray, needed: np.ndarray) -> None:
    """One sum per needed segment.
    Written straight into the model's proto from index arrays: P's whole
    model holds 30,438 such sums and tens of millions of terms, which took
    122 s through `LinearExpr` and Python lists."""
    offsets = np.concatenate([[0], np.cumsum(counts)])  # counts[i]: how many terms piece i has
    literals = np.array([lit.index for t in terms for lit, _ in t], dtype=np.int64)
    coefficients = np.array([c for t in terms for _, c in t], dtype=np.int64)
    for k in np.nonzero(needed)[0]:
        live = np.nonzero((first <= k) & (k < stop) & (counts > 0))[0]
        sizes = counts[live]
        # The positions offsets[i] .. offsets[i] + counts[i] of every live piece i, end to end.
        at = np.repeat(offsets[live] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
        # The sum is never negative: a negative room makes the domain [room, room], infeasible as it must be.
        _add_linear(model, literals[at].tolist(), coefficients[at].tolist(), min(0, int(room[k])), int(room[k]))


def _sweep_constraints(model, terms: list, first: np.ndarray, stop: np.ndarray, cap: np.ndarray) -> None:
    """The running usage of the live nodes as one integer per segment,
    level[k] = level[k-1] + (arrivals at k) - (departures at k), each at most
    its segment's cap: every node's terms enter twice. The LP relaxation is
    the same as the explicit sums'; propagation along the chain is weaker."""
    from ortools.sat.python import cp_model

    segments = len(cap)
    arriving: list[list[int]] = [[] for _ in range(segments + 1)]
    leaving: list[list[int]] = [[] for _ in range(segments + 1)]
    for i, (a, b) in enumerate(zip(first.tolist(), stop.tolist())):
        arriving[a].append(i)
        leaving[b].append(i)
    previous = None
    for k in range(segments):
        level = model.new_int_var(0, max(int(cap[k]), 0), "")
        if cap[k] < 0:  # the fixed nodes alone leave no room: infeasible
            model.add(level <= int(cap[k]))
        lits = [] if previous is None else [previous]
        coeffs = [] if previous is None else [1]
        for i in arriving[k]:
            lits += [t[0] for t in terms[i]]
            coeffs += [t[1] for t in terms[i]]
        for i in leaving[k]:
            lits += [t[0] for t in terms[i]]
            coeffs += [-t[1] for t in terms[i]]
        model.add(cp_model.LinearExpr.weighted_sum(lits, coeffs) == level)
        previous = level


def _segment_sums(first: np.ndarray, stop: np.ndarray, values: np.ndarray, segments: int) -> np.ndarray:
    """Per segment, the sum of `values` of the nodes live in it."""
    delta = np.zeros(segments + 1, dtype=values.dtype)
    np.add.at(delta, first, values)
    np.add.at(delta, stop, -values)
    return np.cumsum(delta)[:segments]


def _subsolve(state: _State, nodes: list[int], seconds: float, workers: int, seed: int,
              tight: bool = False, soft: bool = False, memory: str = "auto") -> tuple[bool, bool]:
    """Re-solve `nodes`; apply the result if it lowers the exact cost.
    Returns (improved, proven optimal for the neighbourhood)."""
    from ortools.sat.python import cp_model

    began = time.perf_counter()
    sub = _build_submodel(state, nodes, tight, soft, memory)
    solver = cp_model.CpSolver()
    # The limit covers building the model too.
    solver.parameters.max_time_in_seconds = max(seconds - (time.perf_counter() - began), 0.01)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.Solve(sub.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False, False
    new = state.choice.copy()
    for v in nodes:
        new[v] = next(s for s, lit in enumerate(sub.x[v]) if solver.BooleanValue(lit))
    if _local_cost(state, nodes, new) >= _local_cost(state, nodes, state.choice):
        return False, status == cp_model.OPTIMAL
    for v in nodes:
        state.move(v, int(new[v]))
    return True, status == cp_model.OPTIMAL


# ------------------------------------------------------------------ solve


@dataclass(frozen=True, slots=True)
class SolveResult:
    """The best assignment found (original strategy indices), its exact
    evaluation, and how the search went."""

    strategies: tuple[int, ...]
    evaluation: Evaluation
    seconds: float
    rounds: int  # neighbourhoods re-solved
    improvements: int
    start_cost: int  # least-usage start, then after the greedy sweeps
    greedy_cost: int
    stats: dict[str, int]
    message: str
    lp_cost: int | None = None  # the best LP rounding, repaired and improved (None: no LP solved)

    def to_json(self) -> dict[str, Any]:
        return {**self.evaluation.to_json(), "time_s": self.seconds, "rounds": self.rounds,
                "improvements": self.improvements, "start_cost": self.start_cost, "greedy_cost": self.greedy_cost,
                "lp_cost": self.lp_cost, "presolve": dict(self.stats), "message": self.message,
                "strategies": list(self.strategies)}


@dataclass(frozen=True, slots=True)
class SolveOptions:
    time_limit_s: float = 60.0
    workers: int = 1
    seed: int = 0
    max_rounds: int | None = None  # neighbourhoods; with it and workers=1 the search is reproducible
    budget: int = 300  # strategies in a neighbourhood at first (adapts)
    whole_model_limit: int = 400_000  # literals up to which one CP-SAT model is solved (see `_whole_model`)
    sub_time_s: float = 2.0  # per neighbourhood (a star above the budget: up to 5x)
    memory_encoding: str = "auto"  # "sums", "sweep" or "auto" (see `_memory_constraints`)

    def __post_init__(self) -> None:
        if self.memory_encoding not in ("auto", "sums", "sweep"):
            raise ValueError(f"memory_encoding must be 'auto', 'sums' or 'sweep', not {self.memory_encoding!r}")


def solve(problem: Problem, options: SolveOptions = SolveOptions(),
          progress: Callable[[str], None] | None = None) -> SolveResult:
    """The best solution found within the time limit (see the module doc)."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    red = presolve(problem)
    state = _start(problem, red)
    start_cost = evaluate(problem, state.original()).cost
    if state.profile.max(initial=0) > problem.usage_limit:
        evaluation = evaluate(problem, state.original())
        return SolveResult(tuple(state.original().tolist()), evaluation, time.perf_counter() - start, 0, 0,
                           start_cost, start_cost, red.stats, "no feasible solution exists: every node at its "
                           f"least usage already exceeds the limit at step {evaluation.first_violation}")
    free = [v for v in range(problem.num_nodes) if red.free(v)]
    rng = random.Random(options.seed)
    order = list(free)
    # Greedy sweeps until nothing moves: the first whatever it takes (it
    # repairs most forbidden choices), later ones within a third of what is left.
    sweeps_until = time.perf_counter() + (deadline - time.perf_counter()) / 3
    _greedy_sweeps(state, order, rng, deadline, sweeps_until)
    # A problem small enough for one tight model is left as it is: CP-SAT
    # proves B and G optimal that way, where absorbing makes their memory
    # sums denser (B: 10.5e6 against 2.4e6 after 20 s, 1.05e6 against its
    # optimum 532,843 after 60 s; G proven in 108 s against 58 s).
    small = _whole_model(red, free, options.whole_model_limit) == "tight"
    merged = _merged_state(problem, state) if free and not small else None
    if merged is not None:
        state, red = merged, merged.red
        free = [v for v in range(problem.num_nodes) if red.free(v)]
        _greedy_sweeps(state, list(free), rng, deadline, sweeps_until)  # whole chains move at once now
    greedy_cost = evaluate(problem, state.original()).cost
    rounds = improvements = 0
    lp_cost = None
    proven = not free  # nothing left to choose: presolve decided every node
    whole = _whole_model(red, free, options.whole_model_limit) if free else None
    if whole is not None:
        # A tight model starts from its LP's rounding, given up to three
        # quarters of the time (GLOP's time varies with the objective's
        # scale: D's LP took 11.5 s to 29 s for scales 10x apart). It took
        # C, D and Q below the best known costs, where CP-SAT alone
        # stalled 15% to 50% above them, and CP-SAT seldom improves on it.
        # The LP has at most `whole_model_limit` columns (C: 91,291).
        if whole == "tight":
            state, lp_cost = _lp_start(state, free, deadline - (deadline - time.perf_counter()) / 4, deadline, rng)
        # CP-SAT's own portfolio (its LNS and local search, hinted with the
        # incumbent) beats our neighbourhoods here.
        improved, proven = _subsolve(state, free, deadline - time.perf_counter(), options.workers, options.seed,
                                     tight=whole == "tight", memory=options.memory_encoding)
        rounds, improvements, free = 1, int(improved), []
    budget = options.budget
    hot: tuple[list[int], int] = (free, 0)
    forbidden, stalled = INFINITE, 0  # nodes touching forbidden choices, rounds since that fell
    improved = False
    tried: set[int] = set()  # expensive seeds whose neighbourhood improved nothing
    while free and time.perf_counter() < deadline and (options.max_rounds is None or rounds < options.max_rounds):
        # An improvement may have cooled a hot node; while repairs go on
        # (thousands of small rounds on K), every 20 rounds is enough.
        if rounds % 20 == 0 or (improved and not hot[1]):
            hot = _hot_nodes(state, free, tried)
            forbidden, stalled = (hot[1], 0) if hot[1] < forbidden else (forbidden, stalled)
        nodes, seed = _neighbourhood(state, rng, budget, free, hot)
        began = time.perf_counter()
        # A star above the budget gets time in proportion (C's first: 6,873
        # strategies, closed in 2.4 s on 2 workers).
        size = sum(len(red.kept[v]) for v in nodes)
        seconds = min(max(options.sub_time_s, size / 2000), 5 * options.sub_time_s, deadline - began)
        # Penalise forbidden boundary choices only when repairs stall (see
        # `_build_submodel`): ruling them out repairs faster while it works (K).
        soft = 0 < forbidden and stalled >= 60
        improved, optimal = _subsolve(state, nodes, seconds, options.workers, rng.randrange(1 << 30), soft=soft,
                                      memory=options.memory_encoding)
        if seed is not None and not improved and not hot[1]:  # repairs retry their seeds (see `_hot_nodes`)
            tried.add(seed)
            hot = ([v for v in hot[0] if v != seed] or free, hot[1])
        stalled += 1
        rounds += 1
        improvements += improved
        if optimal and len(nodes) == len(free):  # the whole reduced problem, solved to optimality
            proven = True
            break
        # Aim at neighbourhoods CP-SAT closes in well under the cap: grow
        # those it closes quickly, shrink those it cannot close.
        if not optimal:
            budget = max(int(budget / 1.5), 50)
        elif time.perf_counter() - began < options.sub_time_s / 4:
            budget = min(int(budget * 1.3) + 1, 50_000)
        if progress is not None and rounds % 10 == 0:
            progress(f"round {rounds}: {improvements} improvements, neighbourhood budget {budget}")
    strategies = state.original()
    evaluation = evaluate(problem, strategies)
    message = (("optimal" if proven else "feasible") if evaluation.feasible else
               "no feasible solution found (forbidden choices remain)" if evaluation.forbidden else
               "no feasible solution found (memory)")
    return SolveResult(tuple(strategies.tolist()), evaluation, time.perf_counter() - start, rounds, improvements,
                       start_cost, greedy_cost, red.stats, message, lp_cost)
