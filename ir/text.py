"""The textual IR: an MLIR-like printer and a parser that inverts it exactly.

    // comments run to the end of the line
    func @mlp(%x: tensor<8x4xf32>, %w1: tensor<4x16xf32>) -> (tensor<8x16xf32>) {
      %0 = dot_general(%x, %w1) {contract = [[1], [0]]} : tensor<8x16xf32>
      %1 = relu(%0) : tensor<8x16xf32>
      return %1
    }

A device-local program names its mesh after the result types:
`func @f(...) -> (...) mesh<batch=4, model=2> {`. Attributes equal to their
op kind's default are not printed; the parser fills them back, so
`parse(print_function(fn)) == fn`. The parser checks every op as it goes
(unknown op, arity, attributes, undefined values, types) and reports the
line and column of the offending token.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ir import ops
from ir.core import DTYPES, AttrValue, Function, IRError, Mesh, Op, TensorType, Value, define, freeze_attr

# ---------------------------------------------------------------- printing


def format_attr(value: AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest round-tripping form: 0.5, 1e-05, inf, nan
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(format_attr(v) for v in value) + "]"


def format_attrs(op: Op) -> str:
    specs = {s.name: s for s in ops.get(op.kind).attrs}
    shown = [
        f"{k} = {format_attr(v)}"
        for k, v in op.attrs.items
        if specs[k].default is ops.REQUIRED or v != freeze_attr(specs[k].default)
    ]
    return " {" + ", ".join(shown) + "}" if shown else ""


def print_op(op: Op) -> str:
    lhs = ", ".join(f"%{r.name}" for r in op.results)
    args = ", ".join(f"%{o.name}" for o in op.operands)
    types = ", ".join(str(r.type) for r in op.results)
    return f"{lhs} = {op.kind}({args}){format_attrs(op)} : {types}"


def print_function(fn: Function) -> str:
    params = ", ".join(f"%{p.name}: {p.type}" for p in fn.params)
    results = ", ".join(str(r.type) for r in fn.results)
    mesh = f" {fn.mesh}" if fn.mesh else ""
    lines = [f"func @{fn.name}({params}) -> ({results}){mesh} {{"]
    lines += [f"  {print_op(op)}" for op in fn.ops]
    lines.append("  return " + ", ".join(f"%{r.name}" for r in fn.results))
    lines.append("}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- parsing


class ParseError(IRError):
    """A syntax or semantic error in IR text, located by line and column."""

    def __init__(self, message: str, line: int, col: int, filename: str = "<text>"):
        super().__init__(f"{filename}:{line}:{col}: {message}")
        self.message, self.line, self.col, self.filename = message, line, col, filename


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # value, symbol, type, number, string, ident, punct, eof
    text: str
    line: int
    col: int


TOKEN_RE = re.compile(
    r"""
    (?P<space>[ \t\r]+|//[^\n]*)
  | (?P<newline>\n)
  | (?P<value>%[A-Za-z0-9_][A-Za-z0-9_.\-]*)
  | (?P<symbol>@[A-Za-z0-9_][A-Za-z0-9_.\-]*)
  | (?P<type>tensor<[^>\n]*>)
  | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|inf\b|nan\b))
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>->|[(){}\[\],=:<>])
    """,
    re.VERBOSE,
)


def tokenize(text: str, filename: str = "<text>") -> list[Token]:
    tokens, line, line_start, pos = [], 1, 0, 0
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", line, pos - line_start + 1, filename)
        kind = m.lastgroup
        if kind == "newline":
            line, line_start = line + 1, m.end()
        elif kind != "space":
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


def parse_type(tok: Token, filename: str = "<text>") -> TensorType:
    body = tok.text[len("tensor<"):-1]
    *dims, dtype = body.split("x") if body else [""]
    if dtype not in DTYPES:
        raise ParseError(f"unknown element type {dtype!r} in {tok.text}; expected one of {', '.join(DTYPES)}",
                         tok.line, tok.col, filename)
    if not all(d.isdigit() for d in dims):
        raise ParseError(f"malformed tensor type {tok.text}: expected tensor<4x8xf32>", tok.line, tok.col, filename)
    return TensorType(tuple(int(d) for d in dims), dtype)


class Parser:
    def __init__(self, text: str, filename: str = "<text>"):
        self.filename = filename
        self.tokens = tokenize(text, filename)
        self.pos = 0
        self.defined: dict[str, Value] = {}
        self.mesh = Mesh()

    # -- token helpers

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        tok = tok or self.peek()
        return ParseError(message, tok.line, tok.col, self.filename)

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (text is None or tok.text == text)

    def expect(self, kind: str, text: str | None = None) -> Token:
        tok = self.peek()
        if not self.at(kind, text):
            wanted = repr(text) if text else kind
            found = repr(tok.text) if tok.text else "end of input"
            raise self.error(f"expected {wanted}, found {found}")
        return self.next()

    def accept(self, kind: str, text: str | None = None) -> bool:
        if self.at(kind, text):
            self.pos += 1
            return True
        return False

    def comma_list(self, item: Any, close: str) -> list:
        """Items separated by commas up to (and consuming) the closing punct."""
        items = []
        if self.accept("punct", close):
            return items
        while True:
            items.append(item())
            if self.accept("punct", close):
                return items
            if not self.accept("punct", ","):
                found = repr(self.peek().text) if self.peek().text else "end of input"
                raise self.error(f"expected ',' or '{close}', found {found}")

    # -- grammar

    def parse_function(self) -> Function:
        self.expect("ident", "func")
        name = self.expect("symbol").text[1:]
        self.expect("punct", "(")
        params = self.comma_list(self.parse_param, ")")
        self.expect("punct", "->")
        self.expect("punct", "(")
        result_types = self.comma_list(lambda: parse_type(self.expect("type"), self.filename), ")")
        if self.accept("ident", "mesh"):
            self.mesh = self.parse_mesh()
        self.expect("punct", "{")
        body = []
        while not self.at("ident", "return"):
            if not self.at("value"):
                found = repr(self.peek().text) if self.peek().text else "end of input"
                raise self.error(f"expected an op ('%name = kind(...)') or 'return', found {found}")
            body.append(self.parse_op())
        return_tok = self.next()
        results = [] if self.at("punct", "}") else self.comma_list_until_brace()
        self.expect("punct", "}")
        self.expect("eof")
        got = [r.type for r in results]
        if got != result_types:
            raise self.error(
                f"return types ({', '.join(map(str, got))}) differ from the declared result types "
                f"({', '.join(map(str, result_types))})", return_tok)
        return Function(name, tuple(params), tuple(body), tuple(results), self.mesh)

    def comma_list_until_brace(self) -> list[Value]:
        values = [self.parse_use()]
        while self.accept("punct", ","):
            values.append(self.parse_use())
        return values

    def parse_param(self) -> Value:
        tok = self.expect("value")
        self.expect("punct", ":")
        value = Value(tok.text[1:], parse_type(self.expect("type"), self.filename))
        self.define(value, tok, "parameter")
        return value

    def parse_mesh(self) -> Mesh:
        tok = self.expect("punct", "<")

        def axis() -> tuple[str, int]:
            name = self.expect("ident").text
            self.expect("punct", "=")
            size = self.expect("number")
            if not size.text.isdigit():
                raise self.error(f"mesh axis size must be a positive integer, got {size.text}", size)
            return name, int(size.text)

        try:
            return Mesh.from_pairs(self.comma_list(axis, ">"))
        except IRError as err:
            raise self.error(str(err), tok) from None

    def define(self, value: Value, tok: Token, where: str) -> None:
        try:
            define(self.defined, value, where)
        except IRError as err:
            raise self.error(str(err), tok) from None

    def parse_use(self) -> Value:
        tok = self.expect("value")
        value = self.defined.get(tok.text[1:])
        if value is None:
            raise self.error(f"value {tok.text} is used before it is defined", tok)
        return value

    def parse_op(self) -> Op:
        first = self.peek()
        result_toks = [self.expect("value")]
        while self.accept("punct", ","):
            result_toks.append(self.expect("value"))
        self.expect("punct", "=")
        kind_tok = self.expect("ident")
        if kind_tok.text not in ops.REGISTRY:
            raise self.error(f"unknown op {kind_tok.text!r}; known ops: {', '.join(sorted(ops.REGISTRY))}", kind_tok)
        self.expect("punct", "(")
        operands = self.comma_list(self.parse_use, ")")
        attrs_tok = self.peek()
        raw_attrs = self.parse_attr_dict() if self.at("punct", "{") else {}
        colon = self.expect("punct", ":")
        types = [parse_type(self.expect("type"), self.filename)]
        while self.accept("punct", ","):
            types.append(parse_type(self.expect("type"), self.filename))
        try:
            attrs = ops.normalize_attrs(kind_tok.text, raw_attrs)
        except IRError as err:
            raise self.error(str(err), attrs_tok) from None
        try:
            inferred = ops.infer_results(kind_tok.text, tuple(o.type for o in operands), attrs, self.mesh)
        except IRError as err:
            raise self.error(str(err), kind_tok) from None
        if len(result_toks) != len(inferred):
            raise self.error(f"{kind_tok.text} has {len(inferred)} result(s), {len(result_toks)} named", first)
        if tuple(types) != inferred:
            raise self.error(
                f"type mismatch: declared {', '.join(map(str, types))}, but {kind_tok.text} gives "
                f"{', '.join(map(str, inferred))}", colon)
        results = tuple(Value(t.text[1:], ty) for t, ty in zip(result_toks, inferred))
        for tok, value in zip(result_toks, results):
            self.define(value, tok, f"result of {kind_tok.text}")
        return Op(kind_tok.text, tuple(operands), results, attrs)

    def parse_attr_dict(self) -> dict[str, AttrValue]:
        self.expect("punct", "{")
        attrs: dict[str, AttrValue] = {}

        def entry() -> None:
            key = self.expect("ident")
            if key.text in attrs:
                raise self.error(f"attribute {key.text!r} given twice", key)
            self.expect("punct", "=")
            attrs[key.text] = self.parse_attr_value()

        self.comma_list(entry, "}")
        return attrs

    def parse_attr_value(self) -> AttrValue:
        tok = self.next()
        if tok.kind == "number":
            if re.fullmatch(r"-?\d+", tok.text):
                return int(tok.text)
            return float(tok.text)
        if tok.kind == "string":
            return json.loads(tok.text)
        if tok.kind == "ident" and tok.text in ("true", "false"):
            return tok.text == "true"
        if tok.kind == "punct" and tok.text == "[":
            return tuple(self.comma_list(self.parse_attr_value, "]"))
        raise self.error(f"expected an attribute value (number, string, true/false or [list]), found {tok.text!r}", tok)


def parse(text: str, filename: str = "<text>") -> Function:
    """Parse one function from IR text. Raises ParseError with line and column."""
    return Parser(text, filename).parse_function()


def parse_file(path: str) -> Function:
    """Parse the IR text file at `path`; errors name the file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ParseError(f"not UTF-8 text (byte {err.start})", 1, 1, path) from None
    return parse(text, path)
