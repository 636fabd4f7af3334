"""Time and peak Python memory of the Named Dimension Analysis on full-size
training steps (Gemma-2B-like and the Chinchilla-like 32-layer model, and
any bundled spec's step with --spec: llama2_70b's is 80 layers).

Target (issue 4): under 2 s and under 1 GiB for the 32-layer training step
on the project's 2-core machine. Building the program is not counted; the
garbage collector runs at the CLI's thresholds (`shardplan` raises them).

    python bench/nda.py [--json] [--repeat N] [--spec specs/llama2_70b.yaml ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

from ir.autodiff import training_step  # noqa: E402
from ir.models import build_preset  # noqa: E402
from ir.nda import analyze  # noqa: E402
from solver.frontend.cli import GC_THRESHOLDS  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402

PRESETS = ("gemma_2b", "chinchilla_32l")


def measure(name: str, repeat: int) -> dict:
    """A preset's training step, or a spec's step where `name` is a path."""
    if name.endswith((".yaml", ".yml")):
        model = load_spec(name).build(())
        fn, groupable = model.function, model.groupable
    else:
        step = training_step(build_preset(name))
        fn, groupable = step.function, step.params
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        nda = analyze(fn, groupable)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    analyze(fn, groupable)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "preset": name,
        "ops": len(fn.ops),
        "dimension_names": len(nda.name_iclass),
        "colors": nda.num_colors,
        "conflicts": len(nda.conflicts),
        "resolution_classes": len(nda.resolution_classes),
        "param_groups": len(nda.param_groups),
        "time_s_min": min(times),
        "time_s_median": sorted(times)[len(times) // 2],
        "peak_python_mib": peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per preset (default 3)")
    parser.add_argument("--spec", action="append", default=[], metavar="PATH",
                        help="also a bundled spec's step (repeatable), e.g. specs/llama2_70b.yaml")
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    rows = [measure(name, args.repeat) for name in (*PRESETS, *args.spec)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'preset':<24}{'ops':>7}{'dim names':>11}{'colors':>8}{'conflicts':>10}{'classes':>9}{'groups':>8}"
          f"{'min s':>8}{'median s':>10}{'peak MiB':>10}")
    for r in rows:
        print(f"{r['preset']:<24}{r['ops']:>7}{r['dimension_names']:>11}{r['colors']:>8}{r['conflicts']:>10}"
              f"{r['resolution_classes']:>9}{r['param_groups']:>8}{r['time_s_min']:>8.2f}{r['time_s_median']:>10.2f}"
              f"{r['peak_python_mib']:>10.1f}")


if __name__ == "__main__":
    main()
