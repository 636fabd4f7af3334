"""`shardplan export`: a plan's shardings as JAX `PartitionSpec`s, one per
function argument and per result in the program's flat order, plus the mesh.

Both functions take the `shardplan plan --json` object (`plan_json.plan_report`)
rather than a `Planned`: it already holds everything needed (the mesh, each
parameter's and result's global type and axes per dimension), and exporting
plain data keeps them pure and lets a saved plan report be exported too.

A dimension's entry is None when it is replicated, the axis name when one
mesh axis shards it, and the axes major to minor when several do: the same
order as JAX's `P(("model", "batch"))`, whose first axis is the major one.
"""

from __future__ import annotations

import json
from typing import Any

Entry = None | str | list[str]


def partition_spec(sharding: list[list[str]]) -> list[Entry]:
    """One entry per dimension of a `sharding` (per dimension, its mesh axes major to minor)."""
    return [None if not axes else axes[0] if len(axes) == 1 else list(axes) for axes in sharding]


def export_json(report: dict[str, Any]) -> dict[str, Any]:
    """The `shardplan export --format json` object (schema in docs/json.md)."""
    return {
        "spec": report["spec"],
        "source": report["source"],
        "schedule": report["schedule"],
        "solver": report["solver"],
        "mesh": {"axes": list(report["mesh"]), "shape": list(report["mesh"].values())},
        "in_shardings": _shardings(report["params"]),
        "out_shardings": _shardings(report["results"]),
    }


def _shardings(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": t["name"], "type": t["type"], "partition_spec": partition_spec(t["sharding"])} for t in tensors]


def export_python(report: dict[str, Any]) -> str:
    """A snippet that defines `mesh`, `in_shardings` and `out_shardings` for
    `jax.jit(f, in_shardings=..., out_shardings=...)`."""
    exported = export_json(report)
    mesh = exported["mesh"]
    schedule = f"schedule {exported['schedule']}" if exported["schedule"] else "the spec's schedule"
    lines = [
        f"# Shardings of {exported['source']} ({schedule}, solver {exported['solver']}), by shardplan export.",
        "import jax",
        "from jax.sharding import NamedSharding, PartitionSpec as P",
        "",
        f"mesh = jax.make_mesh({_tuple([str(s) for s in mesh['shape']])}, {_tuple([_str(a) for a in mesh['axes']])})",
        "",
        *_assignment("in_shardings", exported["in_shardings"]),
        *_assignment("out_shardings", exported["out_shardings"]),
        "# Both tuples follow the program's flat argument and result order (the names in the comments).",
        "# For a function of pytrees, unflatten them with the structure of its arguments and results, e.g.",
        "#   in_shardings = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args), in_shardings)",
        "# (jax flattens a dict in sorted key order), then",
        "#   jax.jit(f, in_shardings=in_shardings, out_shardings=out_shardings)",
    ]
    return "\n".join(lines) + "\n"


def _assignment(variable: str, shardings: list[dict[str, Any]]) -> list[str]:
    # One sharding per line with a trailing comma, so a single one is still a tuple.
    rows = [f"    NamedSharding(mesh, {_p(s['partition_spec'])}),  # {s['name']}: {s['type']}" for s in shardings]
    return [f"{variable} = (", *rows, ")"] if rows else [f"{variable} = ()"]


def _p(spec: list[Entry]) -> str:
    """`P(...)` with every dimension written out, or `P()` when none is sharded."""
    if all(entry is None for entry in spec):
        return "P()"
    return "P(" + ", ".join(_entry(entry) for entry in spec) + ")"


def _entry(entry: Entry) -> str:
    if entry is None:
        return "None"
    if isinstance(entry, str):
        return _str(entry)
    return _tuple([_str(axis) for axis in entry])


def _str(text: str) -> str:
    # A JSON string is a valid Python string literal, in the double quotes JAX's docs use.
    return json.dumps(text)


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
