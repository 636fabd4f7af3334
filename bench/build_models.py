"""Build the full-size transformer training steps and print their figures.

For each preset (Gemma-2B-like, Gemma-7B-like, Chinchilla-like 32 layers):
the parameter count (against the published count where there is one), the
number of ops and values of the forward program and of the Adam training
step, and the wall time to build each (the builder infers every shape and
the verifier checks the whole program; no tensor is allocated).

    python bench/build_models.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from ir.autodiff import Adam, training_step
from ir.models import PRESETS, build_preset

PUBLISHED_PARAMETERS = {"gemma_2b": 2.51e9, "gemma_7b": 8.54e9}


def measure(name: str) -> dict:
    start = time.perf_counter()
    forward = build_preset(name)
    built = time.perf_counter()
    step = training_step(forward, optimizer=Adam())
    done = time.perf_counter()
    params = forward.parameter_elements
    published = PUBLISHED_PARAMETERS.get(name)
    return {
        "preset": name,
        "parameters": params,
        "published_parameters": published,
        "parameters_vs_published": None if published is None else params / published - 1,
        "forward_ops": len(forward.function.ops),
        "forward_values": sum(1 for _ in forward.function.values()),
        "train_step_ops": len(step.function.ops),
        "train_step_values": sum(1 for _ in step.function.values()),
        "forward_build_s": built - start,
        "train_step_build_s": done - built,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    rows = [measure(name) for name in PRESETS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'preset':<16}{'params':>10}{'vs pub.':>9}{'fwd ops':>9}{'step ops':>10}{'step values':>13}"
          f"{'fwd s':>8}{'step s':>8}")
    for r in rows:
        versus = "" if r["parameters_vs_published"] is None else f"{100 * r['parameters_vs_published']:+.1f}%"
        print(f"{r['preset']:<16}{r['parameters'] / 1e9:>9.3f}B{versus:>9}{r['forward_ops']:>9}"
              f"{r['train_step_ops']:>10}{r['train_step_values']:>13}{r['forward_build_s']:>8.2f}"
              f"{r['train_step_build_s']:>8.2f}")


if __name__ == "__main__":
    main()
