"""Did XLA keep the plan's shardings? Reads the HLO module XLA's SPMD
partitioner starts from (after Shardy's propagation, `shardy-xla`) and
compares each annotated value's sharding with the plan's
(`tools/xla_plan_check.py`; no jax needed here).

    options = {"xla_dump_to": folder, "xla_dump_hlo_pass_re": "shardy-xla", "xla_dump_hlo_as_text": True}
    compiled = compile_annotated(annotated, mesh, args, outs, in_dims, out_dims, compiler_options=options)
    check = check_shardings(annotated, *dumped_modules(folder), mesh_axes, in_dims, out_dims)

What is compared (`solver.frontend.annotate` writes the annotations):

  - @main's arguments and results: the entry parameters' and the root
    tuple's `sharding={...}` against the plan's axes per dimension;
  - each value of @main's body the annotated module constrains
    (`%v = sdy.sharding_constraint %sp.v <@mesh, dims>`): XLA turns the
    constraint into a `custom-call @Sharding` whose metadata names the
    annotated text's line (`source_line`), and Shardy's export into a
    `copy` whose metadata names that custom-call (`op_name`). The value is
    kept when the copy's sharding is the plan's and the op that makes the
    value (the copy's operand) is computed in that sharding too, so the
    copy moves nothing.

Two shardings are equal when every device holds the same tile of the
array: the HLO form (`devices=[4,1,2]<=[8] last_tile_dim_replicate`, an
iota tile assignment, maybe transposed, or a device list) and the plan's
form (mesh axes per dimension, major to minor, devices numbered row-major
over the mesh as jax's Mesh numbers them) are both decoded to the tile
index each device holds along each dimension (`device_tiles`, `mesh_tiles`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from solver.frontend.hlo_collectives import _computations, _instructions

DimAxes = Sequence[Sequence[str]]
Tiles = tuple[tuple[int, ...], ...]  # per device (logical id), its tile's index along each dimension
_CONSTRAINT = re.compile(r"^\s*(%[\w.#\-]+) = sdy\.sharding_constraint %\S+ <@\w+, (\[.*\])> : tensor<([^>]*)>")


@dataclasses.dataclass(frozen=True, slots=True)
class Difference:
    """A value whose sharding in XLA's module is not the plan's."""

    value: str  # `argument 3`, `result 0`, or `%1087 (line 2369)` of the annotated text
    planned: str  # the plan's axes per dimension, as Shardy writes them
    xla: str  # what XLA's module says (the op's sharding where the constraint's is the plan's)


@dataclasses.dataclass(frozen=True, slots=True)
class ShardingCheck:
    """Per group, (values that agree, values compared); then the differences."""

    arguments: tuple[int, int]
    results: tuple[int, int]
    values: tuple[int, int]
    differences: tuple[Difference, ...]

    def summary(self) -> str:
        """`arguments 26/26, results 26/26, values 555/555`."""
        return ", ".join(f"{name} {a}/{n}" for name, (a, n) in
                         (("arguments", self.arguments), ("results", self.results), ("values", self.values)))


def sdy_dims_text(dims: DimAxes) -> str:
    return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}" for axes in dims) + "]"


def parse_sdy_dims(text: str) -> tuple[tuple[str, ...], ...]:
    """`[{"batch"}, {}, {"model", "batch"}]` -> (("batch",), (), ("model", "batch"))."""
    return tuple(tuple(re.findall(r'"([^"]+)"', group)) for group in re.findall(r"\{([^{}]*)\}", text))


def mesh_tiles(dims: DimAxes, mesh: Sequence[tuple[str, int]]) -> Tiles:
    """Per device of the row-major mesh, the tile it holds along each dimension (axes major to minor)."""
    sizes = dict(mesh)
    out = []
    for device in range(int(np.prod([s for _, s in mesh]))):
        coords = dict(zip(sizes, np.unravel_index(device, [s for _, s in mesh])))
        tile = []
        for axes in dims:
            index = 0
            for axis in axes:
                index = index * sizes[axis] + int(coords[axis])
            tile.append(index)
        out.append(tuple(tile))
    return tuple(out)


def device_tiles(sharding: str, rank: int, devices: int) -> Tiles | None:
    """Per device, the tile it holds along each of `rank` dimensions under the
    HLO sharding `{...}`; None for a sharding that is not a tiling
    (`maximal`, `manual`, a manual subgroup) or does not cover `devices`."""
    body = sharding.strip().removeprefix("{").removesuffix("}").strip()
    if body == "replicated":
        return ((0,) * rank,) * devices
    m = re.match(r"devices=\[([\d,]+)\](.*)$", body)
    if m is None or "manual" in body:
        return None
    tile = [int(x) for x in m.group(1).split(",")]
    rest = m.group(2)
    iota = re.match(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if iota:
        shape = [int(x) for x in iota.group(1).split(",")]
        order = np.arange(int(np.prod(shape))).reshape(shape)
        if iota.group(2):
            order = order.transpose([int(x) for x in iota.group(2).split(",")])
    else:
        order = np.array([int(x) for x in re.match(r"\s*([\d,]+)", rest).group(1).split(",")])
    if order.size != devices or len(tile) < rank:
        return None
    order = order.reshape(tile)
    out: list[tuple[int, ...]] = [()] * devices
    for index in np.ndindex(*tile):  # dimensions past `rank` are replication subgroups
        out[int(order[index])] = tuple(int(i) for i in index[:rank])
    return tuple(out)


def split_tuple_sharding(sharding: str) -> list[str]:
    """`{{replicated}, {devices=[2,1]<=[2]}}` -> each element's `{...}`; a single sharding -> [it]."""
    inner = re.sub(r"/\*.*?\*/", "", sharding).strip()[1:-1].strip()  # XLA numbers every 5th: /*index=5*/
    if not inner.startswith("{"):
        return ["{" + inner + "}"]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "}" and depth == 0:
            parts.append(inner[start:i + 1].strip().lstrip(","))
            start = i + 1
    return [p.strip() for p in parts]


def attr_braced(text: str, name: str) -> str | None:
    """The balanced `{...}` after `name=` in an HLO line (`sharding=`), or None."""
    at = text.find(name + "={")
    if at < 0:
        return None
    start, depth = at + len(name) + 1, 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    return None


def dumped_modules(folder: str | pathlib.Path) -> tuple[str, str]:
    """The module before and after Shardy's pass (`shardy-xla`) that XLA
    dumped into `folder` (`xla_dump_hlo_pass_re: shardy-xla`): one compilation."""
    folder = pathlib.Path(folder)
    found = [sorted(folder.glob(f"*{which}.txt")) for which in ("before_shardy-xla", "after_shardy-xla.*")]
    if any(len(f) != 1 for f in found):
        raise ValueError(f"{folder}: expected one module before and one after shardy-xla, found {found}")
    return found[0][0].read_text(), found[1][0].read_text()


def check_shardings(annotated: str, before: str, after: str, mesh: Sequence[tuple[str, int]],
                    param_dims: Sequence[DimAxes], result_dims: Sequence[DimAxes]) -> ShardingCheck:
    """The plan's shardings (`param_dims`, `result_dims` and the annotated
    text's constraints) against XLA's module `after` Shardy's propagation,
    `before` it naming each constraint's line (the module docstring)."""
    devices = int(np.prod([s for _, s in mesh]))
    computations = _computations(after)
    everything = {n: i for lines in computations.values() for n, i in _instructions(lines).items()}
    differences: list[Difference] = []

    def same(hlo: str | None, dims: DimAxes) -> bool:
        return hlo is not None and device_tiles(hlo, len(dims), devices) == mesh_tiles(dims, mesh)

    params = {int(m.group(1)): attr_braced(line, "sharding") for line in computations["ENTRY"]
              if (m := re.search(r" parameter\((\d+)\)", line))}
    root = next(line for line in computations["ENTRY"] if line.lstrip().startswith("ROOT"))
    roots = split_tuple_sharding(attr_braced(root, "sharding") or "{}")
    arguments = results = 0
    for group, planned, found in (("argument", param_dims, params), ("result", result_dims, dict(enumerate(roots)))):
        for i, dims in enumerate(planned):
            if same(found.get(i), dims):
                arguments += group == "argument"
                results += group == "result"
            else:
                differences.append(Difference(f"{group} {i}", sdy_dims_text(dims), found.get(i) or "none"))
    kept, values = _check_values(annotated, before, everything, same)
    differences += values
    return ShardingCheck((arguments, len(param_dims)), (results, len(result_dims)),
                         (kept, kept + len(values)), tuple(differences))


def _check_values(annotated: str, before: str, after: dict, same) -> tuple[int, list[Difference]]:
    """(kept, differences) over the annotated text's constraints."""
    planned = {}  # line number -> (ssa name, dims)
    for number, line in enumerate(annotated.splitlines(), 1):
        if m := _CONSTRAINT.match(line):
            planned[number] = (m.group(1), parse_sdy_dims(m.group(2)))
    lines = {}  # custom-call name -> its annotated line
    for name, (op, _, rest) in _instructions(before.splitlines()).items():
        if op == "custom-call" and 'custom_call_target="Sharding"' in rest and (
                m := re.search(r"source_line=(\d+)", rest)):
            lines[name] = int(m.group(1))
    copies = {}  # annotated line -> (the copy's sharding, its operand's sharding, the operand's opcode)
    for op, args, rest in after.values():
        m = re.search(r'op_name="([^"]+)"', rest)
        if op == "copy" and m and m.group(1) in lines:
            made = after.get(args[0], ("?", [], ""))
            copies[lines[m.group(1)]] = (attr_braced(rest, "sharding"), attr_braced(made[2], "sharding"), made[0])
    kept, differences = 0, []
    for number, (ssa, dims) in sorted(planned.items()):
        constraint, made, opcode = copies.get(number, (None, None, "?"))
        if same(constraint, dims) and same(made, dims):
            kept += 1
            continue
        xla = ("no constraint left before partitioning" if constraint is None else
               f"constraint {constraint}" if not same(constraint, dims) else f"{opcode} computed in {made}")
        differences.append(Difference(f"{ssa} (line {number})", sdy_dims_text(dims), xla))
    return kept, differences
