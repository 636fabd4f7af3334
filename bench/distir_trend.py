"""DistIR's trend on its deep MLPs (16 V100-32GB): which data x tensor
split of the 16 devices gives the shortest step, per global batch size.
DistIR's published grid found pure tensor (Megatron) parallelism best at
small batches (128 to 1,024), a mixed split in between and pure data
parallelism at large batches (65,536 and up).

For every batch and every split D x T (16x1, 8x2, 4x4, 2x8, 1x16) this
plans the DP+HP schedule of specs/deep_mlp_8192x16.yaml (the batch on a
`batch` axis of D devices, Megatron on a `model` axis of T) and prices it
three ways: every op its own kernel (the model as it was), fused (the model
now), fused with overlap (the two-stream simulator). Printed: the best split
per batch under each, and which parts of the trend hold, on two fabrics:

- `nvswitch`: every device pair on one fabric, as DistIR's simulator
  assumes (its topology gives every pair one bandwidth) and as the one
  16 x V100-32GB machine has it (a DGX-2: NVSwitch, NVLink bandwidth
  between any two GPUs). This is the trend's setting.
- `nodes`: two nodes of 8 on InfiniBand EDR, NVLink within (the bundled
  deep_mlp specs' fabric): the batch axis crosses the nodes.

    python bench/distir_trend.py [--fabric nvswitch|nodes|both] [--layers 16] [--d-model 8192] [--json] [--write-docs]

`--write-docs` replaces the tables between docs/specs.md's
`<!-- distir-table:begin -->` / `<!-- distir-table:end -->` (nvswitch) and
`<!-- distir-nodes-table:begin -->` / `<!-- distir-nodes-table:end -->`
(nodes) markers; it needs `--fabric both` (the default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from costmodel.evaluate import evaluate  # noqa: E402
from solver.planning.planner import plan_spec, simulate_planned  # noqa: E402
from solver.planning.spec import parse_spec  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import write_table  # noqa: E402, I001

ROOT = _HERE.parent
BATCHES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536, 131072)
SPLITS = ((16, 1), (8, 2), (4, 4), (2, 8), (1, 16))
MODELS = ("as was", "fused", "overlap")

SPEC = """
model:
  builder: deep_mlp
  args: {{layers: {layers}, d_model: {d_model}, batch: {batch}, dtype: f16}}
  step: train
  optimizer: sgd
devices: 16
mesh: {mesh}
hardware:
  preset: V100-32GB
  links: {links}
schedules:
  DP+HP:
    tactics:
{tactics}
"""
DP = '      - {manual: {axis: batch, values: {x: 0}}}'
HP = '      - {manual: {axis: model, values: {"layers.*[02468].w": 1}}}'


FABRICS = {
    "nvswitch": "16 V100-32GB on one NVSwitch fabric (a DGX-2: NVLink between any two GPUs)",
    "nodes": "16 V100-32GB in 2 nodes of 8 (InfiniBand 100 Gb/s between the nodes, NVLink within)",
}


def fabric_links(fabric: str, t: int) -> dict[str, str]:
    """Each axis's link class: on `nodes` the batch axis crosses the nodes
    and the model axis stays within one while it has at most 8 devices."""
    if fabric == "nvswitch":
        return {"batch": "nvlink", "model": "nvlink"}
    return {"batch": "infiniband", "model": "nvlink" if t <= 8 else "infiniband"}


def step_times(layers: int, d_model: int, batch: int, d: int, t: int,
               fabric: str = "nvswitch") -> dict[str, float] | None:
    """The DP+HP plan's step time under each model; None if it does not fit."""
    axes = {"batch": d, "model": t}
    links = fabric_links(fabric, t)
    used = [a for a in axes if axes[a] > 1]  # an axis of one device shards nothing and is left out
    text = SPEC.format(layers=layers, d_model=d_model, batch=batch,
                       mesh="{" + ", ".join(f"{a}: {axes[a]}" for a in used) + "}",
                       links="{" + ", ".join(f"{a}: {links[a]}" for a in used) + "}",
                       tactics="\n".join(tactic for a, tactic in (("batch", DP), ("model", HP)) if a in used))
    spec = parse_spec(text, f"deep_mlp_{d_model}x{layers}_b{batch}_{d}x{t}_{fabric}.yaml")
    planned = plan_spec(spec, "none", schedule="DP+HP")
    if not planned.assessment.cost.fits:
        return None
    unfused = evaluate(planned.lowered.function, spec.hardware_obj(), fused=False)
    return {"as was": unfused.step_time_s, "fused": planned.assessment.cost.step_time_s,
            "overlap": simulate_planned(planned).makespan_s}


def split_name(d: int, t: int) -> str:
    return "DP" if t == 1 else "HP" if d == 1 else f"{d}x{t}"


def tensor_degree(split: str) -> int:
    return 16 if split == "HP" else 1 if split == "DP" else int(split.split("x")[1])


def trend(best: dict[int, str]) -> str:
    """DistIR's trend, part by part: the tensor degree never grows with the
    batch; pure HP at the smallest batch; pure DP at the largest."""
    degrees = [tensor_degree(best[b]) for b in sorted(best)]
    parts = [("the tensor degree never grows with the batch", all(a >= b for a, b in zip(degrees, degrees[1:]))),
             ("pure HP at the smallest batch", degrees[0] == 16), ("pure DP at the largest", degrees[-1] == 1)]
    return "; ".join(f"{what}: {'yes' if ok else 'no'}" for what, ok in parts)


def grid(layers: int, d_model: int, fabric: str) -> list[dict]:
    rows = []
    for batch in BATCHES:
        times = {split_name(d, t): step_times(layers, d_model, batch, d, t, fabric) for d, t in SPLITS}
        fitting = {s: v for s, v in times.items() if v is not None}
        best = {m: min(fitting, key=lambda s: fitting[s][m]) if fitting else None for m in MODELS}
        rows.append({"batch": batch, "times": times, "best": best})
        print(f"{fabric}, batch {batch}: " + ", ".join(f"{m} {best[m]}" for m in MODELS), file=sys.stderr)
    return rows


def table(rows: list[dict], layers: int, d_model: int, fabric: str) -> str:
    lines = ["| global batch | " + " | ".join(f"{split_name(d, t)} (fused)" for d, t in SPLITS)
             + " | best, as was | best, fused | best, with overlap |",
             "|---:|" + "---:|" * len(SPLITS) + "---|---|---|"]
    for r in rows:
        cells = [f"{r['times'][split_name(d, t)]['fused'] * 1e3:,.1f} ms" if r["times"][split_name(d, t)] else "no fit"
                 for d, t in SPLITS]
        lines.append(f"| {r['batch']:,} | " + " | ".join(cells) + " | "
                     + " | ".join(str(r["best"][m]) for m in MODELS) + " |")
    lines.append("")
    for m in MODELS:
        lines.append(f"- {m}: " + trend({r["batch"]: r["best"][m] for r in rows if r["best"][m]}) + ".")
    lines += ["", f"Deep MLP {d_model} x {layers}, f16, SGD, {FABRICS[fabric]}; DP+HP plans; "
              f"`python bench/distir_trend.py --write-docs`."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fabric", choices=(*FABRICS, "both"), default="both")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=8192)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/specs.md")
    args = parser.parse_args()
    if args.write_docs and args.fabric != "both":
        parser.error("--write-docs writes both fabrics' tables: leave --fabric at its default (both)")
    fabrics = tuple(FABRICS) if args.fabric == "both" else (args.fabric,)
    results = {fabric: grid(args.layers, args.d_model, fabric) for fabric in fabrics}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    tables = {fabric: table(rows, args.layers, args.d_model, fabric) for fabric, rows in results.items()}
    print("\n\n".join(tables.values()))
    if args.write_docs:
        write_table("distir-table", tables["nvswitch"], ROOT / "docs" / "specs.md")
        write_table("distir-nodes-table", tables["nodes"], ROOT / "docs" / "specs.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
