"""The CP-SAT model of a search space's terms (`solver.search.cpsat_terms.TermModel`):
its variables, objective and constraints, hints, solves, no-goods and memory
cuts. The search that drives it, and its report, are `solver.search.cpsat`'s;
the module docstring there says what the model is and why.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from ir.core import IRError
from ir.sharding import FactorSharding
from solver.search.cpsat_terms import Term, TermModel
from solver.search.keys import Key
from solver.search.report import SILENT, Progress
from solver.search.space import FREE, LATE, Point
from solver.search.zero import WHOLE


class CpSatModel:
    """The CP-SAT model of a `TermModel`. Its solves take the search's
    `solver.search.cpsat.CpSatOptions` (typed Any: that module imports this one).

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
            if functional(row_ids(matrix, trial), vals):
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

    def _solver(self, seconds: float, options: Any) -> cp_model.CpSolver:
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

    def beats_floor(self, seconds: float, options: Any) -> bool:
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

    def solve(self, seconds: float, options: Any,
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


def functional(rows: np.ndarray, values: np.ndarray) -> bool:
    """Whether equal rows (ids, one per row) have equal values."""
    order = np.lexsort((values, rows))
    rows, values = rows[order], values[order]
    return not ((rows[1:] == rows[:-1]) & (values[1:] != values[:-1])).any()


def row_ids(matrix: np.ndarray, columns: list[int]) -> np.ndarray:
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

    def __init__(self, cp: CpSatModel, progress: Progress) -> None:
        super().__init__()
        self.cp, self.progress = cp, progress

    def on_solution_callback(self) -> None:
        best, bound = self.cp.step_time_s(self.ObjectiveValue()), self.cp.step_time_s(self.BestObjectiveBound())
        self.progress.update(f"cpsat: solve {self.cp.rounds + 1}, best step time {best:.4g} s "
                             f"(bound {bound:.4g} s), {self.WallTime():.1f} s")


__all__ = ["CpSatModel", "functional", "row_ids"]
