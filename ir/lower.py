"""The rewrite engine: a global program + a factor sharding -> the
device-local program every device runs, with every collective explicit.

Each op runs on local shapes: a tensor dimension sharded by axes A has
size / |A| elements per device. Per op, from its factor rule and the factor
sharding:

  - every operand is resharded from how it is (its definition's sharding
    and any pending partial sum) to how the op wants it (its use's factors):
      all_gather   drops trailing axes of a dimension,
      all_slice    adds trailing axes (local, free),
      all_to_all   moves trailing axes from one dimension to another:
                   all_to_all<src, dst>(x) == all_slice<dst>(all_gather<src>(x)),
      all_reduce   combines a pending partial result,
      reduce_scatter == all_slice(all_reduce(x)) when the use also wants a
                   partial axis on a dimension;
  - a reduction factor sharded on axes A leaves the result partial over A;
  - a pending partial sum flows, unreduced, through an op linear in it (add
    and sub of equally partial operands, neg, convert, transpose, reshape,
    broadcast_in_dim, slice, sum-reduce, mul by a non-partial value, div of
    a partial by a non-partial value) when that op is its only use, and is
    reduced once, where a non-linear consumer, a second consumer or a result
    needs the full value (flowing into one of several uses would reduce the
    same sum twice). A use that only reduces it (its reduce_scatter or
    all_reduce already gives the sharding the use wants) has the reduction
    emitted right after the op that completes the sum, not before the use:
    a gradient leaves as soon as it is made, as ZeRO and FSDP reduce each
    bucket during the backward, instead of every layer's full gradient
    waiting for the optimizer update;
  - an op's attributes that spell out shapes are localized by its kind's
    `localize` rule.

Parameters and results become per-device types; results are fully reduced.
An op is lowered afresh the first time its case (signature, factors' axes,
operands' states) is met on a program and mesh, and replayed from that
time's recipe after (`_Recipe`): a step of repeated layers meets few cases.
Option `reuse_resharded`: a resharded value (e.g. an all_gathered parameter)
is kept and reused by later uses needing the same layout (XLA's choice:
fewer collectives, more live memory), or, by default, resharded again at
each use (PartIR's choice: ZeRO-3 gathers each parameter once in the
forward and once in the backward pass).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ir import ops
from ir.builder import Builder
from ir.core import Attrs, Function, IRError, Op, Recent, TensorType, Value, users
from ir.nda import NDA
from ir.sharding import DimAxes, FactorSharding, local_type

LINEAR_UNARY = frozenset({"neg", "convert", "transpose", "reshape", "broadcast_in_dim", "slice"})
# Every kind a pending partial sum may flow through (see `flowing_partial`).
FLOWING_KINDS = LINEAR_UNARY | {"reduce", "add", "sub", "mul", "div"}


class LoweringError(IRError):
    """The lowering could not express a sharding (a bug or an unsupported case)."""


@dataclass(frozen=True, slots=True)
class LowerOptions:
    reuse_resharded: bool = False
    # Run the context-parallel attention kernels over this axis as rings (`ir.ring_attention`), a
    # rewrite of the whole device-local program.
    ring_axis: str | None = None


@dataclass(frozen=True, slots=True)
class Lowered:
    """A device-local program and how its parameters and results are sharded."""

    function: Function
    param_dims: tuple[DimAxes, ...]
    result_dims: tuple[DimAxes, ...]
    # A rewrite's new values (ring attention's): each one's global value it was made for.
    made_for: Mapping[str, str] = field(default_factory=dict)


class _Local(NamedTuple):
    """A global value as it stands on the devices: its local value, sharding
    and pending partial reduction (axes and combiner). (A named tuple: the
    lowering makes one per op, and a frozen dataclass's is slower to make.)"""

    value: Value
    dims: DimAxes
    partial: tuple[str, ...] = ()
    combiner: str = "sum"


@dataclass(frozen=True, slots=True)
class _Recipe:
    """What lowering one op did, to do again for an op of the same case
    (`_Lowering.lower_op`). A value is a ref: -1 - j for the local value of
    the op's j-th distinct operand on entry, r >= 0 for the result of the
    r-th op made. Ops are in the order they were made (their names are
    drawn in it): kind, attributes, operand refs, result type, and the
    collective's name suffix (None: the op itself, named as its global
    result)."""

    made: tuple[tuple[str, Attrs, tuple[int, ...], TensorType, str | None], ...]
    body: tuple[int, ...]  # the made ops left in program order here
    hoisted: tuple[tuple[int, tuple[int, ...]], ...]  # (operand j, the ops placed right after its sum's op)
    states: tuple[tuple[int, int, DimAxes, tuple[str, ...], str], ...]  # operand j's new state: (j, ref, ...)
    result: tuple[int, DimAxes, tuple[str, ...], str]  # the result's state: ref, dims, partial, combiner
    alone: bool  # the op itself and nothing else (most of a step's ops): `_replay`'s short way


# Lowering an op follows from its signature, its factors' axes and its operands' states alone, and a
# step of repeated layers lowers few distinct such cases many times (a pipeline's folded stages, a
# shallow copy's layers, the three copies of one plan): each case is lowered once per program and mesh
# and its recipe replayed (`_Lowering.lower_op`). `Builder.build` still verifies every op it made.
_RECIPES = Recent(4)  # per (program, mesh): case -> _Recipe
_SIGNATURES = Recent(2)  # per program: each op's signature number
_PARAMS = Recent(4)  # per (program, analysis, sharding): each parameter's dims and local type
_NAMES = Recent(2)  # per program: its value names and each value's uses (a mesh search lowers a part of it hundreds
# of times: made per lowering, they were a sixth of lowering a folded pipeline's three stages of 80 layers)


def _signatures(fn: Function) -> list[int]:
    def make() -> list[int]:
        numbers: dict[tuple, int] = {}
        return [numbers.setdefault((op.kind, op.attrs, tuple(v.type for v in op.operands),
                                    tuple(r.type for r in op.results)), len(numbers)) for op in fn.ops]

    return _SIGNATURES.get((fn,), None, make)


@dataclass
class _Lowering:
    fn: Function
    nda: NDA
    sharding: FactorSharding
    options: LowerOptions
    b: Builder = field(init=False)
    env: dict[Value, _Local] = field(default_factory=dict)
    cache: dict[tuple, Value] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)  # the names `fresh` drew (the program's own: `self.names`)
    # Per partial local value, the collectives that only reduce it: emitted right after its op.
    hoisted: dict[Value, list[Op]] = field(default_factory=dict)
    made: list[Op] | None = None  # the ops lowering the current op has made, while recording its recipe

    def __post_init__(self) -> None:
        self.b = Builder(self.fn.name, self.sharding.mesh)
        self.names, self.use_count = _NAMES.get((self.fn,), None, self._names_and_uses)
        # A resharding kept for later uses (`reuse_resharded`) makes lowering depend on more than the case.
        self.recipes: dict[tuple, _Recipe] | None = None if self.options.reuse_resharded else _RECIPES.get(
            (self.fn,), self.sharding.mesh, dict)
        self.signature = _signatures(self.fn)
        self.iclass_axes = (*self.sharding.axes, ())  # per I-class its axes, and () at -1 (a factor of no dim)

    def _names_and_uses(self) -> tuple[frozenset[str], dict[Value, int]]:
        """The program's value names, and each value's uses (a result of the program's is used once more)."""
        use_count = {v: len(us) for v, us in users(self.fn).items()}
        for r in self.fn.results:
            use_count[r] += 1
        return frozenset(v.name for v in self.fn.values()), use_count

    # -- names

    def fresh(self, base: str) -> str:
        """A unique name for a collective's result, derived from its input."""
        name, n = base, 1
        while name in self.taken or name in self.names:
            n += 1
            name = f"{base}{n}"
        self.taken.add(name)
        return name

    def collective(self, kind: str, x: Value, suffix: str, **attrs) -> Value:
        y = self.b.op(kind, [x], self.fresh(f"{x.name}-{suffix}"), **attrs)
        if self.made is not None:
            self.made.append(self.b.body[-1])
        return y

    # -- resharding

    def apply(self, x: Value, steps: list[Step]) -> Value:
        for step in steps:
            x = self.collective(step.kind, x, SUFFIX[step.kind], **dict(step.attrs))
        return x

    def operand(self, v: Value, want: DimAxes, keep_partial: bool, hoist: bool = True) -> Value:
        state = self.env[v]
        if state.partial and not keep_partial:
            steps = reduce_steps(state.dims, state.partial, state.combiner, want)
            emitted = len(self.b.body)
            partial = state.value
            state = _Local(self.apply(state.value, steps), steps[-1].dims)
            self.env[v] = state  # reduced once: later uses start from the full value
            if hoist and state.dims == want:  # only reduced: it goes right after the sum is complete
                self.hoisted[partial] = self.b.body[emitted:]
                del self.b.body[emitted:]
        if state.dims == want:
            return state.value
        key = (v, want, state.partial)
        if self.options.reuse_resharded and key in self.cache:
            return self.cache[key]
        local = self.apply(state.value, redistribute_steps(state.dims, want))
        self.cache[key] = local
        return local

    # -- ops

    def lower_op(self, i: int, op: Op) -> None:
        """Lower op i: afresh the first time its case is met (its signature,
        its factors' axes, its operands' states and which of them are one
        value), else by replaying the recipe of that time."""
        factor_axes = tuple(map(self.iclass_axes.__getitem__, self.nda.op_factor_iclass[i]))
        env = self.env
        states = [env[o] for o in op.operands]
        sole_use = True  # every operand with a pending sum is read by this op alone
        for o, s in zip(op.operands, states):
            if s.partial and self.use_count[o] != 1:
                sole_use = False
                break
        if self.recipes is None:
            self._lower_afresh(i, op, factor_axes, states, sole_use)
            return
        distinct = list(dict.fromkeys(op.operands))
        entry = [env[o] for o in distinct]
        values = [e.value for e in entry]  # Values compare by identity
        case = (self.signature[i], factor_axes, tuple([s[1:] for s in states]), sole_use,  # (dims, partial, combiner)
                tuple(map(op.operands.index, op.operands)), tuple(map(values.index, values)))
        recipe = self.recipes.get(case)
        if recipe is not None:
            self._replay(op, recipe, distinct, entry)
            return
        self.made = []
        hoisted = {e.value: self.hoisted.get(e.value) for e in entry if e.partial}
        try:
            self._lower_afresh(i, op, factor_axes, states, sole_use)
            self.recipes[case] = self._recipe(op, distinct, entry, hoisted)
        finally:
            self.made = None

    def _recipe(self, op: Op, distinct: list[Value], entry: list[_Local], hoisted: dict[Value, Any]) -> _Recipe:
        """The recipe of what lowering `op` just did (`self.made`, and the states and hoisted ops it left)."""
        refs = {}
        for j, e in reversed(list(enumerate(entry))):  # a local value read as two operands: the first
            refs[e.value] = -1 - j
        for r, made in enumerate(self.made):
            refs[made.results[0]] = r
        main = self.made[-1]
        made = tuple((m.kind, m.attrs, tuple(refs[o] for o in m.operands), m.results[0].type,
                      None if m is main else SUFFIX[m.kind]) for m in self.made)
        position = {id(m): r for r, m in enumerate(self.made)}
        moved = tuple((j, tuple(position[id(m)] for m in self.hoisted[e.value]))
                      for j, e in enumerate(entry) if e.partial and self.hoisted.get(e.value) is not hoisted[e.value])
        away = {r for _, rs in moved for r in rs}
        body = tuple(r for r in range(len(self.made)) if r not in away)
        if [id(m) for m in self.b.body[len(self.b.body) - len(body):]] != [id(self.made[r]) for r in body]:
            raise LoweringError(f"{op.describe()}: its lowering left ops where a recipe cannot say")
        states = tuple((j, refs[self.env[o].value], self.env[o].dims, self.env[o].partial, self.env[o].combiner)
                       for j, (o, e) in enumerate(zip(distinct, entry)) if self.env[o] is not e)
        out = self.env[op.results[0]]
        return _Recipe(made, body, moved, states, (refs[out.value], out.dims, out.partial, out.combiner),
                       alone=len(made) == 1 and body == (0,) and not moved and not states and refs[out.value] == 0)

    def _replay(self, op: Op, recipe: _Recipe, distinct: list[Value], entry: list[_Local]) -> None:
        """Make the recipe's ops again on this op's operands (fresh names drawn in the same order)."""
        if recipe.alone:  # the op itself, on its operands' local values
            kind, attrs, refs, ty, _ = recipe.made[0]
            (result,) = op.results
            self.b.take_name(result.name)
            value = Value(result.name, ty)
            self.b.body.append(Op(kind, tuple([entry[-1 - r].value for r in refs]), (value,), attrs))
            self.env[result] = _Local(value, *recipe.result[1:])
            return
        made: list[Op] = []
        values: list[Value] = []

        def local(r: int) -> Value:
            return entry[-1 - r].value if r < 0 else values[r]

        for kind, attrs, refs, ty, suffix in recipe.made:
            operands = tuple(map(local, refs))
            name = op.results[0].name if suffix is None else self.fresh(f"{operands[0].name}-{suffix}")
            self.b.take_name(name)
            value = Value(name, ty)
            values.append(value)
            made.append(Op(kind, operands, (value,), attrs))
        self.b.body.extend(made[r] for r in recipe.body)
        for j, rs in recipe.hoisted:
            self.hoisted[entry[j].value] = [made[r] for r in rs]
        for j, r, dims, partial, combiner in recipe.states:
            self.env[distinct[j]] = _Local(local(r), dims, partial, combiner)
        r, dims, partial, combiner = recipe.result
        self.env[op.results[0]] = _Local(local(r), dims, partial, combiner)

    def _lower_afresh(self, i: int, op: Op, factor_axes: tuple[DimAxes, ...], states: list[_Local],
                      sole_use: bool) -> None:
        rule = ops.factor_rule(op)
        wants = [tuple(factor_axes[dims[0]] for dims in tensor) for tensor in rule.operands]
        flowing = flowing_partial(op, [s.partial for s in states], [s.combiner for s in states], wants) \
            if sole_use else ()
        operands = [self.operand(o, want, bool(flowing)) for o, want in zip(op.operands, wants)]
        partial = set(flowing)
        combiner = "sum"
        for k, f in enumerate(rule.factors):
            if f.kind is ops.FactorKind.REDUCTION and factor_axes[k]:
                partial.update(factor_axes[k])
                combiner = f.combiner or "sum"
        if flowing and combiner != "sum":
            raise LoweringError(f"{op.describe()}: cannot combine a flowing sum with a {combiner} reduction")
        (result,) = op.results
        dims = tuple(factor_axes[d[0]] for d in rule.results[0])
        want_type = local_type(result.type, dims, self.sharding.mesh)
        attrs = ops.get(op.kind).localize(
            op.attrs, tuple(v.type for v in operands), (want_type,))
        local = self.b.emit(op.kind, operands, result.name, attrs)
        if self.made is not None:
            self.made.append(self.b.body[-1])
        if local.type != want_type:
            raise LoweringError(f"{op.describe()}: local result {local.type} differs from the expected {want_type}")
        # Partial axes in mesh order: one canonical form, so equally partial operands compare equal.
        self.env[result] = _Local(local, dims, self.sharding.mesh.ordered(partial), combiner)

    def _params(self) -> list[tuple[DimAxes, TensorType]]:
        """Each parameter's dims and local type (the same for every copy a plan's price lowers)."""
        mesh = self.sharding.mesh
        return [(dims, local_type(p.type, dims, mesh))
                for p in self.fn.params for dims in (self.sharding.def_dims(self.nda, p),)]

    def run(self, keep: Sequence[int] | None = None, substitute: Mapping[Value, Value] | None = None,
            whole: Collection[Value] = (), sent: Collection[Value] = ()) -> Lowered:
        """Lower every op, or only the ops `keep` (indices, in program order;
        see `lower_ops`)."""
        param_dims = []
        for p, (dims, ty) in zip(self.fn.params, _PARAMS.get((self.fn, self.nda, self.sharding), None, self._params)):
            param_dims.append(dims)
            local = Value(p.name, ty)
            self.b.add_param(local)
            self.env[p] = _Local(local, dims)
        substitute = substitute or {}
        for i in range(len(self.fn.ops)) if keep is None else keep:
            op = self.fn.ops[i]
            if ops.get(op.kind).is_collective:
                raise LoweringError(f"{op.describe()}: the input must be a global program without collectives")
            for v in op.operands:
                if v not in self.env:
                    if v not in substitute:
                        raise LoweringError(f"{op.describe()}: %{v.name} is made by an op left out and has no "
                                            "stand-in")
                    self.env[v] = self.env[substitute[v]]
                if v in whole and self.env[v].partial:
                    raise LoweringError(f"{op.describe()}: %{v.name} is read with a pending partial sum")
            self.lower_op(i, op)
            if op.results[0] in sent and self.env[op.results[0]].partial:
                raise LoweringError(f"{op.describe()}: %{op.results[0].name} is sent with a pending partial sum")
        self.b.body[:] = [placed for op in self.b.body for placed in (op, *self.hoisted.get(op.results[0], ()))]
        results, result_dims = [], []
        for r in self.fn.results if keep is None else [r for r in self.fn.results if r in self.env]:
            state = self.env[r]
            results.append(self.operand(r, state.dims, keep_partial=False, hoist=False))
            result_dims.append(self.env[r].dims)
        # Types are not inferred again: an op lowered afresh was made by `Builder.emit`, which infers them,
        # and a replayed one is a recipe's op of the same case (its signature holds the global types, the
        # case every local one), so of the same types. Re-inferring was a twentieth of a mesh search.
        return Lowered(self.b.build(results, types=False), tuple(param_dims), tuple(result_dims))


SUFFIX = {"all_gather": "ag", "all_slice": "as", "all_to_all": "a2a", "all_reduce": "ar", "reduce_scatter": "rs"}


@dataclass(frozen=True, slots=True)
class Step:
    """One collective of a resharding: its kind and attributes, and how the
    value is sharded after it. Pure data, so the cost table can price the
    very steps the lowering emits without building IR."""

    kind: str
    attrs: tuple[tuple[str, object], ...]
    dims: DimAxes


def reduce_steps(dims: DimAxes, partial: tuple[str, ...], combiner: str, want: DimAxes) -> list[Step]:
    """Combine a pending partial result: reduce_scatter where the use adds a
    partial axis to a dimension, all_reduce for the rest. Never empty."""
    steps, cur, pending = [], list(dims), list(partial)
    for d, (have, need) in enumerate(zip(dims, want)):
        if need[: len(have)] != have:
            continue
        run = []
        for a in need[len(have):]:
            if a not in pending:
                break
            run.append(a)
        if run:
            cur[d] = have + tuple(run)
            pending = [a for a in pending if a not in run]
            steps.append(Step("reduce_scatter", (("axes", tuple(run)), ("combiner", combiner), ("dim", d)), tuple(cur)))
    if pending:
        steps.append(Step("all_reduce", (("axes", tuple(pending)), ("combiner", combiner)), tuple(cur)))
    return steps


def redistribute_steps(dims: DimAxes, want: DimAxes) -> list[Step]:
    """Move a (non-partial, or linearly flowing) value from sharding `dims` to `want`.

    Only ever drops the trailing axes of a dimension and appends to one
    whose axes are already the wanted prefix: gathers of dimensions that
    are not all_to_all sources first, then the all_to_alls that are
    valid by then, then the remaining gathers, then the slices.
    """
    steps: list[Step] = []
    cur = [list(d) for d in dims]

    def step(kind: str, **attrs) -> None:
        steps.append(Step(kind, tuple(sorted(attrs.items())), tuple(tuple(c) for c in cur)))

    keep = [_common_prefix(c, w) for c, w in zip(cur, want)]
    extra = [tuple(c[k:]) for c, k in zip(cur, keep)]
    added = [tuple(w[k:]) for w, k in zip(want, keep)]
    moves = []
    for src, moving in enumerate(extra):
        dst = next((d for d, a in enumerate(added) if moving and a == moving and d != src
                    and d not in {m[1] for m in moves}), None)
        if dst is not None:
            moves.append((src, dst))
    sources = {src for src, _ in moves}
    for d, axes in enumerate(extra):
        if axes and d not in sources:
            cur[d], extra[d] = cur[d][: keep[d]], ()
            step("all_gather", axes=axes, dim=d)
    for src, dst in moves:
        moving = list(extra[src])
        if cur[src][-len(moving):] == moving and cur[dst] == list(want[dst][: len(want[dst]) - len(moving)]):
            cur[src], cur[dst] = cur[src][: -len(moving)], cur[dst] + moving
            extra[src], added[dst] = (), ()
            step("all_to_all", axes=tuple(moving), src_dim=src, dst_dim=dst)
    for d, axes in enumerate(extra):
        if axes:
            cur[d] = cur[d][: len(cur[d]) - len(axes)]
            step("all_gather", axes=axes, dim=d)
    for d, axes in enumerate(added):
        if axes:
            cur[d] = cur[d] + list(axes)
            step("all_slice", axes=axes, dim=d)
    return steps


def _common_prefix(a: list[str], b: tuple[str, ...]) -> int:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def flowing_partial(op: Op, partials: Sequence[tuple[str, ...]], combiners: Sequence[str],
                    wants: Sequence[DimAxes]) -> tuple[str, ...]:
    """The pending partial sum (axes, per operand: `partials`) that may flow
    through `op` unreduced, or (). The caller checks that every partial
    operand has this op as its only use."""
    partial = [(p, c) for p, c in zip(partials, combiners) if p]
    if not partial:
        return ()
    axes, combiner = partial[0]
    if combiner != "sum":
        return ()
    for p, want in zip(partials, wants):
        if p and any(a in axes for dim in want for a in dim):
            return ()  # the use shards a partial axis: reduce_scatter instead
    kind = op.kind
    if kind in LINEAR_UNARY or (kind == "reduce" and op.attrs["combiner"] == "sum"):
        return axes if kind != "convert" or op.result.type.dtype in ("f32", "bf16", "f16") else ()
    if kind in ("add", "sub"):
        return axes if all(p == axes for p in partials) else ()
    if kind == "mul" and len(partial) == 1:
        return axes
    if kind == "div" and partials[0] and not partials[1]:
        return axes
    return ()


def lower(fn: Function, nda: NDA, sharding: FactorSharding, options: LowerOptions | None = None) -> Lowered:
    """The device-local program of `fn` under `sharding` (see the module docstring)."""
    if nda.function is not fn:
        raise LoweringError("the NDA was computed for a different function")
    options = options or LowerOptions()
    lowered = _Lowering(fn, nda, sharding, options).run()
    if options.ring_axis is None:
        return lowered
    from ir.ring_attention import ring_attention  # a rewrite of the lowered program, which imports this module

    made_for: dict[str, str] = {}
    function = ring_attention(lowered.function, options.ring_axis, made_for)
    return dataclasses.replace(lowered, function=function, made_for=made_for)


def lower_ops(fn: Function, nda: NDA, sharding: FactorSharding, keep: Sequence[int],
              substitute: Mapping[Value, Value], whole: Collection[Value] = (),
              options: LowerOptions | None = None, sent: Collection[Value] = ()) -> Lowered:
    """The device-local program of the ops `keep` of `fn` alone (indices in
    program order), every parameter kept: an operand made by an op left out
    is read as its stand-in `substitute[v]` stands (an earlier kept value
    lowered the same way); the results are those of `fn` the kept ops make.
    A value in `whole` read with a pending partial sum, or one in `sent` (read
    by an op left out) made with one, raises LoweringError.
    `ir.pipeline_fold` prices a pipeline from its distinct stages so."""
    if nda.function is not fn:
        raise LoweringError("the NDA was computed for a different function")
    return _Lowering(fn, nda, sharding, options or LowerOptions()).run(keep, substitute, whole, sent)

