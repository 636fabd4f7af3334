"""The terms of the CP-SAT model (`solver.search.cpsat`): keys, features and
priced combinations, built from a search space and the cost table.

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
             the use's dimension keys, the value's partial state, for a
             partial sum whether it flows (first use) or which sharding its
             first use reduced it to (later uses), and how often it runs a
             step (`CostTable.edge_repeat`: a weight's resharding once per
             microbatch);
  end term   a partial result reduced after the last op.

Each distinct term gets one boolean per feasible combination of its
inputs (key codes, partial states), exactly one of which holds, linked to
s and to the one-hot partial-state features; its cost is priced once and
multiplied by the number of ops or uses sharing the term. The feasible
combinations are enumerated axis by axis from the x and r values that can
reach them (a superset where enumeration would be large: the linking
constraints keep only the reachable one). The objective is their sum,
integer-scaled so that rounding stays under 0.1% of the step time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodel.table import CostTable
from ir.core import IRError
from ir.lower import flowing_partial
from solver.search.keys import IClassKeys
from solver.search.space import FREE, LATE, SearchSpace

# Enumerating more than 2**this assignments per axis for one term falls back to all 0/1 vectors.
_ENUMERATION_BITS = 14
NOT_PARTIAL = (0, "sum")


@dataclass(slots=True)
class Combo:
    taken: tuple[frozenset[str], ...]  # per key of the term: auto axes it holds
    inputs: tuple  # per input feature: its value
    outputs: tuple  # per output feature: its value
    seconds: float
    result_bytes: int = 0  # op terms: the result's local bytes
    held_bytes: int = 0  # op terms: at least what the result holds once its partial sum is reduced
    use_bytes: tuple[int, ...] = ()  # op terms: each operand's local bytes as the op reads it
    first_step_bytes: int = 0  # edge terms: the local bytes of the first collective's result (0: none)


@dataclass(slots=True, eq=False)  # identity: terms key the memory cuts
class Term:
    kind: str  # op | kernel | edge | end | param
    rep: int  # representative op, edge or value
    keys: tuple[int, ...]
    inputs: tuple[int, ...]  # feature ids
    outputs: tuple[int, ...]
    combos: list[Combo]
    mult: int = 1
    z: list = field(default_factory=list)
    forbidden: list = field(default_factory=list)  # (taken, inputs) the lowering cannot build
    partial_feature: int | None = None  # op terms: the result's partial state
    flow_feature: int | None = None  # op terms: whether a partial operand flows through
    emits: int | bool = False  # edge terms: the feature "a collective sits on this use", or its constant value


class TermModel:
    """Keys, features and terms of one (space, cost table), and the CP-SAT model over them."""

    def __init__(self, space: SearchSpace, table: CostTable) -> None:
        if space.mesh != table.mesh:
            raise IRError(f"the search space is over {space.mesh}, the cost table over {table.mesh}")
        self.space, self.t, self.nda = space, table, space.nda
        self.axes = space.axes
        self.base_codes = np.append(table.codes(space.base), 0)
        self._scratch, self._dirty = self.base_codes.copy(), []  # `_codes`' array, the I-classes it set
        keys = IClassKeys(space)
        self.keys, self.key_of, self.key_members = keys.keys, keys.key_of, keys.key_members
        self.features: list[tuple] = []  # feature id -> domain (tuple of values)
        self._feature_ids: dict[tuple, int] = {}
        self.terms: dict[tuple, Term] = {}
        self.defined_by: dict[int, Term] = {}  # feature id -> the term whose outputs define it
        self.value_partial: list[int | None] = [None] * len(table.values)
        self.op_term: list[tuple] = []
        self.edge_term: dict[int, tuple] = {}  # use -> its edge term's name (uses that may carry a collective)
        # The uses inside a fused kernel: only there does a kernel term read whether a collective sits on
        # the use, so only their edge terms define an `emits` feature (each is a clause per combination).
        self.kernel_uses = {e for kernel in table.kernels.kernels for _, _, edges in kernel.links for e in edges}
        self._vectors: dict[tuple, list[tuple[int, ...]]] = {}
        # The auto axes as a set per bit mask of them (`key_combos`), and per (key, axes held) its code
        # and whether they divide it: asked once per combination of every term the key is in.
        self._axis_sets = [frozenset(a for i, a in enumerate(self.axes) if m >> i & 1)
                           for m in range(1 << len(self.axes))]
        self._key_codes: dict[tuple[int, frozenset[str]], int] = {}
        self._divisible: dict[tuple[int, frozenset[str]], bool] = {}
        self._build_terms()

    # ------------------------------------------------------------ keys

    def code_of_key(self, kid: int, taken: frozenset[str]) -> int:
        code = self._key_codes.get((kid, taken))
        if code is None:
            key = self.keys[kid]
            code = self._key_codes[(kid, taken)] = self.t.code_of[key.base + tuple(a for a in key.order if a in taken)]
        return code

    def _codes_of_keys(self, keys: tuple[int, ...], taken: tuple[frozenset[str], ...]) -> list[int]:
        """Each key's code in one combination of their axes."""
        return [self.code_of_key(k, tk) for k, tk in zip(keys, taken)]

    def _places(self, keys: tuple[int, ...], iclasses: Sequence[int]) -> list[int]:
        """Where each I-class's key is in `keys`: a tensor's dimensions' codes are
        `_codes_of_keys`' at those places, its packed sharding `pack_codes` of them
        (no code array per combination, `_price_edge`)."""
        return [keys.index(self.key_of[k]) for k in iclasses]

    def divisible(self, kid: int, taken: frozenset[str]) -> bool:
        ok = self._divisible.get((kid, taken))
        if ok is None:
            key = self.keys[kid]
            ok = self._divisible[(kid, taken)] = not any(
                t <= taken for i, a in enumerate(self.axes) if a in taken for t in key.nondiv[i])
        return ok

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
        # Per group, the levels its keys here need: the group's decision reaches none, some or all of them,
        # or is LATE; and the levels of the groups whose decisions keep a key from the axis when LATE.
        needs: dict[int, set[int]] = {}
        for k in order:
            key = self.keys[k]
            needs.setdefault(key.group, set()).add(key.level[i])
            late = key.late[i] if key.late else None
            if late is not None:
                needs[key.group].add(LATE)
                for h, level, flag in late:
                    needs.setdefault(h, set()).add(LATE if flag else level)
        groups = sorted(needs)
        reachable = [(0, *sorted(needs[g])) for g in groups]
        classes = sorted({c for k in order for c, _ in self.keys[k].desel})
        fails = [k for k in order if self.keys[k].nondiv[i]]
        n = len(classes) + len(fails)
        if math.prod(map(len, reachable)) * 2 ** n > 2 ** _ENUMERATION_BITS:
            return list(itertools.product((0, 1), repeat=len(free)))
        # Per key in order, what its bit reads, as positions: its group's level in `levels`, its
        # deselecting classes' and its failure's bits in `bits`, the keys above it in `order`, and its
        # LATE blockers' groups. (With dicts per combination this was the function with the most time
        # of its own over tests/test_cpsat.py, test_folding, test_remat and test_pipeline_fold, profiled.)
        g_at, c_at, f_at, o_at = ({v: p for p, v in enumerate(vs)} for vs in (groups, classes, fails, order))
        rows = []
        for k in order:
            key = self.keys[k]
            late = key.late[i] if key.late else None
            rows.append((g_at[key.group], tuple((c_at[c], b) for c, b in key.desel),
                         len(classes) + f_at[k] if k in f_at else None, key.level[i],
                         tuple(o_at[j] for j in key.higher if j in o_at),
                         None if late is None else tuple((g_at[h], least, flag) for h, least, flag in late)))
        return _reachable_bits(rows, reachable, n, [o_at[k] for k in free])

    def key_combos(self, keys: tuple[int, ...]) -> list[tuple[frozenset[str], ...]]:
        """Per key, the auto axes it holds: every reachable, divisible combination."""
        # Per axis, each reachable vector as the bits it sets in each key's mask of axes held.
        per_axis = [[tuple(b << i for b in v) for v in self._axis_vectors(keys, i)] for i in range(len(self.axes))]
        sets = self._axis_sets
        out = []
        for vectors in itertools.product(*per_axis):
            taken = tuple(sets[sum(bits)] for bits in zip(*vectors)) if vectors else (sets[0],) * len(keys)
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

    def _input_values(self, keys: tuple[int, ...], inputs: tuple[int, ...]):
        """Per combination of the keys' axes, the input features' joint values
        that the terms defining those features allow: a feature's value and
        the axes of the keys a term shares with its definer hold together in
        one of the definer's combinations, so any other is unreachable. (A
        use's partial state is its producer's: an axis its result holds on a
        dimension is never one it is partial over.) Dropping them keeps the
        model exact and, on a 3-axis mesh, leaves a third of the edge terms'
        combinations."""
        checks = []
        for n, f in enumerate(inputs):
            definer = self.defined_by.get(f)
            if definer is None:
                continue
            shared = [k for k in keys if k in definer.keys]
            at = [definer.keys.index(k) for k in shared]
            out = definer.outputs.index(f)
            allowed: dict[tuple, set] = {}
            for c in definer.combos:
                allowed.setdefault(tuple(c.taken[p] for p in at), set()).add(c.outputs[out])
            checks.append((n, [keys.index(k) for k in shared], allowed))
        domains = [self.features[f] for f in inputs]

        def values(taken: tuple[frozenset[str], ...]):
            ds = list(domains)
            for n, mine, allowed in checks:
                ok = allowed.get(tuple(taken[p] for p in mine), ())
                ds[n] = [v for v in ds[n] if v in ok]
            return itertools.product(*ds)

        return values

    def _codes(self, keys: tuple[int, ...], taken: tuple[frozenset[str], ...], iclasses: Sequence[int]) -> np.ndarray:
        """A full code array with the given I-classes set from their keys' combination.

        One array, valid until the next call: the earlier call's I-classes are
        set back to the base. (A copy per combination, of 157,437 codes on the
        405B spec, made this a fifth of building its model.)"""
        codes = self._scratch
        codes[self._dirty] = self.base_codes[self._dirty]
        code = {k: self.code_of_key(k, tk) for k, tk in zip(keys, taken)}
        for ic in iclasses:
            codes[ic] = code[self.key_of[ic]]
        self._dirty = list(iclasses)
        return codes

    def _build_terms(self) -> None:
        t = self.t
        for i in range(len(t.fn.ops)):
            self.op_term.append(self._op_term(i))
        for e in range(len(t.edge_op_of)):
            self._edge_term(e)
        for k in range(len(t.kernels.kernels)):
            self._kernel_term(k)
        for v in t.result_vids:
            if self.value_partial[v] is not None and not t.edges_of[v]:
                self._end_term(v)

    def _add(self, name: tuple, build) -> Term:
        term = self.terms.get(name)
        if term is None:
            term = self.terms[name] = build()
            for f in term.outputs:
                self.defined_by[f] = term
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
        name = ("op", t.op_signature_of[i], fkeys, tuple(operands), bool(t.kernels.fused[i]))
        term = self._add(name, lambda: self._price_op_term(i, name, factors, operands))
        self.value_partial[t.num_params + i] = term.partial_feature
        return name

    def _price_op_term(self, i: int, name: tuple, factors: list[int], operands: list) -> Term:
        t = self.t
        keys = tuple(sorted({self.key_of[k] for k in factors}))
        inputs = tuple(pf for pf, _ in operands if pf is not None)
        red = [k for k in t.reduction_ic[i].tolist() if k < len(self.nda.iclasses)]
        op = t.fn.ops[i]
        rows, forbidden = [], []
        consistent = self._input_values(keys, inputs)
        for taken in self.key_combos(keys):
            joint = list(consistent(taken))
            if not joint:
                continue
            codes = self._codes(keys, taken, factors)
            # An op a kernel fuses is priced by its kernel term.
            seconds = 0.0 if t.kernels.fused[i] else t.price_op(i, codes)[0]
            result_bytes = int(t.global_bytes[t.num_params + i]
                               // np.prod(t.code_size[codes[t.def_ic[t.num_params + i]]]))
            use_bytes = tuple(use_local_bytes(t, e, codes) for e in t.op_edges[i])
            own = 0
            for k in red:
                own |= int(t.code_mask[codes[k]])
            wants = None
            for values in joint:
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
                partial = (mask, t.op_combiner[i] if own else "sum") if mask else NOT_PARTIAL
                # Reducing a partial sum over axes A scatters it at most over A.
                held = result_bytes // math.prod(t.mesh.size(a) for a in t.mask_axes[mask])
                rows.append(Combo(taken, tuple(values), (partial, bool(flowing)), seconds, result_bytes, held,
                                  use_bytes))
        partial_f = self._feature(name + ("partial",), [c.outputs[0] for c in rows])
        flow_f = self._feature(name + ("flow",), [c.outputs[1] for c in rows])
        kept = [n for n, f in enumerate((partial_f, flow_f)) if f is not None]
        outputs = [f for f in (partial_f, flow_f) if f is not None]
        for c in rows:
            c.outputs = tuple(c.outputs[n] for n in kept)
        return Term("op", i, keys, inputs, tuple(outputs), rows, forbidden=forbidden,
                     partial_feature=partial_f, flow_feature=flow_f)

    def _flow_feature(self, i: int) -> int | None:
        return self.terms[self.op_term[i]].flow_feature

    def _edge_role(self, e: int) -> tuple[int | None, tuple, list[int]]:
        """A use's partial-sum feature, its role (plain; first use, with the
        flow feature; later use, with the first use's keys) and the first
        use's I-classes (later uses)."""
        t = self.t
        v, i = t.edge_vid_of[e], t.edge_op_of[e]
        rank = t.values[v].type.rank
        pf = self.value_partial[v]
        if pf is None:
            return pf, ("plain",), []
        if t.edges_of[v][0] == e:
            flow = self._flow_feature(i) if t.can_flow[i] and t.use_count_of[v] == 1 else None
            return pf, ("first", flow), []
        first_ic = t.use_ic[t.edges_of[v][0]][:rank].tolist()
        return pf, ("later", tuple(self.key_of[k] for k in first_ic)), first_ic

    def _edge_resharding(self, v: int, have: int, want: int, first: int, state: dict, pf: int | None,
                         role: tuple):
        """The lowering's collectives in front of a use of value v, which has the
        packed sharding `have` and the use wants `want` (`first`: the first
        use's, for a later one), under the feature values `state`: the
        memoized resharding, or None if there are none."""
        t = self.t
        mask, combiner = state.get(pf, NOT_PARTIAL) if pf is not None else NOT_PARTIAL
        if mask and role[0] == "first" and state.get(role[1], False):
            mask = 0  # it flows through the op unreduced
        if mask and role[0] == "later":
            have, mask = t.resharding(v, have, mask, combiner, first).reduced, 0
        if not mask and have == want:
            return None
        return t.resharding(v, have, mask, combiner, want)

    def _edge_term(self, e: int) -> None:
        t = self.t
        v = t.edge_vid_of[e]
        rank = t.values[v].type.rank
        dic, wic = t.def_ic[v][:rank].tolist(), t.use_ic[e][:rank].tolist()
        dkeys = tuple(self.key_of[k] for k in dic)
        wkeys = tuple(self.key_of[k] for k in wic)
        pf, role, first_ic = self._edge_role(e)
        if pf is None and dkeys == wkeys:
            return  # the use always wants what the value has: no collective
        name = ("edge", t.type_id_of[v], dkeys, wkeys, pf, role, e in self.kernel_uses, int(t.edge_repeat[e]))
        self._add(name, lambda: self._price_edge(e, name, dic, wic, first_ic, pf, role))
        self.edge_term[e] = name

    def _price_edge(self, e: int, name: tuple, dic: list[int], wic: list[int], first_ic: list[int],
                    pf: int | None, role: tuple) -> Term:
        t = self.t
        v = t.edge_vid_of[e]
        keys = tuple(sorted({self.key_of[k] for k in dic + wic + first_ic}))
        # Each tensor's packed sharding from its dimensions' keys' codes, not from a code array: an edge
        # term prices every combination of its keys (llama2_70b: 85,000), and a code array per
        # combination, then read back per tensor, was a third of that.
        d_at, w_at, f_at = (self._places(keys, ics) for ics in (dic, wic, first_ic))
        repeat = int(t.edge_repeat[e])
        flow_f = role[1] if role[0] == "first" else None
        inputs = tuple(f for f in (pf, flow_f) if f is not None)
        rows = []
        consistent = self._input_values(keys, inputs)
        for taken in self.key_combos(keys):
            joint = list(consistent(taken))
            if not joint:
                continue
            code = self._codes_of_keys(keys, taken)
            have, want = t.pack_codes([code[n] for n in d_at]), t.pack_codes([code[n] for n in w_at])
            first = t.pack_codes([code[n] for n in f_at])  # a later use's first use's (0 for a scalar)
            for values in joint:
                chain = self._edge_resharding(v, have, want, first, dict(zip(inputs, values)), pf, role)
                seconds = sum(chain.priced.seconds) * repeat if chain is not None else 0.0
                first_bytes = chain.priced.result_bytes[0] if _emits(chain) else 0
                rows.append(Combo(taken, tuple(values), (_emits(chain),), seconds, first_step_bytes=first_bytes))
        # Whether a collective sits on the use: a kernel reading it through this use is cut there.
        emits = {c.outputs[0] for c in rows}
        feature = self._feature(name + ("emits",), emits) if e in self.kernel_uses else None
        for c in rows:
            c.outputs = c.outputs if feature is not None else ()
        return Term("edge", e, keys, inputs, (feature,) if feature is not None else (), rows,
                    emits=feature if feature is not None else len(emits) == 1 and emits.pop())

    def _kernel_term(self, k: int) -> None:
        """A fused kernel's time: keyed by its signature, its I-classes' keys and
        whether a collective sits on each of its internal uses (the edge terms'
        `emits` features), which cuts it into pieces (`costmodel.table_kernels`)."""
        t = self.t
        kernel = t.kernels.kernels[k]
        iclasses = list(kernel.iclasses)
        # Per link: the emits feature or constant of each of its uses (a use with no edge term never emits).
        links = [tuple(self.terms[self.edge_term[e]].emits if e in self.edge_term else False for e in edges)
                 for _, _, edges in kernel.links]
        inputs = tuple(dict.fromkeys(f for link in links for f in link if not isinstance(f, bool)))
        name = ("kernel", kernel.signature, tuple(self.key_of[ic] for ic in iclasses), tuple(links))

        def build() -> Term:
            keys = tuple(sorted({self.key_of[ic] for ic in iclasses}))
            rows = []
            consistent = self._input_values(keys, inputs)
            for taken in self.key_combos(keys):
                joint = list(consistent(taken))
                if not joint:
                    continue
                codes = self._codes(keys, taken, iclasses)
                for values in joint:
                    state = dict(zip(inputs, values))
                    broken = tuple(n for n, link in enumerate(links)
                                   if any(f if isinstance(f, bool) else state[f] for f in link))
                    seconds = sum(s for _, s, _, _ in t.kernels.price_pieces(k, codes, broken))
                    rows.append(Combo(taken, tuple(values), (), seconds))
            return Term("kernel", k, keys, inputs, (), rows)

        self._add(name, build)

    def _end_term(self, v: int) -> None:
        t = self.t
        rank = t.values[v].type.rank
        dic = t.def_ic[v][:rank].tolist()
        pf = self.value_partial[v]
        name = ("end", t.type_id_of[v], tuple(self.key_of[k] for k in dic), pf)

        def build() -> Term:
            keys = tuple(sorted({self.key_of[k] for k in dic}))
            d_at = self._places(keys, dic)
            rows = []
            consistent = self._input_values(keys, (pf,))
            for taken in self.key_combos(keys):
                have = None
                for (value,) in consistent(taken):
                    if have is None:
                        code = self._codes_of_keys(keys, taken)
                        have = t.pack_codes([code[n] for n in d_at])
                    mask, combiner = value
                    seconds = sum(t.resharding(v, have, mask, combiner, have).priced.seconds) if mask else 0.0
                    rows.append(Combo(taken, (value,), (), seconds))
            return Term("end", v, keys, (pf,), (), rows)

        self._add(name, build)

    def param_term(self, p: int) -> Term:
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
                rows.append(Combo(taken, (), (), 0.0, size))
            term = self.terms[name] = Term("param", p, keys, (), (), rows, mult=0)
        return term


def _reachable_bits(rows: list[tuple], reachable: list[tuple[int, ...]], n: int, out_at: list[int]) -> list[tuple]:
    """`TermModel._enumerate_axis`'s enumeration: per combination of its
    groups' levels and its `n` bits, whether each key holds the axis (early,
    where its group's level reaches the key's and no key above it took the
    axis; or LATE, where none of its blockers holds), read at `out_at`."""
    found = set()
    for levels in itertools.product(*reachable):
        for bits in itertools.product((0, 1), repeat=n):
            early, holds = [0] * len(rows), [0] * len(rows)
            for k, (g, desel, fail, least_level, higher, late) in enumerate(rows):
                level = levels[g]
                if any(bits[c] == b for c, b in desel) or (fail is not None and bits[fail]):
                    continue
                if LATE != level >= least_level and not any(early[j] for j in higher):
                    early[k] = holds[k] = 1
                elif level == LATE and not any((levels[h] == LATE) if flag else (LATE != levels[h] >= least)
                                               for h, least, flag in late):
                    holds[k] = 1
            found.add(tuple(holds[k] for k in out_at))
    return sorted(found)


def use_local_bytes(t: CostTable, e: int, codes: np.ndarray) -> int:
    """The local bytes of use `e`'s operand as its op reads it (the wanted
    sharding: the value itself, or its resharding's last result)."""
    v = t.edge_vid_of[e]
    return int(t.global_bytes[v] // np.prod(t.code_size[codes[t.use_ic[e][:t.values[v].type.rank]]]))


def _emits(chain) -> bool:
    """Whether a use's resharding puts a collective in front of it."""
    return chain is not None and bool(chain.priced.kinds)


# ------------------------------------------------------------ the CP-SAT model
