"""Import the StableHLO text that `jax.jit(f).lower(*args).as_text()` prints.

    fn = import_stablehlo(text, "step.mlir", param_names=[...])

The module's public `func.func @main` becomes one `Function`: calls to its
private functions are inlined, `while` loops with a static trip count are
unrolled, and each StableHLO op maps to registry ops (most one to one).
Every result type the text declares is checked against the type the
registry infers, so an import that type-checks computes what the text says.

Modules: `reader` (text -> functions of statements), `importer` (the
driver: survey, dispatch, type checks, known constants), and one module of
handlers per family: `basic`, `bitwise`, `indexing`, `sorting`, `windows`, `control`.

Names: parameters are `param_names` when given, else the sanitized
`jax.arg_info` of each argument where jax printed one, else `arg0`,
`arg1`, ...; a result defined by an op of `@main` is named after its
sanitized `jax.result_info` (`result[1]['w1']` -> `result.1.w1`).

Anything the importer cannot read is a `StableHLOError` naming the file and
line; ops without a mapping are all listed at once, each with its count and
first line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ir.core import Function, without_dead_ops
from ir.stablehlo import basic, bitwise, control, indexing, sorting, windows  # noqa: F401  (register handlers)
from ir.stablehlo.control import sdy_axes
from ir.stablehlo.importer import HANDLERS, Importer, check_supported, parse_type
from ir.stablehlo.reader import VALUE, Func, Reader, StableHLOError, Stmt

__all__ = ["SUPPORTED", "ImportedModule", "StableHLOError", "import_module", "import_stablehlo", "load_stablehlo"]

SUPPORTED: tuple[str, ...] = tuple(sorted(HANDLERS))


@dataclass(frozen=True)
class ImportedModule:
    """An imported program and what ties it back to its text: `origins`
    maps a value's name to the SSA name in @main's body it is the value of
    (an annotated export pins those); `constraints` are the program's own
    sharding annotations, (value name, sharding text), in order; `notes`,
    what the import changed of how the program runs (a run-time conditional
    computes every branch), each naming its line."""

    function: Function
    origins: Mapping[str, str]
    constraints: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()

    def pins(self) -> tuple[tuple[str, int, str], ...]:
        """The Shardy constraints as (value name, dimension, mesh axis), for
        the values the import kept; constraints in another form (an HLO
        sharding names devices, not axes) are left out."""
        types = {v.name: v.type for op in self.function.ops for v in op.results}
        types.update((p.name, p.type) for p in self.function.params)
        out: list[tuple[str, int, str]] = []
        for name, text in self.constraints:
            dims = sdy_axes(text, types[name].rank) if name in types else None
            for d, axes in enumerate(dims or ()):
                out += [(name, d, axis) for axis in axes if (name, d, axis) not in out]
        return tuple(out)


def import_stablehlo(text: str, filename: str = "<stablehlo>", param_names: Sequence[str] | None = None,
                     name: str = "main") -> Function:
    """The Function of the module's public @main (or its only function)."""
    return import_module(text, filename, param_names, name).function


def import_module(text: str, filename: str = "<stablehlo>", param_names: Sequence[str] | None = None,
                  name: str = "main") -> ImportedModule:
    """`import_stablehlo` with the ties back to the text."""
    reader = Reader(text, filename)
    funcs = reader.functions()
    main = funcs.get("main") or (next(iter(funcs.values())) if len(funcs) == 1 else None)
    if main is None:
        raise StableHLOError(f"{filename}: no @main among {', '.join('@' + f for f in funcs)}")
    check_supported(funcs, filename)
    if param_names is not None and len(param_names) != len(main.args):
        raise StableHLOError(f"{filename}: {len(param_names)} param_names for the {len(main.args)} arguments "
                             f"of @{main.name}")
    importer = Importer(reader, funcs, name)
    names = list(param_names) if param_names is not None else [
        _sanitize(_info(attrs, "jax.arg_info") or "") or f"arg{i}" for i, (_, _, attrs) in enumerate(main.args)]
    params = []
    for n, (_, type_text, _) in zip(names, main.args):
        ty = parse_type(type_text, lambda msg: reader.error(main.line, msg))
        params.append(importer.b.param(n, ty.shape, ty.dtype))
    results = importer.function(main, params, _result_names(main, set(names)), top=True)
    fn = without_dead_ops(importer.b.build(results))
    defined = {v.name for op in fn.ops for v in op.results}
    origins = {v: ssa for v, ssa in importer.origins.items() if v in defined}
    return ImportedModule(fn, origins, tuple(importer.constraints), tuple(importer.notes))


def _sanitize(info: str) -> str | None:
    """`result[1]['w1']` -> `result.1.w1`; None if nothing usable is left."""
    words = re.findall(r"[\w-]+", info)
    return ".".join(words) if words and not words[0].startswith("-") else None


def _info(attrs: str, key: str) -> str | None:
    m = re.search(rf'{key}\s*=\s*"([^"]*)"', attrs)
    return m.group(1) if m else None


def _result_names(main: Func, taken: set[str]) -> dict[str, str]:
    """SSA name of each returned value -> its jax.result_info name, where
    that name is usable and the value is returned once."""
    ret = next((s for s in main.body if s.op in ("return", "func.return")), None)
    if ret is None:
        return {}
    defs = {s.results[0]: s for s in main.body if len(s.results) == 1}
    returned = [_annotated(defs, ssa) for ssa in re.findall(VALUE, ret.rest.split(" : ")[0])]
    out: dict[str, str] = {}
    for ssa, (_, attrs) in zip(returned, main.results):
        name = _sanitize(_info(attrs, "jax.result_info") or "")
        if name and returned.count(ssa) == 1 and name not in taken and name not in out.values():
            out[ssa] = name
    return out


def _annotated(defs: dict[str, Stmt], ssa: str) -> str:
    """The SSA name a sharding annotation chain of @main's body (`defs`: its
    single-result statements by name) starts from: a returned value that is
    only annotated takes its name from the value annotated (`%sp.3` in
    `%3 = sdy.sharding_constraint %sp.3`)."""
    seen = set()
    while ssa in defs and ssa not in seen and (defs[ssa].op == "sdy.sharding_constraint"
                                               or defs[ssa].rest.startswith("@Sharding(")):
        seen.add(ssa)
        operands = re.findall(VALUE, defs[ssa].rest)
        if not operands:
            break
        ssa = operands[0]
    return ssa


def load_stablehlo(path: str, param_names: Sequence[str] | None = None) -> Function:
    """`import_stablehlo` of a file; a missing file raises OSError."""
    with open(path, encoding="utf-8") as f:
        return import_stablehlo(f.read(), path, param_names)
