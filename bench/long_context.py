"""Long context: each way to split a long sequence, priced, beside what
CP-SAT chooses.

For every spec under specs/long_context/ (Llama-3-8B-shaped at 128k tokens
on 64 H100s, Llama-2-70B-shaped at 32k on 128), each named schedule (TP+SP,
context parallelism with all-gathered K/V, Ulysses, ...) is planned as
written and the spec is searched by CP-SAT (`--solver cpsat`, its named
schedules as the expert floor); the 8B-shaped spec is also planned with
its mesh left to the planner (`mesh: {data: auto, context: auto, model:
auto}`, `--jobs 2`). Each runs as a user runs it, in a process of its own:
the scheme the report names for each mesh axis, the microbatches chosen
(`microbatches: auto`: the fewest that fit), the step time (the serial sum
the search minimizes) and, without microbatches, the two-stream
simulation's (communication overlapping compute), the peak memory per
device, whether it fits, the wall time.

    python bench/long_context.py [--json] [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("specs/long_context/llama3_8b_128k.yaml", "specs/long_context/llama2_70b_32k.yaml")
MESH_AUTO = ("specs/long_context/llama3_8b_128k.yaml", "mesh: {context: 8, model: 8}",
             "mesh: {data: auto, context: auto, model: auto}")
SHORT = {"data parallel": "DP", "context parallel (K/V all-gathered)": "CP",
         "context parallel (ring of K/V blocks)": "CP ring", "Ulysses (all_to_all around attention)":
         "Ulysses", "tensor parallel": "TP", "sequence parallel": "SP", "ZeRO-3 (weights gathered where read)":
         "ZeRO-3", "ZeRO-1/2 (optimizer state split)": "ZeRO-1/2"}


def plan(spec: str, *flags: str) -> dict:
    """`shardplan plan SPEC FLAGS --json`: the figures of its answer and its wall time."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "solver.frontend.cli", "plan", spec, *flags, "--json", "--quiet"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    row = {"spec": spec, "flags": " ".join(flags), "wall_s": time.perf_counter() - start}
    if out.returncode:
        row["error"] = (out.stderr.strip().splitlines() or ["failed"])[-1]
        return row
    report = json.loads(out.stdout)
    cost = report["cost"]
    floor = report.get("expert_floor") or {}
    if report.get("mesh_search"):
        row["mesh"] = next(r["mesh"] for r in report["mesh_search"] if r["best"])
    row.update(overlap_s=(report.get("simulated") or {}).get("makespan_s"))
    row.update(scheme=report["scheme"], step_time_s=cost["step_time_s"], peak_gib=cost["peak_memory_bytes"] / 2**30,
               fits=cost["fits"], microbatches=(report.get("pipeline") or {}).get("microbatches", 1),
               schedule=report["schedule"], floor_kept=floor.get("kept", False),
               status=(report["search"][0]["status"] if report.get("search") else None))
    return row


def schedules(spec: str) -> list[str]:
    from solver.planning.spec import load_spec

    return list(load_spec(ROOT / spec).schedules)


def scheme_text(scheme: dict[str, list[str]]) -> str:
    return ", ".join(f"{axis}: {' + '.join(SHORT.get(r, r) for r in roles) or '-'}" for axis, roles in scheme.items())


def table(rows: list[dict]) -> str:
    lines = ["| spec | plan | scheme (per mesh axis) | K | step time | with overlap | peak memory | fits | wall |",
             "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        name = Path(r["spec"]).stem
        what = r["flags"].replace("--schedule ", "") if "--schedule" in r["flags"] else "CP-SAT"
        if "error" in r:
            lines.append(f"| {name} | {what} | {r['error']} | | | | | | {r['wall_s']:.0f} s |")
            continue
        if what == "CP-SAT":
            what = f"CP-SAT ({r['status']}" + (", the floor kept" if r["floor_kept"] else "") + ")"
        if "mesh" in r:
            what += ", `mesh: auto`: " + " x ".join(f"{a} {n}" for a, n in r["mesh"].items())
        overlap = f"{r['overlap_s']:.2f} s" if r.get("overlap_s") is not None else "-"
        lines.append(f"| {name} | {what} | {scheme_text(r['scheme'])} | {r['microbatches']} | "
                     f"{r['step_time_s']:.2f} s | {overlap} | {r['peak_gib']:.1f} GiB | "
                     f"{'yes' if r['fits'] else 'no'} | {r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args()
    rows = []
    for spec in SPECS:
        for name in schedules(spec):
            rows.append(plan(spec, "--schedule", name))
            print(json.dumps(rows[-1]), file=sys.stderr)
        rows.append(plan(spec, "--solver", "cpsat"))
        print(json.dumps(rows[-1]), file=sys.stderr)
    spec, fixed, auto = MESH_AUTO
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / Path(spec).name
        path.write_text((ROOT / spec).read_text().replace(fixed, auto))
        rows.append({**plan(str(path), "--solver", "cpsat", "--jobs", "2"), "spec": spec})
        print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    machine = f"Python {platform.python_version()} on {platform.machine()}, `python bench/long_context.py`"
    text = table(rows) + "\n\n" + machine + "."
    print(text)
    if args.write_readme:
        sys.path.append(_HERE)  # after the packages: bench/costmodel.py must not shadow costmodel
        from readme_table import write_table

        write_table("long-context-table", text)


if __name__ == "__main__":
    main()
