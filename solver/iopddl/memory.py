"""Memory: repairing an assignment that overfills it, and memory in a CP-SAT model (sums per
segment of time, or a sweep)."""

from __future__ import annotations

import math
import time

import numpy as np

from solver.iopddl.problem import INFINITE
from solver.iopddl.state import _State


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
