"""The CP-SAT backend: an exact constraint model of an auto tactic's search
space (`solver.search.space`) whose objective is the shared cost model.

Variables (DESIGN.md, "Search backends"):

  x[g, a]  shard color group g along mesh axis a (the decision);
  y[g, a]  set data group g LATE on axis a (sequence parallelism,
           `solver.search.space`);
  z[g, a, l] the (g, a) decision reaches at least the partial level l
           (ZeRO's parts, `solver.search.zero`); x implies every z of its
           pair, and a wider z the narrower ones;
  r[c]     the bit of resolution class c;
  s[k, a]  derived: an I-class with key k holds axis a. Its definition is
           `ir.sharding.materialize`'s rule, exactly: x of its group (or the z
           of the narrowest level that holds its part), not deselected by r,
           the axis not taken by a higher-priority I-class of the same owner,
           and divisible given the axes it already holds; where its group
           may be LATE there, that or y, no group the LATE rule names set,
           and divisible.

Cost terms: `solver.search.cpsat_terms` (op, kernel, edge and end terms,
each priced by `costmodel.table`, the one pricing function).

Memory: the peak of the cost model is not linear, so capacity is enforced
lazily, and exactly. After each solve the plan is priced; if it does not
fit, a cut is added at every position (up to eight, spread over the program,
largest overflow first) where a lower bound of its live bytes, written as a
sum of the model's terms (`solver.search.cpsat_memory`), already exceeds the
capacity, and the plan itself is excluded (a no-good: a cut in whole KiB
may not reach a plan that overflows by a few KiB). Every cut is valid, and
each round removes the plan it priced, so the loop converges: it runs until
a plan fits, the model is infeasible (proven: no plan fits) or the time
limit is spent, with no round cap. The final optimum is the optimum among
plans that fit.

A hint that fits is an incumbent: the answer is never worse than it. (It
is not written into the model as a bound on the objective: on unet that
constraint steered CP-SAT's search to a 0.13% worse plan in the same
deterministic time; the hint alone starts the search there.)

A floor (`CpSatOptions.floor_s`: the expert floor's step time, which the
planner answers unless a searched plan is faster) is not written into the
model either, for the same reason (unet: 7.597 -> 7.772 ms with it as a
constraint). Where the hint is slower than the floor (the floor's plan is
outside the space), a copy of the model with the objective bounded by the
floor is solved first, for a tenth of the time limit, to its first plan:
infeasible proves that no plan beats the floor, and no solve runs
(`_Cp.beats_floor`). Otherwise each solve stops once its best bound passes
the floor. Either way no later memory round or remat program is searched
(each only removes plans or adds compute), status "floor".
deepseek_v3_moe, whose expert parallelism the space does not hold: 57-67 s
of CP-SAT over three programs to a plan 60% slower than the expert's, now
one bounded copy (1.5 s) and no solve (`plan --solver cpsat`: 7.4 s).

What the model proves is the serial step time (the sum of the fused
kernels' times, `costmodel.evaluate`). The overlap of the two-stream
simulator is a schedule, not a sum, so it is not in the model; with
`rerank` K > 1 the solve goes on after the optimum, excluding each plan found
(a no-good cut), until it holds the K best distinct plans that fit; the
simulator then picks the one with the shortest makespan
(`solver.search.rerank`) and the report says so.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from costmodel.table import CostTable
from ir.core import IRError
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.search import CPSAT_TIME_LIMIT_S
from solver.search.cpsat_memory import memory_cuts
from solver.search.cpsat_terms import Term, TermModel
from solver.search.forked import Helpers, forks
from solver.search.keys import Key
from solver.search.report import SILENT, AutoResult, Progress, no_fit_message, report_json
from solver.search.rerank import simulated_makespan_s
from solver.search.space import FREE, LATE, Point, SearchSpace
from solver.search.zero import WHOLE

# The share of the time limit a solve may take to prove that no plan beats the floor (`_Cp.beats_floor`).
_PROBE_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class CpSatOptions:
    time_limit_s: float = CPSAT_TIME_LIMIT_S  # deterministic seconds, summed over the solves
    workers: int = 1
    seed: int = 0
    rerank: int = 1  # the best distinct plans the simulator compares (1: the solver's optimum as it is)
    # What re-ranks them (lower is better; default: the simulated makespan of the plan's program), and
    # its name in the report. A pipelined spec re-ranks by its pipeline schedule's step time.
    score: Callable[[Plan, FactorSharding], float] | None = None
    score_name: str = "the simulator"
    # The score is never below a plan's serial step time (gradient accumulation: K runs of a microbatch
    # take at least one run of the batch). A plan whose step time alone is no faster than the best score
    # so far is then not scored (its makespan is reported as None).
    score_at_least_step_time: bool = False
    # Processes that score the plans (`solver.search.forked`), this one among them: the scores depend on
    # none of one another's, so they are the same wherever they run. Where the first plan's score sets
    # what the others are scored with (`score_first_alone`: a pipelined spec's count of microbatches,
    # chosen for the first), it is scored first, here.
    score_jobs: int = 1
    score_first_alone: bool = True
    # A step time only a faster plan matters against (the expert floor's: the planner answers that plan
    # otherwise): a solve stops once its bound shows that no plan beats it (`_Cp.solve`), status "floor".
    floor_s: float | None = None


@dataclass(frozen=True, slots=True)
class SolveReport:
    """What the backend says about its answer (the `search` objects of `shardplan plan --json`)."""

    solver: str
    axes: tuple[str, ...]
    status: str  # optimal | feasible | infeasible | unknown
    objective_s: float | None  # the model's step time of the plan (descaled)
    bound_s: float | None  # a proven lower bound among plans that fit
    gap: float | None
    solve_s: float
    build_s: float
    variables: int
    constraints: int
    terms: int
    folded: int  # ops and uses priced by a shared term
    space: int  # decision variables: (group, axis) pairs, their partial levels and free resolution bits
    rounds: int
    memory_cuts: int
    no_goods: int  # plans excluded one by one (the memory bound did not see their overflow)
    smallest_peak_bytes: int | None
    message: str
    # Re-ranking (rerank > 1): the serial step times and simulated makespans of the plans compared,
    # best serial first, and the index of the one chosen (the shortest makespan).
    rerank_objectives_s: tuple[float, ...] = ()
    rerank_makespans_s: tuple[float | None, ...] = ()  # None: not scored (its step time alone no faster), or unfit
    rerank_winner: int = 0

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


class _Cp:
    """The CP-SAT model of a `TermModel`.

    A term is not given one boolean per combination: each combination is a
    full assignment of the term's derived booleans (and input features), so
    exactly one holds, and the model states what it implies with that
    conjunction as enforcement literals: its cost as a lower bound on the
    term's cost variable (minimization makes it exact), its outputs as
    implications, and a combination the lowering cannot build as a
    forbidden clause. Propagation then stays local to each term. Each
    conjunction keeps only the literals its value reads (`_implied`), so
    combinations that differ elsewhere share one constraint."""

    def __init__(self, m: TermModel) -> None:
        self.m, self.space = m, m.space
        model = self.model = cp_model.CpModel()
        self.x = {v: model.NewBoolVar(f"x{v[0]}_{v[1]}") for v in self.space.variables}
        self.z = {v: model.NewBoolVar(f"z{v[0]}_{v[1]}_{v[2]}") for v in self.space.partial_variables}
        for g, a, level in self.space.partial_variables:  # a level holds the narrower ones
            wider = min(w for w in self.space.options[(g, a)] if w > level)
            model.AddImplication(self._reaches(g, a, wider), self.z[(g, a, level)])
        self.y = self._late_levels()
        self.r = {c: model.NewBoolVar(f"r{c}") for c in self.space.free_classes}
        self._early: dict[tuple[int, int], Any] = {}  # (key, axis) -> "holds it by an early decision", where LATE too
        self.s = {(kid, i): model.NewBoolVar(f"s{kid}_{i}")
                  for kid, key in enumerate(m.keys) for i, st in enumerate(key.status) if st == FREE}
        for kid, key in enumerate(m.keys):
            for i, st in enumerate(key.status):
                if st == FREE:
                    self._define(kid, key, i)
        self.onehot = [[model.NewBoolVar(f"f{f}_{d}") for d in range(len(dom))] for f, dom in enumerate(m.features)]
        for lits in self.onehot:
            model.AddExactlyOne(lits)
        terms = [t for t in m.terms.values() if t.kind != "param"]
        for term in terms:
            if not term.combos:
                raise IRError(f"internal: no feasible combination for a {term.kind} term")
        # Each term's cost is its cheapest combination (a constant) plus the excess of the one that holds.
        self.constant_s = sum(t.mult * min(c.seconds for c in t.combos) for t in terms)
        varying = [t for t in terms if len({c.seconds for c in t.combos}) > 1]
        # Each combination's excess is rounded once, and one combination per term holds: the total
        # rounding error is under len(varying) / 2 units, kept under 0.05% of a lower bound on the step time.
        self.unit = max(self.constant_s, 1e-15) * 1e-3 / (2 * max(len(varying), 1))
        largest = max((t.mult * c.seconds for t in varying for c in t.combos), default=0.0)
        self.unit = max(self.unit, largest / 2**40)
        self._tables: dict[int, _Table] = {}  # id(term) -> `_table`
        self._rounding = len(varying) / 2  # units: at most the objective's rounding error (above)
        objective = []
        for term in terms:
            self._outputs(term)
            if term in varying:
                low = min(c.seconds for c in term.combos)
                excess = [round(term.mult * (c.seconds - low) / self.unit) for c in term.combos]
                objective.append(self._bounded(term, excess))
        self._objective = [v for v in objective if v is not None]
        model.Minimize(sum(self._objective))
        self.memory_cuts = 0
        self.deterministic_s = 0.0  # CP-SAT's deterministic time over every solve so far
        self.rounds = 0  # solves so far (the progress line shows it)
        self.floored = False  # the last solve proved that no plan beats `CpSatOptions.floor_s`
        self._bytes: dict[tuple, Any] = {}  # (id(term), measure) -> its local-KiB variable

    def _late_levels(self) -> dict[tuple[int, str], Any]:
        """y[g, a]: the pair set LATE; never with x of the pair, nor with x of the group on a later axis."""
        y = {v: self.model.NewBoolVar(f"y{v[0]}_{v[1]}") for v in self.space.late_variables}
        for (g, a), late in y.items():
            self.model.AddBoolOr([late.Not(), self.x[(g, a)].Not()])
            for b in self.space.axes[self.space.axes.index(a) + 1:]:
                if (g, b) in self.x:
                    self.model.AddBoolOr([late.Not(), self.x[(g, b)].Not()])
        return y

    def _define(self, kid: int, key: Key, i: int) -> None:
        """s[kid, i] <=> x and not deselected and no higher key holds the axis
        and divisible; where its group may be set LATE on the axis, s is that
        (`early`) or the LATE rule's literal (`late`)."""
        model, s = self.model, self.s[(kid, i)]
        axis = self.space.axes[i]
        x = self._reaches(key.group, axis, key.level[i])
        ok = [self.r[c].Not() if b == 1 else self.r[c] for c, b in key.desel]
        blocking = self._nondivisible(kid, key, i)
        if key.late and key.late[i] is not None:
            early, late = model.NewBoolVar(""), model.NewBoolVar("")
            model.AddBoolOr([s.Not(), early, late])
            model.AddImplication(early, s)
            model.AddImplication(late, s)
            blockers = [self.y[(h, axis)] if flag else self._reaches(h, axis, level) for h, level, flag in key.late[i]]
            self._holds_if(late, self.y[(key.group, axis)], ok, blockers + blocking)
            s = self._early[(kid, i)] = early
        higher = [self._early.get((j, i), self.s.get((j, i))) for j in key.higher if (j, i) in self.s]
        self._holds_if(s, x, ok, higher + blocking)

    def _nondivisible(self, kid: int, key: Key, i: int) -> list:
        """Literals each saying the I-class holds a set of earlier axes the axis cannot be combined with (and
        a clause that it then does not hold the axis)."""
        model, s = self.model, self.s[(kid, i)]
        blocking = []
        for subset in key.nondiv[i]:
            # In mesh order: a set of axis names iterates in an order that changes with Python's hash seed,
            # and CP-SAT breaks ties between equal optima by the model's order (the same inputs, one plan).
            held = [self.s[(kid, j)] for j, b in enumerate(self.space.axes) if b in subset]
            model.AddBoolOr([s.Not()] + [h.Not() for h in held])
            if len(held) == 1:
                blocking.append(held[0])
            else:
                both = model.NewBoolVar("")
                model.AddBoolAnd(held).OnlyEnforceIf(both)
                model.AddBoolOr([h.Not() for h in held]).OnlyEnforceIf(both.Not())
                blocking.append(both)
        return blocking

    def _holds_if(self, s, x, ok: list, blockers: list) -> None:
        """s <=> x and every `ok` literal and no blocker."""
        model = self.model
        model.AddImplication(s, x)
        for lit in ok:
            model.AddImplication(s, lit)
        for h in blockers:
            model.AddBoolOr([s.Not(), h.Not()])
        model.AddBoolOr([s, x.Not()] + [lit.Not() for lit in ok] + blockers)

    def _reaches(self, group: int, axis: str, level: int):
        """The literal "the (group, axis) decision reaches `level`"."""
        return self.x[(group, axis)] if level == WHOLE else self.z[(group, axis, level)]

    def _literals(self, term: Term, taken: tuple[frozenset[str], ...], inputs: tuple) -> list:
        """The conjunction that says this combination holds."""
        table = self._table(term)
        return [table.literal[k][v] for k, v in enumerate(table.row(taken, inputs))]

    def _outputs(self, term: Term) -> None:
        for n, f in enumerate(term.outputs):
            index = {value: d for d, value in enumerate(self.m.features[f])}
            for cube, d in self._implied(term, [index[c.outputs[n]] for c in term.combos]):
                self.model.AddBoolOr([lit.Not() for lit in cube] + [self.onehot[f][d]])
        for taken, inputs in term.forbidden:
            self.model.AddBoolOr([lit.Not() for lit in self._literals(term, taken, inputs)])

    def _bounded(self, term: Term, values: list[int]):
        """An integer variable at least `values[k]` when combination k holds (0 if none is positive)."""
        top = max(values)
        if top <= 0:
            return None
        var = self.model.NewIntVar(0, top, "")
        for cube, value in self._implied(term, values):
            if value > 0:
                self.model.Add(var >= value).OnlyEnforceIf(cube)
        return var

    def _implied(self, term: Term, values: list[int]) -> list[tuple[list, int]]:
        """What each combination implies (`values[k]` for combination k), as
        (conjunction, value) pairs over only the literals the value depends on.

        A term's value often reads a few of its literals: an op's time does
        not read its operands' partial states, an edge's cost not the keys of
        dimensions that want what they have. Every assignment of the term's
        literals that a solution can take is one of its combinations (their
        enumeration is complete), so a column may be left out wherever the
        combinations that agree on the other columns agree on the value; the
        conjunction of what is left then implies exactly the value the full
        one did. On a 3-axis mesh about half the model's constraints were
        such repetitions (the Llama 2 70B layer: 195k -> 95k)."""
        keep, cubes = self._projection(term, values)
        literal = self._table(term).literal
        return [([literal[k][v] for k, v in zip(keep, row)], value) for row, value in cubes.items()]

    def _projection(self, term: Term, values: list[int]) -> tuple[list[int], dict[tuple, int]]:
        """The columns `values` depends on (greedy: each column, last first, is
        left out if the value stays a function of the others) and the value of
        each distinct row of the combinations on those columns."""
        matrix = self._table(term).matrix
        vals = np.asarray(values, dtype=np.int64)
        keep = list(range(matrix.shape[1]))
        for col in reversed(range(matrix.shape[1])):
            trial = [k for k in keep if k != col]
            if _functional(_row_ids(matrix, trial), vals):
                keep = trial
        cubes: dict[tuple, int] = {}
        for row, value in zip(matrix[:, keep].tolist(), values):
            cubes.setdefault(tuple(row), value)
        return keep, cubes

    def _table(self, term: Term) -> _Table:
        """A term's combinations as a `_Table` (kept per term)."""
        table = self._tables.get(id(term))
        if table is None:
            columns = [(p, kid, i) for p, kid in enumerate(term.keys)
                       for i, st in enumerate(self.m.keys[kid].status) if st == FREE]
            literal = [(self.s[(kid, i)].Not(), self.s[(kid, i)]) for _, kid, i in columns]
            literal += [tuple(self.onehot[f]) for f in term.inputs]
            index = [{value: d for d, value in enumerate(self.m.features[f])} for f in term.inputs]
            table = _Table([(p, self.space.axes[i]) for p, _, i in columns], index, literal)
            rows = [table.row(c.taken, c.inputs) for c in term.combos]
            table.matrix = np.array(rows, dtype=np.int64).reshape(len(rows), len(literal))
            self._tables[id(term)] = table
        return table

    # ------------------------------------------------------------ solving

    def hint(self, point: Point | None) -> None:
        self.model.ClearHints()
        if point is not None:
            for v, var in self.x.items():
                self.model.AddHint(var, v in point.sharded)
            levels = point.levels()
            for (g, a, level), var in self.z.items():
                self.model.AddHint(var, WHOLE >= levels.get((g, a), 0) >= level)
            for v, var in self.y.items():
                self.model.AddHint(var, levels.get(v) == LATE)
            bits = dict(point.bits)
            for c, var in self.r.items():
                self.model.AddHint(var, bits.get(c, 0))

    def _solver(self, seconds: float, options: CpSatOptions) -> cp_model.CpSolver:
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = max(1, options.workers)
        p.random_seed = options.seed
        # Deterministic: the same inputs give the same plan (wall time is only a backstop).
        p.interleave_search = options.workers > 1
        p.max_deterministic_time = max(seconds, 0.01)
        p.max_time_in_seconds = max(3 * seconds, 1.0)
        # No presolve: each term's constraints are already local and projected (`_implied`), and on a
        # 3-axis model presolve spent three quarters of a solve rediscovering that (the 405B spec: 7.6 s a
        # solve, 1.8 s without); on the bundled specs the optima are the same.
        p.cp_model_presolve = False
        return solver

    def _floor_units(self, floor_s: float) -> float:
        """The objective's value at the floor, plus its rounding error: a plan
        no faster than the floor has at least this value, and no plan faster
        than it more (ties are kept)."""
        return (floor_s - self.constant_s) / self.unit + self._rounding

    def beats_floor(self, seconds: float, options: CpSatOptions) -> bool:
        """Whether a plan may beat `options.floor_s`: False where a solve of a
        copy of the model with the objective bounded by the floor is infeasible
        within `seconds` (deterministic). The bound as a constraint proves
        that in a fraction of the solve whose own bound has to get there
        (deepseek_v3_moe: 0.8 s against 36 s), but it steers the search (unet's
        plan 7.597 -> 7.772 ms), so it runs in a copy, and only where the hint
        is no plan as fast as the floor (the floor's plan outside the space)."""
        probe = self.model.Clone()
        probe.Add(sum(probe.GetIntVarFromProtoIndex(v.Index()) for v in self._objective)
                  <= math.floor(self._floor_units(options.floor_s)))
        solver = self._solver(seconds, options)
        solver.parameters.stop_after_first_solution = True
        status = solver.Solve(probe)
        self.deterministic_s += solver.response_proto.deterministic_time
        return status != cp_model.INFEASIBLE

    def solve(self, seconds: float, options: CpSatOptions,
              progress: Progress = SILENT) -> tuple[str, Point | None, float | None, float | None]:
        solver = self._solver(seconds, options)
        # The floor: every plan's step time is at least the bound's (to the objective's rounding), so once
        # the bound passes the floor no plan the search could still find would be the answer.
        limit = math.inf if options.floor_s is None else self._floor_units(options.floor_s)
        if options.floor_s is not None:
            solver.best_bound_callback = lambda bound: solver.stop_search() if bound > limit else None
        status = solver.Solve(self.model, _Progress(self, progress) if progress.enabled else None)
        self.deterministic_s += solver.response_proto.deterministic_time
        name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                cp_model.INFEASIBLE: "infeasible"}.get(status, "unknown")
        self.floored = name != "infeasible" and solver.BestObjectiveBound() > limit
        if name not in ("optimal", "feasible"):
            return name, None, None, None
        sharded = frozenset(v for v, var in self.x.items() if solver.Value(var))
        reached: dict[tuple[int, str], int] = {}
        for (g, a, level), var in self.z.items():
            if solver.Value(var) and (g, a) not in sharded:
                reached[(g, a)] = max(reached.get((g, a), 0), level)
        bits = tuple((c, solver.Value(var)) for c, var in self.r.items())
        objective = self.step_time_s(solver.ObjectiveValue())
        bound = self.step_time_s(solver.BestObjectiveBound())
        reached.update((v, LATE) for v, var in self.y.items() if solver.Value(var))
        partial = frozenset((g, a, level) for (g, a), level in reached.items())
        return name, Point(sharded, bits, partial), objective, bound

    def step_time_s(self, objective: float) -> float:
        return self.constant_s + objective * self.unit

    def exclude(self, sharding: FactorSharding) -> None:
        """A no-good cut on a plan's sharding: its derived booleans, which
        every point that materializes to it shares (each key's I-classes hold
        the same auto axes). Excluding the point alone left others with the
        same sharding (x of a group whose I-classes all lose the axis to a
        higher key, a resolution bit that deselects nothing): the 405B spec's
        four re-ranked plans were one plan four times."""
        lits = []
        for (kid, i), var in self.s.items():
            member = self.m.key_members[kid][0]
            lits.append(var.Not() if self.space.axes[i] in sharding.axes[member] else var)
        self.model.AddBoolOr(lits)

    def memory_cut(self, counts: Counter, capacity: int) -> None:
        """sum over (term, measure) of count * local KiB <= capacity in KiB
        (floors: a valid bound; each term's variable is at least its true KiB)."""
        rhs = int(capacity) // 1024
        expr = []
        for (term, measure), count in counts.items():
            kib = [_measure(c, measure) // 1024 for c in term.combos]
            low = min(kib)
            rhs -= count * low
            if (id(term), measure) not in self._bytes:
                self._bytes[(id(term), measure)] = self._bounded(term, [k - low for k in kib])
            var = self._bytes[(id(term), measure)]
            if var is not None:
                expr.append(count * var)
        self.model.Add(sum(expr) <= rhs)
        self.memory_cuts += 1

    def size(self) -> tuple[int, int]:
        proto = self.model.Proto()
        return len(proto.variables), len(proto.constraints)


def _measure(combo, measure: str | tuple[str, int]) -> int:
    """A combination's bytes by one measure: a Combo field, or (field, operand)."""
    if isinstance(measure, tuple):
        return getattr(combo, measure[0])[measure[1]]
    return getattr(combo, measure)


@dataclass(slots=True)
class _Table:
    """A term's combinations as a matrix, a row each: per free (key, axis)
    whether the key holds it, per input feature its value's index; and per
    column the literal of each value."""

    axes: list[tuple[int, str]]  # per free column: the key's position in the term, the axis
    index: list[dict]  # per input feature: its values' indices
    literal: list[tuple]
    matrix: np.ndarray | None = None

    def row(self, taken: tuple[frozenset[str], ...], inputs: tuple) -> list[int]:
        return [int(a in taken[p]) for p, a in self.axes] + [at[v] for at, v in zip(self.index, inputs)]


def _functional(rows: np.ndarray, values: np.ndarray) -> bool:
    """Whether equal rows (ids, one per row) have equal values."""
    order = np.lexsort((values, rows))
    rows, values = rows[order], values[order]
    return not ((rows[1:] == rows[:-1]) & (values[1:] != values[:-1])).any()


def _row_ids(matrix: np.ndarray, columns: list[int]) -> np.ndarray:
    """An id per row, equal where the rows are equal on `columns`."""
    sub = matrix[:, columns]
    if not columns:
        return np.zeros(len(matrix), dtype=np.int64)
    radix = sub.max(axis=0, initial=0) + 1
    if float(np.prod(radix.astype(float))) < 2.0**62:
        weights = np.cumprod(np.concatenate([[1], radix[:-1]]))
        return sub @ weights
    return np.unique(sub, axis=0, return_inverse=True)[1].reshape(-1)


class _Progress(cp_model.CpSolverSolutionCallback):
    """Shows each improving solution on the progress line (read-only: the
    search is the same with or without it)."""

    def __init__(self, cp: _Cp, progress: Progress) -> None:
        super().__init__()
        self.cp, self.progress = cp, progress

    def on_solution_callback(self) -> None:
        best, bound = self.cp.step_time_s(self.ObjectiveValue()), self.cp.step_time_s(self.BestObjectiveBound())
        self.progress.update(f"cpsat: solve {self.cp.rounds + 1}, best step time {best:.4g} s "
                             f"(bound {bound:.4g} s), {self.WallTime():.1f} s")


def solve(space: SearchSpace, table: CostTable, options: CpSatOptions | None = None,
          hint: Point | None = None, progress: Progress = SILENT) -> AutoResult:
    """The best plan of the space under the cost model that fits memory (module docstring)."""
    options = options or CpSatOptions()
    start = time.perf_counter()
    m = TermModel(space, table)
    cp = _Cp(m)
    build_s = time.perf_counter() - start
    # The budget is CP-SAT's deterministic time summed over the solves, so that the same inputs give the
    # same plan however loaded the machine is; the wall clock only stops a run three times over its limit.
    deadline = time.perf_counter() + 3 * options.time_limit_s
    capacity = table.hardware.capacity_bytes
    loop = _Loop()
    incumbent = _incumbent(space, table, hint, loop)
    solve_start = time.perf_counter()
    wanted = max(1, options.rerank)
    if options.floor_s is not None and (incumbent is None or incumbent[2].step_time_s > options.floor_s * (1 + 1e-9)):
        progress.update("cpsat: may a plan beat the expert floor?", force=True)
        loop.floored = not cp.beats_floor(_PROBE_SHARE * options.time_limit_s, options)
    while not loop.floored:
        left = options.time_limit_s - cp.deterministic_s
        if left <= 0 or time.perf_counter() > deadline:
            break
        cp.hint(hint)
        cp.rounds = loop.rounds
        progress.update(f"cpsat: solve {loop.rounds + 1}, {time.perf_counter() - solve_start:.1f} s", force=True)
        status, point, objective, bound = cp.solve(left, options, progress)
        loop.rounds += 1
        loop.floored = cp.floored  # no plan that fits beats the floor (cuts only remove plans): the last solve
        if point is None:
            loop.exhausted = status == "infeasible"  # every plan that fits (and beats the incumbent) is found
            break
        loop.bound = max(loop.bound, bound)  # each solve relaxes the plans that fit: a valid lower bound
        plan = space.plan(point)
        sharding = plan.materialize(space.nda)
        cost = table.evaluate(sharding)
        if cost.fits:
            hint = point
            loop.found.append((plan, sharding, cost, objective, bound, "floor" if loop.floored else status))
            if len(loop.found) == wanted or loop.floored:
                break
            cp.exclude(sharding)  # the next solve finds the next best distinct plan
            continue
        # The next solve keeps the hint it had: a hint the cuts below rule out sends CP-SAT after a plan it
        # may not take (bench/scale.py's 80 layers, two solves: 23-29 s hinted so, 9-11 s with the first's).
        loop.saw(cost.peak_memory_bytes, sharding)
        if loop.floored:
            break
        cuts = memory_cuts(m, np.append(table.codes(sharding), 0), capacity)
        for counts in cuts:
            cp.memory_cut(counts, capacity)
        # The plan goes too: a cut in whole KiB may not reach a plan that overflows by a few KiB, and
        # removing the plan priced each round is what makes the loop converge.
        cp.exclude(sharding)
        loop.no_goods += not cuts
    solve_s = time.perf_counter() - solve_start
    variables, constraints = cp.size()
    folded = sum(t.mult - 1 for t in m.terms.values() if t.kind != "param")
    common = dict(solver="cpsat", axes=space.axes, solve_s=solve_s, build_s=build_s, variables=variables,
                  constraints=constraints, terms=len(m.terms), folded=folded,
                  space=space.decisions,
                  rounds=loop.rounds,
                  memory_cuts=cp.memory_cuts, no_goods=loop.no_goods,
                  smallest_peak_bytes=loop.smallest[0] if loop.smallest else None)
    found = loop.with_incumbent(incumbent, options.floor_s if loop.floored else None)
    if found:
        return _answer(found, incumbent, options, table, progress, common)
    proven = loop.exhausted
    tries = f"in {loop.rounds} solves" if loop.rounds else f"within the time limit ({options.time_limit_s:g} s)"
    if loop.floored:
        report = SolveReport(status="floor", objective_s=None, bound_s=options.floor_s, gap=None,
                             message=_beaten(options.floor_s, _proof(loop.rounds)), **common)
        return AutoResult(None, None, None, report)
    if not proven:
        tries += f" ({options.time_limit_s:g} s of solving; {cp.memory_cuts} memory cuts, {loop.no_goods} plans " \
                 "excluded one by one)"
    message = no_fit_message(space, table, loop.smallest, proven, tries)
    report = SolveReport(status="infeasible" if proven else "unknown", objective_s=None, bound_s=None, gap=None,
                         message=message, **common)
    return AutoResult(None, None, None, report)


class _Loop:
    """The lazy memory loop's state: the plans that fit, in the order found
    (best serial first), the best bound, the smallest peak seen."""

    def __init__(self) -> None:
        self.rounds = self.no_goods = 0
        self.found: list[tuple] = []  # (plan, sharding, cost, objective, bound, status)
        self.bound = 0.0
        self.exhausted = False
        self.floored = False  # proven: no plan that fits beats `CpSatOptions.floor_s`
        self.smallest: tuple | None = None  # (peak, sharding)

    def saw(self, peak: int, sharding: FactorSharding) -> None:
        if self.smallest is None or peak < self.smallest[0]:
            self.smallest = (peak, sharding)

    def with_incumbent(self, incumbent: tuple | None, floor_s: float | None = None) -> list[tuple]:
        """The plans found, with a fitting hint first where the solve did not
        find it and it is faster than the best found (the model rounds step
        times: a plan within its rounding of the hint may come first).
        `floor_s`: the solves proved that no plan that fits is faster than
        it (`CpSatOptions.floor_s`)."""
        found = list(self.found)
        if incumbent is None or any(f[1] == incumbent[1] for f in found):
            return found
        plan, sharding, cost = incumbent
        if found and cost.step_time_s >= found[0][2].step_time_s:
            return found
        if found:  # what the solve proved about its optimum holds for the hint, as fast or faster
            bound, status = min(found[0][4], cost.step_time_s), found[0][5]
        elif floor_s is not None:
            bound, status = min(floor_s, cost.step_time_s), "floor"
        else:  # the time ran out before a plan that fits was found
            bound, status = min(self.bound, cost.step_time_s), "feasible"
        return [(plan, sharding, cost, cost.step_time_s, bound, status)] + found


def _incumbent(space: SearchSpace, table: CostTable, hint: Point | None, loop: _Loop) -> tuple | None:
    """A hint's (plan, sharding, cost) when it fits (module docstring)."""
    if hint is None:
        return None
    plan = space.plan(hint)
    sharding = plan.materialize(space.nda)
    cost = table.evaluate(sharding)
    if cost.fits:
        return plan, sharding, cost
    loop.saw(cost.peak_memory_bytes, sharding)
    return None


def _answer(found: list[tuple], incumbent: tuple | None, options: CpSatOptions, table: CostTable,
            progress: Progress, common: dict) -> AutoResult:
    """The report of the best plan found (re-ranked by the simulator when more were kept)."""
    winner, makespans = 0, ()
    if len(found) > 1:
        progress.update(f"cpsat: simulating the {len(found)} best plans", force=True)
        makespans = _scores(found, options, table)
        # The first of the fastest, to float rounding (a pipeline priced from shallow copies of its step):
        # of plans that run alike, the better objective.
        fastest = min(m for m in makespans if m is not None)
        winner = next(i for i, m in enumerate(makespans) if m is not None and m <= fastest * (1 + 1e-12))
    plan, sharding, cost, objective = found[winner][:4]
    best, bound, status = found[0][3:]  # what the solver proved is about the optimum
    gap = max(0.0, (best - bound) / best) if best > 0 else 0.0
    message = f"{status}: step time {best:.6g} s (bound {bound:.6g} s, gap {gap:.2%})"
    if status == "floor":
        whose = "the hint's" if incumbent is not None and found[winner][1] == incumbent[1] else "the plan found's"
        message = _beaten(options.floor_s, _proof(common["rounds"])) + f"; {whose} step time {best:.6g} s"
    elif incumbent is not None and found[winner][1] == incumbent[1]:
        message += "; the hint: no searched plan was faster" + (", none is" if status == "optimal" else "")
    if makespans:
        unscored, unfit = sum(m is None for m in makespans), math.isinf(makespans[winner])
        message += (f"; {options.score_name} re-ranked the {len(found)} best plans"
                    + (f" ({unscored} not scored: their step times alone are no faster)" if unscored else "") + ": "
                    + (f"none of them fits memory under {options.score_name}: the optimum is kept" if unfit else
                       f"the optimum has the shortest makespan ({makespans[0]:.6g} s)" if winner == 0 else
                       f"chose #{winner + 1}, step time {objective:.6g} s, makespan {makespans[winner]:.6g} s "
                       f"(the optimum's: {makespans[0]:.6g} s)"))
    report = SolveReport(status=status, objective_s=objective, bound_s=bound, gap=gap, message=message,
                         rerank_objectives_s=tuple(f[3] for f in found) if makespans else (),
                         rerank_makespans_s=tuple(None if m is not None and math.isinf(m) else m for m in makespans),
                         rerank_winner=winner, **common)
    return AutoResult(plan, sharding, cost, report)


def _proof(rounds: int) -> str:
    return f"in {rounds} solves" if rounds else "with the objective bounded by it"


def _beaten(floor_s: float, tries: str) -> str:
    return f"floor: no plan of the space that fits is faster than {floor_s:.6g} s, the expert floor's step time " \
           f"(proven {tries})"


def _scores(found: list[tuple], options: CpSatOptions, table: CostTable) -> tuple[float | None, ...]:
    """Each plan's score, best serial first; None for a plan not scored
    (`CpSatOptions.score_at_least_step_time`). With `score_jobs` the plans
    are scored side by side (after the first, with `score_first_alone`),
    this process scoring its share: the scores it made it keeps (a
    pipeline's price, which the plan kept is then answered with)."""
    def score(i: int) -> float:
        plan, sharding = found[i][:2]
        return options.score(plan, sharding) if options.score is not None else simulated_makespan_s(table, sharding)

    first = 1 if options.score_first_alone else 0
    side_by_side = forks(options.score_jobs, len(found) - first) and not options.score_at_least_step_time
    scores: list[float | None] = []
    best = math.inf
    for i, (_, _, cost, *_) in enumerate(found):
        if i == first and side_by_side and (best < math.inf or not first):
            with Helpers(score, options.score_jobs) as helpers:
                return (*scores, *helpers.map(list(range(first, len(found)))))
        if options.score_at_least_step_time and cost.step_time_s >= best:
            scores.append(None)
            continue
        scores.append(score(i))
        best = min(best, scores[-1])
    return tuple(scores)


__all__ = ["CpSatOptions", "SolveReport", "solve"]
