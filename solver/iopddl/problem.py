"""The problem: its reader (the contest's JSON), the exact evaluator and solutions."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
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
