"""The MCTS's pricing of states (`solver.search.mcts`): each state's
codes, priced from the shared cost table and memoized, and a descent
step's candidates ranked with as little work as the ranking allows.

Bounds. A descent step looks for the best candidate that improves on the
state it is at. Where the state fits memory, a candidate whose relative
step time alone (RT) is no smaller than the state's C = RT + MP cannot rank
before it (its own C is at least its RT, and not fitting ranks it later
still), and among those below, the fastest that fits is the best (a plan
that fits has C = RT). So every candidate is timed (`CostTable.timed`,
without the peak memory replay), and only those below C are replayed, in
RT order, until one fits (`Pricing.step`): the same step as pricing every
candidate, with one replay where memory does not bind (the report's
`timed_only` counts the others). The candidates below C are the ones the
next step focuses on, fitting or not (pricing them all, the focus would
drop those that do not fit; a superset, so no descent looks at less).
Where memory binds (the fastest candidate did not fit), the next step
replays the candidates below C as it times them rather than timing them
twice. On unet (memory does not bind) 5,528 -> 807 replays for the same
plan; on mixtral_8x7b, whose fastest candidates mostly do not fit, 10,955
-> 9,212.

Where the state does not fit, a candidate's rank needs its peak, and a
lower bound of it is a third of a replay (`CostTable.peak_lower_bound`:
the global program's values over their ops, no collectives). With its RT
where known (else 0) it bounds the candidate's rank from below; the step
times or replays the candidate of least bound, bounds it again, and stops
when the least bound is an exact rank: that candidate is the best, as
where every one was priced (`Pricing.least`). The others are improving
where their bound ranks before the state (a superset again). llama2_70b,
whose steps from states that do not fit are most of its search: 7,852
candidates, 229 of them ranked ahead of the best by their bound, 3,714
timings then 505; the same plan.

The bound's walk over partial sums is most of it where the walk's memo
misses, so every candidate is first bounded roughly
(`CostTable.rough_peak_bound`: the same, every result that may ever be
partial taken as partial, no walk), and a candidate popped with a rough
bound is bounded exactly before it is timed. Exact bounds are then made
for the fifth to a quarter that a step pops (mixtral_8x7b 5,700 -> 1,214
in its rounds, deepseek_v3_moe 10,963 candidates, 2,232 bounded exactly) at a
third to a seventh of the work on those two; on llama2_70b, whose walk
mostly hits its memo, the rough bound costs two thirds of the exact one,
and the two together about what the exact ones did. The focus of a
candidate left with a rough bound reads that bound (a superset still):
the same plans on 21 of the 22 bundled specs, deep_mlp_32768x96 1.3255
-> 1.3272 s (+0.13%; CP-SAT's optimum 1.3255 s).

Deltas. A descent step mostly tries the actions of the step before
from a state one decision further on, and most decisions leave most
actions' effect alone. The step time is a sum of terms, and an action can
change only those in its footprint (`solver.search.footprints`): its
change of step time from a state, its delta, depends only on the state's
decisions whose footprints meet its own. Every candidate a descent times or
prices leaves its delta under that key (`Footprints.key`); a later
candidate with the same key takes its RT as the state's RT plus the delta,
neither timed nor priced (the report's `estimated`). Where the step
needs its memory too (here does not fit), it is replayed for its peak
alone (`CostTable.peak_bytes`, `ranks`: its compute and kernels not
priced), and only the candidate taken is priced whole. Exact up to the
rounding of the sums: every estimate a later timing checks agrees within
1e-9 (`delta_misses`, none on the bundled specs). unet: 15,324 -> 4,686
timings, the same plan; mixtral_8x7b, whose steps mostly start from
states that do not fit, 8,843 -> 5,319 timings and 7,657 -> 5,208 whole
prices (the other 2,400 replayed for their peak alone), the same plan.

Pricing uses the tabulated cost (`costmodel.table.CostTable`) of the
state's codes (`SearchSpace.codes`): no IR is built until the end, when the
best plan is materialized once. Prices are memoized per factor sharding.
The space's keys (`solver.search.keys`: I-classes coded alike in every
point) fold both: a state's codes are materialized for the owners of one
member of each key (`SearchSpace.folded_codes`), and its times are priced
from one member of each orbit of ops, kernels and uses
(`costmodel.table_fold`), the same codes and figures to the bit.

Budget. The search's time limit is counted in the seconds of the work it
hands out, not by the clock: each task (a state's codes, a timing, a peak
replay, a whole price) at what it takes on this machine in an idle hour,
from the program's size (`_TIME_S`, `_PEAK_S`, `_CODES_S`; `spent_s`). So
where the limit cuts a search, it cuts it at the same point however loaded
the machine and however many processes price, and the same inputs give the
same plan (mixtral_8x7b's search, cut by a wall-clock limit in a loaded
hour, answered 4.177 s where it answers 4.175 s). As CP-SAT's
deterministic time, it follows the wall only roughly.

Helpers. With `jobs` above 1 (`shardplan plan --jobs N`), a descent
step's candidates, their codes and then their prices, are worked here and
in forked helper processes kept for the whole search, each process taking
the next one not taken as it comes free (`solver.search.forked.Helpers`,
`Pricing.work`). Either is a function of
the codes, the space and the table alone, and the results are taken in the
candidates' order, so the course, the memo tables and the answer are those
of one process; only the time limit can tell them apart. A descent step
has tens to a couple of hundred candidates of a few milliseconds each, so
a batch dwarfs the fork (once a search) and the pipe (twice a step).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.evaluate import Assessment, Cost, ideal_step_time_s, relative_memory_overflow
from costmodel.table import CostTable
from ir.core import IRError
from solver.search.footprints import Footprints
from solver.search.forked import Helpers
from solver.search.keys import IClassKeys
from solver.search.space import Point, SearchSpace


@dataclass(frozen=True, slots=True)
class Priced:
    relative_cost: float  # C = RT + MP
    runtime: float  # RT
    cost: Cost

    @property
    def rank(self) -> tuple[bool, float]:
        return (not self.cost.fits, self.relative_cost)


# The budget's clock (module docstring, "Budget"): a task's seconds, by the program's ops. Measured on
# the root's children of unet, gemma_2b, mixtral_8x7b and llama2_70b (2,824 to 42,419 ops): a timing
# 1.0 to 2.0 ms, a peak replay 1.1 to 4.0 ms, codes 0.1 ms (in an hour whose
# `bench/readme_table.reference_seconds` took 0.62 s); then scaled so that a whole search's clock reads
# about its seconds in one process in an idle hour (reference 0.38 s), the search's own work and colder
# memos included: 0.8x (llama2_70b) to 1.7x (unet) of them.
_CODES_S = 0.11e-3
_TIME_S = (1.0e-3, 27e-9)  # per task, per op
_PEAK_S = (0.95e-3, 80e-9)
_BOUND_S = (0.2e-3, 15e-9)
_ROUGH_S = (0.1e-3, 8e-9)
# A bounded step's timings and replays handed out together (`Pricing.least`): a fixed count, not the
# jobs', so that what is timed and replayed does not depend on them.
_AT_ONCE = 8


class Pricing:
    """What `solver.search.mcts._Mcts` prices states with (module docstring):
    the memo tables, the best, smallest and fastest plans priced, and the
    work its helpers share. `options`: the search's `MctsOptions`."""

    def __init__(self, space: SearchSpace, table: CostTable, options: Any) -> None:
        if space.mesh != table.mesh:
            raise IRError(f"the search space is over {space.mesh}, the cost table over {table.mesh}")
        self.space, self.table, self.options = space, table, options
        fn, hardware = table.fn, table.hardware
        self.baseline = table.baseline()
        self.ideal_s = ideal_step_time_s(fn, space.mesh.num_devices, hardware)
        self.ideal_relative = self.ideal_s / self.baseline.step_time_s if self.baseline.step_time_s else 1.0
        # The space's keys name the I-classes coded alike in every point: a point's codes are made for
        # one member of each (`SearchSpace.folded_codes`), and its times priced by orbit (`CostTable.fold`).
        representatives = IClassKeys(space).representatives()
        self.materialize = space.folded_codes(representatives)
        self.fold = table.fold(representatives)
        # `held`'s gather: per I-class and the sentinel, its place in a state's codes with a 0 appended.
        self._held_read = np.append(self.materialize.read.reshape(-1), len(self.materialize.places))
        self.codes_of: dict[Point, np.ndarray] = {}
        self.prices: dict[bytes, Priced] = {}
        self.timed: dict[bytes, float] = {}  # plans timed, their peak not replayed: their RT (`step`)
        self.peaks: dict[bytes, int] = {}  # plans whose RT was known: their peak alone (`least`)
        self.bounds: dict[bytes, int] = {}  # plans not replayed: a lower bound of their peak (`least`)
        self.rough: dict[bytes, int] = {}  # plans not bounded so: a rougher one (`least`)
        self.helpers: Helpers = Helpers(self.work, 1)  # `mcts.solve` opens the option's processes
        # The budget's clock (module docstring, "Budget"): the seconds of the tasks handed out so far.
        ops = len(table.fn.ops)
        time_s, peak_s = _TIME_S[0] + _TIME_S[1] * ops, _PEAK_S[0] + _PEAK_S[1] * ops
        self._task_s = {"codes": _CODES_S, "time": time_s, "peak": peak_s, "price": time_s + peak_s,
                        "bound": _BOUND_S[0] + _BOUND_S[1] * ops, "rough": _ROUGH_S[0] + _ROUGH_S[1] * ops}
        self.spent_s = 0.0
        # The decisions' footprints, for deltas that stand for a candidate's timing (module docstring).
        self.footprints = Footprints(space, table) if options.deltas else None
        self.deltas: dict[tuple, float] = {}  # per `Footprints.key`: T(state + action) - T(state)
        self.estimated = 0  # candidates whose RT a delta gave, neither timed nor priced
        self.delta_misses = 0  # deltas that disagreed with a timing made later: none, where footprints are right
        self.best: tuple[Priced, Point, np.ndarray] | None = None
        self.smallest: tuple[int, Point, np.ndarray] | None = None
        self.fastest_s = math.inf  # the fastest plan priced, fitting or not

    def codes(self, point: Point, near: Point | None = None) -> np.ndarray:
        """The point's codes, one per key (`_FastMaterialize.few`: equal for
        two points exactly when their I-classes' codes are; `whole` gives
        those), in the narrowest integer type that holds them. The search
        keeps the codes of every state it reaches, as arrays and as the keys
        of its prices: a key's instead of an I-class's, 58 bytes a state
        instead of 100,074 on llama2_70b. `near`: the state whose successor
        the point is (`SearchSpace.codes`)."""
        codes = self.codes_of.get(point)
        if codes is None:
            self.spent_s += self._task_s["codes"]
            codes = self.codes_of[point] = self.work(("codes", point, near))
        return codes

    def whole(self, codes: np.ndarray) -> np.ndarray:
        """Every I-class's code of a state's `codes`: what the table prices."""
        return self.materialize.whole(codes)

    def held(self, codes: np.ndarray) -> np.ndarray:
        """`whole` as the table reads it, the sentinel's 0 appended, int64, in one
        gather: constant on the fold's orbits by construction (every I-class
        takes its representative's code), so the table takes it unchecked
        (`CostTable.timed`'s `held`)."""
        return np.append(codes, 0).astype(np.int64)[self._held_read]

    def price(self, point: Point, codes: np.ndarray) -> Priced:
        return self.price_all([(point, codes)])[0]

    def _priced(self, point: Point, codes: np.ndarray, key: bytes, cost: Cost) -> Priced:
        assessed = Assessment(cost, self.baseline, self.ideal_s)
        priced = self.prices[key] = Priced(assessed.relative_cost, assessed.relative_runtime, cost)
        if self.best is None or priced.rank < self.best[0].rank:
            self.best = (priced, point, codes)
        if self.smallest is None or cost.peak_memory_bytes < self.smallest[0]:
            self.smallest = (cost.peak_memory_bytes, point, codes)
        self.fastest_s = min(self.fastest_s, cost.step_time_s)
        return priced

    def step(self, candidates: list[tuple[Point, np.ndarray]], here: tuple[bool, float],
             binds: bool, estimates: list[float | None] | None = None) -> tuple[int | None, list[bool], bool]:
        """A descent step from a state ranked `here`: the index of the best
        candidate that ranks before it (None: none does), per candidate
        whether it improves, and whether memory bound the step. Where here
        fits, every candidate is timed, and only those whose relative step
        time alone (RT) is below here's C are replayed for memory, one after
        another in RT order until one fits: that one is the best (C = RT + MP
        is at least RT, and a plan that fits has MP 0), and the others are
        improving on their RT (module docstring, "Bounds"). Memory binds
        where the fastest does not fit; then (`binds`, the step before's) the
        candidates below here's C are replayed as they are timed, not timed
        again when their turn comes. Where here does not fit, the
        candidates are ranked by bounds of their peak first (`least`), and
        the best is priced whole. The work is `work`'s, shared
        with the helpers, in the candidates' order. `estimates`: per
        candidate, its RT where a delta gives it (`descend`), which stands
        for its timing (None: timed)."""
        if here[0]:
            best, improving = self.least(candidates, estimates, here)
            if best is not None:
                self.price(*candidates[best])  # the next state: priced whole
            return best, improving, binds
        runtimes = list(estimates or [None] * len(candidates))
        todo = [k for k, rt in enumerate(runtimes) if rt is None]
        for k, rt in zip(todo, self.runtimes([candidates[k] for k in todo], here[1] if binds else None)):
            runtimes[k] = rt
        if binds:  # those a delta gave below here's C, as the timed ones were: in one batch, with the helpers
            self.price_all([candidates[k] for k, rt in enumerate(estimates or ()) if rt is not None and rt < here[1]])
        improving = [rt < here[1] for rt in runtimes]
        # One at a time (here, not in a helper: the first usually fits), so that what is priced does not
        # depend on the jobs.
        for n, k in enumerate(sorted((k for k in range(len(candidates)) if improving[k]), key=runtimes.__getitem__)):
            if self.price(*candidates[k]).cost.fits:
                return k, improving, n > 0
        return None, improving, True

    def least(self, states: list[tuple[Point, np.ndarray]], estimates: list[float | None] | None,
              here: tuple[bool, float]) -> tuple[int | None, list[bool]]:
        """From a state that does not fit (ranked `here`): the index of the
        best state that ranks before it (None: none does; the first of equals)
        and per state whether it may (module docstring, "Bounds"). A state's
        rank is bounded from below by its RT where known (its estimate, a
        timing or price kept), else 0, and its peak where known, else a lower
        bound of it (`CostTable.peak_lower_bound`, kept in `bounds`; at
        first a rougher one, `rough_peak_bound`, kept in `rough`); the
        state with the least bound is bounded exactly, timed, or replayed
        for its peak (`peaks`), in that order, and bounded again,
        `_AT_ONCE` states at a time, until the
        least bound is an exact rank: the best. A state left with a bound
        may improve where the bound ranks before `here`. The work is
        `work`'s, shared with the helpers, in a fixed order."""
        n = len(states)
        keys = [codes.tobytes() for _, codes in states]
        runtimes = [rt if rt is not None else self.exact_runtime(codes)
                    for rt, (_, codes) in zip(estimates or [None] * n, states)]
        peaks = [self._known_peak(key) for key in keys]
        for k in range(n):
            if runtimes[k] is not None and keys[k] not in self.prices:
                self.fastest_s = min(self.fastest_s, runtimes[k] * self.baseline.step_time_s)
        unbounded = {keys[k]: states[k][1] for k in range(n)
                     if peaks[k] is None and keys[k] not in self.bounds and keys[k] not in self.rough}
        for key, bound in zip(unbounded, self.tasks([("rough", codes) for codes in unbounded.values()])):
            self.rough[key] = bound
        lower = [self._lower_rank(key, rt, peak) for key, rt, peak in zip(keys, runtimes, peaks)]
        heap = [(rank, k) for k, rank in enumerate(lower)]
        heapq.heapify(heap)
        best: tuple[tuple[bool, float], int] | None = None
        while heap and (best is None or heap[0] < best):
            todo = []
            while heap and len(todo) < _AT_ONCE and (best is None or heap[0] < best):
                rank, k = heapq.heappop(heap)
                known = runtimes[k], peaks[k]  # or made since, for an equal state (two actions, one plan)
                runtimes[k] = self.exact_runtime(states[k][1]) if known[0] is None else known[0]
                peaks[k] = self._known_peak(keys[k]) if known[1] is None else known[1]
                if (runtimes[k], peaks[k]) != known:
                    lower[k] = self._lower_rank(keys[k], runtimes[k], peaks[k])
                    heapq.heappush(heap, (lower[k], k))
                elif runtimes[k] is None or peaks[k] is None:
                    todo.append(k)
                elif best is None or (rank, k) < best:
                    best = (rank, k)
            # Each state popped is bounded better, the cheapest way first: its peak's bound, its timing, its peak.
            tasks = [("bound", states[k][1]) if peaks[k] is None and keys[k] not in self.bounds else
                     ("time", states[k][1], None) if runtimes[k] is None else ("peak", states[k][1]) for k in todo]
            for k, task, out in zip(todo, tasks, self.tasks(tasks)):
                if task[0] == "bound":
                    self.bounds[keys[k]] = out
                elif task[0] == "time":
                    step_time_s, runtimes[k], _ = out
                    self._keep_time(keys[k], step_time_s, runtimes[k])
                else:
                    peaks[k] = out
                    self._keep_peak(keys[k], states[k], out)
                lower[k] = self._lower_rank(keys[k], runtimes[k], peaks[k])
                heapq.heappush(heap, (lower[k], k))
        improving = [rank < here for rank in lower]
        return (best[1] if best is not None and best[0] < here else None), improving

    def _keep_time(self, key: bytes, step_time_s: float, runtime: float) -> None:
        """Keep a state's timing (`timed`), its peak not replayed."""
        self.timed[key] = runtime
        self.fastest_s = min(self.fastest_s, step_time_s)

    def _keep_peak(self, key: bytes, state: tuple[Point, np.ndarray], peak: int) -> None:
        """Keep a state's peak replayed alone (`peaks`), and the smallest seen."""
        self.peaks[key] = peak
        if self.smallest is None or peak < self.smallest[0]:
            self.smallest = (peak, *state)

    def _known_peak(self, key: bytes) -> int | None:
        """A state's peak where it was priced or replayed, else None."""
        priced = self.prices.get(key)
        return priced.cost.peak_memory_bytes if priced is not None else self.peaks.get(key)

    def _lower_rank(self, key: bytes, runtime: float | None, peak: int | None) -> tuple[bool, float]:
        """A state's rank where it was priced; else its rank with its RT or 0,
        and its peak or the lower bound of it kept (`least`)."""
        priced = self.prices.get(key)
        if priced is not None:
            return priced.rank
        peak = self.bounds.get(key, self.rough.get(key)) if peak is None else peak
        capacity = self.table.hardware.capacity_bytes
        overflow = relative_memory_overflow(peak, capacity, self.baseline.peak_memory_bytes)
        return peak > capacity, (runtime or 0.0) + overflow

    def figures(self, states: list[tuple[Point, np.ndarray]],
                estimates: list[float | None] | None) -> list[tuple[float, int]]:
        """Each state's step time and peak memory: priced whole, but where an
        estimate gives its RT, from that and its peak alone
        (`CostTable.peak_bytes`, kept in `peaks`: its compute and kernels not
        priced)."""
        return [(read.cost.step_time_s, read.cost.peak_memory_bytes) if isinstance(read, Priced) else
                (read[0] * self.baseline.step_time_s, read[1]) for read in self._read(states, estimates)]

    def _read(self, states: list[tuple[Point, np.ndarray]],
              estimates: list[float | None] | None) -> list[Priced | tuple[float, int]]:
        """What `figures` reads of each state: its price, or, where
        an estimate gives its RT and it is not priced, (RT, its peak alone)."""
        estimates = estimates or [None] * len(states)
        peaks = {key: (point, codes) for (point, codes), rt in zip(states, estimates)
                 if rt is not None and (key := codes.tobytes()) not in self.prices and key not in self.peaks}
        for (key, state), peak in zip(peaks.items(), self.tasks([("peak", codes) for _, codes in peaks.values()])):
            self._keep_peak(key, state, peak)
        self.price_all([state for state, rt in zip(states, estimates) if rt is None])
        out: list[Priced | tuple[float, int]] = []
        for (_, codes), rt in zip(states, estimates):
            key = codes.tobytes()
            priced = self.prices.get(key)
            if priced is None:
                self.fastest_s = min(self.fastest_s, rt * self.baseline.step_time_s)
            out.append(priced if priced is not None else (rt, self.peaks[key]))
        return out

    def runtimes(self, states: list[tuple[Point, np.ndarray]], below: float | None = None) -> list[float]:
        """Each state's RT: from its price, or timed (kept in `timed`, its
        peak not replayed), by `work`, shared with the helpers; those timed
        whose RT is below `below` are priced whole in the same work."""
        todo = {key: (point, codes) for point, codes in states
                if (key := codes.tobytes()) not in self.prices and key not in self.timed}
        for (key, (point, codes)), (step_time_s, runtime, cost) in zip(todo.items(), self.tasks(
                [("time", codes, below) for _, codes in todo.values()])):
            self._keep_time(key, step_time_s, runtime)
            if cost is not None:
                self.spent_s += self._task_s["peak"]  # priced whole in the same task
                self._priced(point, codes, key, cost)
        out = []
        for _, codes in states:
            priced = self.prices.get(codes.tobytes())
            out.append(self.timed[codes.tobytes()] if priced is None else priced.runtime)
        return out

    def estimates(self, point: Point, codes: np.ndarray, steps: list[tuple[Any, tuple[Point, np.ndarray]]]
                  ) -> tuple[list[tuple] | None, list[float | None] | None]:
        """Per step (action, state after it) from the priced state (`point`,
        `codes`): its `Footprints.key`, and its RT where that is known: exact
        where it was timed or priced, else the state's RT plus the key's
        delta (`deltas`), None if neither. (None, None) without deltas."""
        if self.footprints is None:
            return None, None
        runtime = self.prices[codes.tobytes()].runtime
        keys = [self.footprints.key(point, action) for action, _ in steps]
        out: list[float | None] = []
        for key, (_, (_, after)) in zip(keys, steps):
            rt = self.exact_runtime(after)
            if rt is None and key in self.deltas:
                rt = runtime + self.deltas[key]
            out.append(rt)
        return keys, out

    def learn(self, point: Point, codes: np.ndarray, steps: list[tuple[Any, tuple[Point, np.ndarray]]],
              keys: list[tuple] | None, estimates: list[float | None] | None) -> None:
        """Keep the delta of each step (`estimates`'s) now timed or priced
        (`deltas`); an estimate its exact RT disagrees with is counted
        (`delta_misses`: none, where the footprints are right)."""
        if keys is None:
            return
        runtime = self.prices[codes.tobytes()].runtime
        for key, (_, (_, after)), estimate in zip(keys, steps, estimates or [None] * len(keys)):
            exact = self.exact_runtime(after)
            if exact is None:
                self.estimated += estimate is not None  # neither timed nor priced
                continue
            if estimate is not None and abs(exact - estimate) > 1e-9 * abs(exact):
                self.delta_misses += 1
            self.deltas[key] = exact - runtime

    def exact_runtime(self, codes: np.ndarray) -> float | None:
        """A state's RT where it was priced or timed, else None."""
        key = codes.tobytes()
        priced = self.prices.get(key)
        return priced.runtime if priced is not None else self.timed.get(key)

    def price_all(self, states: list[tuple[Point, np.ndarray]]) -> list[Priced]:
        """`price` of each state: those not priced yet are priced by `work`,
        shared with the helpers, the results taken in the states' order, so
        the prices, the best and the smallest are those of a loop over them."""
        todo: dict[bytes, tuple[Point, np.ndarray]] = {}
        for point, codes in states:
            key = codes.tobytes()
            if key not in self.prices and key not in todo:
                todo[key] = (point, codes)
        for (key, (point, codes)), cost in zip(todo.items(), self.tasks(
                [("price", codes) for _, codes in todo.values()])):
            self._priced(point, codes, key, cost)
        return [self.prices[codes.tobytes()] for _, codes in states]

    def tasks(self, items: list[tuple]) -> list[Any]:
        """`work` of each item, shared with the helpers, in order; their
        seconds counted on the budget's clock (`spent_s`)."""
        self.spent_s += sum(self._task_s[item[0]] for item in items)
        return self.helpers.map(items)

    def work(self, task: tuple) -> Any:
        """What the helpers share (`solver.search.forked.Helpers`), a function
        of the task, the space and the table alone, so it runs here or in a
        helper: ("codes", point, near): the point's codes (`codes`);
        ("time", codes, below): a state's step time, RT and, where the RT is
        below `below` (a number), its cost, else None, its peak not replayed;
        ("price", codes): its cost; ("peak", codes): its peak memory alone;
        ("bound", codes): a lower bound of that (`CostTable.peak_lower_bound`);
        ("rough", codes): a lower bound of that one (`CostTable.rough_peak_bound`)."""
        if task[0] == "codes":
            _, point, near = task
            return self.materialize.few(point, near).astype(self.table.code_dtype)
        if task[0] == "peak":
            return self.table.peak_bytes(self.held(task[1]), self.fold, held=True)
        if task[0] == "bound":
            return self.table.peak_lower_bound(self.held(task[1]), self.fold, held=True)
        if task[0] == "rough":
            return self.table.rough_peak_bound(self.held(task[1]), self.fold, held=True)
        timed = self.table.timed(self.held(task[1]), self.fold, held=True)
        if task[0] == "time":
            runtime = Assessment(timed.without_peak, self.baseline, self.ideal_s).relative_runtime
            below = task[2] is not None and runtime < task[2]
            return timed.step_time_s, runtime, timed.cost() if below else None
        return timed.cost()



__all__ = ["Priced", "Pricing"]
