"""The MCTS's polish (`solver.search.mcts`, module docstring "Polish"): an
iterated local search from the best plan the rounds found, by moves on its
decisions that a descent, which only adds shardings, cannot make.

Functions of the search (`mcts._Mcts`, typed Any: that module imports this
one): its memoized codes, prices, successors and descents are shared, so a
move that reaches a state the rounds priced costs a look-up.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from solver.search.space import LATE, Point
from solver.search.zero import WHOLE

# The refit: sets of at most _REFIT_SIZE of the _REFIT_ITEMS actions that save the most memory per
# second added, the _REFIT_TRIES cheapest that save enough applied.
_REFIT_ITEMS, _REFIT_SIZE, _REFIT_TRIES = 16, 3, 3

Pair = tuple[int, str]


def polish(search: Any) -> int:
    """From the best plan found, per decision: drop it, narrow its level, or
    drop it and refit (`starts`); descend, and move to the end when it ranks
    better, until no move improves or the time limit is spent
    (`_Mcts.out_of_time`). Then a descent from the root that avoids each
    decision a round committed to (`_Mcts.committed`), its end priced (the
    best found where it ranks first). Those ends are not polished in turn:
    on the 22 bundled specs that found one better answer (unet, 0.04%) for
    an eighth of all their search work (`mcts`, "Polish"). Returns the
    moves tried."""
    if search.best is None:
        return 0
    _, point, codes = search.best
    tried = _polish_from(search, point, codes)
    # From the root without each decision the rounds committed to: the descents those commitments
    # ruled out (the attention step, seed 0: the batch, then the heads, 18% above the optimum, which
    # shards the head dim alone).
    root = Point(frozenset(), ())
    for pair in dict.fromkeys(search.committed):
        if search.out_of_time():
            break
        search.descend(root, search.codes(root), pair)  # each step's state is priced: its end may be the best
        tried += 1
    return tried


def _polish_from(search: Any, point: Point, codes: np.ndarray) -> int:
    """`polish`'s moves from one plan; the search's best becomes the end
    reached when that ranks before it. The starts are scanned round: after a
    move, from the one that made it (the ones before it were just tried from
    a plan that differs in one decision), until a whole round finds nothing.
    A polish that reaches a plan an earlier one moved through stops: that
    one tried the moves from there (`_Mcts.polished`). Both: unet's polish
    1,036 -> 337 moves, the same answers on the bundled specs."""
    tried = 0
    priced = search.price(point, codes)
    at = 0  # where the scan resumes
    while codes.tobytes() not in search.polished:
        search.polished.add(codes.tobytes())
        moves = starts(search, point, essential(search, point, codes))
        savings = Savings(search, point, codes, priced.cost)
        for k in range(len(moves)):
            if search.out_of_time():
                break
            start, avoid = moves[(at + k) % len(moves)]
            tried += 1
            end = search.descend(start, search.codes(start)) if avoid is None else \
                refit(search, start, avoid, savings)
            found = search.price(*end)
            if found.rank < priced.rank:
                priced, (point, codes), at = found, end, (at + k) % len(moves)
                break
        else:
            break
        if search.out_of_time():
            break
    if priced.rank < search.best[0].rank:
        search.best = (priced, point, codes)
    return tried


def refit(search: Any, point: Point, avoid: Pair, savings: Savings) -> tuple[Point, np.ndarray]:
    """The polish's move where a dropped decision was what made the plan fit:
    never that pair again, and the memory it saved found elsewhere, by the
    few decisions that fit at least cost together where none fits alone (a
    descent takes the one step that fits, however slow). Each action's time
    and memory are taken as adding up: the `_REFIT_TRIES` cheapest sets of
    at most `_REFIT_SIZE` actions that save enough are applied, and
    descended from; the best end is returned. `savings`: the actions' times
    and bytes, as measured from the plan the decision was dropped from
    (`Savings`)."""
    codes = search.codes(point)
    here = search.price(point, codes)
    best_end = search.descend(point, codes, avoid)
    if here.cost.fits:
        return best_end
    items = savings.without(avoid)
    need = here.cost.peak_memory_bytes - here.cost.capacity_bytes
    for chosen in _cheapest_sets(items, need):
        state = _applied(search, point, codes, [items[k][2] for k in chosen])
        if state is not None:
            end = search.descend(*state, avoid)
            if search.price(*end).rank < search.price(*best_end).rank:
                best_end = end
    return best_end


def _savings(search: Any, point: Point, codes: np.ndarray, cost: Any) -> list[tuple[float, int, Any]]:
    """Per action from the point that saves memory: the seconds it adds, the
    bytes it saves, the action; those that save the most bytes per second
    added first (a saving at no cost first of all)."""
    actions = search.valid(point)
    steps = [(a, after) for a, after in zip(actions, search.children(point, codes, actions)) if after is not None]
    # Each step's time from its delta where one is known, and then its peak alone (`Pricing.figures`).
    keys, estimates = search.estimates(point, codes, steps)
    figures = search.figures([after for _, after in steps], estimates)
    search.learn(point, codes, steps, keys, estimates)
    items = []
    for (action, _), (step_time_s, peak_bytes) in zip(steps, figures):
        saved = cost.peak_memory_bytes - peak_bytes
        if saved > 0:
            items.append((step_time_s - cost.step_time_s, saved, action))
    items.sort(key=lambda item: (item[0] / item[1], -item[1]))
    return items


class Savings:
    """The refit's items (`_savings`) measured once from the plan the polish
    moves from, for the refits of all its decisions, not from each plan
    with one decision dropped: each of those prices every child of its
    state (llama2_70b: 829 children in 20 refits, a tenth of `plan`'s time),
    while their items, the same actions taken as adding up, differ little.
    The sets a refit applies are priced as they are, so the estimate only
    chooses which are tried: the same answers on the 22 bundled specs, the
    MCTS's work 17.4 -> 12.5 s on llama2_70b, 8.5 -> 7.2 s on
    deepseek_v3_moe. Measured when a refit first needs them."""

    def __init__(self, search: Any, point: Point, codes: np.ndarray, cost: Any) -> None:
        self._measure = lambda: _savings(search, point, codes, cost)
        self._items: list[tuple[float, int, Any]] | None = None

    def without(self, avoid: Pair) -> list[tuple[float, int, Any]]:
        """The `_REFIT_ITEMS` items first in order not on the pair `avoid`."""
        if self._items is None:
            self._items = self._measure()
        return [item for item in self._items if (item[2].group, item[2].axis) != avoid][:_REFIT_ITEMS]


def _cheapest_sets(items: list[tuple[float, int, Any]], need: int) -> list[tuple[int, ...]]:
    """The `_REFIT_TRIES` sets of items, at most `_REFIT_SIZE` on distinct
    pairs, that save `need` bytes at the least seconds added (as sums)."""
    sets = []
    for size in range(1, _REFIT_SIZE + 1):
        for chosen in itertools.combinations(range(len(items)), size):
            pairs = {(items[k][2].group, items[k][2].axis) for k in chosen}
            if len(pairs) == size and sum(items[k][1] for k in chosen) >= need:
                sets.append((sum(items[k][0] for k in chosen), chosen))
    return [chosen for _, chosen in sorted(sets)[:_REFIT_TRIES]]


def _applied(search: Any, point: Point, codes: np.ndarray, actions: list[Any]) -> tuple[Point, np.ndarray] | None:
    """The state after the actions in turn (one that changes nothing is
    skipped), or None where one is not valid there."""
    state = (point, codes)
    for action in actions:
        if action not in search.valid(state[0]):
            return None
        state = search.child(*state, action) or state
    return state


def essential(search: Any, point: Point, codes: np.ndarray) -> Point:
    """The point without the decisions that change nothing in it: a decision
    another one makes a no-op can matter again once that one is narrowed,
    and the polish's moves are on what the plan holds (Gemma-7B on TPUv3:
    three such ZeRO-3 decisions made narrowing the embedding's ZeRO-3 cost
    0.4% where alone it saves 4%)."""
    for pair in sorted(point.levels()):
        fewer = point.without(pair)
        if np.array_equal(search.codes(fewer), codes):
            point = fewer
    return point


def starts(search: Any, point: Point, essential: Point) -> list[tuple[Point, Pair | None]]:
    """Where the polish descends from, and the pair avoided (a refit): per
    decision of the point, the point with it dropped; with it set to each
    narrower level its pair offers; and with it dropped, to refit; and per
    pair the space offers LATE, unset or set whole, the point with it LATE.
    Then the same from the point's essential decisions (`essential`), where
    it has others.

    Actions only widen a level, and a pair the incumbent set may have no
    action at all (pruned for its few dimensions: an embedding's
    vocabulary), so a dropped decision is not always one a descent can take
    again at a narrower level (Gemma-7B on TPUv3: the incumbent's ZeRO-3 of
    the embedding where ZeRO-1 is 4% faster and still fits)."""
    out: dict[tuple[Point, Pair | None], None] = {}
    space = search.space
    for held in (point, essential):
        for pair, level in sorted(held.levels().items()):
            dropped = held.without(pair)
            out[(dropped, None)] = None
            for narrower in (n for n in space.options.get(pair, ()) if n < min(level, WHOLE)):
                out[(held.at(pair, narrower), None)] = None
            out[(dropped, pair)] = None
        # A pair set whole moved to LATE (sequence parallelism): actions only widen a level, so none makes it.
        for pair in space.late_variables:
            if held.levels().get(pair, WHOLE) == WHOLE:
                late = held.at(pair, LATE)
                if space.late_order_ok(late.levels()):
                    out[(late, None)] = None
    return list(out)
