"""Import the StableHLO text that `jax.jit(f).lower(*args).as_text()` prints.

    fn = import_stablehlo(text, "step.mlir", param_names=[...])

The module's public `func.func @main` becomes one `Function`; calls to its
private functions are inlined. Each StableHLO op maps to registry ops (most
one to one; an embedding `gather` or its gradient `scatter` to `gather` /
`scatter_add` with a reshape of the index vector), and every result type
the text declares is checked against the type the registry infers, so an
import that type-checks computes what the text says.

Names: parameters are `param_names` when given, else the sanitized
`jax.arg_info` of each argument where jax printed one, else `arg0`,
`arg1`, ...; a result defined by an op of `@main` is named after its
sanitized `jax.result_info` (`result[1]['w1']` -> `result.1.w1`).

The reader is line-based, which is the form jax prints: one op per line,
regions (a reduction's or a scatter's combiner) on the lines that follow.
Anything else is a `StableHLOError` naming the file, the line and, for an
op that has no mapping, the ops that do.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ir.builder import Builder
from ir.core import Function, IRError, TensorType, Value

# StableHLO element types -> ours.
ELEMENT_TYPES = {"f32": "f32", "bf16": "bf16", "f16": "f16", "i32": "i32", "i1": "bool"}
UNARY = {"negate": "neg", "exponential": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
         "logistic": "logistic"}
BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max",
          "minimum": "min", "power": "pow"}
COMBINERS = {"add": "sum", "maximum": "max", "minimum": "min"}
OTHER = ("constant", "broadcast_in_dim", "transpose", "reshape", "convert", "iota", "compare", "select",
         "dot_general", "reduce", "gather", "scatter", "slice", "concatenate", "call")
SUPPORTED = tuple(sorted([f"stablehlo.{k}" for k in (*UNARY, *BINARY, *OTHER) if k != "call"] + ["call"]))

_VALUE = r"%[\w.$-]+(?:#\d+)?"


class StableHLOError(IRError):
    """Text this importer cannot read; the message names the file and line."""


# ------------------------------------------------------------------ reading


@dataclass
class _Stmt:
    """One op: its result names, op name, the text after the op name, the
    lines of its region (if any) and the line it starts on."""

    line: int
    results: list[str]
    op: str
    rest: str
    region: list[_Stmt] = field(default_factory=list)


@dataclass
class _Func:
    name: str
    line: int
    args: list[tuple[str, TensorType, str]]  # (ssa name, type, attributes text)
    results: list[tuple[TensorType, str]]  # (type, attributes text)
    body: list[_Stmt]


def _split_top(text: str, sep: str = ",") -> list[str]:
    """`text` split at `sep` outside brackets and quotes."""
    parts, depth, quote, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quote = not quote
        elif quote:
            continue
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1] == "-"):  # `->` is not a bracket
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + [tail] if tail else parts


def _depth_change(line: str) -> int:
    """Braces opened minus closed on a line, outside quotes."""
    text = re.sub(r'"[^"]*"', "", line)
    return text.count("{") - text.count("}")


class _Reader:
    def __init__(self, text: str, filename: str):
        self.lines = text.splitlines()
        self.filename = filename

    def error(self, line: int, message: str) -> StableHLOError:
        return StableHLOError(f"{self.filename}:{line}: {message}")

    def parse_type(self, text: str, line: int) -> TensorType:
        m = re.fullmatch(r"tensor<((?:\d+x)*)(\w+)>", text.strip())
        if m is None:
            raise self.error(line, f"unsupported type {text.strip()!r}: expected a ranked tensor like tensor<4x8xf32>")
        dims, element = m.groups()
        if element not in ELEMENT_TYPES:
            raise self.error(line, f"unsupported element type {element} in {text.strip()}; "
                             f"supported: {', '.join(ELEMENT_TYPES)}")
        shape = tuple(int(d) for d in dims.split("x") if d)
        return TensorType(shape, ELEMENT_TYPES[element])

    def functions(self) -> dict[str, _Func]:
        out: dict[str, _Func] = {}
        i = 0
        while i < len(self.lines):
            if self.lines[i].lstrip().startswith("func.func"):
                func, i = self.function(i)
                out[func.name] = func
            else:
                i += 1
        if not out:
            raise StableHLOError(f"{self.filename}: no func.func found: expected the text of "
                                 "jax.jit(f).lower(*args).as_text()")
        return out

    def function(self, start: int) -> tuple[_Func, int]:
        header = self.lines[start].strip()
        m = re.match(r"func\.func\s+(?:public\s+|private\s+)?@([\w.$-]+)\((.*)\)\s*->\s*(.*)\{$", header)
        if m is None:
            raise self.error(start + 1, "cannot read this func.func signature")
        name, args_text, results_text = m.groups()
        args = []
        for arg in _split_top(args_text):
            am = re.match(r"(%[\w.$-]+)\s*:\s*(tensor<[^>]*>)\s*(.*)$", arg)
            if am is None:
                raise self.error(start + 1, f"cannot read argument {arg!r}")
            args.append((am.group(1), self.parse_type(am.group(2), start + 1), am.group(3)))
        results_text = results_text.strip()
        if results_text.startswith("(") and results_text.endswith(")"):
            results_text = results_text[1:-1]
        results = []
        for res in _split_top(results_text):
            rm = re.match(r"(tensor<[^>]*>)\s*(.*)$", res)
            if rm is None:
                raise self.error(start + 1, f"cannot read result {res!r}")
            results.append((self.parse_type(rm.group(1), start + 1), rm.group(2)))
        body, end = self.block(start + 1)
        return _Func(name, start + 1, args, results, body), end

    def block(self, i: int) -> tuple[list[_Stmt], int]:
        """Statements from line i up to the `}` closing the enclosing block;
        returns them and the index after that line."""
        stmts: list[_Stmt] = []
        while i < len(self.lines):
            text = self.lines[i].strip()
            if text.startswith("}") and not text.startswith("})"):
                return stmts, i + 1
            if not text:
                i += 1
                continue
            stmt, i = self.statement(i)
            stmts.append(stmt)
        raise self.error(len(self.lines), "unexpected end of text inside a function")

    def statement(self, i: int) -> tuple[_Stmt, int]:
        text = self.lines[i].strip()
        line = i + 1
        results: list[str] = []
        m = re.match(r"((?:%[\w.$-]+(?::\d+)?)(?:\s*,\s*%[\w.$-]+)*)\s*=\s*(.*)$", text)
        if m is not None:
            results = self.result_names(m.group(1))
            text = m.group(2)
        om = re.match(r'"?([\w.]+)"?\s*(.*)$', text)
        if om is None:
            raise self.error(line, f"cannot read {text!r}")
        op, rest = om.groups()
        stmt = _Stmt(line, results, op, rest)
        i += 1
        region_follows = i < len(self.lines) and self.lines[i].strip().startswith("reducer(")
        if _depth_change(self.lines[i - 1]) > 0 or region_follows:
            stmt.region, i = self.region(i, stmt)
        return stmt, i

    def region(self, i: int, stmt: _Stmt) -> tuple[list[_Stmt], int]:
        """The region's statements (after its `^bb0(...)` or `reducer(...) {`
        line), and the rest of the op's text from its closing `})` line."""
        if self.lines[i].strip().startswith("reducer("):
            i += 1
        if self.lines[i].strip().startswith("^bb"):
            i += 1
        body: list[_Stmt] = []
        while i < len(self.lines):
            text = self.lines[i].strip()
            if text.startswith("}"):
                stmt.rest += " " + text.lstrip("})").strip()
                return body, i + 1
            inner, i = self.statement(i)
            body.append(inner)
        raise self.error(stmt.line, "unexpected end of text inside a region")

    @staticmethod
    def result_names(text: str) -> list[str]:
        names = []
        for part in _split_top(text):
            base, _, count = part.partition(":")
            names += [f"{base}#{k}" for k in range(int(count))] if count else [base]
        return names


# ------------------------------------------------------------------ emitting


@dataclass
class _Scope:
    """SSA name -> Value inside one (possibly inlined) function, and the
    names the results of its ops take (only @main's are named)."""

    values: dict[str, Value]
    names: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, reader: _Reader, line: int) -> Value:
        if name not in self.values:
            raise reader.error(line, f"{name} is not defined")
        return self.values[name]


class _Importer:
    def __init__(self, reader: _Reader, funcs: dict[str, _Func], name: str):
        self.reader = reader
        self.funcs = funcs
        self.b = Builder(name)
        self.scalars: dict[int, float] = {}  # id(Value) -> value of a scalar or splat constant
        self.handlers: dict[str, Callable[[_Stmt, _Scope], list[Value]]] = {
            "stablehlo.constant": self.constant, "stablehlo.broadcast_in_dim": self.broadcast_in_dim,
            "stablehlo.transpose": self.transpose, "stablehlo.reshape": self.reshape,
            "stablehlo.convert": self.convert, "stablehlo.iota": self.iota, "stablehlo.compare": self.compare,
            "stablehlo.select": self.select, "stablehlo.dot_general": self.dot_general,
            "stablehlo.reduce": self.reduce, "stablehlo.gather": self.gather, "stablehlo.scatter": self.scatter,
            "stablehlo.slice": self.slice, "stablehlo.concatenate": self.concatenate, "call": self.call,
            "func.call": self.call,
        }

    def error(self, stmt: _Stmt, message: str) -> StableHLOError:
        return self.reader.error(stmt.line, message)

    # -------------------------------------------------------------- driving

    def function(self, func: _Func, args: Sequence[Value], names: dict[str, str] | None = None) -> list[Value]:
        scope = _Scope({name: v for (name, _, _), v in zip(func.args, args)}, names or {})
        for stmt in func.body:
            if stmt.op in ("return", "func.return"):
                return self.args(stmt, scope)
            values = self.emit(stmt, scope)
            if len(values) != len(stmt.results):
                raise self.error(stmt, f"{stmt.op} gives {len(values)} results, the text names {len(stmt.results)}")
            scope.values.update(zip(stmt.results, values))
        raise self.reader.error(func.line, f"@{func.name} has no return")

    def emit(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        kind = stmt.op.removeprefix("stablehlo.")
        if stmt.op.startswith("stablehlo.") and kind in UNARY:
            return [self.checked(stmt, scope, UNARY[kind], self.args(stmt, scope))]
        if stmt.op.startswith("stablehlo.") and kind in BINARY:
            return [self.checked(stmt, scope, BINARY[kind], self.args(stmt, scope))]
        handler = self.handlers.get(stmt.op)
        if handler is None:
            raise self.error(stmt, f"unsupported op {stmt.op}; supported: {', '.join(SUPPORTED)}")
        return handler(stmt, scope)

    # -------------------------------------------------------------- helpers

    @staticmethod
    def operands(text: str) -> list[str]:
        return re.findall(_VALUE, text)

    def args(self, stmt: _Stmt, scope: _Scope, text: str | None = None) -> list[Value]:
        head = stmt.rest.split(" : ")[0] if text is None else text
        return [scope.get(n, self.reader, stmt.line) for n in self.operands(head)]

    def declared(self, stmt: _Stmt) -> list[TensorType]:
        """The result types the text declares: after the last `->`, or the
        single type after ` : `."""
        sig = stmt.rest.rsplit(" : ", 1)[-1]
        out = sig.rsplit("->", 1)[-1].strip()
        if out.startswith("(") and out.endswith(")"):
            out = out[1:-1]
        return [self.reader.parse_type(t, stmt.line) for t in _split_top(out)]

    def checked(self, stmt: _Stmt, scope: _Scope, kind: str, operands: Sequence[Value], **attrs) -> Value:
        """Emit `kind` and check its inferred type against the declared one."""
        want = self.declared(stmt)[-1]
        name = scope.names.get(stmt.results[0]) if stmt.results else None
        try:
            value = self.b.op(kind, list(operands), name, **attrs)
        except IRError as err:
            raise self.error(stmt, f"{stmt.op}: {err}") from err
        if value.type != want:
            raise self.error(stmt, f"{stmt.op}: the text declares {want}, the op gives {value.type}")
        return value

    def ints(self, stmt: _Stmt, key: str, text: str | None = None) -> list[int]:
        m = re.search(rf"{key}\s*=\s*\[([^\]]*)\]", stmt.rest if text is None else text)
        if m is None:
            raise self.error(stmt, f"{stmt.op}: missing {key} = [...]")
        return [int(v) for v in m.group(1).split(",") if v.strip()]

    # -------------------------------------------------------------- ops

    def constant(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        (want,) = self.declared(stmt)
        m = re.match(r"dense<(.*)>\s*$", stmt.rest.rsplit(" : ", 1)[0].strip())
        if m is None:
            raise self.error(stmt, "stablehlo.constant: expected dense<...>")
        body = m.group(1).strip()
        if body.startswith("["):
            values = _dense_array(body, want.dtype, lambda msg: self.error(stmt, msg))
            return [self.checked(stmt, scope, "constant", [], shape=list(want.shape), dtype=want.dtype,
                                 value=[float(v) if want.dtype != "i32" else int(v) for v in values])]
        value = _scalar(body, want.dtype, lambda msg: self.error(stmt, msg))
        result = self.checked(stmt, scope, "full", [], shape=list(want.shape), dtype=want.dtype, value=value)
        self.scalars[id(result)] = float(value)
        return [result]

    def broadcast_in_dim(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        (x,) = self.args(stmt, scope)
        (want,) = self.declared(stmt)
        dims = self.ints(stmt, "dims")
        result = self.checked(stmt, scope, "broadcast_in_dim", [x], shape=list(want.shape), dims=dims)
        if id(x) in self.scalars:
            self.scalars[id(result)] = self.scalars[id(x)]
        return [result]

    def transpose(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        return [self.checked(stmt, scope, "transpose", self.args(stmt, scope), perm=self.ints(stmt, "dims"))]

    def reshape(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        (want,) = self.declared(stmt)
        return [self.checked(stmt, scope, "reshape", self.args(stmt, scope), shape=list(want.shape))]

    def convert(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        (want,) = self.declared(stmt)
        return [self.checked(stmt, scope, "convert", self.args(stmt, scope), dtype=want.dtype)]

    def iota(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        (want,) = self.declared(stmt)
        m = re.search(r"dim\s*=\s*(\d+)", stmt.rest)
        if m is None:
            raise self.error(stmt, "stablehlo.iota: missing dim = N")
        return [self.checked(stmt, scope, "iota", [], shape=list(want.shape), dtype=want.dtype,
                             dimension=int(m.group(1)))]

    def compare(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        m = re.match(r"(EQ|NE|LT|LE|GT|GE)\s*,", stmt.rest)
        if m is None:
            raise self.error(stmt, "stablehlo.compare: expected a direction EQ, NE, LT, LE, GT or GE")
        return [self.checked(stmt, scope, "compare", self.args(stmt, scope), direction=m.group(1).lower())]

    def select(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        return [self.checked(stmt, scope, "select", self.args(stmt, scope))]

    def dot_general(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        head = stmt.rest.split(" : ")[0]
        a, b = self.args(stmt, scope)[:2]

        def pair(key: str) -> list[list[int]]:
            m = re.search(rf"{key}\s*=\s*\[([^\]]*)\]\s*x\s*\[([^\]]*)\]", head)
            if m is None:
                return [[], []]
            return [[int(v) for v in side.split(",") if v.strip()] for side in m.groups()]

        return [self.checked(stmt, scope, "dot_general", [a, b], contract=pair("contracting_dims"),
                             batch=pair("batching_dims"))]

    def reduce(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        m = re.match(r"\((" + _VALUE + r")\s+init:\s*(" + _VALUE + r")\)\s*(.*)$", stmt.rest)
        if m is None or m.group(3).startswith(","):  # several operands: an argmax, say
            raise self.error(stmt, "stablehlo.reduce: only single-operand reductions `(%x init: %c)` are supported")
        x, init = (scope.get(n, self.reader, stmt.line) for n in m.group(1, 2))
        applies = re.search(r"applies\s+stablehlo\.(\w+)", m.group(3))
        combiner_op = applies.group(1) if applies else self.region_combiner(stmt)
        if combiner_op not in COMBINERS:
            raise self.error(stmt, f"stablehlo.reduce: combiner stablehlo.{combiner_op} is not supported; "
                             f"supported: {', '.join('stablehlo.' + c for c in COMBINERS)}")
        combiner = COMBINERS[combiner_op]
        dims = self.ints(stmt, "dimensions")
        if self.scalars.get(id(init)) == _identity(combiner):
            return [self.checked(stmt, scope, "reduce", [x], dims=dims, combiner=combiner)]
        # A non-identity init joins the reduction once, as the combiner of the result and the init.
        (want,) = self.declared(stmt)
        reduced = self.b.op("reduce", [x], None, dims=dims, combiner=combiner)
        start = self.b.op("broadcast_in_dim", [init], None, shape=list(want.shape), dims=[])
        return [self.checked(stmt, scope, BINARY[combiner_op], [reduced, start])]

    def region_combiner(self, stmt: _Stmt) -> str:
        """The op of a region that combines its two arguments and returns it."""
        ops = [s.op for s in stmt.region if s.op not in ("stablehlo.return", "return")]
        if len(ops) != 1 or not ops[0].startswith("stablehlo."):
            raise self.error(stmt, f"{stmt.op}: only a region of one add, maximum or minimum is supported")
        return ops[0].removeprefix("stablehlo.")

    def gather(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        """The embedding lookup form: rows of the operand at indices with a
        trailing index vector of size 1 (jax's `table[ids]`)."""
        table, idx = self.args(stmt, scope, stmt.rest.split(")")[0])
        numbers = _dimension_numbers(stmt.rest)
        sizes = self.array_attr(stmt, "slice_sizes")
        lookup = (numbers.get("collapsed_slice_dims") == [0] and numbers.get("start_index_map") == [0]
                  and numbers.get("index_vector_dim") == [idx.type.rank - 1] and idx.type.shape[-1:] == (1,)
                  and sizes == [1, *table.type.shape[1:]]
                  and numbers.get("offset_dims") == list(range(idx.type.rank - 1, idx.type.rank + table.type.rank - 2)))
        if not lookup:
            raise self.error(stmt, "stablehlo.gather: only the embedding-lookup form (rows of the operand at "
                             "indices with a trailing index vector of size 1) is supported")
        rows = self.b.op("reshape", [idx], None, shape=list(idx.type.shape[:-1]))
        return [self.checked(stmt, scope, "gather", [table, rows], axis=0)]

    def scatter(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        """The embedding-gradient form of `gather`'s transpose: updates added
        into rows of the operand (a scatter whose region adds)."""
        operand, idx, updates = self.args(stmt, scope, stmt.rest.split(")")[0])
        numbers = _dimension_numbers(stmt.rest)
        add = self.region_combiner(stmt) == "add"
        rows_form = (numbers.get("inserted_window_dims") == [0] and numbers.get("scatter_dims_to_operand_dims") == [0]
                     and numbers.get("index_vector_dim") == [idx.type.rank - 1] and idx.type.shape[-1:] == (1,)
                     and updates.type.shape == idx.type.shape[:-1] + operand.type.shape[1:])
        if not (add and rows_form):
            raise self.error(stmt, "stablehlo.scatter: only the embedding-gradient form (updates added into rows "
                             "of the operand at indices with a trailing index vector of size 1) is supported")
        rows = self.b.op("reshape", [idx], None, shape=list(idx.type.shape[:-1]))
        if self.scalars.get(id(operand)) == 0.0:  # scattered into zeros: the scatter_add is the result
            return [self.checked(stmt, scope, "scatter_add", [updates, rows], axis=0, size=operand.type.shape[0])]
        added = self.b.op("scatter_add", [updates, rows], None, axis=0, size=operand.type.shape[0])
        return [self.checked(stmt, scope, "add", [operand, added])]

    def slice(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        m = re.search(r"\[([^\]]*)\]", stmt.rest.split(" : ")[0])
        if m is None:
            raise self.error(stmt, "stablehlo.slice: expected [start:limit(:stride), ...]")
        start, limit, stride = [], [], []
        for part in m.group(1).split(","):
            bounds = [int(v) for v in part.split(":")]
            start.append(bounds[0])
            limit.append(bounds[1])
            stride.append(bounds[2] if len(bounds) > 2 else 1)
        (x,) = self.args(stmt, scope, stmt.rest.split("[")[0])
        return [self.checked(stmt, scope, "slice", [x], start=start, limit=limit, stride=stride)]

    def concatenate(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        m = re.search(r"dim\s*=\s*(\d+)", stmt.rest)
        if m is None:
            raise self.error(stmt, "stablehlo.concatenate: missing dim = N")
        return [self.checked(stmt, scope, "concatenate", self.args(stmt, scope), dim=int(m.group(1)))]

    def call(self, stmt: _Stmt, scope: _Scope) -> list[Value]:
        m = re.match(r"@([\w.$-]+)\((.*?)\)\s*:", stmt.rest)
        if m is None:
            raise self.error(stmt, "call: expected call @name(%args) : ...")
        callee = self.funcs.get(m.group(1))
        if callee is None:
            raise self.error(stmt, f"call: no function @{m.group(1)} in the module")
        return self.function(callee, self.args(stmt, scope, m.group(2)))

    def array_attr(self, stmt: _Stmt, key: str) -> list[int]:
        m = re.search(rf"{key}\s*=\s*array<i64:\s*([^>]*)>", stmt.rest)
        if m is None:
            raise self.error(stmt, f"{stmt.op}: missing {key} = array<i64: ...>")
        return [int(v) for v in m.group(1).split(",") if v.strip()]


def _identity(combiner: str) -> float:
    return {"sum": 0.0, "max": -math.inf, "min": math.inf}[combiner]


def _dimension_numbers(text: str) -> dict[str, list[int]]:
    """The fields of a `#stablehlo.gather<...>` or `#stablehlo.scatter<...>`."""
    m = re.search(r"#stablehlo\.(?:gather|scatter)<([^>]*)>", text)
    if m is None:
        return {}
    out: dict[str, list[int]] = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|\d+)", m.group(1)):
        out[key] = [int(v) for v in value.strip("[]").split(",") if v.strip()]
    return out


def _scalar(text: str, dtype: str, error: Callable[[str], StableHLOError]) -> float | int | bool:
    """A scalar literal of a dense<...>: decimal, hex bit pattern, true/false."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("0x"):
        bits = int(text, 16)
        if dtype == "f32":
            return struct.unpack("<f", struct.pack("<I", bits))[0]
        if dtype == "f16":
            return struct.unpack("<e", struct.pack("<H", bits))[0]
        if dtype == "bf16":
            return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
        raise error(f"stablehlo.constant: hex literal {text} for {dtype}")
    try:
        return int(text) if dtype == "i32" else float(text)
    except ValueError:
        raise error(f"stablehlo.constant: cannot read {text!r} as {dtype}") from None


def _dense_array(text: str, dtype: str, error: Callable[[str], StableHLOError]) -> list[float | int | bool]:
    """The elements of a nested dense<[[...], ...]> literal, row-major."""
    return [_scalar(v, dtype, error) for v in re.findall(r"[^\[\],\s]+", text)]


def _sanitize(info: str) -> str | None:
    """`result[1]['w1']` -> `result.1.w1`; None if nothing usable is left."""
    words = re.findall(r"[\w-]+", info)
    return ".".join(words) if words and not words[0].startswith("-") else None


def _info(attrs: str, key: str) -> str | None:
    m = re.search(rf'{key}\s*=\s*"([^"]*)"', attrs)
    return m.group(1) if m else None


def import_stablehlo(text: str, filename: str = "<stablehlo>", param_names: Sequence[str] | None = None,
                     name: str = "main") -> Function:
    """The Function of the module's public @main (or its only function)."""
    reader = _Reader(text, filename)
    funcs = reader.functions()
    main = funcs.get("main") or (next(iter(funcs.values())) if len(funcs) == 1 else None)
    if main is None:
        raise StableHLOError(f"{filename}: no @main among {', '.join('@' + f for f in funcs)}")
    if param_names is not None and len(param_names) != len(main.args):
        raise StableHLOError(f"{filename}: {len(param_names)} param_names for the {len(main.args)} arguments "
                             f"of @{main.name}")
    importer = _Importer(reader, funcs, name)
    names = list(param_names) if param_names is not None else [
        _sanitize(_info(attrs, "jax.arg_info") or "") or f"arg{i}" for i, (_, _, attrs) in enumerate(main.args)]
    params = [importer.b.param(n, t.shape, t.dtype) for n, (_, t, _) in zip(names, main.args)]
    results = importer.function(main, params, _result_names(main, set(names)))
    return importer.b.build(results)


def _result_names(main: _Func, taken: set[str]) -> dict[str, str]:
    """SSA name of each returned value -> its jax.result_info name, where
    that name is usable and the value is returned once."""
    ret = next((s for s in main.body if s.op in ("return", "func.return")), None)
    if ret is None:
        return {}
    returned = re.findall(_VALUE, ret.rest.split(" : ")[0])
    out: dict[str, str] = {}
    for ssa, (_, attrs) in zip(returned, main.results):
        name = _sanitize(_info(attrs, "jax.result_info") or "")
        if name and returned.count(ssa) == 1 and name not in taken and name not in out.values():
            out[ssa] = name
    return out


def load_stablehlo(path: str, param_names: Sequence[str] | None = None) -> Function:
    """`import_stablehlo` of a file; a missing file raises OSError."""
    with open(path, encoding="utf-8") as f:
        return import_stablehlo(f.read(), path, param_names)
