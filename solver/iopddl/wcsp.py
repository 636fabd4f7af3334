"""The reduced problem as a weighted CSP solved by toulbar2 (`pytoulbar2`).

toulbar2 (INRAE, MIT licence) is a branch-and-bound solver for cost
function networks: variables with finite domains, unary and binary cost
tables, hard constraints as a forbidden cost. That is exactly this problem
without its memory limit, and toulbar2's soft arc consistency, limited
discrepancy search and variable elimination solve it far better than our
neighbourhoods: V without the limit, 767 free nodes, is solved to
optimality (87,814) in 0.3 s, where 90 s of CP-SAT neighbourhoods ended
at 231,538. The contest's winner built on the same solver.

The memory limit enters in two ways (see `solver.iopddl.penalty`):
  - a price per unit of a node's extra usage, added to its costs
    (`penalty`): the problem stays a pure cost network;
  - exact usage constraints at chosen time steps (`steps`): at step t,
    the usages of the free nodes live at t sum to at most the room the
    fixed nodes leave, a knapsack constraint over their strategies.

pytoulbar2 has wheels for Linux (x86_64, aarch64); elsewhere `available()`
is False and the solver keeps to CP-SAT.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from solver.iopddl.problem import INFINITE
from solver.iopddl.state import _State

# toulbar2's costs are int64 and TOP is its forbidden cost. Every finite
# cost is capped at TOP over the number of cost functions, so that no sum
# over a solution reaches it; the instances' finite entries are far below
# the cap (under 10^13, against 6 * 10^13 for R's 117,000 functions).
TOP = 1 << 62


def available() -> bool:
    """Whether pytoulbar2 can be imported here."""
    try:
        import pytoulbar2  # noqa: F401
    except ImportError:
        return False
    return True


def fixed_profile(state: _State, free: Sequence[int]) -> np.ndarray:
    """Usage per step of the nodes outside `free` (the state's profile less
    the free nodes' chosen usage)."""
    fixed = state.profile.copy()
    red = state.red
    for v in free:
        bounds = red.bounds[v]
        if len(bounds):
            fixed[bounds[0]:bounds[-1]] -= np.repeat(red.load[v][state.choice[v]], np.diff(bounds))
    return fixed


@dataclass(frozen=True, slots=True)
class WcspAnswer:
    """toulbar2's best assignment (a full `choice` of the reduced problem)
    and whether its search completed: then no assignment of the network it
    was given (penalties and imposed steps included) costs less."""

    choice: np.ndarray
    optimal: bool


def solve_wcsp(state: _State, free: Sequence[int], *, penalty: Mapping[int, np.ndarray] | None = None,
               steps: Sequence[int] = (), fixed: np.ndarray | None = None, seconds: float = 10.0,
               backtracks: int | None = None, seed: int = 0) -> WcspAnswer | None:
    """The best assignment toulbar2 finds for the free nodes of the state's
    reduced problem (`state.choice` with them re-chosen), or None if it finds
    none within the limit: `seconds` (whole seconds, at least one) or, when
    given, `backtracks`, which makes the result independent of the
    machine's speed. `penalty[v]`: extra cost per strategy of v (rounded
    up, then capped). `steps`: time steps whose memory limit is imposed
    exactly (`fixed`: the other nodes' usage per step, else computed)."""
    import pytoulbar2

    red = state.red
    cfn = pytoulbar2.CFN(TOP, verbose=-1, seed=seed)
    # Limited discrepancy search first (up to 4 discrepancies from the value
    # ordering), then the complete search: toulbar2's setting for a good
    # solution early, which the contest's winner used as well.
    pytoulbar2.tb2.option.lds = 4
    if backtracks is not None:
        pytoulbar2.tb2.option.backtrackLimit = backtracks
    cap = TOP // (len(free) + len(red.edges) + 1)
    capped = False
    index = {v: cfn.AddVariable(f"x{v}", range(len(red.kept[v]))) for v in free}
    for v in free:
        costs = red.cost[v].astype(np.float64)
        if penalty is not None and v in penalty:
            costs = np.ceil(costs + penalty[v])
        finite = red.cost[v] < INFINITE
        capped |= bool((costs[finite] > cap).any())
        cfn.AddFunction([index[v]], np.where(finite, np.minimum(costs, cap), TOP).astype(np.int64).tolist())
    for (u, w), m in red.edges.items():
        finite = m < INFINITE
        low = int(m[finite].min()) if finite.any() else 0
        capped |= bool((m[finite] - low > cap).any())
        cfn.AddFunction([index[u], index[w]], np.where(finite, np.minimum(m - low, cap), TOP).ravel().tolist())
    if len(steps):
        _knapsacks(cfn, state, free, index, steps, fixed_profile(state, free) if fixed is None else fixed)
    result = cfn.Solve(timeLimit=0 if backtracks is not None else max(1, int(seconds)))
    if backtracks is not None:
        pytoulbar2.tb2.option.backtrackLimit = np.iinfo(np.int64).max  # options are global: leave none behind
    if not result:
        return None
    choice = state.choice.copy()
    for v in free:
        choice[v] = int(result[0][index[v]])
    # The dual bound reaches the answer's cost only when the search completed;
    # with a cost capped, the network was not the problem.
    return WcspAnswer(choice, not capped and cfn.GetDDualBound() >= result[1])


def solve_many(state: _State, free: Sequence[int], requests: Sequence[dict[str, Any]],
               workers: int = 1) -> list[WcspAnswer | None]:
    """`solve_wcsp(state, free, **request)` for each request, up to `workers`
    at a time in forked processes (toulbar2 is single-threaded; the
    children inherit the state instead of receiving it)."""
    if workers <= 1 or len(requests) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [solve_wcsp(state, free, **request) for request in requests]
    # Forked children receive the initializer's arguments without pickling: the problem is never copied.
    with multiprocessing.get_context("fork").Pool(min(workers, len(requests)), initializer=_share,
                                                  initargs=(state, free, requests)) as pool:
        return pool.map(_solve_shared, range(len(requests)))


_shared: tuple = ()  # set in `solve_many`'s children only


def _share(*shared) -> None:
    global _shared
    _shared = shared


def _solve_shared(i: int) -> WcspAnswer | None:
    state, free, requests = _shared
    return solve_wcsp(state, free, **requests[i])


def _knapsacks(cfn, state: _State, free: Sequence[int], index: Mapping[int, int], steps: Sequence[int],
               fixed: np.ndarray) -> None:
    """At each step, sum of the live free nodes' usage <= limit - fixed usage,
    as toulbar2's knapsack constraint (sum of weights >= capacity, so every
    usage enters negated). A node's least usage at the step moves to the
    right-hand side; only strategies above it get a weight."""
    red, limit = state.red, state.problem.usage_limit
    for t in steps:
        room = limit - int(fixed[t])
        scope, parts = [], []
        for v in free:
            bounds = red.bounds[v]
            if not len(bounds) or not bounds[0] <= t < bounds[-1]:
                continue
            usage = red.load[v][:, int(np.searchsorted(bounds, t, side="right")) - 1]
            low = int(usage.min())
            room -= low
            above = np.nonzero(usage > low)[0]
            if len(above):
                scope.append(index[v])
                parts.append(f"{len(above)} " + " ".join(f"{s} {low - int(usage[s])}" for s in above))
        if scope:
            cfn.CFN.wcsp.postKnapsackConstraint(scope, f"{-room} " + " ".join(parts), kp=True)
