"""`shardplan compare`: the two search backends on one spec, side by side, on
the same cost model (A/B)."""

from __future__ import annotations

from typing import Any

from ir.core import IRError
from solver.planning.expect import COLLECTIVE_KINDS
from solver.planning.plan_json import plan_report
from solver.planning.planner import SearchOverrides, plan_spec, prepare
from solver.planning.spec import Spec
from solver.search.report import SILENT, Progress

BACKENDS = ("cpsat", "mcts")
NAMES = {"cpsat": "CP-SAT", "mcts": "MCTS"}


def compare(spec: Spec, overrides: SearchOverrides | None = None, progress: Progress = SILENT,
            schedule: str | None = None, floor: bool = True) -> dict[str, Any]:
    """`{"cpsat": ..., "mcts": ...}`: each the `shardplan plan --json` object of
    the spec (its schedule `schedule`, see `plan_spec`) planned with that
    backend, or `{"error": message}` if it returned no plan (nothing fits,
    or nothing found within the budget). `floor`: as `plan_spec`'s."""
    out: dict[str, Any] = {}
    prepared = prepare(spec)
    for solver in BACKENDS:
        try:
            planned = plan_spec(spec, solver, overrides=overrides, progress=progress, schedule=schedule,
                                prepared=prepared, floor=floor)
            out[solver] = plan_report(planned, solver)
        except IRError as err:
            out[solver] = {"error": str(err)}
    return out


def search_seconds(report: dict[str, Any]) -> float:
    return sum(r["build_s"] + r["solve_s"] for r in report["search"])


def verdict(report: dict[str, Any]) -> str:
    """Which backend's plan is better, and by how much (estimated step time)."""
    a, b = report["cpsat"], report["mcts"]
    if "error" in a or "error" in b:
        ok = [NAMES[s] for s in BACKENDS if "error" not in report[s]]
        return f"only {ok[0]} found a plan" if ok else "neither backend found a plan"
    ta, tb = a["cost"]["step_time_s"], b["cost"]["step_time_s"]
    if abs(ta - tb) <= 1e-9 * max(ta, tb):
        same = a["params"] == b["params"] and a["collectives"] == b["collectives"]
        return "same estimated step time" + (" (the same plan)" if same else " (different plans)")
    fast, slow = ("cpsat", "mcts") if ta < tb else ("mcts", "cpsat")
    t_fast, t_slow = min(ta, tb), max(ta, tb)
    return (f"{NAMES[fast]}'s plan is faster: {_seconds(t_fast)} against {_seconds(t_slow)} "
            f"({t_slow / t_fast - 1:.2%} slower with {NAMES[slow]})")


def format_compare(report: dict[str, Any], source: str) -> str:
    rows: list[tuple[str, list[str]]] = []
    cols = {s: report[s] for s in BACKENDS}

    def row(label: str, value) -> None:
        rows.append((label, [value(r) if "error" not in r else "-" for r in cols.values()]))

    row("estimated step time", lambda r: _seconds(r["cost"]["step_time_s"]))
    row("efficiency", lambda r: f"{r['cost']['efficiency']:.1%}")
    row("peak memory", lambda r: f"{_gib(r['cost']['peak_memory_bytes'])} of {_gib(r['cost']['capacity_bytes'])}")
    row("fits", lambda r: "yes" if r["cost"]["fits"] else "NO")
    for kind in COLLECTIVE_KINDS:
        row(kind, lambda r, kind=kind: str(r["collectives"][kind]))
    row("search time", lambda r: f"{search_seconds(r):.2f} s")
    row("status", lambda r: ", ".join(s["status"] for s in r["search"]))
    header = [""] + [NAMES[s] for s in BACKENDS]
    table = [header] + [[label, *values] for label, values in rows]
    widths = [max(len(line[c]) for line in table) for c in range(len(header))]
    lines = [f"{source}: CP-SAT against MCTS on the same cost model", ""]
    for line in table:
        cells = [cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells))
    lines.append("")
    for s in BACKENDS:
        if "error" in report[s]:
            lines.append(f"{NAMES[s]}: no plan: {report[s]['error']}")
        else:
            lines += [f"{NAMES[s]}: {r['message']}" for r in report[s]["search"]]
    lines.append(verdict(report))
    return "\n".join(lines) + "\n"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.4g} ms" if s < 1 else f"{s:.4g} s"


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"
