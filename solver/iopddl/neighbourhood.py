"""Choosing what to search: whole models for small problems, neighbourhoods for large ones."""

from __future__ import annotations

import random

import numpy as np

from solver.iopddl.presolve import _Reduced
from solver.iopddl.problem import INFINITE
from solver.iopddl.state import _State

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
