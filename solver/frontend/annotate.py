"""The plan written back into the StableHLO module it was imported from, as
Shardy annotations, so that XLA runs the plan shardplan chose rather than
re-deciding everything between the arguments and the results.

    text = annotate_stablehlo(source_text, imported, planned)

Given the module jax printed, what importing it gave (`ir.stablehlo.
import_module`: which value each SSA name of @main's body is) and a plan
of that imported program, the annotated module has:

  - `sdy.mesh @mesh = <["batch"=4, "model"=2]>` and `mhlo.num_partitions`
    set to the mesh's device count;
  - `sdy.sharding` on every argument and result of @main (the plan's
    shardings of the parameters and of the values returned);
  - after every op of @main's body with one result of rank > 0, an
    `sdy.sharding_constraint` of that result to the sharding the plan gives
    its definition: the op is renamed `%sp.<name>` and the constraint takes
    its old name, so every later use reads the constrained value.

A dimension's axes are listed major to minor, as in the plan and in
JAX's PartitionSpec. Values inside inlined calls and unrolled loop bodies
are not @main's and are not constrained: XLA propagates into them from
their constrained operands and results.

Why annotations rather than re-tracing the user's function with
`jax.lax.with_sharding_constraint`: the imported module is what was
planned, value for value, so every constraint lands on the exact value the
plan describes, the text is all a tool needs (no Python function, no jax
to write it), and the result is a plain StableHLO file any Shardy-enabled
XLA compiles. docs/import.md and docs/xla_comparison.md have the measured comparison with XLA.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ir.core import TensorType
from ir.stablehlo import ImportedModule, import_module
from ir.stablehlo.importer import ELEMENT_TYPES
from ir.stablehlo.reader import Reader, split_top

STABLEHLO_TYPES = {ours: theirs for theirs, ours in ELEMENT_TYPES.items()}
DimAxes = Sequence[Sequence[str]]


def sdy_dims(dims: DimAxes) -> str:
    """`[{"batch"}, {}, {"model", "batch"}]`: closed dimensions, axes major to minor."""
    return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}" for axes in dims) + "]"


def sdy_sharding(dims: DimAxes) -> str:
    return f"#sdy.sharding<@mesh, {sdy_dims(dims)}>"


def stablehlo_type(ty: TensorType) -> str:
    return "tensor<" + "".join(f"{d}x" for d in ty.shape) + STABLEHLO_TYPES[ty.dtype] + ">"


def annotate_stablehlo(text: str, imported: ImportedModule, mesh: Sequence[tuple[str, int]],
                       param_dims: Sequence[DimAxes], result_dims: Sequence[DimAxes],
                       value_dims: dict[str, DimAxes]) -> str:
    """The module `text` with the plan's shardings (see the module docstring).

    `param_dims` / `result_dims`: per argument and result of @main, the
    plan's axes per dimension; `value_dims`: value name -> axes per
    dimension of its definition, for the values of `imported.function`."""
    lines = text.splitlines()
    main = Reader(text, "<annotate>").functions().get("main")
    if main is None:
        raise ValueError("the module has no @main to annotate")
    values = {v.name: v for op in imported.function.ops for v in op.results}
    by_ssa = {ssa: values[name] for name, ssa in imported.origins.items() if "#" not in ssa}
    inserts: dict[int, str] = {}  # line index -> constraint line to insert before it
    body_lines = [stmt.line - 1 for stmt in main.body] + [_closing_line(lines, main.line - 1)]
    for stmt, next_line in zip(main.body, body_lines[1:]):
        if len(stmt.results) != 1 or stmt.results[0] not in by_ssa:
            continue
        value = by_ssa[stmt.results[0]]
        dims = value_dims.get(value.name)
        if dims is None or value.type.rank == 0:
            continue
        ssa = stmt.results[0]
        raw = "%sp." + ssa[1:]
        index = stmt.line - 1
        lines[index] = re.sub(rf"^(\s*){re.escape(ssa)}(\s*=)", lambda m, raw=raw: m.group(1) + raw + m.group(2),
                              lines[index], count=1)
        indent = re.match(r"\s*", lines[index]).group(0)
        inserts[_insertion_point(lines, next_line)] = (
            f"{indent}{ssa} = sdy.sharding_constraint {raw} <@mesh, {sdy_dims(dims)}> : {stablehlo_type(value.type)}")
    lines[main.line - 1] = _signature(lines[main.line - 1], param_dims, result_dims)
    out = []
    for i, line in enumerate(lines):
        if i in inserts:
            out.append(inserts[i])
        out.append(line)
    return "\n".join(_module_header(out, mesh)) + "\n"


def _closing_line(lines: list[str], start: int) -> int:
    """Index of the `}` that closes the function opened at line `start`."""
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0:
            return i
    raise ValueError("unclosed function")


def _insertion_point(lines: list[str], next_line: int) -> int:
    """The next statement's line, moved up past blank lines (so a constraint
    sits right after the op it constrains)."""
    while next_line > 0 and not lines[next_line - 1].strip():
        next_line -= 1
    return next_line


def _with_attr(entry: str, attr: str) -> str:
    """A signature entry `tensor<..>` or `tensor<..> {a = b}` with `attr` added to its attributes."""
    entry = entry.strip()
    if entry.endswith("}"):
        return entry[:-1].rstrip() + f", {attr}}}"
    return f"{entry} {{{attr}}}"


def _signature(header: str, param_dims: Sequence[DimAxes], result_dims: Sequence[DimAxes]) -> str:
    m = re.match(r"(\s*func\.func\s+(?:public\s+)?@main\()", header)
    assert m is not None
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(header[i], 0)
        i += 1
    args = split_top(header[m.end():i - 1])
    args = [_with_attr(a, f"sdy.sharding = {sdy_sharding(d)}") for a, d in zip(args, param_dims)]
    rest = header[i:]
    arrow = re.match(r"(\s*->\s*)(\(?)(.*?)(\)?)(\s*\{)$", rest)
    assert arrow is not None
    results = split_top(arrow.group(3))
    results = [_with_attr(r, f"sdy.sharding = {sdy_sharding(d)}") for r, d in zip(results, result_dims)]
    return (header[:m.end()] + ", ".join(args) + ")" + arrow.group(1) + "(" + ", ".join(results) + ")"
            + arrow.group(5))


def _module_header(lines: list[str], mesh: Sequence[tuple[str, int]]) -> list[str]:
    devices = 1
    for _, size in mesh:
        devices *= size
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("module"))
    header = re.sub(r"mhlo\.num_partitions = \d+", f"mhlo.num_partitions = {devices}", lines[first])
    axes = ", ".join(f'"{name}"={size}' for name, size in mesh)
    return lines[:first] + [header, f"  sdy.mesh @mesh = <[{axes}]>"] + lines[first + 1:]


def _same_program(a, b) -> bool:
    """Same ops on the same names. (Not `==`: a NaN in an attribute, as jax's
    constants have, is unequal to itself.)"""
    def shape(fn) -> list:
        return [(op.kind, [v.name for v in op.operands], [v.name for v in op.results]) for op in fn.ops]

    return [p.name for p in a.params] == [p.name for p in b.params] and shape(a) == shape(b)


def annotate_planned(planned) -> str:
    """The annotated module of a plan of an imported spec (`model.stablehlo`)."""
    spec = planned.spec
    if spec.model.stablehlo is None:
        raise ValueError(f"{spec.name}: only a plan of an imported program (model.stablehlo) can be written back "
                         "into its module")
    path = spec.stablehlo_path()
    text = path.read_text(encoding="utf-8")
    imported = import_module(text, str(path), spec.model.param_names)
    fn = planned.model.function
    if not _same_program(imported.function, fn):
        raise ValueError(f"{path}: the module no longer imports to the planned program")
    value_dims = {v.name: planned.sharding.def_dims(planned.nda, v) for op in fn.ops for v in op.results}
    return annotate_stablehlo(text, imported, planned.sharding.mesh.axes, planned.lowered.param_dims,
                              planned.lowered.result_dims, value_dims)
