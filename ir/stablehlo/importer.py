"""The importer's driver: statements in, registry ops out.

Each StableHLO op name maps to a handler (`@handles("stablehlo.add")`) in
one of the family modules (`basic`, `control`, `indexing`, `windows`,
`bitwise`); a handler reads its statement's text and emits registry ops
through `Importer.checked`, which compares the type the registry infers
with the type the text declares, so a misread dimension number fails at its
line instead of computing something else.

Before anything is emitted the whole module is surveyed: every op without a
handler is listed with its count and first line in one error, so a user
sees everything that blocks a program at once.

Known values: the importer evaluates, with the registry's numpy semantics,
every op whose operands are all known small constants (`Importer.known`).
That is what unrolls a `while` whose trip count is static (its condition is
evaluated on the known loop counter), and what turns a dynamic slice at a
known index into a static slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ir import ops
from ir.builder import Builder
from ir.core import IRError, TensorType, Value
from ir.interpret import numpy_dtype
from ir.stablehlo.reader import VALUE, Func, Reader, StableHLOError, Stmt, split_top

# StableHLO element types -> ours.
ELEMENT_TYPES = {"f32": "f32", "bf16": "bf16", "f16": "f16", "f64": "f64", "i1": "bool", "i8": "i8", "i32": "i32",
                 "i64": "i64", "ui8": "u8", "ui32": "u32", "ui64": "u64"}
KNOWN_LIMIT = 4096  # elements: larger constants are not evaluated at import time
RETURNS = ("return", "func.return", "stablehlo.return")

Handler = Callable[["Importer", Stmt, "Scope"], list[Value]]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler for the StableHLO op names given."""

    def register(fn: Handler) -> Handler:
        for name in names:
            if name in HANDLERS:
                raise AssertionError(f"two handlers for {name}")
            HANDLERS[name] = fn
        return fn

    return register


def parse_type(text: str, error: Callable[[str], StableHLOError]) -> TensorType:
    m = re.fullmatch(r"tensor<((?:\d+x)*)(\w+)>", text.strip())
    if m is None:
        raise error(f"unsupported type {text.strip()!r}: expected a ranked tensor like tensor<4x8xf32>")
    dims, element = m.groups()
    if element not in ELEMENT_TYPES:
        raise error(f"unsupported element type {element} in {text.strip()}; supported: {', '.join(ELEMENT_TYPES)}")
    return TensorType(tuple(int(d) for d in dims.split("x") if d), ELEMENT_TYPES[element])


@dataclass
class Scope:
    """SSA name -> Value inside one (possibly inlined) function or region,
    and the names the results of its ops take (only @main's are named)."""

    values: dict[str, Value]
    names: dict[str, str] = field(default_factory=dict)
    top: bool = False  # @main's own body, whose SSA names a plan can be written back to

    def get(self, name: str, importer: Importer, stmt: Stmt) -> Value:
        if name not in self.values:
            raise importer.error(stmt, f"{name} is not defined")
        return self.values[name]


class Importer:
    def __init__(self, reader: Reader, funcs: dict[str, Func], name: str):
        self.reader = reader
        self.funcs = funcs
        self.b = Builder(name)
        self.known: dict[int, np.ndarray] = {}  # id(Value) -> its value, when computed from constants
        self.depth = 0  # of inlined calls, to refuse recursion
        # Sharding constraints the program states (custom_call @Sharding,
        # sdy.sharding_constraint), in order: (value name, sharding text).
        self.constraints: list[tuple[str, str]] = []
        # Value name -> the SSA name in @main's body that it is the value of
        # (what an annotated export pins); inlined and unrolled bodies have none.
        self.origins: dict[str, str] = {}
        # What the import changed of the program's meaning for planning (a run-time conditional computes
        # every branch), one line each, naming the statement's line: `explain` shows them.
        self.notes: list[str] = []

    def error(self, stmt: Stmt, message: str) -> StableHLOError:
        return self.reader.error(stmt.line, message)

    # -------------------------------------------------------------- driving

    def function(self, func: Func, args: Sequence[Value], names: dict[str, str] | None = None,
                 top: bool = False) -> list[Value]:
        scope = Scope({name: v for (name, _, _), v in zip(func.args, args)}, names or {}, top)
        out = self.block(func.body, scope)
        if out is None:
            raise self.reader.error(func.line, f"@{func.name} has no return")
        return out

    def block(self, body: list[Stmt], scope: Scope) -> list[Value] | None:
        """Emit a block's statements into `scope`; the values it returns."""
        for stmt in body:
            if stmt.op in RETURNS:
                return self.args(stmt, scope)
            values = self.emit(stmt, scope)
            if len(values) != len(stmt.results):
                raise self.error(stmt, f"{stmt.op} gives {len(values)} results, the text names {len(stmt.results)}")
            scope.values.update(zip(stmt.results, values))
            if scope.top:
                for ssa, value in zip(stmt.results, values):
                    self.origins.setdefault(value.name, ssa)
        return None

    def emit(self, stmt: Stmt, scope: Scope) -> list[Value]:
        handler = HANDLERS.get(stmt.op)
        if handler is None:
            raise self.error(stmt, f"unsupported op {stmt.op}; supported: {', '.join(sorted(HANDLERS))}")
        try:
            return handler(self, stmt, scope)
        except StableHLOError:
            raise
        except IRError as err:  # an op a handler builds on the way (not `checked`) refuses the text's types
            raise self.error(stmt, f"{stmt.op}: {err}") from err
        except (ValueError, IndexError, KeyError) as err:  # malformed numbers or lists in the text
            raise self.error(stmt, f"{stmt.op}: cannot read {stmt.rest[:120]!r}: {err}") from None

    # -------------------------------------------------------------- reading a statement

    @staticmethod
    def operands(text: str) -> list[str]:
        return re.findall(VALUE, text)

    def args(self, stmt: Stmt, scope: Scope, text: str | None = None) -> list[Value]:
        head = stmt.rest.split(" : ")[0] if text is None else text
        return [scope.get(n, self, stmt) for n in self.operands(head)]

    def parse_type(self, stmt: Stmt, text: str) -> TensorType:
        return parse_type(text, lambda msg: self.error(stmt, msg))

    def declared(self, stmt: Stmt) -> list[TensorType]:
        """The result types the text declares: after the last `->`, or the
        single type after ` : `."""
        sig = stmt.rest.rsplit(" : ", 1)[-1]
        out = sig.rsplit("->", 1)[-1].strip()
        if out.startswith("(") and out.endswith(")"):
            out = out[1:-1]
        return [self.parse_type(stmt, t) for t in split_top(out)]

    def ints(self, stmt: Stmt, key: str, text: str | None = None, default: list[int] | None = None) -> list[int]:
        """The list of `key = [1, 2]` (or `key = array<i64: 1, 2>`)."""
        source = stmt.rest if text is None else text
        m = re.search(rf"\b{key}\s*=\s*(?:\[([^\]]*)\]|array<i64(?::\s*([^>]*))?>)", source)
        if m is None:
            if default is not None:
                return default
            raise self.error(stmt, f"{stmt.op}: missing {key} = [...]")
        return [int(v) for v in (m.group(1) or m.group(2) or "").split(",") if v.strip()]

    def int_attr(self, stmt: Stmt, key: str, default: int | None = None) -> int:
        m = re.search(rf"\b{key}\s*=\s*(-?\d+)", stmt.rest)
        if m is None:
            if default is not None:
                return default
            raise self.error(stmt, f"{stmt.op}: missing {key} = N")
        return int(m.group(1))

    # -------------------------------------------------------------- emitting

    def op(self, kind: str, operands: Sequence[Value], name: str | None = None, **attrs) -> Value:
        """Emit one registry op; evaluate it when its operands are known."""
        value = self.b.op(kind, list(operands), name, **attrs)
        self.fold(kind, operands, value)
        return value

    def checked(self, stmt: Stmt, scope: Scope, kind: str, operands: Sequence[Value], result: int = -1,
                **attrs) -> Value:
        """Emit `kind` and check its inferred type against the declared one
        (the `result`-th declared type)."""
        want = self.declared(stmt)[result]
        index = result % len(stmt.results) if stmt.results else 0
        name = scope.names.get(stmt.results[index]) if stmt.results else None
        try:
            value = self.op(kind, operands, name, **attrs)
        except IRError as err:
            raise self.error(stmt, f"{stmt.op}: {err}") from err
        if value.type != want:
            raise self.error(stmt, f"{stmt.op}: the text declares {want}, the op gives {value.type}")
        return value

    def fold(self, kind: str, operands: Sequence[Value], value: Value) -> None:
        if value.type.num_elements > KNOWN_LIMIT or not all(id(v) in self.known for v in operands):
            return
        opdef = ops.get(kind)
        if opdef.impl is None:
            return
        op = self.b.body[-1]
        with np.errstate(all="ignore"):
            (result,) = opdef.impl([self.known[id(v)] for v in operands], op.attrs)
        self.known[id(value)] = np.asarray(result).astype(numpy_dtype(value.type.dtype))

    def known_int(self, value: Value) -> int | None:
        """The value of a known integer scalar, else None."""
        array = self.known.get(id(value))
        return int(array) if array is not None and array.size == 1 else None


def region_combiner(imp: Importer, stmt: Stmt) -> str:
    """The op of a region that combines its two arguments and returns it."""
    body = [s.op for s in stmt.region if s.op not in ("stablehlo.return", "return")]
    if len(body) != 1 or not body[0].startswith("stablehlo."):
        raise imp.error(stmt, f"{stmt.op}: only a region of one add, maximum, minimum, and or or is supported")
    return body[0].removeprefix("stablehlo.")


def unsupported(funcs: dict[str, Func]) -> dict[str, tuple[int, int]]:
    """Op name -> (count, first line) of every op no handler reads."""
    found: dict[str, tuple[int, int]] = {}

    def visit(body: list[Stmt]) -> None:
        for stmt in body:
            if stmt.op not in HANDLERS and stmt.op not in RETURNS:
                count, first = found.get(stmt.op, (0, stmt.line))
                found[stmt.op] = (count + 1, min(first, stmt.line))
            for region in stmt.regions:
                visit(region.body)

    for func in funcs.values():
        visit(func.body)
    return found


def check_supported(funcs: dict[str, Func], filename: str) -> None:
    missing = unsupported(funcs)
    if missing:
        rows = [f"  {name}: {count} use(s), first at line {line}"
                for name, (count, line) in sorted(missing.items(), key=lambda kv: kv[1][1])]
        raise StableHLOError(f"{filename}: {len(missing)} unsupported op kind(s):\n" + "\n".join(rows)
                             + f"\nsupported: {', '.join(sorted(HANDLERS))}")
