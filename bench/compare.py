"""The A/B table of the two search backends on every bundled spec: each
backend's search time and estimated step time (the same cost model), and
the ratio MCTS / CP-SAT.

Targets (issue 8): MCTS within 5% of CP-SAT's estimated step time on every
spec; CP-SAT never worse than MCTS when it reports optimal.

    python bench/compare.py [--budget S] [--iterations N] [--only NAME] [--json] [--write-docs]

The backends' own searches are compared (no expert floor, which would hand
both the same schedule where it wins: bench/auto_vs_expert.py shows that).
`--write-docs` replaces the table between the `<!-- compare-table:begin -->`
and `<!-- compare-table:end -->` markers of docs/specs.md, so the published
figures are the ones this script printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from solver.frontend.compare import compare, search_seconds  # noqa: E402
from solver.planning.planner import SearchOverrides  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402
from solver.search import CPSAT_TIME_LIMIT_S, MCTS_TIME_LIMIT_S  # noqa: E402
from solver.search.report import Progress  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import write_table  # noqa: E402, I001

ROOT = _HERE.parent
TARGET = 0.05  # MCTS within 5% of CP-SAT


def measure(path: Path, overrides: SearchOverrides, progress: Progress) -> dict:
    spec = load_spec(path)
    report = compare(spec, overrides, progress, floor=False)
    row = {"spec": path.stem, "mesh": spec.mesh}
    for solver in ("cpsat", "mcts"):
        r = report[solver]
        if "error" in r:
            row[solver] = {"error": r["error"]}
            continue
        row[solver] = {"step_time_s": r["cost"]["step_time_s"], "search_s": search_seconds(r),
                       "status": ",".join(s["status"] for s in r["search"]), "fits": r["cost"]["fits"]}
    if "error" not in row["cpsat"] and "error" not in row["mcts"]:
        row["ratio"] = row["mcts"]["step_time_s"] / row["cpsat"]["step_time_s"]
        row["mcts_within_target"] = row["ratio"] <= 1 + TARGET
        row["cpsat_not_worse"] = row["cpsat"]["status"] != "optimal" or row["ratio"] >= 1 - 1e-9
    return row


def _time(s: float) -> str:
    return f"{s * 1e3:.4g} ms" if s < 1 else f"{s:.4g} s"


def markdown(rows: list[dict], overrides: SearchOverrides) -> str:
    lines = [
        "| spec | mesh | CP-SAT step time | CP-SAT search | CP-SAT status | MCTS step time | MCTS search "
        "| MCTS / CP-SAT |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        mesh = " x ".join(f"{a}={n}" for a, n in row["mesh"].items())
        cells = [row["spec"], mesh]
        for solver in ("cpsat", "mcts"):
            r = row[solver]
            if "error" in r:
                cells += ["no plan", "-"] + (["-"] if solver == "cpsat" else [])
                continue
            cells += [_time(r["step_time_s"]), f"{r['search_s']:.1f} s"] + ([r["status"]] if solver == "cpsat" else [])
        cells.append(f"{row['ratio']:.4f}" if "ratio" in row else "-")
        lines.append("| " + " | ".join(cells) + " |")
    budget = (f"{overrides.time_limit_s:g} s" if overrides.time_limit_s
              else f"the spec's (default {CPSAT_TIME_LIMIT_S:g} s for CP-SAT, {MCTS_TIME_LIMIT_S:g} s for the MCTS)")
    iterations = overrides.iterations or "the spec's (default 200)"
    lines.append("")
    lines.append(f"Budget per backend: {budget}; MCTS trajectories: {iterations}; seed "
                 f"{overrides.seed if overrides.seed is not None else 0}; one worker; "
                 f"Python {platform.python_version()} on {platform.machine()}, `python bench/compare.py`.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, help="time limit of each backend, seconds (default: the spec's)")
    parser.add_argument("--iterations", type=int, help="MCTS trajectories (default: the spec's)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--only", action="append", metavar="NAME", help="only this spec (repeatable)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/specs.md")
    args = parser.parse_args()
    overrides = SearchOverrides(time_limit_s=args.budget, iterations=args.iterations, seed=args.seed)
    specs = sorted((ROOT / "specs").glob("*.yaml"))
    if args.only:
        specs = [p for p in specs if p.stem in args.only]
    progress = Progress(sys.stderr)
    rows = []
    for path in specs:
        rows.append(measure(path, overrides, progress))
        progress.clear()
        print(f"{path.stem}: done", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = markdown(rows, overrides)
    print(table)
    missed = [r["spec"] for r in rows if not r.get("mcts_within_target", False)]
    worse = [r["spec"] for r in rows if not r.get("cpsat_not_worse", False)]
    print(f"\nMCTS within {TARGET:.0%} of CP-SAT: {len(rows) - len(missed)} of {len(rows)} specs"
          + (f" (missed: {', '.join(missed)})" if missed else ""))
    print("CP-SAT optimal and worse than MCTS: " + (", ".join(worse) if worse else "never"))
    if args.write_docs:
        write_table("compare-table", table, ROOT / "docs" / "specs.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
