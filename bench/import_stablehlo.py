"""Import speed of the StableHLO importer, and planning an imported step end
to end with CP-SAT.

Targets (issue 23): importing 10,000 lines of StableHLO in under 2 s;
`plan --solver cpsat` on the Gemma-2B-sized imported step in under 30 s.
The largest committed fixture is always measured; the Gemma-2B-sized step
(13,059 lines, 145 MiB with jax's hex constants) is generated on demand, as
it is too large to commit:

    tools/dev_env.sh
    .venv-dev/bin/python tools/export_real_fixtures.py --gemma-2b bench/data/gemma_2b_train.mlir
    python bench/import_stablehlo.py [--json] [--repeat N] [--no-plan]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

from ir.stablehlo import load_stablehlo  # noqa: E402
from solver.planning.planner import collective_counts, plan_spec  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
LARGEST_FIXTURE = ROOT / "tests" / "fixtures" / "real" / "gpt2_dropout_train.mlir"
GEMMA_2B = ROOT / "bench" / "data" / "gemma_2b_train.mlir"


def measure_import(path: pathlib.Path, repeat: int) -> dict:
    lines = len(path.read_text().splitlines())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn = load_stablehlo(str(path))
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"file": str(path.relative_to(ROOT)), "lines": lines, "ops": len(fn.ops), "import_s": best,
            "lines_per_s": lines / best, "ops_per_s": len(fn.ops) / best,
            "import_s_per_10k_lines": best * 10_000 / lines}


def measure_plan(spec_path: pathlib.Path) -> dict:
    start = time.perf_counter()
    planned = plan_spec(load_spec(spec_path), solver="cpsat")
    total = time.perf_counter() - start
    report = planned.search[0] if planned.search else None
    return {"spec": str(spec_path.relative_to(ROOT)), "plan_s": total, "seconds": planned.seconds,
            "status": getattr(report, "status", None), "collectives": collective_counts(planned.lowered),
            "step_time_s": planned.assessment.cost.step_time_s, "fits": planned.assessment.cost.fits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-plan", action="store_true", help="time the import only")
    args = parser.parse_args()
    results = {"imports": [measure_import(LARGEST_FIXTURE, args.repeat)]}
    if GEMMA_2B.exists():
        results["imports"].append(measure_import(GEMMA_2B, args.repeat))
        if not args.no_plan:
            results["plan"] = measure_plan(GEMMA_2B.with_suffix(".yaml"))
    else:
        results["note"] = f"{GEMMA_2B.relative_to(ROOT)} absent: generate it as the docstring says"
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results["imports"]:
        print(f"{r['file']}: {r['lines']:,} lines, {r['ops']:,} ops in {r['import_s']:.2f} s "
              f"({r['lines_per_s']:,.0f} lines/s, {r['ops_per_s']:,.0f} ops/s; "
              f"{r['import_s_per_10k_lines']:.2f} s per 10,000 lines; target 2 s)")
    if "plan" in results:
        p = results["plan"]
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in p["seconds"].items())
        print(f"plan --solver cpsat {p['spec']}: {p['plan_s']:.1f} s end to end (target 30 s; {phases}); "
              f"status {p['status']}, step {p['step_time_s'] * 1e3:.1f} ms, fits {p['fits']}")
    if "note" in results:
        print(results["note"])


if __name__ == "__main__":
    main()
