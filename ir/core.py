"""Core IR objects: tensor types, values, ops, functions, and the verifier.

Everything here is a small frozen dataclass. A `Function` is SSA and
straight-line: every value is defined once (as a parameter or an op result)
before it is used, and there is no control flow (layers are unrolled).

A `Value` compares by identity, so it can key dictionaries during rewrites
even when two functions reuse a name. Structural equality of whole functions
(what `parse(print(fn)) == fn` needs) is `Function.__eq__`, which compares
values by name and type.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Integer types beyond i32 come from real programs: jax's PRNG works on u32
# (u64 with x64), gathers index with i64, quantized models use i8 and u8.
DTYPES: tuple[str, ...] = ("f32", "bf16", "f16", "f64", "i8", "i32", "i64", "u8", "u32", "u64", "bool")
FLOAT_DTYPES: frozenset[str] = frozenset({"f32", "bf16", "f16", "f64"})
INT_DTYPES: frozenset[str] = frozenset({"i8", "i32", "i64", "u8", "u32", "u64"})
DTYPE_BYTES: Mapping[str, int] = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "i8": 1, "i32": 4, "i64": 8, "u8": 1,
                                  "u32": 4, "u64": 8, "bool": 1}
# numpy has no bfloat16: the reference executor computes bf16 in float32. It
# checks program semantics, not rounding behaviour.
NUMPY_DTYPES: Mapping[str, Any] = {
    "f32": np.float32, "bf16": np.float32, "f16": np.float16, "f64": np.float64, "i8": np.int8, "i32": np.int32,
    "i64": np.int64, "u8": np.uint8, "u32": np.uint32, "u64": np.uint64, "bool": np.bool_,
}

# Value and function names: hierarchical parameter names such as
# `layers.3.attn.wq` or `opt.m.w1` must survive the text form unquoted.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


class IRError(Exception):
    """Base of every error about a malformed program (the CLI prints these)."""


class VerifyError(IRError):
    """A Function breaks an IR invariant; the message names the value and op."""


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise IRError(
            f"invalid {what} name {name!r}: use letters, digits, '_', '.', '-' "
            "(not starting with '.' or '-')"
        )
    return name


@dataclass(frozen=True, slots=True)
class TensorType:
    """A ranked tensor type: static shape and element dtype."""

    shape: tuple[int, ...]
    dtype: str
    # Made once: pricing a plan at scale reads a type's bytes and hashes it millions of times.
    num_elements: int = field(init=False, repr=False, compare=False)
    num_bytes: int = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise IRError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in self.shape):
            raise IRError(f"invalid shape {self.shape!r}: dimensions must be non-negative ints")
        elements = math.prod(self.shape)
        object.__setattr__(self, "num_elements", elements)
        object.__setattr__(self, "num_bytes", elements * DTYPE_BYTES[self.dtype])
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"


def tensor(shape: tuple[int, ...] | list[int], dtype: str = "f32") -> TensorType:
    """Shorthand constructor: `tensor([4, 8])` is `tensor<4x8xf32>`."""
    return TensorType(tuple(shape), dtype)


@dataclass(frozen=True, slots=True, eq=False)
class Value:
    """An SSA value. Compares and hashes by identity."""

    name: str
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


AttrValue = Any  # int | float | bool | str | tuple[AttrValue, ...]


def freeze_attr(value: Any) -> AttrValue:
    """Turn lists into tuples, recursively, so attribute values are hashable."""
    return _frozen(value, [])


def _frozen(value: Any, spelled: list) -> AttrValue:
    """`freeze_attr`, noting in `spelled` a float or bool met (`Attrs.spellings`)."""
    kind = type(value)
    if kind is int or kind is str:
        return value
    if kind is tuple or kind is list:
        return tuple([_frozen(v, spelled) for v in value])
    if kind is float or kind is bool:
        spelled.append(kind)
        return value
    if isinstance(value, (list, tuple)):
        return tuple([_frozen(v, spelled) for v in value])
    if isinstance(value, np.generic) and not isinstance(value, np.str_):
        return _frozen(value.item(), spelled)  # numpy scalars (shapes computed with numpy) become Python numbers
    if isinstance(value, bool | float):
        spelled.append(float)
        return value
    if isinstance(value, (int, str)):
        return value
    raise IRError(f"unsupported attribute value {value!r} of type {type(value).__name__}")


def _spelling(value: AttrValue) -> Any:
    """What tells an attribute value from an equal one spelled otherwise
    (1, 1.0 and True are equal, and hash alike): None for ints and strings
    (and tuples of ints), which no other spelling equals; else the types."""
    kind = type(value)
    if kind is int or kind is str:
        return None
    if kind is tuple:
        inner = tuple(map(_spelling, value))
        return None if inner.count(None) == len(inner) else inner
    return kind.__name__


@dataclass(frozen=True, slots=True)
class Attrs:
    """An immutable attribute mapping, stored as key-sorted pairs. Equal
    where the values are equal and spelled alike: the op registry memoizes
    by attributes (`ir.opdef`), and a float 1.0 or a True must not come
    back as another op's 1."""

    items: tuple[tuple[str, AttrValue], ...] = ()
    spellings: tuple[tuple[str, Any], ...] = field(default=(), repr=False)  # per item not all ints or strings

    @staticmethod
    def of(mapping: Mapping[str, Any] | None = None) -> Attrs:
        mapping = mapping or {}
        spelled: list = []
        items = tuple(sorted((k, _frozen(v, spelled)) for k, v in mapping.items()))
        if not spelled:  # ints and strings alone: no other spelling equals them
            return Attrs(items)
        return Attrs(items, tuple((k, s) for k, v in items if (s := _spelling(v)) is not None))

    def __getitem__(self, key: str) -> AttrValue:
        for k, v in self.items:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> AttrValue:
        for k, v in self.items:
            if k == key:
                return v
        return default

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self.items)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.items)

    def replace(self, **changes: Any) -> Attrs:
        merged = dict(self.items)
        merged.update(changes)
        return Attrs.of(merged)

    def as_dict(self) -> dict[str, AttrValue]:
        return dict(self.items)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: `results = kind(operands) {attrs}`."""

    kind: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: Attrs = Attrs()

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise IRError(f"op {self.kind} has {len(self.results)} results, not one")
        return self.results[0]

    def describe(self) -> str:
        lhs = ", ".join(f"%{r.name}" for r in self.results)
        rhs = ", ".join(f"%{o.name}" for o in self.operands)
        return f"'{lhs} = {self.kind}({rhs})'"


@dataclass(frozen=True, slots=True)
class Mesh:
    """A named device mesh, e.g. `Mesh.of(batch=4, model=2)`; axes major to minor."""

    axes: tuple[tuple[str, int], ...] = ()
    # Derived once: a search asks an axis's size millions of times.
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False, hash=False)
    _sizes: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_names", tuple(n for n, _ in self.axes))
        object.__setattr__(self, "_sizes", dict(self.axes))  # private: never handed out

    @staticmethod
    def of(**axes: int) -> Mesh:
        return Mesh.from_pairs(axes.items())

    @staticmethod
    def from_pairs(pairs: Any) -> Mesh:
        mesh = Mesh(tuple((str(n), int(s)) for n, s in pairs))
        names = [n for n, _ in mesh.axes]
        if len(set(names)) != len(names):
            raise IRError(f"mesh axis names must be distinct, got {names}")
        for name, size in mesh.axes:
            check_name(name, "mesh axis")
            if size < 1:
                raise IRError(f"mesh axis {name!r} must have size >= 1, got {size}")
        return mesh

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def num_devices(self) -> int:
        return math.prod(s for _, s in self.axes)

    def axis_index(self, axis: str) -> int:
        if axis not in self.names:
            raise IRError(f"unknown mesh axis {axis!r}; mesh axes are {list(self.names) or 'none'}")
        return self.names.index(axis)

    def size(self, axis: str) -> int:
        if axis not in self._sizes:
            self.axis_index(axis)  # raises, naming the mesh's axes
        return self._sizes[axis]

    def group_size(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.size(a) for a in axes)

    def ordered(self, axes: Any) -> tuple[str, ...]:
        """The given axes (any iterable) in mesh order, major to minor."""
        chosen = set(axes)
        return tuple(n for n in self.names if n in chosen)

    def __bool__(self) -> bool:
        return bool(self.axes)

    def device_coords(self) -> list[tuple[int, ...]]:
        """Mesh coordinates of every device; device ids number them row-major."""
        return list(itertools.product(*(range(s) for _, s in self.axes)))

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Device ids of each collective group over `axes`.

        A group holds the devices that agree on every other axis; within a
        group, devices are ordered by their coordinates along `axes` with the
        first listed axis major. Groups come in order of their first device.
        """
        positions = [self.axis_index(a) for a in axes]
        by_key: dict[tuple[int, ...], dict[int, int]] = {}
        for device, coord in enumerate(self.device_coords()):
            key = tuple(c for i, c in enumerate(coord) if i not in positions)
            rank = 0
            for p in positions:
                rank = rank * self.axes[p][1] + coord[p]
            by_key.setdefault(key, {})[rank] = device
        return [[members[r] for r in sorted(members)] for members in by_key.values()]

    def __str__(self) -> str:
        return "mesh<" + ", ".join(f"{n}={s}" for n, s in self.axes) + ">"


@dataclass(frozen=True, slots=True, eq=False)
class Function:
    """A straight-line SSA function. `mesh` is empty for global programs and
    names the device mesh for device-local (SPMD) programs."""

    name: str
    params: tuple[Value, ...]
    ops: tuple[Op, ...]
    results: tuple[Value, ...]
    mesh: Mesh = field(default_factory=Mesh)

    def structure(self) -> tuple:
        """A name-based key: equal for structurally identical functions."""

        def val(v: Value) -> tuple:
            return (v.name, v.type)

        return (
            self.name,
            self.mesh,
            tuple(val(p) for p in self.params),
            tuple(
                (op.kind, tuple(val(o) for o in op.operands), tuple(val(r) for r in op.results), op.attrs)
                for op in self.ops
            ),
            tuple(val(r) for r in self.results),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Function):
            return NotImplemented
        return self.structure() == other.structure()

    def __hash__(self) -> int:
        return hash(self.structure())

    def param(self, name: str) -> Value:
        for p in self.params:
            if p.name == name:
                return p
        raise IRError(f"function @{self.name} has no parameter %{name}")

    def values(self) -> Iterator[Value]:
        """Every value defined in the function: parameters, then op results in order."""
        yield from self.params
        for op in self.ops:
            yield from op.results



def producers(fn: Function) -> dict[Value, Op]:
    """Map each op result to the op defining it (parameters are absent)."""
    return {r: op for op in fn.ops for r in op.results}


class Recent:
    """The last `kept` results of a computation, by the identity of the
    objects it reads (held while kept, so an id is not reused) and a
    hashable key: what pricing at scale reads many times of one large
    program (its readers, a plan's sharding, the fold's cut)."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.entries: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, objects: tuple, key: Hashable, make: Callable[[], Any]) -> Any:
        value = self.find(objects, key)
        if value is None:
            value = make()
            self.put(objects, key, value)
        return value

    def find(self, objects: tuple, key: Hashable) -> Any:
        """The result kept for these objects and key, or None."""
        known = self.entries.get((tuple(map(id, objects)), key))
        return known[1] if known is not None and all(a is b for a, b in zip(known[0], objects)) else None

    def put(self, objects: tuple, key: Hashable, value: Any) -> None:
        """Keep `value` (not None) for these objects and key, forgetting the oldest kept past `kept`."""
        full = (tuple(map(id, objects)), key)
        if full not in self.entries and len(self.entries) >= self.kept:
            del self.entries[next(iter(self.entries))]
        self.entries[full] = (objects, value)


_USERS = Recent(2)


def without_dead_ops(fn: Function) -> Function:
    """`fn` without the ops no result depends on (`fn` itself if there are
    none): what an import's unrolled loop or a rewrite left unread."""
    live = set(fn.results)
    kept = []
    for op in reversed(fn.ops):
        if any(r in live for r in op.results):
            kept.append(op)
            live.update(op.operands)
    if len(kept) == len(fn.ops):
        return fn
    return Function(fn.name, fn.params, tuple(reversed(kept)), fn.results, fn.mesh)


def users(fn: Function) -> dict[Value, list[Op]]:
    """Map each value to the ops that use it, in program order (once per op).
    A function does not change, so the map is kept for the last two and
    shared by their callers: read it, do not change it (pricing one plan of
    a large program reads it twice, and a mesh search prices hundreds)."""

    def make() -> dict[Value, list[Op]]:
        out: dict[Value, list[Op]] = {v: [] for v in fn.values()}
        for op in fn.ops:
            for v in dict.fromkeys(op.operands):
                out.setdefault(v, []).append(op)
        return out

    return _USERS.get((fn,), None, make)


def define(defined: dict[str, Value], value: Value, where: str | Callable[[], str]) -> None:
    """Define `value`; `where` names the definition in an error (or makes that name)."""
    check_name(value.name, "value")
    if value.name in defined:
        named = where if isinstance(where, str) else where()
        raise VerifyError(f"value %{value.name} is defined twice (again as {named})")
    defined[value.name] = value


def verify_op(op: Op, defined: dict[str, Value], mesh: Mesh, index: int, infer_results: Any) -> None:
    """Check one op against the values defined so far, then define its
    results; its types against `infer_results` (None: not checked)."""

    def where() -> str:  # only an error prints the op (a large program verifies many)
        return f"op #{index} {op.describe()}"

    for operand in op.operands:
        known = defined.get(operand.name)
        if known is None:
            raise VerifyError(f"value %{operand.name} is used before it is defined, in {where()}")
        if known is not operand:
            raise VerifyError(
                f"value %{operand.name} in {where()} is not the value defined under that name"
            )
    if infer_results is not None:
        try:
            expected = infer_results(op.kind, tuple(o.type for o in op.operands), op.attrs, mesh)
        except IRError as err:
            raise VerifyError(f"{where()}: {err}") from None
        got = tuple(r.type for r in op.results)
        if got != expected:
            shown = ", ".join(map(str, expected))
            actual = ", ".join(map(str, got))
            raise VerifyError(f"type mismatch in {where()}: declared {actual}, but {op.kind} gives {shown}")
    for r in op.results:
        define(defined, r, where)
