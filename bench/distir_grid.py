"""DistIR's grid on its deep MLPs: every data x tensor x pipeline split of
16 V100-32GB (one NVSwitch fabric, a DGX-2) and every microbatch count, at
several global batch sizes, from the bundled mesh-search specs
(specs/mesh_search/deep_mlp_*.yaml, their batch replaced).

Each grid is `shardplan plan SPEC --solver cpsat --grid` (P in 1, 2, 4; K
in 1 to 32): each mesh's plan is searched once, then pipelined with every K
(solver/planning/grid.py). Beside the best configuration this prices two
hand-written references on a 16-device axis, as DistIR defines them: pure
data parallelism (DP, the batch split 16 ways, weights replicated) and
pure tensor parallelism (HP, Megatron: even layers by column, odd by row).

DistIR's published findings, checked below the table:
  1. pure tensor parallelism is best at small batch;
  2. data parallelism is best at very large batch;
  3. pipeline parallelism with many microbatches becomes best for the
     largest model (64 x 16384) at large batch, where data parallelism no
     longer fits memory.

    python bench/distir_grid.py [--solver cpsat] [--json] [--write-readme] [--write-docs]

`--write-readme` replaces the summary between README.md's
`<!-- distir-grid:begin -->` / `<!-- distir-grid:end -->` markers;
`--write-docs` writes every grid's leading rows into docs/grid.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from solver.planning.grid import GridRow, dtp, plan_grid  # noqa: E402
from solver.planning.planner import plan_spec  # noqa: E402
from solver.planning.spec import parse_spec, parse_yaml, read_spec_text  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import write_table  # noqa: E402, I001

ROOT = _HERE.parent
MODELS = {"8192 x 16": ROOT / "specs" / "mesh_search" / "deep_mlp_8192x16.yaml",
          "16384 x 64": ROOT / "specs" / "mesh_search" / "deep_mlp_16384x64.yaml"}
BATCHES = (256, 2048, 16384, 65536, 262144)
SHOWN = 12  # rows of each grid in docs/grid.md

REFERENCE = """
model:
  builder: deep_mlp
  args: {{layers: {layers}, d_model: {d_model}, batch: {batch}, dtype: f16}}
  step: train
  optimizer: sgd
devices: 16
mesh: {{all: 16}}
hardware: V100-32GB
schedules:
  DP: {{tactics: [{{manual: {{axis: all, values: {{x: 0}}}}}}]}}
  HP: {{tactics: [{{manual: {{axis: all, values: {{"layers.*[02468].w": 1}}}}}}]}}
"""


def reference(args: dict, name: str) -> dict:
    """DP or HP on one 16-device axis: its step time and whether it fits."""
    spec = parse_spec(REFERENCE.format(**args), f"deep_mlp_{name}.yaml")
    cost = plan_spec(spec, "none", schedule=name).assessment.cost
    return {"step_time_s": cost.step_time_s, "fits": cost.fits, "peak_memory_bytes": cost.peak_memory_bytes}


def one_grid(path: Path, batch: int, solver: str) -> dict:
    data = parse_yaml(read_spec_text(path), str(path))
    data["model"]["args"]["batch"] = batch
    start = time.perf_counter()
    rows = plan_grid(f"{path.stem} at batch {batch}", solver, data=data)
    seconds = time.perf_counter() - start
    args = {k: data["model"]["args"][k] for k in ("layers", "d_model", "batch")}
    fitting = [r for r in rows if r.fits]
    unpipelined = [r for r in fitting if r.stages == 1 and r.microbatches == 1]
    out = {"batch": batch, "grid_s": seconds, "configurations": len(rows), "fitting": len(fitting),
           "best": fitting[0].to_json() if fitting else None,
           "best_unpipelined": unpipelined[0].to_json() if unpipelined else None,
           "DP": reference(args, "DP"), "HP": reference(args, "HP"), "rows": [r.to_json() for r in rows]}
    print(f"{path.stem} at batch {batch}: {len(rows)} configurations in {seconds:.1f} s, best "
          f"{_config(out['best'])}", file=sys.stderr)
    return out


def _config(row: dict | None) -> str:
    if row is None:
        return "none fits"
    return f"{dtp(GridRow.from_json(row))}, K {row['microbatches']}"


def _time(row: dict | None) -> str:
    if row is None:
        return "-"
    if not row["fits"]:
        return "no fit"
    ms = row["step_time_s"] * 1e3
    return f"{ms:,.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def findings(results: dict[str, list[dict]]) -> list[tuple[str, bool]]:
    """DistIR's three findings (module docstring), each held or not."""
    small = [grids[0]["best"] for grids in results.values()]
    largest = results["8192 x 16"][-1]["best"]
    big = next(g for g in results["16384 x 64"] if g["batch"] == 65536)
    return [
        ("pure tensor parallelism (D = 1, P = 1) is best at the smallest batch of each model",
         all(b is not None and b["data"] == 1 and b["stages"] == 1 for b in small)),
        ("data parallelism (D = 16) is best at the largest batch (8192 x 16, 262,144)",
         largest is not None and largest["data"] == 16),
        ("pipelining with many microbatches (P > 1, K >= 4) is best for 16384 x 64 at batch 65,536, "
         "where data parallelism does not fit",
         big["best"] is not None and big["best"]["stages"] > 1 and big["best"]["microbatches"] >= 4
         and not big["DP"]["fits"]),
    ]


def summary(results: dict[str, list[dict]]) -> str:
    lines = ["| model (d x layers) | global batch | best D x T x P, K | step time | best unpipelined | "
             "DP (16 x 1 x 1) | HP (1 x 16 x 1) | fit / configurations | grid time |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for model, grids in results.items():
        for g in grids:
            lines.append(f"| {model} | {g['batch']:,} | {_config(g['best'])} | {_time(g['best'])} | "
                         f"{_time(g['best_unpipelined'])} | {_time(g['DP'])} | {_time(g['HP'])} | "
                         f"{g['fitting']} / {g['configurations']} | {g['grid_s']:.1f} s |")
    lines.append("")
    lines += [f"- {what}: {'yes' if ok else 'no'}." for what, ok in findings(results)]
    beaten = [f"{name} at {model}, batch {g['batch']:,} ({_time(g[name])} against {_time(g['best'])})"
              for model, grids in results.items() for g in grids for name in ("DP", "HP")
              if g["best"] and g[name]["fits"] and g[name]["step_time_s"] < g["best"]["step_time_s"]]
    if beaten:
        lines.append(f"- a hand-written plan beats the grid's best: {'; '.join(beaten)}. The search folds repeated "
                     "layers with a period of one layer, so Megatron's column/row alternation is not in its space "
                     "(issue 27).")
    return "\n".join(lines)


def grids_page(results: dict[str, list[dict]]) -> str:
    out = ["# DistIR's grid, measured", "",
           "Generated by `python bench/distir_grid.py --write-docs`; do not edit. Each grid is "
           "`shardplan plan SPEC --solver cpsat --grid` on a bundled mesh-search spec "
           "(specs/mesh_search/) with its batch replaced: every split D x T x P of 16 V100-32GB on one "
           "NVSwitch fabric and every microbatch count K, fitting configurations first, fastest first. "
           f"The first {SHOWN} rows of each; `--json` on the command gives them all.", ""]
    for model, grids in results.items():
        for g in grids:
            out += [f"## {model} at batch {g['batch']:,}", "",
                    f"{g['configurations']} configurations, {g['fitting']} fit; {g['grid_s']:.1f} s.", "",
                    "| D x T x P | K | schedule | mesh | step time | bubble | peak memory | fits |",
                    "|---|---:|---|---|---:|---:|---:|---|"]
            for row in g["rows"][:SHOWN]:
                r = GridRow.from_json(row)
                step = f"{r.step_time_s * 1e3:,.1f} ms" if r.step_time_s is not None else "no plan"
                peak = f"{r.peak_memory_bytes / 2**30:,.2f} GiB" if r.peak_memory_bytes is not None else "-"
                mesh = " x ".join(f"{a}={n}" for a, n in r.mesh)
                out.append(f"| {dtp(r)} | {r.microbatches} | {r.schedule or '-'} | {mesh} | {step} | "
                           f"{r.bubble_fraction:.1%} | {peak} | {'yes' if r.fits else 'no'} |")
            out.append("")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solver", choices=("cpsat", "mcts"), default="cpsat")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-readme", action="store_true", help="write the summary into README.md")
    parser.add_argument("--write-docs", action="store_true", help="write the grids into docs/grid.md")
    args = parser.parse_args()
    results = {model: [one_grid(path, b, args.solver) for b in BATCHES] for model, path in MODELS.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    table = summary(results)
    print(table)
    if args.write_readme:
        write_table("distir-grid", table + "\n\n16 V100-32GB on one NVSwitch fabric; `python bench/distir_grid.py "
                    "--write-readme` (every grid: [docs/grid.md](docs/grid.md)).")
    if args.write_docs:
        (ROOT / "docs" / "grid.md").write_text(grids_page(results) + "\n", encoding="utf-8")
        print("wrote docs/grid.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
