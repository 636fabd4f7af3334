"""The op registry's records and queries: `OpDef` (one per op kind, holding
everything about it), factor rules, attribute schemas, `register`, and the
queries every other module uses (`get`, `make_op`, `infer_results`,
`factor_rule`, `op_cost`, `verify`). The op kinds themselves live in
`ir/opset/`, which imports this module; `ir.ops` imports both, so importing
`ir.ops` registers every kind and the import graph has no cycle."""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ir.core import (
    DTYPES,
    Attrs,
    AttrValue,
    Function,
    IRError,
    Mesh,
    Op,
    TensorType,
    Value,
    VerifyError,
    check_name,
    define,
    freeze_attr,
    verify_op,
)


class OpError(IRError):
    """An op is used wrongly: unknown kind, wrong arity, bad attribute, bad types."""


# --------------------------------------------------------------------------
# Factor rules


class FactorKind(enum.Enum):
    """What sharding a factor means for the op that owns it."""

    PARALLEL = "parallel"  # in operands and results: shard all of them, compute locally
    REDUCTION = "reduction"  # operands only: local results are partial, combine them
    BROADCAST = "broadcast"  # results only: each device computes its own slice
    OPAQUE = "opaque"  # must be whole at this op (a sliced or concatenated dim)


@dataclass(frozen=True, slots=True)
class Factor:
    name: str
    size: int
    kind: FactorKind
    combiner: str | None = None  # "sum" | "max" | "min" for reductions


# A dimension maps to a tuple of factor indices, major to minor. Almost always
# one; a reshape that splits or merges dimensions gives a merged dimension
# several factors (`[6] -> [2, 3]`: the operand's dim is (a, b)).
DimFactors = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FactorRule:
    factors: tuple[Factor, ...]
    operands: tuple[tuple[DimFactors, ...], ...]
    results: tuple[tuple[DimFactors, ...], ...]

    @staticmethod
    def build(
        operand_types: Sequence[TensorType],
        result_types: Sequence[TensorType],
        operand_dims: Sequence[Sequence[str | tuple[str, ...]]],
        result_dims: Sequence[Sequence[str | tuple[str, ...]]],
        *,
        combiners: Mapping[str, str] | None = None,
        opaque: Sequence[str] = (),
        sizes: Mapping[str, int] | None = None,
    ) -> FactorRule:
        """Build a rule from factor names per dimension, einsum style.

        Kinds are derived: named in `combiners` -> reduction; in `opaque` ->
        opaque; else in operands and results -> parallel; results only ->
        broadcast. Factor sizes come from single-factor dimensions (or
        `sizes` for split/merged ones) and are cross-checked against every
        dimension they appear in, so a wrong rule fails at once.
        """
        combiners = dict(combiners or {})
        operands = _factor_names(operand_types, operand_dims)
        results = _factor_names(result_types, result_dims)
        order = list(dict.fromkeys(n for spec in operands + results for dim in spec for n in dim))
        known = _factor_sizes(list(operand_types) + list(result_types), operands + results, dict(sizes or {}))
        in_operands = {n for spec in operands for dim in spec for n in dim}
        in_results = {n for spec in results for dim in spec for n in dim}

        def kind_of(n: str) -> FactorKind:
            if n in combiners:
                if n in in_results:
                    raise AssertionError(f"reduction factor {n} appears in a result")
                return FactorKind.REDUCTION
            if n in opaque:
                return FactorKind.OPAQUE
            if n in in_results:
                return FactorKind.PARALLEL if n in in_operands else FactorKind.BROADCAST
            raise AssertionError(f"factor {n} appears only in operands but is no reduction")

        index = {n: i for i, n in enumerate(order)}

        def encode(specs: list) -> tuple:
            return tuple(tuple(tuple(index[n] for n in dim) for dim in spec) for spec in specs)

        factors = tuple(Factor(n, known[n], kind_of(n), combiners.get(n)) for n in order)
        return FactorRule(factors, encode(operands), encode(results))

    def __str__(self) -> str:
        """Einsum form: `(m0,k0),(k0,n0)->(m0,n0) {k0:sum}`; a multi-factor dim prints as `[a*b]`."""

        def dim(d: DimFactors) -> str:
            names = [self.factors[i].name for i in d]
            return names[0] if len(names) == 1 else "[" + "*".join(names) + "]"

        def tensors(ts: tuple) -> str:
            return ",".join("(" + ",".join(dim(d) for d in t) + ")" for t in ts)

        notes = [
            f"{f.name}:{f.combiner if f.kind is FactorKind.REDUCTION else f.kind.value}"
            for f in self.factors
            if f.kind is not FactorKind.PARALLEL
        ]
        text = f"{tensors(self.operands)}->{tensors(self.results)}"
        return text + (" {" + ", ".join(notes) + "}" if notes else "")


def _factor_names(types: Sequence[TensorType], dims_list: Sequence) -> list[list[tuple[str, ...]]]:
    """Normalize per-dim factor names (a name or a tuple of names) to tuples."""
    if len(types) != len(dims_list):
        raise AssertionError("factor rule: one dims list per tensor")
    out = []
    for ty, dims in zip(types, dims_list):
        if len(dims) != ty.rank:
            raise AssertionError(f"factor rule: {len(dims)} dims given for {ty}")
        out.append([(d,) if isinstance(d, str) else tuple(d) for d in dims])
    return out


def _factor_sizes(types: list[TensorType], specs: list, sizes: dict[str, int]) -> dict[str, int]:
    """Sizes from single-factor dims, checked against every dim's product."""
    for ty, spec in zip(types, specs):
        for size, names in zip(ty.shape, spec):
            if len(names) == 1:
                sizes.setdefault(names[0], size)
    for ty, spec in zip(types, specs):
        for size, names in zip(ty.shape, spec):
            if math.prod(sizes[n] for n in names) != size:
                raise AssertionError(f"factor sizes of {names} do not multiply to {size} in {ty}")
    return sizes


def dim_names(prefix: str, rank: int) -> list[str]:
    """Factor names for the dims of a tensor: d0, d1, ... (prefix + index)."""
    return [f"{prefix}{i}" for i in range(rank)]


# --------------------------------------------------------------------------
# Attributes


REQUIRED = object()


@dataclass(frozen=True, slots=True)
class AttrSpec:
    name: str
    check: Callable[[Any], AttrValue]  # validate and normalize, raise ValueError
    default: Any = REQUIRED


def attr_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an int, got {v!r}")
    return v


def attr_ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected a list of ints, got {v!r}")
    return tuple(attr_int(x) for x in v)


def attr_int_pair(v: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ValueError(f"expected two lists of ints [[lhs...], [rhs...]], got {v!r}")
    return attr_ints(v[0]), attr_ints(v[1])


def attr_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def attr_number(v: Any) -> int | float | bool:
    if not isinstance(v, (int, float, bool)):
        raise ValueError(f"expected a number, got {v!r}")
    return v


def attr_numbers(v: Any) -> tuple:
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected a list of numbers, got {v!r}")
    return tuple(attr_number(x) for x in v)


def attr_axes(v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(a, str) for a in v):
        raise ValueError(f"expected a non-empty list of mesh axis names, got {v!r}")
    if len(set(v)) != len(v):
        raise ValueError(f"mesh axes must be distinct, got {list(v)}")
    return tuple(v)


def attr_choice(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v

    return check


attr_dtype = attr_choice(*DTYPES)


# --------------------------------------------------------------------------
# The registry


@dataclass(frozen=True, slots=True)
class OpCost:
    flops: int
    bytes: int


Types = tuple[TensorType, ...]
InferFn = Callable[[Types, Attrs, Mesh], Types]
FactorFn = Callable[[Types, Types, Attrs], FactorRule]
CostFn = Callable[[Types, Types, Attrs], OpCost]
ImplFn = Callable[[Sequence[np.ndarray], Attrs], tuple[np.ndarray, ...]]
SpmdImplFn = Callable[[list[tuple[np.ndarray, ...]], Attrs, Mesh], list[tuple[np.ndarray, ...]]]
LocalizeFn = Callable[[Attrs, Types, Types], Attrs]


def keep_attrs(attrs: Attrs, local_operands: Types, local_results: Types) -> Attrs:
    return attrs


@dataclass(frozen=True, slots=True)
class OpDef:
    """Everything about one op kind. See the module docstring."""

    name: str
    family: str
    arity: int | None  # None: variadic, at least one operand
    attrs: tuple[AttrSpec, ...]
    infer: InferFn
    factors: FactorFn
    cost: CostFn
    impl: ImplFn | None = None
    spmd_impl: SpmdImplFn | None = None
    localize: LocalizeFn = keep_attrs
    vjp: Callable | None = None
    doc: str = ""

    @property
    def is_collective(self) -> bool:
        return self.spmd_impl is not None


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in REGISTRY:
        raise AssertionError(f"op kind {opdef.name!r} registered twice")
    if (opdef.impl is None) == (opdef.spmd_impl is None):
        raise AssertionError(f"op kind {opdef.name!r} needs exactly one of impl and spmd_impl")
    REGISTRY[opdef.name] = opdef
    _inferred.cache_clear()
    _factor_rule.cache_clear()
    _normal_attrs.cache_clear()
    return opdef


def get(kind: str) -> OpDef:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise OpError(f"unknown op {kind!r}; known ops: {', '.join(sorted(REGISTRY))}") from None


def normalize_attrs(kind: str, attrs: Mapping[str, Any] | Attrs | None) -> Attrs:
    """Validate attributes against the kind's schema and fill defaults."""
    if isinstance(attrs, Attrs):  # hashable: a program's many ops of one kind share a few
        return _normal_attrs(kind, attrs)
    return _normalize(kind, attrs)


@functools.lru_cache(maxsize=1 << 16)
def _normal_attrs(kind: str, attrs: Attrs) -> Attrs:
    return _normalize(kind, attrs)


def _normalize(kind: str, attrs: Mapping[str, Any] | Attrs | None) -> Attrs:
    opdef = get(kind)
    given = attrs.as_dict() if isinstance(attrs, Attrs) else dict(attrs or {})
    schema = {s.name: s for s in opdef.attrs}
    unknown = sorted(set(given) - set(schema))
    if unknown:
        allowed = ", ".join(schema) or "none"
        raise OpError(f"{kind}: unknown attribute {unknown[0]!r} (allowed: {allowed})")
    out: dict[str, AttrValue] = {}
    for spec in opdef.attrs:
        if spec.name in given:
            try:
                out[spec.name] = spec.check(freeze_attr(given[spec.name]))
            except (ValueError, IRError) as err:
                raise OpError(f"{kind}: attribute {spec.name!r}: {err}") from None
        elif spec.default is REQUIRED:
            raise OpError(f"{kind}: missing required attribute {spec.name!r}")
        else:
            out[spec.name] = freeze_attr(spec.default)
    return Attrs.of(out)


NO_MESH = Mesh()


def infer_results(kind: str, operand_types: Types, attrs: Attrs, mesh: Mesh = NO_MESH) -> Types:
    """Result types of `kind` on these operands; raises OpError naming the problem."""
    opdef = get(kind)
    if opdef.arity is None:
        if not operand_types:
            raise OpError(f"{kind} takes at least one operand, got none")
    elif len(operand_types) != opdef.arity:
        raise OpError(f"{kind} takes {opdef.arity} operand(s), got {len(operand_types)}")
    if normalize_attrs(kind, attrs) != attrs:
        raise OpError(f"{kind}: attributes {dict(attrs.items)} are not in normal form")
    return opdef.infer(operand_types, attrs, mesh)


def make_op(
    kind: str,
    operands: Sequence[Value],
    attrs: Mapping[str, Any] | Attrs | None = None,
    result_names: Sequence[str] = (),
    mesh: Mesh = NO_MESH,
) -> Op:
    """Create an op with normalized attributes and inferred result types."""
    norm = normalize_attrs(kind, attrs)
    operand_types = tuple(v.type for v in operands)
    types = _inferred(kind, operand_types, norm, mesh)
    if len(result_names) != len(types):
        raise OpError(f"{kind} has {len(types)} result(s), {len(result_names)} name(s) given")
    results = tuple(Value(n, t) for n, t in zip(result_names, types))
    return Op(kind, tuple(operands), results, norm)


def verify(fn: Function, types: bool = True, inferred: Container[int] = ()) -> Function:
    """Check SSA, straight-line order and types; return `fn` or raise VerifyError.

    Types are checked by re-running each op kind's shape rule from the
    registry, so the verifier and shape inference can never disagree.
    `types=False`: SSA and order alone, for a function cut from ops whose
    types and names were checked where they were made (a pipeline's tasks,
    `ir.pipeline`: re-inferring them was a sixteenth of a 1,536-device
    mesh search); so too for the ops whose ids are in `inferred` (made by
    `make_op`: a `Builder`'s). The ops are then looked at one by one
    (`verify_op`) only to name what is wrong.
    """
    check_name(fn.name, "function")
    defined: dict[str, Value] = {}
    for p in fn.params:
        define(defined, p, f"parameter of @{fn.name}")
    for index, op in enumerate(fn.ops):
        typed = types and id(op) not in inferred
        if typed or not _defines(op, defined):
            verify_op(op, defined, fn.mesh, index, _inferred if typed else None)
    for r in fn.results:
        if defined.get(r.name) is not r:
            raise VerifyError(f"@{fn.name} returns %{r.name}, which is not defined in the function")
    return fn


def _defines(op: Op, defined: dict[str, Value]) -> bool:
    """Define the op's results if its operands are the values defined under
    their names and its results' names are new; else False, nothing defined."""
    for operand in op.operands:
        if defined.get(operand.name) is not operand:
            return False
    results = op.results
    if len(results) == 1:  # nearly every op: no generator and set for one name (a verify runs per build)
        if results[0].name in defined:
            return False
    elif any(r.name in defined for r in results) or len({r.name for r in results}) != len(results):
        return False
    for r in results:
        defined[r.name] = r
    return True


# An op's result types and factor rule follow from its kind, operand types and attributes alone,
# and a program of repeated layers has few distinct such ops: both are memoized (and forgotten
# when a kind is registered again).
@functools.lru_cache(maxsize=1 << 16)
def _inferred(kind: str, operand_types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    return infer_results(kind, operand_types, attrs, mesh)


@functools.lru_cache(maxsize=1 << 16)
def _factor_rule(kind: str, operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    return get(kind).factors(operand_types, result_types, attrs)


def factor_rule(op: Op) -> FactorRule:
    return _factor_rule(op.kind, tuple(v.type for v in op.operands), tuple(v.type for v in op.results), op.attrs)


def op_cost(op: Op) -> OpCost:
    opdef = get(op.kind)
    return opdef.cost(tuple(v.type for v in op.operands), tuple(v.type for v in op.results), op.attrs)


def io_bytes(operand_types: Types, result_types: Types) -> int:
    """Bytes read plus bytes written, the default memory traffic of an op."""
    return sum(t.num_bytes for t in operand_types) + sum(t.num_bytes for t in result_types)


def require(cond: bool, message: str) -> None:
    """Shape-rule check: raise OpError(message) when `cond` is false."""
    if not cond:
        raise OpError(message)


def check_dim(kind: str, dim: int, rank: int, what: str = "dimension") -> None:
    require(0 <= dim < rank, f"{kind}: {what} {dim} out of range for rank {rank}")


def local_shape_attrs(attrs: Attrs, local_operands: Types, local_results: Types) -> Attrs:
    """Localize ops whose `shape` attribute spells out their result shape."""
    return attrs.replace(shape=local_results[0].shape)
