"""TOAST's Monte-Carlo Tree Search (section 4 of the paper) over an auto
tactic's search space (`solver.search.space`), priced by the shared cost table.

Actions. An action is (color group, resolution of the group's conflicts,
mesh axis, level): shard every color of the group along the axis (at a
partial level, only ZeRO's part of them, `solver.search.zero`; a later
action may widen the level; at LATE, a data group after every other color,
`solver.search.space`), and fix the bit of each free resolution class
whose conflicts lie in those colors (one action per combination of bits,
for at most `_RESOLVED_CLASSES` classes; classes beyond that stay free for
a later action). Groups are the space's: colors of repeated layers'
parameter groups are one group, so one action mirrors the decision across
the layers. Actions are precomputed once from the NDA; those touching fewer
than `min_dims` dimension names are dropped (TOAST's pruning: they cannot
matter to the step time). In a state, an action is invalid if its (group,
axis) is already set at its level or a wider one, if it contradicts a bit
fixed earlier, or if it leaves the factor sharding unchanged (every I-class
it would shard is taken, deselected or indivisible). A stop action ends the
trajectory; trajectories are at most `max_depth` actions long.

States. A state is the space's `Point` (the (group, axis) pairs set, at
their levels, and the bits fixed so far). Its plan appends whole-color
decisions in the space's fixed order, so the factor sharding does not
depend on the order in which actions were taken. The transposition table is
keyed by the canonical state: the factor sharding (as codes) and the fixed
bits. Action orders that reach the same sharding share one node and its
statistics; the tree is a DAG.

Search. Trajectories run in rounds of `round_iterations`. Each trajectory
selects by UCT from the round's root through expanded nodes, expands one
untried action, completes the trajectory and prices its final state.
Selection maximises

    best reward below + exploration * sqrt(ln N(parent) / N(child))
                      + length_bonus * (1 - mean trajectory length / max_depth)

(the last term: TOAST's preference for shorter trajectories, i.e. simpler
plans of equal cost). The reward is C* / C(s), where C(s) = RT(s) + MP(s)
is TOAST's relative cost (`costmodel.evaluate.Assessment.relative_cost`)
and C* the ideal step time's RT, so rewards lie in (0, 1]. After a round
the best found is applied: the root's child on the way to the best state
becomes the next round's root. A round also ends early once `patience`
trajectories in a row did not beat the tree's best so far: in the first
round, by any amount; in a later one, by more than `round_gain` (what
the round must gain for the search to go on; a trajectory that finds the
rounds' best again, or a sliver better, is no progress: on the 22 bundled
specs the same answers, 9.6% less search work, llama2_70b 9.1 -> 8.3 s,
mixtral_8x7b 9.5 -> 8.5 s, deepseek_v3_moe 7.2 -> 5.8 s). The
search stops when a round brings no improvement, or one of less than
`round_gain` (0.5%) of the best C(s) (the polish takes such gains: on the
22 bundled specs the same answers, mixtral_8x7b's search 11.1 -> 9.5 s of
work, gns 3.1 -> 2.1 s, unet 7.3 -> 6.7 s), or when the budget
(trajectories, seconds) is spent. "Best" is lexicographic: plans that fit
memory first, then C(s).

Incumbent. `solve(..., incumbent=point)` (the planner passes the best
expert schedule's nearest point) prices the point first and seeds the best
found with it, so the answer is never worse than the incumbent; one descent
also starts from it. Rounds (their patience, and whether they improved) are
judged by their trajectories only, so the tree takes the same course with
or without an incumbent, which only seeds the answer.

Departures, measured on Gemma-2B (`specs/gemma_2b.yaml`, 5 seeds, against
CP-SAT's optimum): trajectories completed by uniformly random actions
ended 7-27% slower than the optimum (mean reward) and the node values
averaged mostly bad completions. Here a node's value is the best reward
below it (optimisation, not a game), and the trajectory is completed by
steepest descent on the cost (a "heavy playout": take the action whose
state is cheapest while it improves, then stop); the tree decides where
descents start. Megatron needs four colors on the model axis whose subsets
are worse than sequence sharding, which random completions rarely sample
and a descent from the right start finds. With it every seed reached the
optimum (on the bundled gemma_2b today, seeds 0 to 3; seed 4 ends 1.0%
above it). Applying the best *state* as the next root (rather than its
first action) trapped later rounds in a local optimum, since actions only
add shardings.

Budget: a round ends after `patience` trajectories in a row that did not
beat the tree's best (as above), and a descent's later steps try only the
actions that improved on the state just left ("don't look bits"; its
first step tries them all, so a start the tree chose still reaches plans
whose parts are worse alone). docs/search.md ("MCTS") has the measurements
behind both.
Descents are memoized per start state, and per state its valid actions
and per (state, action) its successor, so revisits cost dict look-ups.

Polish. After the rounds, an iterated local search from the best plan:
per decision, drop it, set it to a narrower ZeRO level, or drop it and
refit (below), descend from there, and move to the end when it ranks
better, until no move improves (`solver.search.mcts_polish`); the moves are tried from
the plan's decisions and again from its essential ones (those without
which its sharding changes: a decision another makes a no-op can matter
again once that one is narrowed). A descent only adds shardings, so an
early decision that later ones made a poor fit stays: on Gemma-7B on
TPUv3 (memory binds) the search ended 2.7% above CP-SAT's optimum with the
d_ff color on the batch axis, where the optimum shards optimizer state
there instead; one drop and a descent reach the optimum. Actions only
widen a level, and the incumbent may set a pair that has no actions
(pruned): narrowing the embedding's ZeRO-3 to ZeRO-1 on Gemma-7B on TPUv3
is 4% faster and still fits. Refit: where the dropped decision was what
made the plan fit, a descent takes it (or the one other step that fits)
again, however slow; the refit never takes that pair, and applies the
cheapest few sets of up to three actions that save the memory together
(each action's time and memory taken as adding up, measured once from the
plan the polish moves from for all its decisions' refits), then descends
(Megatron's 18.4B: ZeRO-1 on two layer groups in place of a third,
with ZeRO-3 of the embedding, 2.1% faster; no single action gets there).
On the small ZeRO space of tests/test_mcts.py, a descent from 118 of
the 128 fitting points ends above the optimum, the polish from 62 of them
reaches it. It costs a few memoized descents per decision
of the answer; the decisions are scanned round, from the one that made the
last move, and a polish that reaches a plan an earlier one moved through
stops (unet: 1,036 -> 337 moves, mixtral_8x7b 913 -> 280, the same answers
within 0.002%). Then descents from the root that avoid each decision a
round committed to, their ends priced (on the attention step with seed 0
the rounds committed to the batch and ended 18% above the optimum, which
shards the head dim alone, and such a descent reaches). Polishing again
from where the incumbent's descent ended improved none of the 22 bundled
specs' answers, for 5% of their search work (81.8 -> 77.7 s), and from
the ends of those descents one (unet, by 0.04%), for 12% (73.9 -> 64.8 s
with `round_gain`; llama2_70b 10.8 -> 9.1 s, chinchilla_32l_a100 10.6 ->
7.9 s, unet 6.7 -> 4.6 s): the rounds and the first polish now reach what
those found (llama2_70b: the heads and the MLP on the model axis, from the
expert's DP+FSDP+MP+R).

Pricing: each state is priced from its codes by the shared cost table,
memoized, a descent step's candidates bounded by their step times and
their deltas, in helper processes with `jobs` above 1
(`solver.search.mcts_pricing`).

Determinism: one `random.Random(seed)` drives every choice, and iteration
orders are fixed, so the same inputs and budget give the same plan. The
time limit is a backstop, counted in the seconds of the work the search
hands out rather than by the clock (`mcts_pricing`, "Budget"), so a search
it cuts short is cut at the same point on a loaded machine, with any
`jobs`; the wall clock stops a run only three times over the limit. The
rounds stop at `_ROUNDS_SHARE` of it, so that the polish always has the
rest: on llama2_70b, whose rounds a 60 s limit once cut, the polish then
took the answer from 8.722 to 8.696 s.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.table import CostTable
from solver.search import MCTS_TIME_LIMIT_S
from solver.search.forked import Helpers
from solver.search.mcts_actions import STOP, Action, actions, statically_valid, successor
from solver.search.mcts_polish import polish
from solver.search.mcts_pricing import Priced, Pricing
from solver.search.report import SILENT, AutoResult, Progress, no_fit_message, report_json
from solver.search.space import Point, SearchSpace

# The share of the time limit the rounds may take: the polish has the rest at least.
_ROUNDS_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class MctsOptions:
    iterations: int = 200  # trajectories, in all rounds
    time_limit_s: float = MCTS_TIME_LIMIT_S  # a backstop (see the module docstring on determinism)
    seed: int = 0
    round_iterations: int = 100
    max_depth: int = 30
    min_dims: int = 10
    exploration: float = 0.1
    length_bonus: float = 0.01
    patience: int = 6  # a round ends after this many trajectories in a row that did not beat the tree's best
    round_gain: float = 0.005  # the search ends after a round that lowered the tree's best C(s) by less than this share
    focus: bool = True  # a descent's later steps try only the actions that improved on the step before
    polish: bool = True  # after the rounds, drop one decision of the best plan and descend again (`_Mcts.polish`)
    jobs: int = 1  # processes pricing a descent step's candidates (`mcts_pricing.Pricing.step`): the same search
    deltas: bool = True  # a candidate's RT from its action's delta where footprints allow (`mcts_pricing`, "Deltas")

    def __post_init__(self) -> None:
        for name in ("iterations", "round_iterations", "max_depth", "patience", "jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"MctsOptions.{name} must be at least 1, got {getattr(self, name)}")
        if self.time_limit_s <= 0:
            raise ValueError(f"MctsOptions.time_limit_s must be positive, got {self.time_limit_s}")
        if not 0 <= self.round_gain < 1:
            raise ValueError(f"MctsOptions.round_gain must be in [0, 1), got {self.round_gain}")


@dataclass(frozen=True, slots=True)
class MctsReport:
    """What the MCTS says about its answer (a `search` object of `shardplan plan --json`)."""

    solver: str
    axes: tuple[str, ...]
    status: str  # feasible (a plan that fits was found) | unknown (none was)
    objective_s: float | None  # the plan's step time (cost table)
    relative_cost: float | None  # its C(s)
    solve_s: float
    build_s: float
    iterations: int  # trajectories run
    rounds: int
    evaluations: int  # distinct factor shardings priced
    timed_only: int  # more ruled out by their step time alone, their peak memory not replayed
    estimated: int  # candidates whose step time a delta gave, neither timed nor priced (`mcts_pricing`, "Deltas")
    bounded: int  # ruled out by a lower bound of their peak, neither timed, replayed nor priced ("Bounds")
    states: int  # nodes of the transposition table
    merged: int  # expansions that reached an existing node (another action order)
    actions: int  # after pruning
    pruned: int  # actions dropped for touching fewer than min_dims dimensions
    space: int  # decision variables: (group, axis) pairs and free resolution bits
    smallest_peak_bytes: int | None
    incumbent_s: float | None  # the incumbent's step time (None: no incumbent was given)
    memory_shaped: bool  # a plan priced that does not fit is faster than the answer
    stopped_by: str  # no-improvement | iterations | time-limit
    work_s: float  # the time limit's clock at the end (`mcts_pricing`, "Budget")
    message: str

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


@dataclass(slots=True, eq=False)
class _Node:
    point: Point
    codes: np.ndarray
    depth: int
    untried: list  # actions (and STOP) not yet expanded, in the order they will be
    children: dict = field(default_factory=dict)  # action -> _Node
    visits: int = 0
    length_sum: float = 0.0
    stop_visits: int = 0
    reward_max: float = 0.0


class _Mcts(Pricing):
    def __init__(self, space: SearchSpace, table: CostTable, options: MctsOptions, progress: Progress) -> None:
        super().__init__(space, table, options)
        self.progress = progress
        self.started = time.perf_counter()  # the wall's backstop (`out_of_time`) counts from `run`
        self.rng = random.Random(options.seed)
        self.actions, self.pruned = actions(space, options.min_dims)
        self.nodes: dict[tuple, _Node] = {}
        self.children_of: dict[tuple[Point, Action], tuple[Point, np.ndarray] | None] = {}
        self.valid_of: dict[Point, list[Action]] = {}
        # Per delta key, how its action recodes a state: the codes it changes, and to what (`children`).
        self.patches: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.descent_of: dict[tuple[Point, tuple[int, str] | None], tuple[Point, np.ndarray]] = {}
        self.merged = 0
        self.incumbent: Priced | None = None
        self.polished: set[bytes] = set()  # the codes of the plans the polish moved through (`mcts_polish`)
        self.committed: list[tuple[int, str]] = []  # the (group, axis) of each action a round committed to

    # ------------------------------------------------------------ states

    def node(self, point: Point, codes: np.ndarray) -> _Node:
        key = (codes.tobytes(), point.bits)
        node = self.nodes.get(key)
        if node is None:
            untried: list = [*self.valid(point), STOP]
            self.rng.shuffle(untried)
            node = self.nodes[key] = _Node(point, codes, point.size, untried)
        return node

    def valid(self, point: Point) -> list[Action]:
        valid = self.valid_of.get(point)
        if valid is None:
            valid = self.valid_of[point] = [a for a in self.actions if statically_valid(point, a, self.space)]
        return valid

    def child(self, point: Point, codes: np.ndarray, action: Action) -> tuple[Point, np.ndarray] | None:
        """The state after a statically valid action, or None if it changes nothing."""
        return self.children(point, codes, [action])[0]

    def children(self, point: Point, codes: np.ndarray,
                 actions: list[Action]) -> list[tuple[Point, np.ndarray] | None]:
        """`child` of each action; the codes not made yet are made by `work`,
        shared with the helpers, as a descent step's prices are, or, where
        the action's delta key was met before, patched: how an action
        recodes its I-classes depends only on the decisions its key holds
        (`solver.search.footprints`), so the child's codes are the state's
        with the change that key's child made (`patches`; unet: 84% of its
        children, a fifth of its search where each was made)."""
        made = {}
        for action in actions:
            if (point, action) not in self.children_of:
                made[action] = successor(point, action)
        keys = {action: self.footprints.key(point, action) for action in made} if self.footprints is not None else {}
        for action, child in made.items():
            patch = self.patches.get(keys[action]) if keys else None
            if patch is not None and child not in self.codes_of:
                self.codes_of[child] = child_codes = codes.copy()
                child_codes[patch[0]] = patch[1]
        todo = list(dict.fromkeys(c for c in made.values() if c not in self.codes_of))
        for child, child_codes in zip(todo, self.tasks([("codes", child, point) for child in todo])):
            self.codes_of[child] = child_codes
        for action, child in made.items():
            child_codes = self.codes_of[child]
            if keys and keys[action] not in self.patches:
                changed = np.flatnonzero(child_codes != codes)
                self.patches[keys[action]] = (changed, child_codes[changed])
            self.children_of[(point, action)] = None if np.array_equal(child_codes, codes) else (child, child_codes)
        return [self.children_of[(point, action)] for action in actions]

    # ------------------------------------------------------------ one trajectory

    def trajectory(self, root: _Node) -> tuple[bool, float]:
        """Run one trajectory from `root`; the rank of the state it priced last."""
        path, node, stopped = [root], root, False
        while node.depth < self.options.max_depth:
            action, child, expanded = self.select(node)
            if action is STOP:
                stopped = True
                break
            if child is None:  # no valid action left: the state is final
                break
            path.append(child)
            node = child
            if expanded:
                break
        point, codes = (node.point, node.codes) if stopped else self.rollout(node)
        priced = self.price(point, codes)
        reward = self.ideal_relative / max(priced.relative_cost, 1e-300)
        length = point.size
        for n in path:
            n.visits += 1
            n.reward_max = max(n.reward_max, reward)
            n.length_sum += length
        if stopped:
            node.stop_visits += 1
        return priced.rank

    def select(self, node: _Node) -> tuple[Any, _Node | None, bool]:
        """Expand the next untried action of `node`, or choose by UCT among the tried ones."""
        while node.untried:
            action = node.untried.pop()
            if action is STOP:
                return STOP, None, True
            after = self.child(node.point, node.codes, action)
            if after is None:
                continue
            before = len(self.nodes)
            child = self.node(*after)
            self.merged += len(self.nodes) == before
            node.children[action] = child
            return action, child, True
        o = self.options
        log_n = math.log(max(node.visits, 1))

        def score(visits: int, reward_max: float, length_sum: float) -> float:
            if visits == 0:
                return math.inf
            return (reward_max + o.exploration * math.sqrt(log_n / visits)
                    + o.length_bonus * (1 - length_sum / visits / o.max_depth))

        stop_reward = self.ideal_relative / self.price(node.point, node.codes).relative_cost
        best: tuple[float, Any] = (score(node.stop_visits, stop_reward, node.stop_visits * node.depth), STOP)
        for action, child in node.children.items():
            s = score(child.visits, child.reward_max, child.length_sum)
            if s > best[0]:
                best = (s, action)
        if best[1] is STOP:
            return STOP, None, False
        return best[1], node.children[best[1]], False

    def rollout(self, node: _Node) -> tuple[Point, np.ndarray]:
        return self.descend(node.point, node.codes)

    def descend(self, point: Point, codes: np.ndarray,
                avoid: tuple[int, str] | None = None) -> tuple[Point, np.ndarray]:
        """Steepest descent from a state: take the valid action whose state is
        cheapest while that improves on the current state, then stop (module
        docstring: why not uniformly random actions); never an action on the
        pair `avoid` (the polish's). Memoized per start state and pair avoided."""
        known = self.descent_of.get((point, avoid))
        if known is not None:
            return known
        start, focus = point, self.options.focus
        here = self.price(point, codes).rank
        candidates, binds = self.allowed(point, avoid), False
        while point.size < self.options.max_depth:
            steps = [(a, after) for a, after in zip(candidates, self.children(point, codes, candidates)) if after]
            keys, estimates = self.estimates(point, codes, steps)
            chosen, improves, binds = self.step([after for _, after in steps], here, binds, estimates)
            self.learn(point, codes, steps, keys, estimates)
            if chosen is None:
                break
            improving = [action for (action, _), better in zip(steps, improves) if better]
            taken, (point, codes) = steps[chosen]
            here = self.prices[codes.tobytes()].rank
            # Focus: only the actions that improved on the state just left are tried from the next one.
            candidates = [a for a in improving if a is not taken and statically_valid(point, a, self.space)] if focus \
                else self.allowed(point, avoid)
        self.descent_of[(start, avoid)] = (point, codes)
        return point, codes

    def allowed(self, point: Point, avoid: tuple[int, str] | None) -> list[Action]:
        """The valid actions of a state, less those on the pair `avoid`."""
        valid = self.valid(point)
        return valid if avoid is None else [a for a in valid if (a.group, a.axis) != avoid]

    def polish(self) -> int:
        """The polish (module docstring, `solver.search.mcts_polish`) until it
        ends or the time limit is spent (`out_of_time`); returns the moves tried."""
        return polish(self)

    def out_of_time(self, share: float = 1.0) -> bool:
        """Whether `share` of the time limit is spent: on the budget's clock
        (`mcts_pricing`, "Budget"), or, a backstop for a machine many times
        slower than that clock's, three times over on the wall's."""
        limit = self.options.time_limit_s
        return self.spent_s > limit * share or time.perf_counter() - self.started > 3 * limit

    # ------------------------------------------------------------ rounds

    def seed(self, incumbent: Point) -> None:
        """Price the incumbent (the best found so far if it is) and descend from it."""
        codes = self.codes(incumbent)
        self.incumbent = self.price(incumbent, codes)
        if self.best[0].rank == self.incumbent.rank:  # the incumbent's plan is the root's
            self.best = (self.incumbent, incumbent, codes)
        self.descend(incumbent, codes)

    def run(self, incumbent: Point | None = None) -> tuple[int, int, str]:
        o, start = self.options, time.perf_counter()
        self.started = start
        root = self.node(Point(frozenset(), ()), self.codes(Point(frozenset(), ())))
        self.price(root.point, root.codes)
        if incumbent is not None:
            self.seed(incumbent)
        tree_best = None  # the best rank a trajectory ended at: what rounds are judged by
        done = rounds = 0
        stopped_by = "iterations"
        while done < o.iterations:
            # Rounds are judged by the trajectories alone, not by the best found overall: the
            # incumbent (and its descent) seeds the answer but does not change the tree's course, so
            # a good incumbent never ends a round or the search before the tree had its turn.
            # A trajectory of a later round counts as progress only where it gains what a round must
            # gain to go on (`round_gain`): one that finds again what the rounds before found, or a
            # sliver better, is no reason to go on with the round.
            at_start, stale = tree_best, 0
            share = 0.0 if at_start is None else o.round_gain
            for _ in range(min(o.round_iterations, o.iterations - done)):
                rank = self.trajectory(root)
                done += 1
                if tree_best is None or _gained(tree_best, rank, share):
                    stale = 0
                else:
                    stale += 1
                if tree_best is None or rank < tree_best:
                    tree_best = rank
                if stale >= o.patience:  # the round ends; the search goes on if it improved
                    break
                if self.out_of_time(_ROUNDS_SHARE):
                    stopped_by = "time-limit"
                    break
                self.progress.update(self._status(rounds, done, time.perf_counter() - start))
            rounds += 1
            if stopped_by == "time-limit":
                break
            if at_start is not None and not _gained(at_start, tree_best, o.round_gain):
                stopped_by = "no-improvement"
                break
            # Commit to the root's child that leads to the best state found (not to that state itself:
            # later rounds could then only add to a local optimum).
            stop_reward = self.ideal_relative / self.price(root.point, root.codes).relative_cost
            best_child = max(root.children.values(), key=lambda c: (c.reward_max, c.visits), default=None)
            if best_child is None or best_child.reward_max <= stop_reward:
                stopped_by = "no-improvement"
                break
            self.committed += [(a.group, a.axis) for a, c in root.children.items() if c is best_child][:1]
            root = best_child
        if o.polish:
            self.polish()
        return done, rounds, stopped_by

    def _status(self, rounds: int, done: int, elapsed: float) -> str:
        priced = self.best[0]
        fits = "fits" if priced.cost.fits else "does not fit"
        return (f"mcts: round {rounds + 1}, {done}/{self.options.iterations} trajectories, "
                f"best step time {priced.cost.step_time_s:.4g} s ({fits}), {elapsed:.1f} s")


def _gained(before: tuple[bool, float], after: tuple[bool, float], share: float) -> bool:
    """Whether a round took the tree's best rank from `before` to `after`
    by more than `share` of its C(s), or from a plan that does not fit to
    one that does (module docstring, "Search")."""
    if after[0] != before[0]:
        return after < before
    return after[1] < before[1] * (1 - share)


def solve(space: SearchSpace, table: CostTable, options: MctsOptions | None = None,
          progress: Progress = SILENT, *, incumbent: Point | None = None) -> AutoResult:
    """The best plan the search finds (module docstring); plan None if none fits memory."""
    options = options or MctsOptions()
    start = time.perf_counter()
    search = _Mcts(space, table, options, progress)
    build_s = time.perf_counter() - start
    with Helpers(search.work, options.jobs) as search.helpers:
        done, rounds, stopped_by = search.run(incumbent)
    solve_s = time.perf_counter() - start - build_s
    priced, point, codes = search.best
    common = dict(solver="mcts", axes=space.axes, solve_s=solve_s, build_s=build_s, iterations=done, rounds=rounds,
                  evaluations=len(search.prices), timed_only=len(search.timed.keys() - search.prices.keys()),
                  estimated=search.estimated,
                  bounded=len((search.bounds.keys() | search.rough.keys()) - search.prices.keys()
                              - search.timed.keys() - search.peaks.keys()),
                  states=len(search.nodes), merged=search.merged,
                  actions=len(search.actions), pruned=search.pruned,
                  space=space.decisions,
                  smallest_peak_bytes=search.smallest[0], stopped_by=stopped_by, work_s=search.spent_s,
                  incumbent_s=search.incumbent.cost.step_time_s if search.incumbent else None,
                  # Memory shaped the answer when a faster plan was rejected for it (what the planner's
                  # rematerialization search asks; CP-SAT's memory cuts say the same exactly).
                  memory_shaped=search.fastest_s < priced.cost.step_time_s * (1 - 1e-9))
    tried = f"in {done} trajectories ({len(search.prices)} plans priced)"
    if priced.cost.fits:
        plan = space.plan(point)
        sharding = plan.materialize(space.nda)
        message = (f"best of {done} trajectories in {rounds} rounds ({len(search.prices)} plans priced, "
                   f"stopped by {stopped_by}): step time {priced.cost.step_time_s:.6g} s")
        if priced is search.incumbent:  # the same codes priced once: the incumbent's plan, or one alike
            message += "; no searched plan beat the incumbent"
        report = MctsReport(status="feasible", objective_s=priced.cost.step_time_s,
                            relative_cost=priced.relative_cost, message=message, **common)
        return AutoResult(plan, sharding, priced.cost, report)
    _, small_point, _ = search.smallest
    smallest = (search.smallest[0], space.plan(small_point).materialize(space.nda))
    message = no_fit_message(space, table, smallest, False, tried)
    report = MctsReport(status="unknown", objective_s=None, relative_cost=None, message=message, **common)
    return AutoResult(None, None, None, report)


__all__ = ["Action", "MctsOptions", "MctsReport", "STOP", "solve"]
