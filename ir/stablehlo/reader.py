"""Read the text jax prints into functions of statements, without meaning.

jax prints one op per line. The multi-line constructs are regions, in four
forms, all read as a list of `Region`s of the statement that owns them:

    %r = "stablehlo.scatter"(%a, %i, %u) <{...}> ({      a generic op's region,
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):              its block arguments,
      ...                                                its body,
    }) : (...) -> ...                                    and the rest of the op;
    %r = stablehlo.reduce(%x init: %c) across ... : ...  a reduction's combiner
     reducer(%a: tensor<f32>, %b: tensor<f32>) (...) {   (several operand pairs
      ...                                                on one line);
    }
    %r:3 = stablehlo.while(%iterArg = %a, ...) : ...     a loop's two regions,
    cond { ... } do { ... }                              over the iteration args.

Nothing here knows what an op means; `importer.py` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ir.core import IRError

VALUE = r"%[\w.$-]+(?:#\d+)?"
MAX_RESULTS = 100_000  # results of one op; more is a malformed count, not a program


class StableHLOError(IRError):
    """Text this importer cannot read; the message names the file and line."""


@dataclass
class Region:
    args: list[str]  # block argument names, in order
    body: list[Stmt]


@dataclass
class Stmt:
    """One op: its result names, op name, the text after the op name, its
    regions (if any) and the line it starts on."""

    line: int
    results: list[str]
    op: str
    rest: str
    regions: list[Region] = field(default_factory=list)

    @property
    def region(self) -> list[Stmt]:
        """The body of the first region (a reduction's or a scatter's combiner)."""
        return self.regions[0].body if self.regions else []


@dataclass
class Func:
    name: str
    line: int
    args: list[tuple[str, str, str]]  # (ssa name, type text, attributes text)
    results: list[tuple[str, str]]  # (type text, attributes text)
    body: list[Stmt]


def _depths(text: str, start: int = 0):
    """(index, character, bracket depth after it) for each character outside
    quotes; `->` is not a bracket."""
    depth, quote = 0, False
    for i in range(start, len(text)):
        ch = text[i]
        if ch == '"':
            quote = not quote
            continue
        if quote:
            continue
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1] == "-"):
            depth -= 1
        yield i, ch, depth


def split_top(text: str, sep: str = ",") -> list[str]:
    """`text` split at `sep` outside brackets and quotes."""
    # Most texts are one SSA name or one type, or hold no bracket: split without the scan by character
    # (a fifth of importing GPT-2's decode step went to it).
    if sep not in text:
        tail = text.strip()
        return [tail] if tail else []
    if not any(ch in text for ch in '()[]{}<>"'):
        parts = [part.strip() for part in text.split(sep)]
        return parts if parts[-1] else parts[:-1]
    return _split_scanned(text, sep)


def _split_scanned(text: str, sep: str) -> list[str]:
    """`split_top` by its scan by character, whatever the text."""
    parts, start = [], 0
    for i, ch, depth in _depths(text):
        if ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + [tail] if tail else parts


def _closing(text: str, start: int) -> int:
    """Index of the bracket that closes the one at `start`, or -1."""
    return next((i for i, ch, depth in _depths(text, start) if depth == 0 and ch in ")]}>"), -1)


def _depth_change(line: str) -> int:
    """Braces opened minus closed on a line, outside quotes."""
    text = re.sub(r'"[^"]*"', "", line)
    return text.count("{") - text.count("}")


def _block_args(text: str) -> list[str]:
    """The names declared in `^bb0(%a: t, %b: t):` or `reducer(%a: t, %b: t) (%c: t, ...)`."""
    return re.findall(r"(%[\w.$-]+)\s*:", text)


class Reader:
    def __init__(self, text: str, filename: str):
        self.lines = text.splitlines()
        self.filename = filename

    def error(self, line: int, message: str) -> StableHLOError:
        return StableHLOError(f"{self.filename}:{line}: {message}")

    def functions(self) -> dict[str, Func]:
        out: dict[str, Func] = {}
        i = 0
        while i < len(self.lines):
            if self.lines[i].lstrip().startswith("func.func"):
                func, i = self.function(i)
                if func.name in out:
                    raise self.error(func.line, f"@{func.name} is defined twice")
                out[func.name] = func
            else:
                i += 1
        if not out:
            raise StableHLOError(f"{self.filename}: no func.func found: expected the text of "
                                 "jax.jit(f).lower(*args).as_text()")
        return out

    def function(self, start: int) -> tuple[Func, int]:
        header = self.lines[start].strip()
        m = re.match(r"func\.func\s+(?:public\s+|private\s+)?@([\w.$-]+)\(", header)
        close = _closing(header, m.end() - 1) if m else -1
        tail = None if close < 0 else re.match(r"\s*(?:->\s*(.*?))?\s*(?:attributes\s*\{.*\}\s*)?\{$",
                                               header[close + 1:])
        if m is None or tail is None:
            raise self.error(start + 1, "cannot read this func.func signature")
        name, args_text, results_text = m.group(1), header[m.end():close], tail.group(1)
        args = []
        for arg in split_top(args_text):
            am = re.match(r"(%[\w.$-]+)\s*:\s*(tensor<[^>]*>)\s*(.*)$", arg)
            if am is None:
                raise self.error(start + 1, f"cannot read argument {arg!r}")
            args.append((am.group(1), am.group(2), am.group(3)))
        results_text = (results_text or "").strip()
        if results_text.startswith("(") and results_text.endswith(")"):
            results_text = results_text[1:-1]
        results = []
        for res in split_top(results_text):
            rm = re.match(r"(tensor<[^>]*>)\s*(.*)$", res)
            if rm is None:
                raise self.error(start + 1, f"cannot read result {res!r}")
            results.append((rm.group(1), rm.group(2)))
        body, end = self.block(start + 1)
        if end >= len(self.lines) or not self.lines[end].strip().startswith("}"):
            raise self.error(start + 1, f"@{name} is not closed by a line `}}`")
        return Func(name, start + 1, args, results, body), end + 1

    def block(self, i: int) -> tuple[list[Stmt], int]:
        """Statements from line i up to the next line that starts with `}`;
        returns them and that line's index."""
        stmts: list[Stmt] = []
        while i < len(self.lines):
            text = self.lines[i].strip()
            if text.startswith("}"):
                return stmts, i
            if not text or text.startswith("//"):
                i += 1
                continue
            stmt, i = self.statement(i)
            stmts.append(stmt)
        raise self.error(len(self.lines), "unexpected end of text inside a block")

    def statement(self, i: int) -> tuple[Stmt, int]:
        text = self.lines[i].strip()
        line = i + 1
        results: list[str] = []
        m = re.match(r"((?:%[\w.$-]+(?::\d+)?)(?:\s*,\s*%[\w.$-]+)*)\s*=\s*(.*)$", text)
        if m is not None:
            results = self.result_names(m.group(1), line)
            text = m.group(2)
        om = re.match(r'"?([\w.]+)"?\s*(.*)$', text)
        if om is None:
            raise self.error(line, f"cannot read {text!r}")
        stmt = Stmt(line, results, om.group(1), om.group(2))
        i += 1
        following = self.lines[i].strip() if i < len(self.lines) else ""
        if _depth_change(self.lines[i - 1]) > 0:  # a generic op's `({`
            i = self.generic_regions(i, stmt)
        elif following.startswith("reducer("):
            args = _block_args(following)
            body, close = self.block(i + 1)
            stmt.regions.append(Region(args, body))
            i = close + 1
        elif following.startswith("cond {"):
            args = re.findall(r"(%[\w.$-]+)\s*=", stmt.rest.split(")")[0])
            cond, close = self.block(i + 1)
            if not self.lines[close].strip().startswith("} do {"):
                raise self.error(close + 1, "expected `} do {` after a while loop's condition")
            body, close = self.block(close + 1)
            stmt.regions += [Region(args, cond), Region(args, body)]
            i = close + 1
        return stmt, i

    def generic_regions(self, i: int, stmt: Stmt) -> int:
        """Regions after a line ending in `({`, up to the `})` that closes
        them; the text after `})` joins the op's rest."""
        while True:
            args: list[str] = []
            if i < len(self.lines) and self.lines[i].strip().startswith("^bb"):
                args = _block_args(self.lines[i])
                i += 1
            body, close = self.block(i)
            stmt.regions.append(Region(args, body))
            closing = self.lines[close].strip()
            if closing.startswith("}, {"):  # another region of the same op
                i = close + 1
                continue
            stmt.rest += " " + closing.lstrip("})").strip()
            return close + 1

    def result_names(self, text: str, line: int) -> list[str]:
        names = []
        for part in split_top(text):
            base, _, count = part.partition(":")
            if count and not (count.isdigit() and 0 < int(count) <= MAX_RESULTS):
                raise self.error(line, f"cannot read the result count in {part!r}")
            names += [f"{base}#{k}" for k in range(int(count))] if count else [base]
        return names
