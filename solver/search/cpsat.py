"""The CP-SAT backend: an exact constraint model of an auto tactic's search
space (`solver.search.space`) whose objective is the shared cost model.

Variables (DESIGN.md, "Search backends"):

  x[g, a]  shard color group g along mesh axis a (the decision);
  r[c]     the bit of resolution class c;
  s[k, a]  derived: an I-class with key k holds axis a. Its definition is
           `ir.sharding.materialize`'s rule, exactly: x of its group, not
           deselected by r, the axis not taken by a higher-priority I-class
           of the same owner, and divisible given the axes it already holds.

I-classes whose derived booleans are the same function of x and r share
one *key* (hash-consed: group, earlier sharding, per-axis status,
deselecting bits, divisibility, the keys above it at its owner). Repeated
layers of a layer-symmetric space have the same keys, so their terms fold.

Cost terms (`costmodel.table` is the one pricing function):

  op term    an op's compute time, keyed by its signature and its factors'
             keys; it also defines the op's *outputs*: whether its result
             is a pending partial sum (which axes, which combiner) and
             whether a partial operand flows through it unreduced;
  edge term  the collectives in front of one use: keyed by the value's and
             the use's dimension keys, the value's partial state, and for a
             partial sum whether it flows (first use) or which sharding its
             first use reduced it to (later uses);
  end term   a partial result reduced after the last op.

Each distinct term gets one boolean per feasible combination of its
inputs (key codes, partial states), exactly one of which holds, linked to
s and to the one-hot partial-state features; its cost is priced once and
multiplied by the number of ops or uses sharing the term. The feasible
combinations are enumerated axis by axis from the x and r values that can
reach them (a superset where enumeration would be large: the linking
constraints keep only the reachable one). The objective is their sum,
integer-scaled so that rounding stays under 0.1% of the step time.

Memory: the peak of the cost model is not linear, so capacity is enforced
lazily. After each solve the plan is priced; if it does not fit, a cut is
added at the op positions where a *lower bound* of the live bytes (resident
parameters, the op's result, and results that are never partial sums and are
read later) already exceeds the capacity; where the bound does not see the
overflow, the point itself is excluded. Every cut is valid, so the final
optimum is the optimum among plans that fit.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from costmodel.table import CostTable
from ir.core import IRError
from ir.lower import flowing_partial
from solver.search.report import SILENT, AutoResult, Progress, no_fit_message, report_json
from solver.search.space import FREE, Point, SearchSpace

# Enumerating more than 2**this assignments per axis for one term falls back to all 0/1 vectors.
_ENUMERATION_BITS = 14
_NOT_PARTIAL = (0, "sum")


@dataclass(frozen=True, slots=True)
class CpSatOptions:
    time_limit_s: float = 60.0
    workers: int = 1
    seed: int = 0
    memory_rounds: int = 20  # solves at most (lazy memory constraints)


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
    space: int  # decision variables: (group, axis) pairs and free resolution bits
    rounds: int
    memory_cuts: int
    smallest_peak_bytes: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


@dataclass(frozen=True, slots=True)
class _Key:
    group: int
    base: tuple[str, ...]
    status: tuple[int, ...]  # per auto axis: FREE, OFF, ON
    desel: tuple[tuple[int, int], ...]  # (free class, the bit that deselects it)
    nondiv: tuple[tuple[frozenset[str], ...], ...]  # per auto axis: earlier axes it cannot be combined with
    higher: tuple[int, ...]  # keys of the owner's I-classes that take an axis first


@dataclass(slots=True)
class _Combo:
    taken: tuple[frozenset[str], ...]  # per key of the term: auto axes it holds
    inputs: tuple  # per input feature: its value
    outputs: tuple  # per output feature: its value
    seconds: float
    result_bytes: int = 0


@dataclass(slots=True, eq=False)  # identity: terms key the memory cuts
class _Term:
    kind: str  # op | edge | end | param
    rep: int  # representative op, edge or value
    keys: tuple[int, ...]
    inputs: tuple[int, ...]  # feature ids
    outputs: tuple[int, ...]
    combos: list[_Combo]
    mult: int = 1
    z: list = field(default_factory=list)
    forbidden: list = field(default_factory=list)  # (taken, inputs) the lowering cannot build
    partial_feature: int | None = None  # op terms: the result's partial state
    flow_feature: int | None = None  # op terms: whether a partial operand flows through


class _Model:
    """Keys, features and terms of one (space, cost table), and the CP-SAT model over them."""

    def __init__(self, space: SearchSpace, table: CostTable) -> None:
        if space.mesh != table.mesh:
            raise IRError(f"the search space is over {space.mesh}, the cost table over {table.mesh}")
        self.space, self.t, self.nda = space, table, space.nda
        self.axes = space.axes
        self.base_codes = np.append(table.codes(space.base), 0)
        self._build_keys()
        self.features: list[tuple] = []  # feature id -> domain (tuple of values)
        self._feature_ids: dict[tuple, int] = {}
        self.terms: dict[tuple, _Term] = {}
        self.value_partial: list[int | None] = [None] * len(table.values)
        self.op_term: list[tuple] = []
        self._vectors: dict[tuple, list[tuple[int, ...]]] = {}
        self._build_terms()

    # ------------------------------------------------------------ keys

    def _build_keys(self) -> None:
        nda, space = self.nda, self.space
        rank = {c: r for r, c in enumerate(space.priority)}
        position = {k: p for c in range(nda.num_colors) for p, k in enumerate(nda.color_iclasses[c])}
        members: dict[tuple, list[int]] = {}
        for k, ic in enumerate(nda.iclasses):
            members.setdefault(ic.owner[:2], []).append(k)
        self.keys: list[_Key] = []
        key_ids: dict[_Key, int] = {}
        self.key_of = [0] * (len(nda.iclasses) + 1)  # the sentinel I-class: a fixed key
        self.key_members: list[list[int]] = []
        sentinel = _Key(-1, (), tuple(1 for _ in self.axes), (), (), ())
        self.key_of[-1] = self._intern(key_ids, sentinel, len(nda.iclasses))
        for owner_members in members.values():
            ordered = sorted(owner_members, key=lambda k: (rank[nda.iclasses[k].color], position[k]))
            above: list[int] = []
            for k in ordered:
                key = self._key(k, above)
                kid = self._intern(key_ids, key, k)
                self.key_of[k] = kid
                if FREE in key.status:
                    above.append(kid)

    def _intern(self, ids: dict, key: _Key, iclass: int) -> int:
        kid = ids.get(key)
        if kid is None:
            kid = ids[key] = len(self.keys)
            self.keys.append(key)
            self.key_members.append([])
        self.key_members[kid].append(iclass)
        return kid

    def _key(self, k: int, above: list[int]) -> _Key:
        space, ic = self.space, self.nda.iclasses[k]
        status = space.status[k]
        base = space.base.axes[k]
        if FREE not in status:
            return _Key(-1, base, status, (), (), ())
        desel = tuple((c, b) for c in space.free_classes for b in (0, 1) if k in self.nda.resolutions(c)[b])
        held = space.mesh.group_size(base)
        nondiv = []
        for i, a in enumerate(self.axes):
            earlier = [b for b, st in zip(self.axes[:i], status) if st == FREE]
            sets: list[frozenset[str]] = []
            if status[i] == FREE:
                for n in range(1, len(earlier) + 1):
                    for subset in itertools.combinations(earlier, n):
                        s = frozenset(subset)
                        size = held * space.mesh.size(a) * math.prod(space.mesh.size(b) for b in s)
                        if ic.size % size and not any(t <= s for t in sets):
                            sets.append(s)
            nondiv.append(tuple(sets))
        higher = tuple(sorted({j for j in above
                               if any(x == FREE and y == FREE for x, y in zip(self.keys[j].status, status))}))
        return _Key(space.group_of[ic.color], base, status, desel, tuple(nondiv), higher)

    def code_of_key(self, kid: int, taken: frozenset[str]) -> int:
        key = self.keys[kid]
        return self.t.code_of[key.base + tuple(a for a in self.axes if a in taken)]

    def divisible(self, kid: int, taken: frozenset[str]) -> bool:
        key = self.keys[kid]
        return not any(t <= taken for i, a in enumerate(self.axes) if a in taken for t in key.nondiv[i])

    def _axis_vectors(self, keys: tuple[int, ...], i: int) -> list[tuple[int, ...]]:
        """The 0/1 vectors (does key hold auto axis i) reachable from some x and r."""
        free = tuple(k for k in keys if self.keys[k].status[i] == FREE)
        memo = self._vectors.get((free, i))
        if memo is None:
            memo = self._vectors[(free, i)] = self._enumerate_axis(free, i)
        at = {k: n for n, k in enumerate(free)}
        return [tuple(v[at[k]] if k in at else 0 for k in keys) for v in memo]

    def _enumerate_axis(self, free: tuple[int, ...], i: int) -> list[tuple[int, ...]]:
        if not free:
            return [()]
        closure, stack = set(free), list(free)
        while stack:
            for j in self.keys[stack.pop()].higher:
                if j not in closure and self.keys[j].status[i] == FREE:
                    closure.add(j)
                    stack.append(j)
        order = sorted(closure)  # a key's higher keys were interned first
        groups = sorted({self.keys[k].group for k in order})
        classes = sorted({c for k in order for c, _ in self.keys[k].desel})
        fails = [k for k in order if self.keys[k].nondiv[i]]
        n = len(groups) + len(classes) + len(fails)
        if n > _ENUMERATION_BITS:
            return list(itertools.product((0, 1), repeat=len(free)))
        found = set()
        for bits in itertools.product((0, 1), repeat=n):
            x = dict(zip(groups, bits))
            r = dict(zip(classes, bits[len(groups):]))
            fail = dict(zip(fails, bits[len(groups) + len(classes):]))
            s: dict[int, int] = {}
            for k in order:
                key = self.keys[k]
                s[k] = int(x[key.group] and all(r[c] != b for c, b in key.desel) and not fail.get(k, 0)
                           and not any(s.get(j, 0) for j in key.higher))
            found.add(tuple(s[k] for k in free))
        return sorted(found)

    def key_combos(self, keys: tuple[int, ...]) -> list[tuple[frozenset[str], ...]]:
        """Per key, the auto axes it holds: every reachable, divisible combination."""
        per_axis = [self._axis_vectors(keys, i) for i in range(len(self.axes))]
        out = []
        for vectors in itertools.product(*per_axis):
            taken = tuple(frozenset(a for a, v in zip(self.axes, vectors) if v[j]) for j in range(len(keys)))
            if all(self.divisible(k, tk) for k, tk in zip(keys, taken)):
                out.append(taken)
        return out

    # ------------------------------------------------------------ features and terms

    def _feature(self, name: tuple, domain: Sequence) -> int | None:
        """A derived one-hot quantity (partial state, flow); None if it is constant."""
        domain = tuple(sorted(set(domain), key=repr))
        if len(domain) <= 1:
            return None
        fid = self._feature_ids.get(name)
        if fid is None:
            fid = self._feature_ids[name] = len(self.features)
            self.features.append(domain)
        return fid

    def _codes(self, keys: tuple[int, ...], taken: tuple[frozenset[str], ...], iclasses: Sequence[int]) -> np.ndarray:
        """A full code array with the given I-classes set from their keys' combination."""
        codes = self.base_codes.copy()
        code = {k: self.code_of_key(k, tk) for k, tk in zip(keys, taken)}
        for ic in iclasses:
            codes[ic] = code[self.key_of[ic]]
        return codes

    def _build_terms(self) -> None:
        t = self.t
        for i in range(len(t.fn.ops)):
            self.op_term.append(self._op_term(i))
        for e in range(len(t.edge_op_of)):
            self._edge_term(e)
        for v in t.result_vids:
            if self.value_partial[v] is not None and not t.edges_of[v]:
                self._end_term(v)

    def _add(self, name: tuple, build) -> _Term:
        term = self.terms.get(name)
        if term is None:
            term = self.terms[name] = build()
        else:
            term.mult += 1
        return term

    def _op_term(self, i: int) -> tuple:
        t, nda = self.t, self.nda
        factors = [k if k >= 0 else len(nda.iclasses) for k in nda.op_factor_iclass[i]]
        fkeys = tuple(self.key_of[k] for k in factors)
        operands = []
        for v in t.op_vids[i]:
            pf = self.value_partial[v] if t.first_user[v] == i else None
            operands.append((pf, t.use_count_of[v] == 1))
        name = ("op", t.op_signature_of[i], fkeys, tuple(operands))
        term = self._add(name, lambda: self._price_op_term(i, name, factors, operands))
        self.value_partial[t.num_params + i] = term.partial_feature
        return name

    def _price_op_term(self, i: int, name: tuple, factors: list[int], operands: list) -> _Term:
        t = self.t
        keys = tuple(sorted({self.key_of[k] for k in factors}))
        inputs = tuple(pf for pf, _ in operands if pf is not None)
        red = [k for k in t.reduction_ic[i].tolist() if k < len(self.nda.iclasses)]
        op = t.fn.ops[i]
        rows, forbidden = [], []
        for taken in self.key_combos(keys):
            codes = self._codes(keys, taken, factors)
            seconds, _, _ = t.price_op(i, codes)
            result_bytes = int(t.global_bytes[t.num_params + i]
                               // np.prod(t.code_size[codes[t.def_ic[t.num_params + i]]]))
            own = 0
            for k in red:
                own |= int(t.code_mask[codes[k]])
            wants = None
            for values in itertools.product(*(self.features[f] for f in inputs)):
                state = dict(zip(inputs, values))
                masks = [state[pf][0] if pf is not None else 0 for pf, _ in operands]
                combiners = [state[pf][1] if pf is not None else "sum" for pf, _ in operands]
                flowing = 0
                if t.can_flow[i] and any(masks) and all(single for m, (_, single) in zip(masks, operands) if m):
                    if wants is None:
                        wants = [t.want_dims(e, codes) for e in t.op_edges[i]]
                    axes = flowing_partial(op, [t.mask_axes[m] for m in masks], combiners, wants)
                    flowing = sum(t.axis_bit[a] for a in axes)
                if flowing and own and t.op_combiner[i] != "sum":
                    forbidden.append((taken, tuple(values)))  # the lowering cannot combine them
                    continue
                mask = flowing | own
                partial = (mask, t.op_combiner[i] if own else "sum") if mask else _NOT_PARTIAL
                rows.append(_Combo(taken, tuple(values), (partial, bool(flowing)), seconds, result_bytes))
        partial_f = self._feature(name + ("partial",), [c.outputs[0] for c in rows])
        flow_f = self._feature(name + ("flow",), [c.outputs[1] for c in rows])
        kept = [n for n, f in enumerate((partial_f, flow_f)) if f is not None]
        outputs = [f for f in (partial_f, flow_f) if f is not None]
        for c in rows:
            c.outputs = tuple(c.outputs[n] for n in kept)
        return _Term("op", i, keys, inputs, tuple(outputs), rows, forbidden=forbidden,
                     partial_feature=partial_f, flow_feature=flow_f)

    def _flow_feature(self, i: int) -> int | None:
        return self.terms[self.op_term[i]].flow_feature

    def _edge_term(self, e: int) -> None:
        t = self.t
        v, i = t.edge_vid_of[e], t.edge_op_of[e]
        rank = t.values[v].type.rank
        dic, wic = t.def_ic[v][:rank].tolist(), t.use_ic[e][:rank].tolist()
        dkeys = tuple(self.key_of[k] for k in dic)
        wkeys = tuple(self.key_of[k] for k in wic)
        pf = self.value_partial[v]
        if pf is None and dkeys == wkeys:
            return  # the use always wants what the value has: no collective
        first_ic: list[int] = []
        if pf is None:
            role: tuple = ("plain",)
        elif t.edges_of[v][0] == e:
            flow = self._flow_feature(i) if t.can_flow[i] and t.use_count_of[v] == 1 else None
            role = ("first", flow)
        else:
            first_ic = t.use_ic[t.edges_of[v][0]][:rank].tolist()
            role = ("later", tuple(self.key_of[k] for k in first_ic))
        name = ("edge", t.type_id_of[v], dkeys, wkeys, pf, role)
        self._add(name, lambda: self._price_edge(e, v, dic, wic, first_ic, pf, role))

    def _price_edge(self, e: int, v: int, dic: list[int], wic: list[int], first_ic: list[int],
                    pf: int | None, role: tuple) -> _Term:
        t = self.t
        iclasses = dic + wic + first_ic
        keys = tuple(sorted({self.key_of[k] for k in iclasses}))
        flow_f = role[1] if role[0] == "first" else None
        inputs = tuple(f for f in (pf, flow_f) if f is not None)
        rows = []
        for taken in self.key_combos(keys):
            codes = self._codes(keys, taken, iclasses)
            have = _packed(t, codes, dic)
            want = _packed(t, codes, wic)
            for values in itertools.product(*(self.features[f] for f in inputs)):
                state = dict(zip(inputs, values))
                mask, combiner = state.get(pf, _NOT_PARTIAL) if pf is not None else _NOT_PARTIAL
                if mask and role[0] == "first" and state.get(flow_f, False):
                    mask = 0  # it flows through the op unreduced
                state_now = have
                if mask and role[0] == "later":
                    first = _packed(t, codes, first_ic)
                    state_now, mask = t.resharding(v, have, mask, combiner, first).reduced, 0
                seconds = 0.0
                if mask or state_now != want:
                    seconds = sum(t.resharding(v, state_now, mask, combiner, want).priced.seconds)
                rows.append(_Combo(taken, tuple(values), (), seconds))
        return _Term("edge", e, keys, inputs, (), rows)

    def _end_term(self, v: int) -> None:
        t = self.t
        rank = t.values[v].type.rank
        dic = t.def_ic[v][:rank].tolist()
        pf = self.value_partial[v]
        name = ("end", t.type_id_of[v], tuple(self.key_of[k] for k in dic), pf)

        def build() -> _Term:
            keys = tuple(sorted({self.key_of[k] for k in dic}))
            rows = []
            for taken in self.key_combos(keys):
                codes = self._codes(keys, taken, dic)
                have = _packed(t, codes, dic)
                for (value,) in itertools.product(self.features[pf]):
                    mask, combiner = value
                    seconds = sum(t.resharding(v, have, mask, combiner, have).priced.seconds) if mask else 0.0
                    rows.append(_Combo(taken, (value,), (), seconds))
            return _Term("end", v, keys, (pf,), (), rows)

        self._add(name, build)

    def param_term(self, p: int) -> _Term:
        """A parameter's local bytes as a term (memory cuts only)."""
        t = self.t
        rank = t.values[p].type.rank
        dic = t.def_ic[p][:rank].tolist()
        name = ("param", t.type_id_of[p], tuple(self.key_of[k] for k in dic))
        term = self.terms.get(name)
        if term is None:
            keys = tuple(sorted({self.key_of[k] for k in dic}))
            rows = []
            for taken in self.key_combos(keys):
                codes = self._codes(keys, taken, dic)
                size = int(t.global_bytes[p] // np.prod(t.code_size[codes[dic]])) if rank else int(t.global_bytes[p])
                rows.append(_Combo(taken, (), (), 0.0, size))
            term = self.terms[name] = _Term("param", p, keys, (), (), rows, mult=0)
        return term


def _packed(t: CostTable, codes: np.ndarray, iclasses: list[int]) -> int:
    """A tensor's packed sharding, its dimensions' I-classes taking their codes."""
    return t.pack_dims(tuple(t.axis_tuples[c] for c in codes[iclasses]))


# ------------------------------------------------------------ the CP-SAT model


class _Cp:
    """The CP-SAT model of a `_Model`.

    A term is not given one boolean per combination: each combination is a
    full assignment of the term's derived booleans (and input features), so
    exactly one holds, and the model states what it implies with that
    conjunction as enforcement literals: its cost as a lower bound on the
    term's cost variable (minimization makes it exact), its outputs as
    implications, and a combination the lowering cannot build as a
    forbidden clause. Propagation then stays local to each term."""

    def __init__(self, m: _Model) -> None:
        self.m, self.space = m, m.space
        model = self.model = cp_model.CpModel()
        self.x = {v: model.NewBoolVar(f"x{v[0]}_{v[1]}") for v in self.space.variables}
        self.r = {c: model.NewBoolVar(f"r{c}") for c in self.space.free_classes}
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
        objective = []
        for term in terms:
            self._outputs(term)
            if term in varying:
                low = min(c.seconds for c in term.combos)
                excess = [round(term.mult * (c.seconds - low) / self.unit) for c in term.combos]
                objective.append(self._bounded(term, excess))
        model.Minimize(sum(v for v in objective if v is not None))
        self.memory_cuts = 0
        self.rounds = 0  # solves so far (the progress line shows it)
        self._bytes: dict[int, Any] = {}  # id(term) -> its local-KiB variable

    def _define(self, kid: int, key: _Key, i: int) -> None:
        """s[kid, i] <=> x and not deselected and no higher key holds the axis and divisible."""
        model, s = self.model, self.s[(kid, i)]
        axis = self.space.axes[i]
        x = self.x[(key.group, axis)]
        ok = [self.r[c].Not() if b == 1 else self.r[c] for c, b in key.desel]
        higher = [self.s[(j, i)] for j in key.higher if (j, i) in self.s]
        blocking = []
        for subset in key.nondiv[i]:
            held = [self.s[(kid, self.space.axes.index(b))] for b in subset]
            model.AddBoolOr([s.Not()] + [h.Not() for h in held])
            if len(held) == 1:
                blocking.append(held[0])
            else:
                both = model.NewBoolVar("")
                model.AddBoolAnd(held).OnlyEnforceIf(both)
                model.AddBoolOr([h.Not() for h in held]).OnlyEnforceIf(both.Not())
                blocking.append(both)
        model.AddImplication(s, x)
        for lit in ok:
            model.AddImplication(s, lit)
        for h in higher:
            model.AddBoolOr([s.Not(), h.Not()])
        model.AddBoolOr([s, x.Not()] + [lit.Not() for lit in ok] + higher + blocking)

    def _literals(self, term: _Term, taken: tuple[frozenset[str], ...], inputs: tuple) -> list:
        """The conjunction that says this combination holds."""
        lits = []
        for kid, tk in zip(term.keys, taken):
            for i, st in enumerate(self.m.keys[kid].status):
                if st == FREE:
                    var = self.s[(kid, i)]
                    lits.append(var if self.space.axes[i] in tk else var.Not())
        for f, value in zip(term.inputs, inputs):
            lits.append(self.onehot[f][self.m.features[f].index(value)])
        return lits

    def _outputs(self, term: _Term) -> None:
        for c in term.combos:
            if term.outputs:
                lits = self._literals(term, c.taken, c.inputs)
                for f, value in zip(term.outputs, c.outputs):
                    holds = self.onehot[f][self.m.features[f].index(value)]
                    self.model.AddBoolOr([lit.Not() for lit in lits] + [holds])
        for taken, inputs in term.forbidden:
            self.model.AddBoolOr([lit.Not() for lit in self._literals(term, taken, inputs)])

    def _bounded(self, term: _Term, values: list[int]):
        """An integer variable at least `values[k]` when combination k holds (0 if none is positive)."""
        top = max(values)
        if top <= 0:
            return None
        var = self.model.NewIntVar(0, top, "")
        for c, value in zip(term.combos, values):
            if value > 0:
                self.model.Add(var >= value).OnlyEnforceIf(self._literals(term, c.taken, c.inputs))
        return var

    # ------------------------------------------------------------ solving

    def hint(self, point: Point | None) -> None:
        self.model.ClearHints()
        if point is not None:
            for v, var in self.x.items():
                self.model.AddHint(var, v in point.sharded)
            bits = dict(point.bits)
            for c, var in self.r.items():
                self.model.AddHint(var, bits.get(c, 0))

    def solve(self, seconds: float, options: CpSatOptions,
              progress: Progress = SILENT) -> tuple[str, Point | None, float | None, float | None]:
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = max(1, options.workers)
        p.random_seed = options.seed
        # Deterministic: the same inputs give the same plan (wall time is only a backstop).
        p.interleave_search = options.workers > 1
        p.max_deterministic_time = max(seconds, 0.01)
        p.max_time_in_seconds = max(3 * seconds, 1.0)
        status = solver.Solve(self.model, _Progress(self, progress) if progress.enabled else None)
        name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                cp_model.INFEASIBLE: "infeasible"}.get(status, "unknown")
        if name not in ("optimal", "feasible"):
            return name, None, None, None
        sharded = frozenset(v for v, var in self.x.items() if solver.Value(var))
        bits = tuple((c, solver.Value(var)) for c, var in self.r.items())
        objective = self.step_time_s(solver.ObjectiveValue())
        bound = self.step_time_s(solver.BestObjectiveBound())
        return name, Point(sharded, bits), objective, bound

    def step_time_s(self, objective: float) -> float:
        return self.constant_s + objective * self.unit

    def exclude(self, point: Point) -> None:
        """A no-good cut: this point does not fit."""
        bits = dict(point.bits)
        lits = [var.Not() if v in point.sharded else var for v, var in self.x.items()]
        lits += [var.Not() if bits.get(c, 0) else var for c, var in self.r.items()]
        self.model.AddBoolOr(lits)

    def memory_cut(self, counts: Counter, capacity: int) -> None:
        """sum over terms of count * local KiB <= capacity in KiB (floors: a
        valid bound; each term's variable is at least its true KiB)."""
        rhs = int(capacity) // 1024
        expr = []
        for term, count in counts.items():
            kib = [c.result_bytes // 1024 for c in term.combos]
            low = min(kib)
            rhs -= count * low
            if id(term) not in self._bytes:
                self._bytes[id(term)] = self._bounded(term, [k - low for k in kib])
            var = self._bytes[id(term)]
            if var is not None:
                expr.append(count * var)
        self.model.Add(sum(expr) <= rhs)
        self.memory_cuts += 1

    def size(self) -> tuple[int, int]:
        proto = self.model.Proto()
        return len(proto.variables), len(proto.constraints)


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


def _lower_bound_counts(m: _Model, codes: np.ndarray, capacity: int, at_most: int = 3) -> list[Counter]:
    """Op positions where resident parameters plus the results that are live
    there in any lowering already exceed the capacity (module docstring), as
    counts of the terms whose bytes make up the bound."""
    t = m.t
    n = len(t.fn.ops)
    value_bytes = t.global_bytes // np.prod(t.code_size[codes[t.def_ic]], axis=1)
    delta = np.zeros(n + 1, dtype=np.int64)
    spans = []
    for i in range(n):
        v = t.num_params + i
        if m.value_partial[v] is not None:
            continue
        last = n - 1 if t.is_result[v] else max(i, int(t.last_user[v]) - 1)
        delta[i] += value_bytes[v]
        delta[last + 1] -= value_bytes[v]
        spans.append((i, last))
    bound = int(value_bytes[: t.num_params].sum()) + np.cumsum(delta[:n])
    over = [int(i) for i in np.argsort(-bound, kind="stable") if bound[i] > capacity]
    chosen: list[int] = []
    for i in over:
        if all(abs(i - j) > n // 10 for j in chosen):
            chosen.append(i)
        if len(chosen) == at_most:
            break
    cuts = []
    for pos in chosen:
        counts: Counter = Counter(m.param_term(p) for p in range(t.num_params))
        counts.update(m.terms[m.op_term[i]] for i, last in spans if i <= pos <= last)
        cuts.append(counts)
    return cuts


def solve(space: SearchSpace, table: CostTable, options: CpSatOptions | None = None,
          hint: Point | None = None, progress: Progress = SILENT) -> AutoResult:
    """The best plan of the space under the cost model that fits memory (module docstring)."""
    options = options or CpSatOptions()
    start = time.perf_counter()
    m = _Model(space, table)
    cp = _Cp(m)
    build_s = time.perf_counter() - start
    deadline = time.perf_counter() + options.time_limit_s
    capacity = table.hardware.capacity_bytes
    rounds, status, proven = 0, "unknown", False
    found: tuple | None = None  # (point, plan, sharding, cost, objective, bound, status)
    smallest: tuple | None = None  # (peak, sharding)
    solve_start = time.perf_counter()
    while rounds < options.memory_rounds:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        cp.hint(hint)
        cp.rounds = rounds
        progress.update(f"cpsat: solve {rounds + 1}, {time.perf_counter() - solve_start:.1f} s", force=True)
        status, point, objective, bound = cp.solve(left, options, progress)
        rounds += 1
        if point is None:
            proven = status == "infeasible"
            break
        plan = space.plan(point)
        sharding = plan.materialize(space.nda)
        cost = table.evaluate(sharding)
        if cost.fits:
            found = (plan, sharding, cost, objective, bound, status)
            break
        if smallest is None or cost.peak_memory_bytes < smallest[0]:
            smallest = (cost.peak_memory_bytes, sharding)
        cuts = _lower_bound_counts(m, np.append(table.codes(sharding), 0), capacity)
        for counts in cuts:
            cp.memory_cut(counts, capacity)
        if not cuts:
            cp.exclude(point)
        hint = point
    solve_s = time.perf_counter() - solve_start
    variables, constraints = cp.size()
    folded = sum(t.mult - 1 for t in m.terms.values() if t.kind != "param")
    common = dict(solver="cpsat", axes=space.axes, solve_s=solve_s, build_s=build_s, variables=variables,
                  constraints=constraints, terms=len(m.terms), folded=folded,
                  space=len(space.variables) + len(space.free_classes), rounds=rounds, memory_cuts=cp.memory_cuts,
                  smallest_peak_bytes=smallest[0] if smallest else None)
    if found is not None:
        plan, sharding, cost, objective, bound, status = found
        gap = (objective - bound) / objective if objective > 0 else 0.0
        message = f"{status}: step time {objective:.6g} s (bound {bound:.6g} s, gap {gap:.2%})"
        report = SolveReport(status=status, objective_s=objective, bound_s=bound, gap=gap, message=message, **common)
        return AutoResult(plan, sharding, cost, report)
    status = "infeasible" if proven else "unknown"
    tries = f"in {rounds} solves" if rounds else f"within the time limit ({options.time_limit_s:g} s)"
    message = no_fit_message(space, table, smallest, proven, tries)
    report = SolveReport(status=status, objective_s=None, bound_s=None, gap=None, message=message, **common)
    return AutoResult(None, None, None, report)


__all__ = ["CpSatOptions", "SolveReport", "solve"]
