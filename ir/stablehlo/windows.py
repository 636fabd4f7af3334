"""Handlers of the convolution and window ops: convolution, reduce_window,
select_and_scatter and reverse, in the forms jax prints.

    %0 = stablehlo.convolution(%a, %b) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
         window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1],
         reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, ...}
    %1 = "stablehlo.reduce_window"(%x, %init) <{base_dilations = array<i64: ...>, padding = dense<0> :
         tensor<4x2xi64>, window_dilations = ..., window_dimensions = ..., window_strides = ...}> ({ region })
    %2 = "stablehlo.select_and_scatter"(%x, %source, %init) <{padding = ..., window_dimensions = ...,
         window_strides = ...}> ({ select region }, { scatter region })
    %3 = stablehlo.reverse %x, dims = [0, 1] : tensor<...>

The generic spelling of convolution (`dimension_numbers = #stablehlo.conv<...>`,
`window_strides = array<i64: ...>`, `padding = dense<...>`, `lhs_dilation`,
`rhs_dilation`, `window_reversal = array<i1: ...>`) is read too: the keys
differ, the values do not.

Inits: a reduce_window whose init is the combiner's identity (what jax
emits) is our reduce_window alone; another init is combined with the result
once, which is exact for max and min and, for sum, only where no window
reads padding or a dilation hole (each of those would add the init again),
so a sum with such a window and another init is refused. A select_and_scatter
whose init is zero is our select_and_scatter_add; another init is added.
"""

from __future__ import annotations

import math
import re

from ir.core import Value
from ir.stablehlo.basic import COMBINERS, is_identity
from ir.stablehlo.importer import Importer, Scope, handles, region_combiner
from ir.stablehlo.reader import Stmt

FLIPPED = {"ge": "le", "gt": "lt", "le": "ge", "lt": "gt"}
# Numbers of a window attribute: a (low, high) pair or one number per dimension of the operand, whose type the
# text declares; a splat claiming more (a mutated `tensor<2147483648x2xi64>`) is refused, never spelled out.
MOST_NUMBERS = 2 * 1024


def _list(text: str, key: str, most: int) -> str | None:
    """The text of `key = [...]` (nested brackets allowed), `key = array<...: ...>` or `key = dense<...>`;
    a splat `dense<0> : tensor<AxBxi64>` of more than `most` numbers is a ValueError, never spelled out."""
    m = re.search(rf"\b{key}\s*=\s*", text)
    if m is None:
        return None
    rest = text[m.end():]
    if rest.startswith("["):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"[": 1, "]": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i + 1]
    shaped = re.match(r"(?:array<\w+(?::\s*([^>]*))?>|dense<([^>]*)>(?:\s*:\s*tensor<([\dx]*)x?i64>)?)", rest)
    if shaped is None:
        return None
    if shaped.group(2) is not None:  # dense<0> : tensor<4x2xi64>: a splat spells every element
        dims = [int(d) for d in (shaped.group(3) or "").split("x") if d]
        values = re.findall(r"-?\d+", shaped.group(2))
        count = math.prod(dims)
        if len(values) == 1 and dims and count > most:
            raise ValueError(f"{key} spells {count:,} numbers as dense<...> : tensor<{shaped.group(3)}xi64>; "
                             f"an op of this rank takes at most {most}")
        if len(values) == 1 and dims:
            values = values * count
        return "[" + ", ".join(values) + "]"
    return "[" + (shaped.group(1) or "") + "]"


def read_ints(imp: Importer, stmt: Stmt, text: str, *keys: str, default: list | None = None,
              most: int = MOST_NUMBERS) -> list[int]:
    """The ints of the first of `keys` present (true/false read as 1/0); a
    splat of more than `most` numbers is refused (`_list`)."""
    for key in keys:
        found = _list(text, key, most)
        if found is not None:
            words = re.findall(r"-?\d+|true|false", found)
            return [1 if w == "true" else 0 if w == "false" else int(w) for w in words]
    if default is not None:
        return default
    raise imp.error(stmt, f"{stmt.op}: missing {keys[0]} = [...]")


def read_pairs(imp: Importer, stmt: Stmt, text: str, rank: int, *keys: str) -> list[list[int]]:
    flat = read_ints(imp, stmt, text, *keys, default=[0] * (2 * rank), most=2 * rank)
    if len(flat) != 2 * rank:
        raise imp.error(stmt, f"{stmt.op}: {keys[0]} needs {rank} (low, high) pairs, found {len(flat)} numbers")
    return [flat[i:i + 2] for i in range(0, len(flat), 2)]


def head(stmt: Stmt) -> str:
    """The operand list: the text up to its closing parenthesis."""
    return stmt.rest.split(")")[0]


# ---------------------------------------------------------------- convolution


def dimension_numbers(imp: Importer, stmt: Stmt) -> tuple[list[int], list[int], list[int]]:
    """`[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]` as role-first index lists."""
    m = re.search(r"\[([^\]]*)\]\s*x\s*\[([^\]]*)\]\s*->\s*\[([^\]]*)\]", stmt.rest)
    if m is None:
        raise imp.error(stmt, "stablehlo.convolution: expected dim_numbers = [..]x[..]->[..]")
    out = []
    for side, roles in zip(m.groups(), ("bf", "io", "bf")):
        tokens = [s.strip() for s in side.split(",")]
        spatial = sorted((int(tok), d) for d, tok in enumerate(tokens) if tok.isdigit())
        try:
            out.append([tokens.index(roles[0]), tokens.index(roles[1])] + [d for _, d in spatial])
        except ValueError:
            raise imp.error(stmt, f"stablehlo.convolution: cannot read dimension numbers [{side}]") from None
    return out[0], out[1], out[2]


@handles("stablehlo.convolution")
def convolution(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    lhs, rhs = _arity(imp, stmt, imp.args(stmt, scope, head(stmt)), 2)
    lhs_dims, rhs_dims, out_dims = dimension_numbers(imp, stmt)
    spatial = lhs.type.rank - 2
    ones, text = [1] * spatial, stmt.rest
    attrs = dict(
        lhs_dims=lhs_dims, rhs_dims=rhs_dims, out_dims=out_dims,
        window_strides=read_ints(imp, stmt, text, "stride", "window_strides", default=ones),
        padding=read_pairs(imp, stmt, text, spatial, "pad", "padding"),
        lhs_dilation=read_ints(imp, stmt, text, "lhs_dilate", "lhs_dilation", default=ones),
        rhs_dilation=read_ints(imp, stmt, text, "rhs_dilate", "rhs_dilation", default=ones),
        window_reversal=[bool(v) for v in read_ints(imp, stmt, text, "reverse", "window_reversal",
                                                    default=[0] * spatial)],
        feature_group_count=imp.int_attr(stmt, "feature_group_count", 1),
        batch_group_count=imp.int_attr(stmt, "batch_group_count", 1))
    (want,) = imp.declared(stmt)
    if want.dtype == lhs.type.dtype:
        return [imp.checked(stmt, scope, "conv_general", [lhs, rhs], **attrs)]
    # preferred_element_type: computed in the operands' type, then converted
    out = imp.op("conv_general", [lhs, rhs], **attrs)
    return [imp.checked(stmt, scope, "convert", [out], dtype=want.dtype)]


# ---------------------------------------------------------------- reduce_window


@handles("stablehlo.reduce_window")
def reduce_window(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    operands = imp.args(stmt, scope, head(stmt))
    if len(operands) != 2:
        raise imp.error(stmt, f"stablehlo.reduce_window: only one operand and its init are supported, "
                        f"found {len(operands)} values")
    x, init = operands
    name = region_combiner(imp, stmt)
    if name not in ("add", "maximum", "minimum"):
        raise imp.error(stmt, f"stablehlo.reduce_window: combiner stablehlo.{name} is not supported; "
                        "supported: stablehlo.add, stablehlo.maximum, stablehlo.minimum")
    combiner, binary = COMBINERS[name]
    rank, ones, text = x.type.rank, [1] * x.type.rank, stmt.rest
    attrs = dict(window_dimensions=read_ints(imp, stmt, text, "window_dimensions"),
                 window_strides=read_ints(imp, stmt, text, "window_strides", default=ones),
                 padding=read_pairs(imp, stmt, text, rank, "padding"),
                 base_dilations=read_ints(imp, stmt, text, "base_dilations", default=ones),
                 window_dilations=read_ints(imp, stmt, text, "window_dilations", default=ones), combiner=combiner)
    start = imp.known.get(id(init))
    if start is not None and start.size == 1 and is_identity(start.item(), combiner, x.type.dtype):
        return [imp.checked(stmt, scope, "reduce_window", [x], **attrs)]
    holes = any(p != [0, 0] for p in attrs["padding"]) or any(d != 1 for d in attrs["base_dilations"])
    if combiner == "sum" and holes:
        raise imp.error(stmt, "stablehlo.reduce_window: a sum whose init is not a known zero is supported only "
                        "without padding and base dilation (each padded position would add the init again)")
    (want,) = imp.declared(stmt)
    reduced = imp.op("reduce_window", [x], **attrs)
    spread = imp.op("broadcast_in_dim", [init], shape=list(want.shape), dims=[])
    return [imp.checked(stmt, scope, binary, [reduced, spread])]


# ---------------------------------------------------------------- select_and_scatter


def select_direction(imp: Importer, stmt: Stmt) -> str:
    """The select region's comparison of its first block argument (the
    current selection) with its second: ge, gt, le or lt."""
    region = stmt.regions[0] if stmt.regions else None
    body = [s for s in (region.body if region else []) if s.op not in ("stablehlo.return", "return")]
    m = re.match(r"(GE|GT|LE|LT)\s*,\s*(%[\w.$-]+)\s*,\s*(%[\w.$-]+)", body[0].rest) if len(body) == 1 and \
        body[0].op == "stablehlo.compare" else None
    if m is None or region is None or sorted(m.group(2, 3)) != sorted(region.args[:2]):
        raise imp.error(stmt, "stablehlo.select_and_scatter: the select region must be one stablehlo.compare "
                        "GE, GT, LE or LT of its two arguments")
    direction = m.group(1).lower()
    return direction if m.group(2) == region.args[0] else FLIPPED[direction]


@handles("stablehlo.select_and_scatter")
def select_and_scatter(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    operands = imp.args(stmt, scope, head(stmt))
    if len(operands) != 3:
        raise imp.error(stmt, f"stablehlo.select_and_scatter: expected 3 operands, found {len(operands)}")
    x, source, init = operands
    select = select_direction(imp, stmt)
    scatter = [s.op for s in (stmt.regions[1].body if len(stmt.regions) > 1 else [])
               if s.op not in ("stablehlo.return", "return")]
    if scatter != ["stablehlo.add"]:
        raise imp.error(stmt, "stablehlo.select_and_scatter: only a scatter region of one stablehlo.add is "
                        f"supported, found {scatter or 'none'}")
    rank, text = x.type.rank, stmt.rest
    attrs = dict(window_dimensions=read_ints(imp, stmt, text, "window_dimensions"),
                 window_strides=read_ints(imp, stmt, text, "window_strides", default=[1] * rank),
                 padding=read_pairs(imp, stmt, text, rank, "padding"), select=select)
    start = imp.known.get(id(init))
    if start is not None and start.size == 1 and start.item() == 0:
        return [imp.checked(stmt, scope, "select_and_scatter_add", [x, source], **attrs)]
    # The output starts as the init everywhere; the selected positions add to it.
    (want,) = imp.declared(stmt)
    scattered = imp.op("select_and_scatter_add", [x, source], **attrs)
    spread = imp.op("broadcast_in_dim", [init], shape=list(want.shape), dims=[])
    return [imp.checked(stmt, scope, "add", [scattered, spread])]


# ---------------------------------------------------------------- reverse


@handles("stablehlo.reverse")
def reverse(imp: Importer, stmt: Stmt, scope: Scope) -> list[Value]:
    args = _arity(imp, stmt, imp.args(stmt, scope, stmt.rest.split(",")[0]), 1)
    return [imp.checked(stmt, scope, "reverse", args, dims=imp.ints(stmt, "dims"))]


def _arity(imp: Importer, stmt: Stmt, values: list[Value], n: int) -> list[Value]:
    if len(values) != n:
        raise imp.error(stmt, f"{stmt.op}: expected {n} operand(s), found {len(values)}")
    return values
