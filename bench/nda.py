"""Time and peak Python memory of the Named Dimension Analysis on full-size
training steps (Gemma-2B-like and the Chinchilla-like 32-layer model).

Target (issue 4): under 2 s and under 1 GiB for the 32-layer training step
on the project's 2-core machine. Building the program is not counted.

    python bench/nda.py [--json] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

from ir.autodiff import training_step
from ir.models import build_preset
from ir.nda import analyze

PRESETS = ("gemma_2b", "chinchilla_32l")


def measure(name: str, repeat: int) -> dict:
    step = training_step(build_preset(name))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        nda = analyze(step.function, step.params)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    analyze(step.function, step.params)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "preset": name,
        "ops": len(step.function.ops),
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
    args = parser.parse_args()
    rows = [measure(name, args.repeat) for name in PRESETS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'preset':<16}{'ops':>7}{'dim names':>11}{'colors':>8}{'conflicts':>10}{'classes':>9}{'groups':>8}"
          f"{'min s':>8}{'median s':>10}{'peak MiB':>10}")
    for r in rows:
        print(f"{r['preset']:<16}{r['ops']:>7}{r['dimension_names']:>11}{r['colors']:>8}{r['conflicts']:>10}"
              f"{r['resolution_classes']:>9}{r['param_groups']:>8}{r['time_s_min']:>8.2f}{r['time_s_median']:>10.2f}"
              f"{r['peak_python_mib']:>10.1f}")


if __name__ == "__main__":
    main()
