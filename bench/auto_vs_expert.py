"""Auto against expert on every bundled spec (specs/ and specs/moe/): the fastest named schedule
that fits (the expert floor), and each search backend's own plan and its
answer (the floor kept where no searched plan is faster), with step time,
peak memory, status and wall time.

Targets (issue 27): no answer worse than the best fitting named schedule,
for either backend; CP-SAT's memory exact (a fitting plan, or `infeasible`
only when proven); MCTS within 1% of CP-SAT.

    python bench/auto_vs_expert.py [--only NAME] [--time-limit S] [--jobs N] [--json] [--write-readme]
                                   [--write-docs]

`--jobs N`: what `shardplan plan --jobs N` does (the MCTS prices a
descent step's candidates in N processes; the same answers).

`--write-readme` replaces the summary between the README's
`<!-- auto-vs-expert:begin -->` and `<!-- auto-vs-expert:end -->` markers;
`--write-docs` writes the full table (CP-SAT's build and solve times,
rounds, memory cuts and gap) into docs/auto_vs_expert.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from ir.core import IRError  # noqa: E402
from solver.frontend.cli import GC_THRESHOLDS  # noqa: E402
from solver.planning.floor import expert_floor  # noqa: E402
from solver.planning.planner import SearchOverrides, plan_spec, prepare  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import reference_seconds, write_table  # noqa: E402, I001

ROOT = _HERE.parent
DOCS = ROOT / "docs" / "auto_vs_expert.md"
BACKENDS = ("cpsat", "mcts")
MAX_AXES = 3  # llama2_70b's 3-axis search plans in about 90 s since its layers fold (bench/scale.py)


def measure(path: Path, overrides: SearchOverrides) -> dict:
    """One spec's row: the floor, and per backend its search and its answer.
    Each backend plans in a process of its own, forked from this one before
    any spec was planned, as `shardplan plan` runs in a fresh process: in one
    process, the MCTS after CP-SAT's plan of the same spec ran 10-20% slower
    (llama2_70b 14.4-15.0 s against 12.3-13.2 s alone), on the heap and the
    caches CP-SAT left (every fork copies them, every collection scans them)."""
    row: dict = {"spec": path.stem, "expert": None}
    for solver in BACKENDS:
        expert, row[solver] = _in_a_fresh_process(_backend, path, solver, overrides)
        row["expert"] = row["expert"] or expert
        if row[solver].get("error", "").startswith("not run"):
            row.update({other: row[solver] for other in BACKENDS})  # the floor alone, priced once
            break
    expert = row["expert"]["step_time_s"] if row["expert"] else None
    for solver in BACKENDS:
        r = row[solver]
        if "error" not in r and expert is not None:
            r["answer_over_expert"] = r["step_time_s"] / expert
    if all("error" not in row[s] for s in BACKENDS):
        row["mcts_over_cpsat"] = row["mcts"]["step_time_s"] / row["cpsat"]["step_time_s"]
    return row


def _backend(path: Path, solver: str, overrides: SearchOverrides) -> tuple[dict | None, dict]:
    """The floor's best and one backend's part of `measure`'s row: its plan's
    wall from the spec prepared (built, analyzed, its baseline priced) to the
    answer, what `plan --solver` adds to that."""
    spec = load_spec(path)
    prepared = prepare(spec)
    axes = len(spec.sharding_mesh().names)
    if axes > MAX_AXES:
        floor = expert_floor(spec, lambda remat: prepared if remat == prepared.remat else prepare(spec, remat))
        return _expert(floor), {"error": f"not run ({axes}-axis mesh)", "wall_s": 0.0}
    start = time.perf_counter()
    try:
        planned = plan_spec(spec, solver, overrides=overrides, prepared=prepared)
    except IRError as err:
        return None, {"error": str(err).splitlines()[0], "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    cost, floor = planned.assessment.cost, planned.floor
    reports = [r.to_json() for r in planned.search]
    cpsat = [r for r in reports if r["solver"] == "cpsat"]
    return _expert(floor), {
        "searched_step_time_s": planned.searched_step_s if floor is not None else cost.step_time_s,
        "step_time_s": cost.step_time_s, "peak_memory_bytes": cost.peak_memory_bytes, "fits": cost.fits,
        "kept_expert": planned.floor_kept, "remat": list(planned.remat),
        "status": ",".join(r["status"] for r in reports) or "-", "wall_s": wall,
        "build_s": sum(r["build_s"] for r in reports), "solve_s": sum(r["solve_s"] for r in reports),
        "work_s": sum(r.get("work_s", 0.0) for r in reports),
        "rounds": sum(r.get("rounds", 0) for r in cpsat), "memory_cuts": sum(r["memory_cuts"] for r in cpsat),
        "no_goods": sum(r["no_goods"] for r in cpsat),
        "gap": max((r["gap"] for r in cpsat if r["gap"] is not None), default=None),
    }


def _expert(floor) -> dict | None:
    """The floor's best fitting schedule, as the row keeps it (None: none fits)."""
    best = floor.best if floor is not None else None
    if best is None:
        return None
    return {"schedule": best.schedule, "step_time_s": best.step_time_s, "peak_memory_bytes": best.peak_memory_bytes}


def _in_a_fresh_process(work, *args):
    """work(*args) in a process forked from this one (where the platform forks, else here)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return work(*args)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        return pool.submit(work, *args).result()


def _time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.4g} us" if s < 1e-3 else f"{s * 1e3:.4g} ms" if s < 1 else f"{s:.4g} s"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _search(r: dict) -> str:
    if "error" in r:
        return "-" if r["error"].startswith("not run") else "no plan"
    searched = r["searched_step_time_s"]
    if searched is None:  # CP-SAT's "floor": proven that none beats the expert, so it returned none
        return "none faster (floor)" if r["status"] == "floor" else "no plan fits"
    return _time(searched)


def _answer(r: dict) -> str:
    if "error" in r:
        return r["error"] if r["error"].startswith("not run") else f"no plan ({r['wall_s']:.3g} s)"
    head = f"{_time(r['step_time_s'])}, {_gib(r['peak_memory_bytes'])}"
    ratio = f", {r['answer_over_expert']:.3g}x" if "answer_over_expert" in r else ""
    kept = " (the expert's)" if r["kept_expert"] else ""
    return f"{head}{ratio}{kept}, {r['wall_s']:.3g} s"


def summary(rows: list[dict], seconds: float, jobs: int = 1, speed: tuple[float, float] | None = None) -> str:
    lines = ["| spec | best fitting expert | CP-SAT searched | CP-SAT answer | MCTS searched | MCTS answer |",
             "|---|---|---:|---|---:|---|"]
    for row in rows:
        e = row["expert"]
        expert = f"{e['schedule']} {_time(e['step_time_s'])}, {_gib(e['peak_memory_bytes'])}" if e else "none fits"
        c, m = row["cpsat"], row["mcts"]
        cstatus = f" {c['status']}" if "error" not in c and c["status"] != "floor" else ""
        lines.append(f"| {row['spec']} | {expert} | {_search(c)}{cstatus} | {_answer(c)} | {_search(m)} | "
                     f"{_answer(m)} |")
    worse = [f"{row['spec']} ({s})" for row in rows for s in BACKENDS
             if row[s].get("answer_over_expert", 1.0) > 1 + 1e-9]
    beat = sum(1 for row in rows if row["expert"] and "error" not in row["cpsat"]
               and not row["cpsat"]["kept_expert"] and row["cpsat"]["answer_over_expert"] < 1 - 1e-9)
    with_expert = sum(1 for row in rows if row["expert"])
    near = [row for row in rows if "mcts_over_cpsat" in row]
    within = sum(1 for row in near if row["mcts_over_cpsat"] <= 1.01)
    ran = [row["mcts"] for row in rows if "error" not in row["mcts"]]
    quick = sum(1 for m in ran if m["wall_s"] < 10)
    command = "python bench/auto_vs_expert.py" + (f" --jobs {jobs}" if jobs > 1 else "")
    processes = f"; `--jobs {jobs}`: the MCTS prices candidates in {jobs} processes" if jobs > 1 else ""
    lines += ["", f"Answers worse than the best fitting expert: {', '.join(worse) or 'none'}. CP-SAT's search beats "
              f"the expert on {beat} of the {with_expert} specs with one that fits; MCTS within 1% of CP-SAT on "
              f"{within} of {len(near)}, its answer in under 10 s on {quick} of {len(ran)}. \"searched\": the "
              "backend's own plan (\"none faster (floor)\": CP-SAT proved that no plan of its space beats the "
              "expert); \"answer\": what `plan --solver` returns (the expert's plan where no searched "
              "plan is faster), its ratio to the expert and the wall time. "
              f"{len(rows)} specs in {seconds:.0f} s{processes}, Python {platform.python_version()} on "
              f"{platform.machine()}"
              + (f", a reference Python workload {speed[0]:.2f} s before and {speed[1]:.2f} s after "
                 "(`bench/readme_table.reference_seconds`: the hour's speed; the walls scale with it)" if speed else "")
              + f", `{command}`."]
    return "\n".join(lines)


def details(rows: list[dict]) -> str:
    lines = ["| spec | CP-SAT status | build | solve | rounds | memory cuts | no-goods | gap | remat | "
             "MCTS / CP-SAT | MCTS search: set-up + search, work |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for row in rows:
        c, m = row["cpsat"], row["mcts"]
        ratio = f"{row['mcts_over_cpsat']:.4f}" if "mcts_over_cpsat" in row else "-"
        mcts = "-" if "error" in m else \
            f"{m['build_s']:.2f} + {m['solve_s']:.2f} s, {m['work_s']:.2f} s"
        if "error" in c:
            lines.append(f"| {row['spec']} | {c['error'][:80]} | | | | | | | | {ratio} | {mcts} |")
            continue
        gap = f"{c['gap']:.2%}" if c["gap"] is not None else "-"
        lines.append(f"| {row['spec']} | {c['status']} | {c['build_s']:.2f} s | {c['solve_s']:.2f} s | "
                     f"{c['rounds']} | {c['memory_cuts']} | {c['no_goods']} | {gap} | "
                     f"{', '.join(c['remat']) or '-'} | {ratio} | {mcts} |")
    return "\n".join(lines)


def write_docs(table: str, rows: list[dict], jobs: str) -> None:
    """docs/auto_vs_expert.md: the summary table and the details."""
    DOCS.write_text("# Auto against expert, in detail\n\n"
                    "[README](../README.md) · [specs](specs.md) · [architecture](ARCHITECTURE.md)\n\n"
                    f"Generated by `python bench/auto_vs_expert.py{jobs} --write-docs`; the summary is in the "
                    "README.\n\n" + table + "\n\nCP-SAT's search on each spec (its remat choice's program "
                    "when memory binds): build and solve seconds, solves, memory cuts, plans excluded one "
                    "by one, the proven gap; and the MCTS's answer over CP-SAT's, with the search of the program "
                    "answered (a remat choice's other programs are searched too, and not shown): its set-up "
                    "(`Pricing`: the fold, the keys) and search seconds, and its work on the budget's clock "
                    "(`solver.search.mcts_pricing`, \"Budget\"). The rest of the answer's wall is those other "
                    "searches and the plan's fixed stages: the remat programs built and analyzed, the cost "
                    "table, the expert floor, the lowering of the answer.\n\n" + details(rows) + "\n",
                    encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="only this spec (repeatable)")
    parser.add_argument("--time-limit", type=float, help="each search's limit (default: the spec's)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="processes, as `shardplan plan --jobs N` (default 1)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--write-readme", action="store_true", help="write the summary into README.md")
    parser.add_argument("--write-docs", action="store_true", help="write docs/auto_vs_expert.md")
    args = parser.parse_args()
    specs = sorted((ROOT / "specs").glob("*.yaml")) + sorted((ROOT / "specs" / "moe").glob("*.yaml"))
    if args.only:
        specs = [s for s in specs if s.stem in args.only]
    if args.jobs < 1:
        parser.error(f"--jobs: at least one process, got {args.jobs}")
    overrides = SearchOverrides(time_limit_s=args.time_limit, jobs=args.jobs)
    # The collector as `shardplan plan` runs it: at Python's default thresholds its full collections
    # rescan every program built so far (llama2_70b's MCTS wall 19.4 s against 15.9-17.3 s).
    gc.set_threshold(*GC_THRESHOLDS)
    before = reference_seconds()  # the hour's speed, before and after the run
    start = time.perf_counter()
    rows = []
    for path in specs:
        rows.append(measure(path, overrides))
        print(f"{path.stem}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    table = summary(rows, seconds, args.jobs, (before, reference_seconds()))
    jobs = f" --jobs {args.jobs}" if args.jobs > 1 else ""
    # --json prints the rows in place of the tables; the tables are still written where asked.
    print(json.dumps(rows, indent=2) if args.json else table + "\n\n" + details(rows))
    if args.write_readme:
        write_table("auto-vs-expert", table)
    if args.write_docs:
        write_docs(table, rows, jobs)
        print(f"wrote {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
