"""The IOPDDL contest instances (ASPLOS 2025, ../shared/iopddl/) solved by
solver/iopddl/ at the contest's time limit for each instance, against the
best known cost (the contest's final results) and XLA's own auto-sharding
solver where its cost was published.

Each instance runs in a fresh subprocess (this script re-invoked with
`--one NAME`), so its memory is returned and a crash or a hang (timeout:
limit x 1.5 + 120 s) costs one row, not the run. A full run takes about
47 minutes; rows are printed as the instances finish.

    python bench/iopddl.py [--dir PATH] [--only NAME] [--time-scale X] [--workers N] [--seed S]
                           [--json] [--write-readme]

`--write-readme` replaces the text between the README's
`<!-- iopddl-table:begin -->` and `<!-- iopddl-table:end -->` markers, so
the published figures are the ones this script printed. `--time-scale 0.05`
makes a quick trial run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

ROOT = _HERE.parent
DATA = ROOT.parent / "shared" / "iopddl"
BEGIN, END = "<!-- iopddl-table:begin -->", "<!-- iopddl-table:end -->"
PATTERN = re.compile(r"asplos-2025-iopddl-([A-Z]+)\.json\.gz")
CONTEST_CORES = 8
NEAR_BEST = 1.10  # "within 1.10x of the best known cost"

# Contest timeout per instance, seconds (../shared/iopddl/README.md, "What is here").
LIMITS = {"A": 60, "B": 60, "C": 60, "D": 60, "G": 120, "K": 180, "L": 180, "M": 180, "N": 180,
          "P": 240, "Q": 240, "R": 240, "S": 240, "T": 240, "U": 300, "V": 300}

# Best known cost and XLA's cost (None: not published), from the same README's "Best known costs"
# table (asplos-contest/2025 misc/iopddl_final_results.csv).
BEST = {"A": 6_548_641_531, "B": 532_843, "C": 84_102_445_260, "D": 313_613_524_736, "G": 217_039,
        "K": 2_274_276_676, "L": 1_970_993_742, "M": 49_928_460_991, "N": 202_739_586_553,
        "P": 651_833_115_436, "Q": 526_776_842_042, "R": 371_899_551_572, "S": 1_534_613_444,
        "T": 682_895_254_913, "U": 2_569_342_178, "V": 1_632_051}
XLA = {"A": 13_214_846_074, "B": 990_205, "C": 4_195_881_092_919, "G": 1_264_777,
       "P": 651_833_115_436, "Q": 1_995_944_800_323}


def instances(folder: Path) -> dict[str, Path]:
    """Instance name -> file, for the instances in `folder` that have a known time limit."""
    found = {}
    for path in sorted(folder.glob("asplos-2025-iopddl-*.json.gz")):
        m = PATTERN.fullmatch(path.name)
        if m is None:
            continue
        if m.group(1) not in LIMITS:
            print(f"{path.name}: no contest time limit known, skipped", file=sys.stderr)
            continue
        found[m.group(1)] = path
    return found


# ------------------------------------------------------------------ child


def run_one(path: Path, limit_s: float, workers: int, seed: int) -> dict:
    """Read and solve one instance in this process (the child's side)."""
    from solver.iopddl import SolveOptions, read_problem, solve

    began = time.perf_counter()
    problem = read_problem(path)
    read_s = time.perf_counter() - began
    result = solve(problem, SolveOptions(time_limit_s=limit_s, workers=workers, seed=seed))
    return {"instance": problem.name, "nodes": problem.num_nodes, "edges": problem.num_edges,
            "cost": int(result.evaluation.cost), "feasible": bool(result.evaluation.feasible),
            "seconds": result.seconds, "read_s": read_s, "rounds": result.rounds, "message": result.message}


# ------------------------------------------------------------------ parent


def measure(name: str, path: Path, limit_s: float, workers: int, seed: int) -> dict:
    """Solve one instance in a fresh subprocess; a timeout or crash becomes a row with `error`."""
    row: dict = {"instance": name, "limit_s": limit_s, "best": BEST.get(name), "xla": XLA.get(name)}
    command = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--dir", str(path.parent),
               "--limit", repr(limit_s), "--workers", str(workers), "--seed", str(seed)]
    timeout = limit_s * 1.5 + 120
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        row["wall_s"] = time.perf_counter() - began
        row["error"] = f"timed out after {timeout:.0f} s"
        return row
    row["wall_s"] = time.perf_counter() - began
    lines = done.stdout.strip().splitlines()
    try:
        if done.returncode != 0 or not lines:
            raise ValueError
        child = json.loads(lines[-1])
    except ValueError:
        rc = done.returncode
        row["error"] = (f"killed by signal {-rc}" if rc < 0 else f"crashed (exit status {rc})" if rc else
                        "no result printed")
        row["detail"] = " / ".join(done.stderr.strip().splitlines()[-3:])  # JSON and stderr only
        return row
    row.update({k: v for k, v in child.items() if k != "instance"})
    row["problem"] = child["instance"]
    if row["feasible"]:
        row["ours_best"] = row["cost"] / row["best"] if row["best"] else None
        row["ours_xla"] = row["cost"] / row["xla"] if row["xla"] else None
    return row


def _ratio(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def _cost(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


HEADER = ["| instance | nodes | edges | time limit | our cost | feasible | best known | XLA | ours / best "
          "| ours / XLA | time |",
          "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]


def markdown_row(row: dict) -> str:
    limit = f"{row['limit_s']:g} s"
    if "error" in row:
        cells = [row["instance"], "-", "-", limit, row["error"], "no", _cost(row["best"]), _cost(row["xla"]),
                 "", "", "-"]
    else:
        cells = [row["instance"], f"{row['nodes']:,}", f"{row['edges']:,}", limit, _cost(row["cost"]),
                 "yes" if row["feasible"] else "no", _cost(row["best"]), _cost(row["xla"]),
                 _ratio(row.get("ours_best")), _ratio(row.get("ours_xla")), f"{row['seconds']:.1f} s"]
    return "| " + " | ".join(cells) + " |"


def summary(rows: list[dict], workers: int, scale: float) -> str:
    feasible = [r for r in rows if r.get("feasible")]
    with_xla = [r for r in rows if r["xla"] is not None]
    beat_xla = [r for r in feasible if r.get("ours_xla") is not None and r["ours_xla"] <= 1]
    near = [r for r in feasible if r.get("ours_best") is not None and r["ours_best"] <= NEAR_BEST]
    limits = "the same time limits" if scale == 1 else f"the contest's time limits x {scale:g}"
    return (f"Feasible: {len(feasible)} of {len(rows)}; at most XLA's cost: {len(beat_xla)} of {len(with_xla)} "
            f"(instances with an XLA cost); within {NEAR_BEST:.2f}x of the best known cost: {len(near)} of "
            f"{len(rows)}.\n\n"
            f"The runs used {workers} worker{'s' if workers != 1 else ''} on this {os.cpu_count()}-core machine, "
            f"where the contest used {CONTEST_CORES}-core machines, and {limits} (the limit bounds the solve; "
            f"reading the file, timed separately, is not counted). Python {platform.python_version()} on "
            f"{platform.machine()}, `python bench/iopddl.py`.")


def _readme_text(path: Path) -> str:
    content = path.read_text(encoding="utf-8")
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{path}: the markers {BEGIN} and {END} are missing; add them where the table goes")
    return content


def write_readme(text: str, path: Path = ROOT / "README.md") -> None:
    content = _readme_text(path)
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")
    print(f"wrote the table into {path}", file=sys.stderr)


def _progress(row: dict) -> str:
    if "error" in row:
        detail = f": {row['detail']}" if row.get("detail") else ""
        return f"{row['instance']}: {row['error']} ({row['wall_s']:.1f} s wall){detail}"
    ratio = f", {row['ours_best']:.3g} x best" if row.get("ours_best") is not None else ""
    return (f"{row['instance']}: cost {row['cost']:,} ({row['message']}{ratio}); read {row['read_s']:.1f} s, "
            f"solve {row['seconds']:.1f} s, {row['rounds']} rounds, {row['wall_s']:.1f} s wall")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DATA, help=f"the instances' folder (default: {DATA})")
    parser.add_argument("--only", action="append", metavar="NAME", help="only this instance: A, B, ... (repeatable)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="multiply the contest's time limits (e.g. 0.05 for a quick trial)")
    parser.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    parser.add_argument("--write-readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--limit", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    found = instances(args.dir)
    if args.one:
        if args.one not in found or args.limit is None:
            parser.error(f"--one needs --limit and an instance of {args.dir}, got {args.one}")
        print(json.dumps(run_one(found[args.one], args.limit, args.workers, args.seed)), flush=True)
        return 0
    names = sorted(found)
    if args.only:
        missing = sorted(set(args.only) - set(found))
        if missing:
            parser.error(f"no instance {', '.join(missing)} in {args.dir} (have: {' '.join(names) or 'none'})")
        names = [n for n in names if n in args.only]
    if not names:
        parser.error(f"no instances in {args.dir}")
    if args.write_readme:
        _readme_text(ROOT / "README.md")  # fail now, not after the run
    if not args.json:
        print("\n".join(HEADER), flush=True)
    rows = []
    for name in names:
        limit = LIMITS[name] * args.time_scale
        print(f"{name}: solving ({limit:g} s limit) ...", file=sys.stderr, flush=True)
        row = measure(name, found[name], limit, args.workers, args.seed)
        rows.append(row)
        print(_progress(row), file=sys.stderr, flush=True)
        if not args.json:
            print(markdown_row(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n" + summary(rows, args.workers, args.time_scale), flush=True)
    if args.write_readme:
        write_readme("\n".join(HEADER + [markdown_row(r) for r in rows]) + "\n\n"
                     + summary(rows, args.workers, args.time_scale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
