"""`shardplan explain`: the Named Dimension Analysis of a spec's program, as a
report (text or JSON) or as a Graphviz DOT graph of one color.

The JSON schema is documented in docs/json.md ("shardplan explain --json").
"""

from __future__ import annotations

import time
from typing import Any

from ir.core import IRError
from ir.nda import NDA, analyze
from solver.planning.spec import Spec

EXAMPLES_PER_COLOR = 3
LISTED = 20  # the text report lists this many of each kind; JSON lists all


def explain(spec: Spec) -> tuple[dict[str, Any], NDA]:
    """Build the spec's program, analyze it, and summarize the analysis."""
    start = time.perf_counter()
    model = spec.build()
    built = time.perf_counter()
    nda = analyze(model.function, model.groupable)
    done = time.perf_counter()
    fn = model.function
    report = {
        "spec": spec.name,
        "source": spec.source,
        "model": _model_summary(spec),
        "mesh": dict(spec.mesh),
        "hardware": spec.hardware_name,
        "program": {
            "ops": len(fn.ops),
            "values": sum(1 for _ in fn.values()),
            "params": len(model.params),
            "parameter_elements": model.parameter_elements,
            "inputs": len(model.inputs),
            "state": len(model.state),
        },
        "notes": list(model.notes),
        "colors": _colors(nda),
        "conflicts": len(nda.conflicts),
        "compat_sets": len(nda.compat_sets),
        "resolution_classes": len(nda.resolution_classes),
        "param_groups": len(nda.param_groups),
        "details": _details(nda),
        "build_time_s": built - start,
        "time_s": done - built,
    }
    return report, nda


def _model_summary(spec: Spec) -> dict[str, Any]:
    m = spec.model
    source = "builder" if m.builder else "preset" if m.preset else "stablehlo"
    summary: dict[str, Any] = {source: getattr(m, source)}
    if m.builder:
        summary["args"] = dict(m.args)
    summary["step"] = m.step
    if m.step == "train":
        summary["optimizer"] = m.optimizer
    return summary


def _colors(nda: NDA) -> list[dict[str, Any]]:
    """Colors sorted by how many dimension names they cover (ties: by id)."""
    examples: list[list[str]] = [[] for _ in range(nda.num_colors)]
    for value in nda.function.values():  # parameters first: the most telling examples
        for d in range(value.type.rank):
            shown = examples[nda.def_color(value, d)]
            if len(shown) < EXAMPLES_PER_COLOR:
                shown.append(f"%{value.name}[{d}]")
    out = []
    for color, members in enumerate(nda.color_iclasses):
        sizes = sorted({nda.iclasses[i].size for i in members})
        out.append({
            "id": color,
            "size": sizes[-1],
            "sizes": sizes,
            "dims": nda.color_names[color],
            "iclasses": len(members),
            "conflicts": len(nda.color_conflicts[color]),
            "examples": examples[color],
        })
    return sorted(out, key=lambda c: (-c["dims"], c["id"]))


def _details(nda: NDA) -> dict[str, Any]:
    describe = nda.describe_iclass
    return {
        "conflicts": [
            {"id": c.id, "color": c.color, "between": [describe(i) for i in c.iclasses]} for c in nda.conflicts
        ],
        "compat_sets": [
            {"id": s.id, "conflicts": list(s.conflicts), "resolution_class": s.resolution_class,
             "sides": [sorted(describe(i) for i in side) for side in s.sides]}
            for s in nda.compat_sets
        ],
        "resolution_classes": [{"id": r.id, "compat_sets": list(r.compat_sets)} for r in nda.resolution_classes],
        "param_groups": [list(g) for g in nda.param_groups],
    }


# ------------------------------------------------------------------ text


def format_report(report: dict[str, Any]) -> str:
    """The human-readable explain report."""
    p = report["program"]
    mesh = " x ".join(f"{n}={s}" for n, s in report["mesh"].items())
    model = report["model"]
    what = model.get("builder") or (f"preset {model['preset']}" if "preset" in model
                                    else f"StableHLO {model['stablehlo']}")
    step = f"train step ({model['optimizer']})" if model["step"] == "train" else "forward"
    lines = [
        f"{report['source']}: {what}, {step}, mesh {mesh}, {report['hardware']}",
        f"program: {p['ops']} ops, {p['values']} values; {p['params']} parameters "
        f"({p['parameter_elements']:,} scalars), {p['inputs']} batch inputs, {p['state']} optimizer state",
        f"analysis: {len(report['colors'])} colors, {report['conflicts']} conflicts, {report['compat_sets']} "
        f"compatibility sets, {report['resolution_classes']} resolution classes, {report['param_groups']} "
        f"parameter groups ({report['time_s']:.3f} s)",
        *(f"note: {n}" for n in report["notes"]),
        "",
        "colors, by dimensions covered:",
        f"  {'color':>6} {'dims':>6} {'size':>8} {'conflicts':>9}  examples",
    ]
    for c in report["colors"][:LISTED]:
        size = str(c["size"]) if len(c["sizes"]) == 1 else "/".join(map(str, c["sizes"]))
        lines.append(f"  {'#' + str(c['id']):>6} {c['dims']:>6} {size:>8} {c['conflicts']:>9}  "
                     + ", ".join(c["examples"]))
    lines += _more(report["colors"], "colors")
    details = report["details"]
    lines += _section("conflicts", [f"#{c['id']} (color #{c['color']}): {c['between'][0]}  vs  {c['between'][1]}"
                                    for c in details["conflicts"]])
    lines += _section("compatibility sets", [
        f"#{s['id']}: {len(s['conflicts'])} conflicts, resolution class {s['resolution_class']}; "
        f"side 0 shards {len(s['sides'][0])} factors, side 1 shards {len(s['sides'][1])}"
        for s in details["compat_sets"]])
    lines += _section("resolution classes", [
        f"#{r['id']}: {len(r['compat_sets'])} compatibility set(s), 2 resolutions"
        for r in details["resolution_classes"]])
    lines += _section("parameter groups", [f"{len(g)} members: {', '.join(g)}" for g in details["param_groups"]])
    return "\n".join(lines) + "\n"


def _section(title: str, rows: list[str]) -> list[str]:
    if not rows:
        return ["", f"{title}: none"]
    return ["", f"{title}:"] + [f"  {r}" for r in rows[:LISTED]] + _more(rows, title)


def _more(rows: list, what: str) -> list[str]:
    return [f"  ... and {len(rows) - LISTED} more {what} (--json lists them all)"] if len(rows) > LISTED else []


# ------------------------------------------------------------------- DOT


def color_dot(nda: NDA, color: int) -> str:
    """Graphviz DOT of one color's dimension graph: a box per I-class holding its
    dimension names, map-M edges from definitions to uses, and red dashed
    edges for conflicts (as in the TOAST paper's Figure 5d)."""
    if not 0 <= color < nda.num_colors:
        raise IRError(f"no color #{color}; colors are #0..#{nda.num_colors - 1}")
    fn = nda.function
    members: dict[int, list[tuple[int, str]]] = {i: [] for i in nda.color_iclasses[color]}
    edges = []
    for value, base in nda.def_base.items():
        for d in range(value.type.rank):
            ic = int(nda.name_iclass[base + d])
            if ic in members:
                members[ic].append((base + d, f"%{value.name}[{d}]"))
    for i, op in enumerate(fn.ops):
        for j, v in enumerate(op.operands):
            for d in range(v.type.rank):
                use = nda.use_base[i][j] + d
                ic = int(nda.name_iclass[use])
                if ic in members:
                    members[ic].append((use, f"%{v.name}[{d}] in {op.kind} #{i}"))
                    edges.append(f"  n{nda.def_base[v] + d} -> n{use};")
    lines = [f"digraph color{color} {{", "  rankdir=LR;", "  node [shape=box, fontsize=10];"]
    for ic, names in members.items():
        lines.append(f"  subgraph cluster_{ic} {{")
        lines.append(f"    label={_quote(nda.describe_iclass(ic))};")
        lines += [f"    n{n} [label={_quote(label)}];" for n, label in names]
        lines.append("  }")
    lines += edges
    for c in nda.color_conflicts[color]:
        a, b = (members[i][0][0] for i in nda.conflicts[c].iclasses)
        lines.append(f'  n{a} -> n{b} [dir=none, style=dashed, color=red, label="conflict #{c}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
