"""Time of the cost model on the full-size Chinchilla-like 32-layer training
step (specs/chinchilla_32l.yaml: BP x Megatron on 8 x 8 A100s).

Targets, on the project's 2-core machine:
  - evaluating one lowered plan (the device-local program): under 0.5 s
    (issue 6);
  - one tabulated plan evaluation without lowering: under 10 ms with fusion
    (issue 25; 5 ms before fusion, issue 6): the MCTS evaluates thousands
    of plans, from codes as timed here.

Also printed: building the table (once per program, mesh and hardware), a
first evaluation (prices every distinct op and resharding, filling the
memo), converting a FactorSharding to codes, and for comparison lowering.
A second plan (BP + Megatron + ZeRO-3) shows a plan with more collectives.
Building the program, its analysis and planning are not counted.

    python bench/costmodel.py [--json] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# This script has the name of the package it measures: keep its own folder
# off the import path, or `import costmodel` would import this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from costmodel.evaluate import evaluate  # noqa: E402
from costmodel.table import CostTable  # noqa: E402
from ir.lower import lower  # noqa: E402
from solver.planning.planner import plan_spec  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402
from solver.planning.tactics import FIRST_DIVISIBLE, Manual, apply_schedule  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "specs" / "chinchilla_32l.yaml"


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median seconds of `repeat` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(repeat: int) -> dict:
    planned = plan_spec(load_spec(SPEC))
    fn, nda, mesh = planned.model.function, planned.nda, planned.sharding.mesh
    hardware = planned.spec.hardware_obj()
    zero3 = planned.spec.tactics() + [Manual("batch", (("*", FIRST_DIVISIBLE),))]
    plans = {"bp_mp": planned.sharding, "bp_mp_zero3": apply_schedule(nda, mesh, zero3).materialize(nda)}

    start = time.perf_counter()
    table = CostTable(fn, nda, mesh, hardware)
    out: dict = {"ops": len(fn.ops), "iclasses": len(nda.iclasses), "table_build_s": time.perf_counter() - start,
                 "plans": {}}
    for name, sharding in plans.items():
        lowered_s, lowered = timed(lambda s=sharding: lower(fn, nda, s), 1)
        evaluate_s, cost = timed(lambda f=lowered.function: evaluate(f, hardware), repeat)
        codes_s, codes = timed(lambda s=sharding: table.codes(s), repeat)
        start = time.perf_counter()
        first = table.evaluate(codes)
        first_s = time.perf_counter() - start
        table_s, tabulated = timed(lambda c=codes: table.evaluate(c), max(repeat, 20))
        assert tabulated == first
        out["plans"][name] = {
            "local_ops": len(lowered.function.ops),
            "collectives": sum(cost.collective_counts.values()),
            "step_time_s": cost.step_time_s,
            "table_step_time_s": tabulated.step_time_s,
            "peak_memory_bytes": cost.peak_memory_bytes,
            "table_peak_memory_bytes": tabulated.peak_memory_bytes,
            "lower_s": lowered_s,
            "evaluate_lowered_s": evaluate_s,
            "codes_from_sharding_s": codes_s,
            "table_first_evaluation_s": first_s,
            "table_evaluation_s": table_s,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"chinchilla_32l training step: {result['ops']} ops, {result['iclasses']} I-classes; "
          f"table built in {result['table_build_s']:.2f} s")
    for name, r in result["plans"].items():
        print(f"  {name}: {r['local_ops']} local ops, {r['collectives']} collectives, step "
              f"{r['step_time_s'] * 1e3:.1f} ms (table {r['table_step_time_s'] * 1e3:.1f} ms), peak "
              f"{r['peak_memory_bytes'] / 2**30:.2f} GiB (table {r['table_peak_memory_bytes'] / 2**30:.2f} GiB)")
        print(f"    lower {r['lower_s']:.3f} s; evaluate lowered {r['evaluate_lowered_s']:.3f} s (target < 0.5 s)")
        print(f"    table: first evaluation {r['table_first_evaluation_s'] * 1e3:.1f} ms, then "
              f"{r['table_evaluation_s'] * 1e3:.2f} ms (target < 10 ms); codes from a sharding "
              f"{r['codes_from_sharding_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
