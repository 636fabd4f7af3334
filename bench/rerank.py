"""How often the simulator's re-ranking changes CP-SAT's winner, on every
bundled spec (2-axis meshes; 3-axis ones take minutes to build, see
bench/efficiency.py).

CP-SAT proves the serial step time (the fused kernels' sum). With
`--rerank K` it goes on to the K best distinct plans and keeps the one
whose simulated makespan (collectives beside compute) is shortest. Per spec
this prints the optimum's serial time and makespan, the kept plan's, whether
the winner changed, and the search time with and without re-ranking.

    python bench/rerank.py [--k 4] [--only NAME] [--json] [--write-docs]

`--write-docs` replaces the table between docs/specs.md's
`<!-- rerank-table:begin -->` and `<!-- rerank-table:end -->` markers.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from ir.pipeline import PIPELINE  # noqa: E402
from solver.planning.planner import SearchOverrides, plan_spec, prepare  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402
from solver.search.report import NoPlanFits  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import write_table  # noqa: E402, I001

ROOT = _HERE.parent
MAX_AXES = 2


def measure(path: Path, k: int) -> dict:
    spec = load_spec(path)
    row: dict = {"spec": path.stem}
    if len(spec.mesh) > MAX_AXES:
        row["skipped"] = f"{len(spec.mesh)}-axis mesh"
        return row
    prepared = prepare(spec)
    timings = {}
    planned = {}
    for rerank in (1, k):
        start = time.perf_counter()
        try:
            planned[rerank] = plan_spec(spec, "cpsat", prepared=prepared, overrides=SearchOverrides(rerank=rerank),
                                        floor=False)
        except NoPlanFits:
            row["skipped"] = "no plan fits"
            return row
        timings[rerank] = time.perf_counter() - start
    reports = [r for r in planned[k].search if r.solver == "cpsat"]
    report = reports[-1]
    if not report.rerank_makespans_s:  # no second plan: the space has one, or the time limit was spent
        row["skipped"] = f"one plan found ({report.status}, {report.rounds} solves in {report.solve_s:.1f} s)"
        return row
    w = report.rerank_winner
    row.update(
        remat=list(planned[k].remat), compared=len(report.rerank_makespans_s), winner=w + 1,
        optimum_serial_s=report.rerank_objectives_s[0], optimum_makespan_s=report.rerank_makespans_s[0],
        kept_serial_s=report.rerank_objectives_s[w], kept_makespan_s=report.rerank_makespans_s[w],
        evaluated_serial_s=planned[k].assessment.cost.step_time_s,
        search_s=timings[1], search_rerank_s=timings[k])
    return row


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f} ms" if s >= 1e-3 else f"{s * 1e6:,.3g} us"


def markdown(rows: list[dict], k: int) -> str:
    lines = [f"| spec | optimum: serial, with overlap | kept (of the {k} best): serial, with overlap | changed "
             "| makespan gained | plan time, K=1 / K=" + str(k) + " |",
             "|---|---|---|---|---:|---|"]
    done = [r for r in rows if "skipped" not in r]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['spec']} | not run: {r['skipped']} | | | | |")
            continue
        changed = r["winner"] != 1
        gained = 1 - r["kept_makespan_s"] / r["optimum_makespan_s"]
        lines.append(f"| {r['spec']} | {_ms(r['optimum_serial_s'])}, {_ms(r['optimum_makespan_s'])} "
                     f"| #{r['winner']}: {_ms(r['kept_serial_s'])}, {_ms(r['kept_makespan_s'])} "
                     f"| {'yes' if changed else 'no'} | {gained:.2%} "
                     f"| {r['search_s']:.1f} s / {r['search_rerank_s']:.1f} s |")
    changed = [r for r in done if r["winner"] != 1]
    if done:
        best = max((1 - r["kept_makespan_s"] / r["optimum_makespan_s"] for r in done), default=0.0)
        lines += ["", f"The re-ranking changed the winner on {len(changed)} of {len(done)} specs; the largest "
                  f"makespan gained is {best:.2%}. Serial: the step time CP-SAT proves (fused kernels in sequence); "
                  "with overlap: the two-stream simulator's makespan. Python "
                  f"{platform.python_version()} on {platform.machine()}, `python bench/rerank.py --write-docs`."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4, help="plans the simulator compares (default 4)")
    parser.add_argument("--only", action="append", metavar="NAME", help="only this spec (repeatable)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/specs.md")
    args = parser.parse_args()
    if args.k < 2:
        parser.error("--k must be at least 2 (1 is the optimum without re-ranking)")
    specs = sorted((ROOT / "specs").glob("*.yaml"))
    if args.only:
        specs = [p for p in specs if p.stem in args.only]
    # A pipeline is priced by its schedule, not by one program's serial sum, overlap or re-ranking:
    # bench/distir_grid.py covers pipelines.
    specs = [p for p in specs if PIPELINE not in load_spec(p).mesh]
    rows = []
    for path in specs:
        rows.append(measure(path, args.k))
        what = rows[-1].get("skipped") or f"winner #{rows[-1]['winner']}"
        print(f"{path.stem}: {what}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = markdown(rows, args.k)
    print(table)
    if args.write_docs:
        write_table("rerank-table", table, ROOT / "docs" / "specs.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
