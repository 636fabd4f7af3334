"""Step time and efficiency of every bundled spec's schedules under the cost
model as it was (every op its own pass over HBM, no overlap), with fusion
(`costmodel.fusion`, what the search optimizes) and with fusion and overlap
(the two-stream simulator, `costmodel.simulate`).

Per spec: the best manual schedule that fits under each model (by step time),
and optionally (`--cpsat`) the CP-SAT plan. Efficiency is the ideal step time
(the flops spread over every device at peak) over the step time.

    python bench/efficiency.py [--only NAME] [--cpsat] [--json] [--write-readme]

`--write-readme` replaces the table between README.md's
`<!-- efficiency-table:begin -->` and `<!-- efficiency-table:end -->` markers.
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

from costmodel.evaluate import evaluate  # noqa: E402
from costmodel.simulate import DEFAULT_PREFETCH  # noqa: E402
from solver.planning.planner import Planned, plan_spec, prepare, simulate_planned  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402
from solver.search.report import NoPlanFits  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import write_table  # noqa: E402, I001

ROOT = _HERE.parent
# CP-SAT on a 3-axis mesh of a full-size model takes minutes to build (bench/cpsat.py measures it on
# Chinchilla); this table keeps to what runs in a few seconds a spec.
MAX_CPSAT_AXES = 2


def figures(planned: Planned) -> dict:
    """One plan under the three models."""
    hardware = planned.spec.hardware_obj()
    ideal = planned.assessment.ideal_step_time_s
    before = evaluate(planned.lowered.function, hardware, fused=False)
    after = planned.assessment.cost
    timeline = simulate_planned(planned)
    return {"fits": after.fits, "before_s": before.step_time_s, "after_s": after.step_time_s,
            "overlap_s": timeline.makespan_s, "before_eff": ideal / before.step_time_s,
            "after_eff": ideal / after.step_time_s, "overlap_eff": ideal / timeline.makespan_s,
            "kernels": after.kernels, "ops": len(planned.lowered.function.ops)}


def measure(path: Path, cpsat: bool) -> dict:
    spec = load_spec(path)
    prepared = prepare(spec)
    plans = {}
    for name in spec.schedules or [None]:
        planned = plan_spec(spec, "none", schedule=name, prepared=prepared)
        plans[name or "default"] = figures(planned)
    row = {"spec": path.stem, "mesh": " x ".join(f"{a}={n}" for a, n in spec.mesh.items()),
           "hardware": spec.hardware_name, "schedules": plans}
    fitting = {n: f for n, f in plans.items() if f["fits"]}
    for model in ("before", "after"):
        if fitting:
            best = min(fitting, key=lambda n: fitting[n][f"{model}_s"])
            row[f"best_{model}"] = best
    if cpsat and len(spec.mesh) > MAX_CPSAT_AXES:
        row["cpsat_skipped"] = f"not run ({len(spec.mesh)}-axis mesh)"
    elif cpsat:
        try:
            planned = plan_spec(spec, "cpsat", prepared=prepared, floor=False)  # the search's own plan
            row["cpsat"] = figures(planned)
            # What the solver proved, next to the cost model's evaluation of the lowered plan.
            row["cpsat"]["objective_s"] = [r.objective_s for r in planned.search if r.solver == "cpsat"]
            row["cpsat"]["status"] = [r.status for r in planned.search if r.solver == "cpsat"]
        except NoPlanFits:
            row["cpsat"] = None
    return row


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s >= 1e-3 else f"{s * 1e6:,.3g} us"


def markdown(rows: list[dict]) -> str:
    lines = ["| spec | hardware, mesh | best manual (as was) | efficiency as was | best manual (fused) "
             "| efficiency fused | with overlap | CP-SAT (fused) |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        cp = r.get("cpsat")
        cp_cell = (f"{_ms(cp['after_s'])}, {cp['after_eff']:.1%}" if cp else "no plan fits") if "cpsat" in r \
            else r.get("cpsat_skipped", "")
        if "best_after" not in r:
            lines.append(f"| {r['spec']} | {r['hardware']}, {r['mesh']} | no schedule fits | | | | | {cp_cell} |")
            continue
        was, now = r["schedules"][r["best_before"]], r["schedules"][r["best_after"]]
        lines.append(f"| {r['spec']} | {r['hardware']}, {r['mesh']} | {r['best_before']}: {_ms(was['before_s'])} "
                     f"| {was['before_eff']:.1%} | {r['best_after']}: {_ms(now['after_s'])} | {now['after_eff']:.1%} "
                     f"| {_ms(now['overlap_s'])}, {now['overlap_eff']:.1%} | {cp_cell} |")
    # Proven optima only: a term's cost is a variable bounded below by its combination's, which
    # minimization makes exact at the optimum; an unproven incumbent may still carry slack (unet: 1.3%).
    agree = [abs(o - r["cpsat"]["after_s"]) / r["cpsat"]["after_s"] for r in rows if r.get("cpsat")
             for o, status in zip(r["cpsat"]["objective_s"][-1:], r["cpsat"].get("status", ["optimal"])[-1:])
             if o is not None and status == "optimal"]
    if agree:
        lines += ["", "CP-SAT's objective against the cost model's evaluation of the lowered plan, on the "
                  f"{len(agree)} specs it solved to optimality: largest relative difference {max(agree):.1e} "
                  "(the objective's integer rounding; an unproven incumbent's objective may exceed its plan's "
                  "cost, as each term's cost is only bounded below)."]
    lines += ["", "As was: every op its own pass over HBM. Fused: the cost model now (what the search minimizes). "
              "With overlap: the fused best manual schedule on the two-stream simulator "
              f"(collectives beside compute, all_gathers at most {DEFAULT_PREFETCH} compute kernels early). "
              f"Python {platform.python_version()} on {platform.machine()}, `python bench/efficiency.py --cpsat`."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="only this spec (repeatable)")
    parser.add_argument("--cpsat", action="store_true", help="also plan each spec with CP-SAT")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args()
    specs = sorted((ROOT / "specs").glob("*.yaml"))
    if args.only:
        specs = [p for p in specs if p.stem in args.only]
    # A pipeline (and gradient accumulation, a one-stage pipeline) is priced by its schedule, not by one
    # program's serial sum, overlap or re-ranking: bench/distir_grid.py covers pipelines.
    specs = [p for p in specs if not load_spec(p).pipelined]
    rows = []
    for path in specs:
        rows.append(measure(path, args.cpsat))
        print(f"{path.stem}: done", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = markdown(rows)
    print(table)
    if args.write_readme:
        write_table("efficiency-table", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
