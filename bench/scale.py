"""The search at the scale people train: does its size follow the distinct
work rather than the program's length?

The scale curve: the Llama 2 70B layer shape (d_model 8192, GQA 64/8, gated
MLP 28,672, sequences of 4096, global batch 1024, bf16, Adam) on H100s as
data 16 x fsdp 8 x model 8, every layer's forward recomputed in its backward
(what fits at 80 layers), searched by CP-SAT on the three axes, at 2 to 80
layers. Each point runs in a process of its own, so its peak RSS
(`resource.getrusage`) is its own. Then the whole `shardplan plan
specs/llama2_70b.yaml` with each backend, as a user runs it (the expert
floor and the remat search included).

Targets (issue 34): flat within 2x from 2 to 80 layers; 80 layers under 60 s
and 4 GB.

    python bench/scale.py [--layers 2,4,8,16,32,80] [--json] [--write-readme]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

ROOT = Path(__file__).resolve().parent.parent
LAYERS = (2, 4, 8, 16, 32, 80)
MESH = {"data": 16, "fsdp": 8, "model": 8}
TIME_LIMIT_S = 60


def spec_text(layers: int) -> str:
    """The Llama 2 70B layer shape with `layers` layers, every layer recomputed, CP-SAT on every axis."""
    from ir.models.presets import llama2_70b

    args = dict(llama2_70b, layers=layers)
    return json.dumps({
        "description": f"Llama 2 70B layer shape, {layers} layers (bench/scale.py)",
        "model": {"builder": "transformer", "args": args},
        "mesh": MESH,
        "hardware": {"preset": "H100-SXM", "links": {"data": "infiniband", "fsdp": "infiniband"}},
        "schedule": [{"remat": {"values": ["layers.*"]}},
                     {"auto": {"axes": list(MESH), "solver": "cpsat", "time_limit": TIME_LIMIT_S}}],
    })


def measure_point(layers: int) -> dict:
    """One point of the curve, in this process."""
    from solver.frontend.cli import GC_THRESHOLDS
    from solver.planning.planner import plan_spec
    from solver.planning.spec import parse_spec

    gc.set_threshold(*GC_THRESHOLDS)  # the collector as `shardplan plan` runs it
    start = time.perf_counter()
    planned = plan_spec(parse_spec(spec_text(layers), f"<llama2_70b x {layers} layers>"))
    wall = time.perf_counter() - start
    (search,) = planned.search
    cost = planned.assessment.cost
    return {
        "layers": layers, "ops": len(planned.model.function.ops), "status": search.status, "gap": search.gap,
        "variables": search.variables, "constraints": search.constraints, "terms": search.terms,
        "build_s": search.build_s, "solve_s": search.solve_s, "rounds": search.rounds,
        "memory_cuts": search.memory_cuts, "step_time_s": cost.step_time_s,
        "peak_gib": cost.peak_memory_bytes / 2**30, "fits": cost.fits, "wall_s": wall,
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


def run_point(layers: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--point", str(layers)], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode:
        return {"layers": layers, "error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout)


# The CLI in this process, its own peak RSS printed last on stderr (RUSAGE_CHILDREN would give the
# largest child so far, not this one).
_MEASURED = ("import resource, sys\nfrom solver.frontend.cli import leave, main\ntry:\n"
             "    code = main(sys.argv[1:])\nexcept SystemExit as exc:\n"
             "    code = exc.code if isinstance(exc.code, int) else 1\n"
             "print('peak-rss-kb', max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,\n"
             "                         resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss), file=sys.stderr)\n"
             "leave(code)")


def run_command(spec: str, *flags: str, command: str = "plan") -> dict:
    """`shardplan plan SPEC FLAGS --json` as a user runs it: wall time, peak RSS (of its largest process:
    `--jobs` screens meshes in processes of their own), the answer."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _MEASURED, command, spec, *flags, "--json"], capture_output=True,
                         text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - start
    lines = out.stderr.strip().splitlines()
    rss = int(lines.pop().split()[1]) if lines and lines[-1].startswith("peak-rss-kb ") else None
    row = {"spec": spec, "flags": " ".join(flags), "wall_s": wall, "rss_gb": rss * 1024 / 1e9 if rss else None}
    if out.returncode:
        row["error"] = (lines or ["failed"])[-1]
        return row
    report = json.loads(out.stdout)
    search = report["search"][0] if report.get("search") else {}
    floor = report.get("expert_floor") or {}
    row.update(step_time_s=report["cost"]["step_time_s"], fits=report["cost"]["fits"],
               peak_gib=report["cost"]["peak_memory_bytes"] / 2**30, status=search.get("status"),
               remat=report.get("remat"), floor_kept=floor.get("kept", False),
               searched_step_s=floor.get("searched_step_time_s", report["cost"]["step_time_s"]))
    if report.get("mesh_search"):  # a mesh search: the mesh it chose, of how many, how many searched
        rows = report["mesh_search"]
        row.update(mesh=next(r["mesh"] for r in rows if r["best"]), meshes=len(rows),
                   meshes_searched=sum(r["searched"] for r in rows))
    if report.get("pipeline"):
        row["microbatches"] = report["pipeline"]["microbatches"]
    return row


def curve_table(rows: list[dict]) -> str:
    lines = ["| layers | ops | CP-SAT variables | constraints | terms | build | solve | status | step time | "
             "peak memory | wall | peak RSS |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layers']} | | | | | | | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['layers']} | {r['ops']:,} | {r['variables']:,} | {r['constraints']:,} | {r['terms']:,} | "
            f"{r['build_s']:.1f} s | {r['solve_s']:.1f} s | {r['status']} | {r['step_time_s']:.3f} s | "
            f"{r['peak_gib']:.1f} GiB | {r['wall_s']:.0f} s | {r['rss_gb']:.2f} GB |")
    ok = [r for r in rows if "error" not in r]
    if len(ok) > 1:
        low, high = ok[0], ok[-1]
        lines.append("")
        lines.append(f"From {low['layers']} to {high['layers']} layers: constraints x"
                     f"{high['constraints'] / low['constraints']:.2f}, build + solve x"
                     f"{(high['build_s'] + high['solve_s']) / (low['build_s'] + low['solve_s']):.2f}, "
                     f"peak RSS x{high['rss_gb'] / low['rss_gb']:.2f}.")
    return "\n".join(lines)


def command_table(rows: list[dict]) -> str:
    lines = ["| command | answer | step time | wall | peak RSS |", "|---|---|---:|---:|---:|"]
    for r in rows:
        command = f"`shardplan plan {r['spec']} {r['flags']}`"
        rss = f"{r['rss_gb']:.2f} GB" if r.get("rss_gb") else "n/a"
        if "error" in r:
            lines.append(f"| {command} | {r['error']} | | {r['wall_s']:.0f} s | {rss} |")
            continue
        remat = f", remat {', '.join(r['remat'])}" if r.get("remat") else ""
        answer = f"{r['status'] or 'schedule'}{remat}, {'fits' if r['fits'] else 'does not fit'}"
        lines.append(f"| {command} | {answer} | {r['step_time_s']:.3f} s | {r['wall_s']:.0f} s | {rss} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)), help="comma-separated layer counts")
    parser.add_argument("--no-commands", action="store_true", help="only the curve, not the llama2_70b commands")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON in place of the tables (still written with --write-readme)")
    parser.add_argument("--write-readme", action="store_true", help="write the tables into README.md")
    parser.add_argument("--point", type=int, help=argparse.SUPPRESS)  # one point, in this process
    args = parser.parse_args()
    if args.point is not None:
        print(json.dumps(measure_point(args.point)))
        return
    sys.path.append(_HERE)  # after the packages: bench/costmodel.py must not shadow costmodel
    from readme_table import reference_seconds, write_table

    before = reference_seconds()  # the hour's speed, before and after
    curve = []
    for layers in (int(n) for n in args.layers.split(",")):
        curve.append(run_point(layers))
        print(json.dumps(curve[-1]), file=sys.stderr)
    commands = [] if args.no_commands else [run_command("specs/llama2_70b.yaml", "--solver", s)
                                            for s in ("cpsat", "mcts")]
    after = reference_seconds()
    if args.json:  # the rows on stdout, the tables (with --write-readme) in the README only
        print(json.dumps({"curve": curve, "commands": commands}, indent=2))
    machine = (f"Python {platform.python_version()} on {platform.machine()}, a reference Python workload "
               f"{before:.2f} s before and {after:.2f} s after (`bench/readme_table.reference_seconds`: the hour's "
               "speed; the walls scale with it), `python bench/scale.py`")
    text = curve_table(curve) + "\n\n" + (command_table(commands) + "\n\n" if commands else "") + machine + "."
    if not args.json:
        print(text)
    if args.write_readme:
        write_table("scale-table", text)


if __name__ == "__main__":
    main()
