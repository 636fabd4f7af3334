"""Handlers of the ops most programs are made of: arithmetic, constants,
layout (broadcast, transpose, reshape, slice, concatenate, pad), compare,
select, convert, iota, dot_general and single-operand reductions."""

from __future__ import annotations

import re
import struct

import numpy as np

from ir.core import DTYPES, FLOAT_DTYPES, TensorType, Value
from ir.interpret import numpy_dtype
from ir.opset.reduction import identity
from ir.stablehlo.importer import KNOWN_LIMIT, Importer, Scope, handles, region_combiner
from ir.stablehlo.indexing import multi_operand_reduce
from ir.stablehlo.reader import VALUE, Stmt

UNARY = {"negate": "neg", "exponential": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
         "logistic": "logistic"}
BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max",
          "minimum": "min", "power": "pow"}
# A reduction's combiner region (or `applies`) -> our combiner and the binary op it is.
COMBINERS = {"add": ("sum", "add"), "maximum": ("max", "max"), "minimum": ("min", "min"), "and": ("and", "and"),
             "or": ("or", "or")}


def elementwise(kind: str):
    def handler(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
        return [imp.checked(stmt, scope, kind, imp.args(stmt, scope))]

    return handler


for _name, _kind in {**UNARY, **BINARY}.items():
    handles(f"stablehlo.{_name}")(elementwise(_kind))


# ---------------------------------------------------------------- constants


def parse_literal(text: str, ty: TensorType) -> np.ndarray:
    """The elements of a `dense<...>` body of type `ty`, flat: one element
    for a splat, else all of them. Three spellings: a scalar, a nested list,
    or a hex string of the raw little-endian bytes (how jax prints larger
    constants)."""
    text = text.strip()
    dtype = numpy_dtype(ty.dtype)
    if text.startswith('"0x'):
        raw = bytes.fromhex(text.strip('"')[2:])
        if ty.dtype == "bf16":
            values = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))
    elif text.startswith("["):
        values = np.array([_scalar(v, ty.dtype) for v in re.findall(r"[^\[\],\s]+", text)], dtype)
    else:
        values = np.array([_scalar(text, ty.dtype)], dtype)
    if values.size not in (1, ty.num_elements):
        raise ValueError(f"{values.size} elements given for {ty}")
    return values.astype(dtype)


def _little_endian(flat: np.ndarray, dtype: str) -> bytes:
    if dtype == "bf16":  # executed in float32: its top half is the bf16
        return (flat.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return flat.astype(flat.dtype.newbyteorder("<")).tobytes()


def _scalar(text: str, dtype: str) -> float | int | bool:
    """A scalar literal: decimal, hex bit pattern (0x7F800000 is inf), true/false."""
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("0x"):
        bits = int(text, 16)
        if dtype in ("f32", "bf16"):
            return struct.unpack("<f", struct.pack("<I", bits << 16 if dtype == "bf16" else bits))[0]
        if dtype == "f16":
            return struct.unpack("<e", struct.pack("<H", bits))[0]
        if dtype == "f64":
            return struct.unpack("<d", struct.pack("<Q", bits))[0]
        return bits
    return float(text) if dtype in FLOAT_DTYPES else int(text)


@handles("stablehlo.constant")
def constant(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    m = re.match(r"dense<(.*)>\s*$", stmt.rest.rsplit(" : ", 1)[0].strip())
    if m is None:
        raise imp.error(stmt, "stablehlo.constant: expected dense<...>")
    try:
        flat = parse_literal(m.group(1), want)
    except (ValueError, OverflowError) as err:
        raise imp.error(stmt, f"stablehlo.constant: cannot read {m.group(1)[:60]!r} as {want}: {err}") from None
    splat = flat.size == 1 or bool((flat == flat[0]).all()) or bool(np.isnan(flat.astype(float)).all())
    if splat:
        value = imp.checked(stmt, scope, "full", [], shape=list(want.shape), dtype=want.dtype, value=flat[0].item())
    elif flat.size > KNOWN_LIMIT:  # kept as bytes: a tuple of millions of Python numbers would not do
        value = imp.checked(stmt, scope, "constant", [], shape=list(want.shape), dtype=want.dtype,
                            data="0x" + _little_endian(flat, want.dtype).hex().upper())
    else:
        value = imp.checked(stmt, scope, "constant", [], shape=list(want.shape), dtype=want.dtype,
                            value=[v.item() for v in flat])
    if want.num_elements <= KNOWN_LIMIT:
        imp.known[id(value)] = np.broadcast_to(flat, want.num_elements).reshape(want.shape).copy()
    return [value]


# ---------------------------------------------------------------- layout


@handles("stablehlo.broadcast_in_dim")
def broadcast_in_dim(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    return [imp.checked(stmt, scope, "broadcast_in_dim", imp.args(stmt, scope), shape=list(want.shape),
                        dims=imp.ints(stmt, "dims"))]


@handles("stablehlo.transpose")
def transpose(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    return [imp.checked(stmt, scope, "transpose", imp.args(stmt, scope), perm=imp.ints(stmt, "dims"))]


@handles("stablehlo.reshape")
def reshape(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    return [imp.checked(stmt, scope, "reshape", imp.args(stmt, scope), shape=list(want.shape))]


@handles("stablehlo.convert")
def convert(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    return [imp.checked(stmt, scope, "convert", imp.args(stmt, scope), dtype=want.dtype)]


@handles("stablehlo.iota")
def iota(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    (want,) = imp.declared(stmt)
    return [imp.checked(stmt, scope, "iota", [], shape=list(want.shape), dtype=want.dtype,
                        dimension=imp.int_attr(stmt, "dim"))]


@handles("stablehlo.compare")
def compare(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    m = re.match(r"(EQ|NE|LT|LE|GT|GE)\s*,", stmt.rest)
    if m is None:
        raise imp.error(stmt, "stablehlo.compare: expected a direction EQ, NE, LT, LE, GT or GE")
    return [imp.checked(stmt, scope, "compare", imp.args(stmt, scope), direction=m.group(1).lower())]


@handles("stablehlo.select")
def select(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    pred, on_true, on_false = _arity(imp, stmt, imp.args(stmt, scope), 3)
    if pred.type.rank == 0 and on_true.type.rank > 0:  # a scalar predicate picks a whole tensor
        pred = imp.op("broadcast_in_dim", [pred], shape=list(on_true.type.shape), dims=[])
    return [imp.checked(stmt, scope, "select", [pred, on_true, on_false])]


@handles("stablehlo.slice")
def slice_(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    m = re.search(r"\[([^\]]*)\]", stmt.rest.split(" : ")[0])
    if m is None:
        raise imp.error(stmt, "stablehlo.slice: expected [start:limit(:stride), ...]")
    start, limit, stride = [], [], []
    for part in m.group(1).split(","):
        bounds = [int(v) for v in part.split(":")]
        if len(bounds) not in (2, 3):
            raise imp.error(stmt, f"stablehlo.slice: cannot read {part.strip()!r} as start:limit(:stride)")
        start.append(bounds[0])
        limit.append(bounds[1])
        stride.append(bounds[2] if len(bounds) > 2 else 1)
    args = _arity(imp, stmt, imp.args(stmt, scope, stmt.rest.split("[")[0]), 1)
    return [imp.checked(stmt, scope, "slice", args, start=start, limit=limit, stride=stride)]


@handles("stablehlo.concatenate")
def concatenate(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    return [imp.checked(stmt, scope, "concatenate", imp.args(stmt, scope), dim=imp.int_attr(stmt, "dim"))]


@handles("stablehlo.pad")
def pad(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    """Our `pad` pads with zeros; another padding value is selected in
    where a padded mask of ones is false (exact for any value, -inf too)."""
    x, fill = _arity(imp, stmt, imp.args(stmt, scope), 2)
    low, high, interior = (imp.ints(stmt, k) for k in ("low", "high", "interior"))
    if any(v < 0 for v in low + high):
        raise imp.error(stmt, "stablehlo.pad: negative padding (cropping) is not supported")
    known = imp.known.get(id(fill))
    if known is not None and not np.any(known):
        return [imp.checked(stmt, scope, "pad", [x], low=low, high=high, interior=interior)]
    (want,) = imp.declared(stmt)
    padded = imp.op("pad", [x], low=low, high=high, interior=interior)
    ones = imp.op("full", [], shape=list(x.type.shape), dtype="bool", value=True)
    inside = imp.op("pad", [ones], low=low, high=high, interior=interior)
    outside = imp.op("broadcast_in_dim", [fill], shape=list(want.shape), dims=[])
    return [imp.checked(stmt, scope, "select", [inside, padded, outside])]


# ---------------------------------------------------------------- contraction and reduction


@handles("stablehlo.dot_general")
def dot_general(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    head = stmt.rest.split(" : ")[0]
    a, b = _arity(imp, stmt, imp.args(stmt, scope), 2)

    def pair(key: str) -> list[list[int]]:
        m = re.search(rf"{key}\s*=\s*\[([^\]]*)\]\s*x\s*\[([^\]]*)\]", head)
        if m is None:
            return [[], []]
        return [[int(v) for v in side.split(",") if v.strip()] for side in m.groups()]

    (want,) = imp.declared(stmt)
    if a.type.dtype != b.type.dtype:
        a, b = _common_precision(imp, stmt, a, b)
    out = imp.checked(stmt, scope, "dot_general", [a, b], contract=pair("contracting_dims"),
                      batch=pair("batching_dims")) if a.type.dtype == want.dtype else None
    if out is None:  # preferred_element_type: computed in the operands' type, then converted
        out = imp.op("dot_general", [a, b], contract=pair("contracting_dims"), batch=pair("batching_dims"))
        out = imp.checked(stmt, scope, "convert", [out], dtype=want.dtype)
    return [out]


def _common_precision(imp: Importer, stmt: Stmt, a: Value, b: Value) -> tuple[Value, Value]:
    """Operands of two dtypes (jax's attention multiplies f32 probabilities by
    bf16 values) in one: the precision the statement's `algorithm` names for
    its inputs (`lhs_precision_type = bf16`: XLA rounds the operand to it),
    else the wider of the two. The products run at that dtype's rate."""
    named = re.search(r"lhs_precision_type\s*=\s*(\w+)\s*,\s*rhs_precision_type\s*=\s*(\w+)", stmt.rest)
    if named and named.group(1) == named.group(2) and named.group(1) in DTYPES:
        dtype = named.group(1)
    else:
        dtype = max((a.type.dtype, b.type.dtype), key=lambda d: TensorType((), d).num_bytes)
    return tuple(x if x.type.dtype == dtype else imp.op("convert", [x], dtype=dtype) for x in (a, b))


def reduction_combiner(imp: Importer, stmt: Stmt, text: str) -> tuple[str, str]:
    """(our combiner, the binary op kind) of a reduction statement."""
    applies = re.search(r"applies\s+stablehlo\.(\w+)", text)
    name = applies.group(1) if applies else region_combiner(imp, stmt)
    if name not in COMBINERS:
        raise imp.error(stmt, f"{stmt.op}: combiner stablehlo.{name} is not supported; "
                        f"supported: {', '.join('stablehlo.' + c for c in COMBINERS)}")
    return COMBINERS[name]


@handles("stablehlo.reduce")
def reduce(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    pairs = re.findall(r"\((" + VALUE + r")\s+init:\s*(" + VALUE + r")\)", stmt.rest.split(" across ")[0]
                       .split(" applies ")[0])
    if not pairs:
        raise imp.error(stmt, "stablehlo.reduce: expected (%x init: %c)")
    if len(pairs) > 1:  # argmax and argmin: a (value, index) pair per element
        return multi_operand_reduce(imp, stmt, scope, pairs)
    x, init = (scope.get(n, imp, stmt) for n in pairs[0])
    combiner, binary = reduction_combiner(imp, stmt, stmt.rest)
    dims = imp.ints(stmt, "dimensions")
    start = imp.known.get(id(init))
    if start is not None and start.size == 1 and is_identity(start.item(), combiner, x.type.dtype):
        return [imp.checked(stmt, scope, "reduce", [x], dims=dims, combiner=combiner)]
    # A non-identity init joins the reduction once, as the combiner of the result and the init.
    (want,) = imp.declared(stmt)
    reduced = imp.op("reduce", [x], dims=dims, combiner=combiner)
    spread = imp.op("broadcast_in_dim", [init], shape=list(want.shape), dims=[])
    return [imp.checked(stmt, scope, binary, [reduced, spread])]


def is_identity(value: float | int | bool, combiner: str, dtype: str) -> bool:
    """Whether a reduction's init is its combiner's identity (then it adds nothing)."""
    return bool(np.asarray(value).astype(numpy_dtype(dtype)) == identity(combiner, np.dtype(numpy_dtype(dtype))))


def _arity(imp: Importer, stmt: Stmt, values: list[Value], n: int) -> list[Value]:
    if len(values) != n:
        raise imp.error(stmt, f"{stmt.op}: expected {n} operand(s), found {len(values)}")
    return values
