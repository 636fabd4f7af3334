"""Megatron-LM's published GPT configurations under the cost model.

The ten model shapes of Narayanan et al. (SC 2021, Table 1;
../shared/megatron_gpt_configs.json), 1.7B to 1T parameters on 32 to 3,072
A100-80GB, each with its published tensor x pipeline x data split, global
batch and one sequence per data replica per microbatch, every layer
recomputed: `specs/megatron/*.yaml` (the 18.4B one is the bundled
`specs/megatron_gpt_18b.yaml`, which CI checks). Per configuration:

  - the published split as written (`plan --schedule Megatron`): the step
    time the cost model predicts (a pipeline's simulated 1F1B schedule), the
    model FLOP/s per GPU that implies (the paper's count of a step's flops,
    96 B s l h^2 (1 + s / 6h + V / 16 l h), recomputation included), the
    peak memory and whether it fits;
  - the paper's own measurement (its Table 1, achieved teraFLOP/s per GPU)
    beside that;
  - for a pipelined split, the same split on Megatron's interleaved 1F1B
    (`pipeline: {schedule: interleaved, chunks: v}`), each v that divides
    the layers per stage, the fastest that fits;
  - with `--search`, `plan --solver cpsat` on the same mesh, as a user runs
    it (the expert floor, the remat search and, for a pipeline or
    microbatches, the re-ranking by the microbatched step): its answer, the
    searched plan's own step time, wall time and peak RSS.

Each command runs in a process of its own (`resource.getrusage`).

  - with `--mesh-auto`, the same model and GPUs with `mesh: {pipeline:
    auto, data: auto, model: auto}` and `microbatches: auto` (the published
    split a named schedule: the screen's plan and each search's floor):
    the split and K chosen, its step time, how many meshes were screened
    and searched, wall time and peak RSS (a table of its own); `--jobs N`
    screens the meshes, and scores the re-ranked plans, in N processes
    (`shardplan plan --jobs`).

    python bench/megatron.py [--only 145.6] [--search] [--mesh-auto [--jobs N]] [--json] [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import yaml

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]
sys.path.append(_HERE)  # after the packages: bench/costmodel.py must not shadow costmodel
from readme_table import reference_seconds, write_table  # noqa: E402, I001
from scale import ROOT, run_command  # noqa: E402  (importing it takes this directory off sys.path again)

CONFIGS = ROOT.parent / "shared" / "megatron_gpt_configs.json"
VOCAB, SEQ = 51200, 2048
# Narayanan et al. (SC 2021), Table 1: achieved teraFLOP/s per GPU, by model size in billions of parameters.
PAPER_TFLOPS = {1.7: 137, 3.6: 138, 7.5: 142, 18.4: 135, 39.1: 138, 76.1: 140, 145.6: 148, 310.1: 155, 529.6: 163,
                1008.0: 163}


def spec_and_schedule(config: dict) -> tuple[str, str]:
    """The configuration's spec and its published split's schedule."""
    if config["params_billion"] == 18.4:
        return "specs/megatron_gpt_18b.yaml", "DP+MP+R"
    name = f"gpt_{config['params_billion']:g}b".replace(".", "_")
    return f"specs/megatron/{name}.yaml", "Megatron"


def step_flops(config: dict) -> float:
    """The paper's flops of one training step with every layer recomputed."""
    b, s, layers, h = config["global_batch"], SEQ, config["layers"], config["hidden"]
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + VOCAB / (16 * layers * h))


def auto_spec(config: dict, directory: Path) -> str:
    """The configuration's spec with the mesh and the microbatches left to the
    planner: pipeline x data x tensor over its GPUs, the links from the
    preset's nodes, the published split a named schedule (its screen and floor)."""
    spec, _ = spec_and_schedule(config)
    data = yaml.safe_load((ROOT / spec).read_text())
    hardware = data["hardware"]
    data.update(mesh={"pipeline": "auto", "data": "auto", "model": "auto"}, microbatches="auto",
                pipeline={"schedule": "1f1b"},
                hardware={"preset": hardware["preset"] if isinstance(hardware, dict) else hardware})
    path = directory / f"{Path(spec).stem}_auto.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def interleaved_spec(config: dict, chunks: int, directory: Path) -> str:
    """The configuration's spec on Megatron's interleaved 1F1B with `chunks` stages per device."""
    spec, _ = spec_and_schedule(config)
    data = yaml.safe_load((ROOT / spec).read_text())
    data["pipeline"] = {**(data.get("pipeline") or {}), "schedule": "interleaved", "chunks": chunks}
    path = directory / f"{Path(spec).stem}_interleaved_{chunks}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def interleaved(config: dict, directory: Path) -> dict | None:
    """The published split on the interleaved schedule: each count of chunks
    that divides the layers per stage, the fastest that fits (else the
    fastest), with the counts tried."""
    if config["pipeline"] == 1:
        return None
    per_stage = config["layers"] // config["pipeline"]
    _, schedule = spec_and_schedule(config)
    runs = {v: run_command(interleaved_spec(config, v, directory), "--schedule", schedule)
            for v in range(2, per_stage + 1) if per_stage % v == 0}
    priced = {v: r for v, r in runs.items() if "error" not in r}
    if not priced:
        return next(iter(runs.values()), None)
    best = min(priced, key=lambda v: (not priced[v]["fits"], priced[v]["step_time_s"]))
    return {**priced[best], "chunks": best, "tried": sorted(runs),
            "tflops_per_gpu": step_flops(config) / priced[best]["step_time_s"] / config["gpus"] / 1e12}


def measure(config: dict, search: bool, mesh_auto: bool, directory: Path, jobs: int = 1) -> dict:
    spec, schedule = spec_and_schedule(config)
    row = {"config": config, "spec": spec, "published": run_command(spec, "--schedule", schedule),
           "interleaved": interleaved(config, directory)}
    published = row["published"]
    if "error" not in published:
        published["tflops_per_gpu"] = step_flops(config) / published["step_time_s"] / config["gpus"] / 1e12
    if search:
        row["cpsat"] = run_command(spec, "--solver", "cpsat")
    if mesh_auto:
        row["auto"] = run_command(auto_spec(config, directory), "--solver", "cpsat", "--jobs", str(jobs))
    return row


def _split(c: dict) -> str:
    return f"{c['tensor']} x {c['pipeline']} x {c['data']}"


def table(rows: list[dict]) -> str:
    lines = ["| model | t x p x d | GPUs | batch, microbatches | published split: step time | model TFLOP/s per GPU "
             "| the paper's | peak memory | plan wall | interleaved: chunks, step time, TFLOP/s | CP-SAT answer "
             "| searched plan | search wall, peak RSS |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        c, p = r["config"], r["published"]
        k = c["global_batch"] // c["data"]
        head = f"| {c['params_billion']:g}B | {_split(c)} | {c['gpus']:,} | {c['global_batch']:,}, K = {k} |"
        paper = PAPER_TFLOPS.get(c["params_billion"], "")
        if "error" in p:
            lines.append(f"{head} {p['error']} | | {paper} | | {p['wall_s']:.0f} s | | | | |")
            continue
        fit = "fits" if p["fits"] else "DOES NOT FIT"
        cells = (f" {p['step_time_s']:.2f} s | {p['tflops_per_gpu']:.0f} | {paper} | {p['peak_gib']:.1f} GiB, {fit} | "
                 f"{p['wall_s']:.0f} s | {_interleaved_cell(r.get('interleaved'))} |")
        s = r.get("cpsat")
        if s is None:
            lines.append(f"{head}{cells} not run | | |")
        elif "error" in s:
            lines.append(f"{head}{cells} {s['error']} | | {s['wall_s']:.0f} s |")
        else:
            kept = " (the published split)" if s.get("floor_kept") else ""
            searched = f"{s['searched_step_s']:.2f} s" if s.get("searched_step_s") else "none fits"
            rss = f"{s['rss_gb']:.2f} GB" if s.get("rss_gb") else "n/a"
            lines.append(f"{head}{cells} {s['step_time_s']:.2f} s{kept} | {searched} | {s['wall_s']:.0f} s, {rss} |")
    return "\n".join(lines)


def _interleaved_cell(i: dict | None) -> str:
    if i is None:
        return "-"
    if "error" in i:
        return i["error"]
    fit = "" if i["fits"] else ", DOES NOT FIT"
    tried = ", ".join(map(str, i["tried"]))
    return f"{i['chunks']} (of {tried}), {i['step_time_s']:.2f} s, {i['tflops_per_gpu']:.0f}{fit}"


def auto_table(rows: list[dict]) -> str:
    lines = ["| model | GPUs | published t x p x d, K | its step time | `mesh: auto`: model x pipeline x data axes, K "
             "| step time | meshes screened, searched | wall, peak RSS |",
             "|---|---:|---|---:|---|---:|---:|---:|"]
    for r in rows:
        c, p, a = r["config"], r["published"], r.get("auto")
        head = (f"| {c['params_billion']:g}B | {c['gpus']:,} | {_split(c)}, {c['global_batch'] // c['data']} | "
                f"{p['step_time_s']:.2f} s |" if "error" not in p else f"| {c['params_billion']:g}B | | | |")
        if a is None:
            continue
        rss = f"{a['rss_gb']:.2f} GB" if a.get("rss_gb") else "n/a"
        if "error" in a:
            lines.append(f"{head} {a['error']} | | | {a['wall_s']:.0f} s, {rss} |")
            continue
        mesh = a["mesh"]
        t, pp, d = (mesh.get(axis, 1) for axis in ("model", "pipeline", "data"))
        split = f"{t} x {pp} x {d}, {a.get('microbatches', 1)}"
        lines.append(f"{head} {split} | {a['step_time_s']:.2f} s | {a['meshes']}, {a['meshes_searched']} | "
                     f"{a['wall_s']:.0f} s, {rss} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="BILLIONS", help="only this size, e.g. 145.6 (repeatable)")
    parser.add_argument("--search", action="store_true", help="also plan each configuration with --solver cpsat")
    parser.add_argument("--mesh-auto", action="store_true",
                        help="also plan each configuration with mesh and microbatches auto (its own table)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="--mesh-auto: screen the meshes, search those after the first and score the "
                        "re-ranked plans in N processes (default 1)")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON in place of the table (still written with --write-readme)")
    parser.add_argument("--write-readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args()
    configs = json.loads(CONFIGS.read_text())["configs"]
    if args.only:
        configs = [c for c in configs if f"{c['params_billion']:g}" in args.only]
    rows = []
    speed = [reference_seconds()]  # the hour's speed, before and after
    with tempfile.TemporaryDirectory() as directory:
        for config in configs:
            rows.append(measure(config, args.search, args.mesh_auto, Path(directory), args.jobs))
            print(json.dumps(rows[-1]), file=sys.stderr)
    speed.append(reference_seconds())
    if args.json:  # the rows on stdout, the table (with --write-readme) in the README only
        print(json.dumps(rows, indent=2))
        if not args.write_readme:
            return
    if args.mesh_auto:
        text = (auto_table(rows) + "\n\nt x p x d, K: tensor x pipeline x data and microbatches; `mesh: auto`: "
                "`mesh: {pipeline: auto, data: auto, model: auto}`, `microbatches: auto`, the links from the "
                "preset's nodes, CP-SAT with the screen's default 4 meshes searched"
                + (f", the meshes screened, the 3 searched after the first and the re-ranked plans scored in "
                   f"{args.jobs} processes "
                   f"(`--jobs {args.jobs}`)" if args.jobs > 1 else "")
                + f". Python {platform.python_version()} on {platform.machine()}, a reference Python workload "
                f"{speed[0]:.2f} s before and {speed[1]:.2f} s after (`bench/readme_table.reference_seconds`: the "
                "hour's speed; the walls scale with it), "
                f"`python bench/megatron.py --mesh-auto{f' --jobs {args.jobs}' if args.jobs > 1 else ''}"
                f"{''.join(f' --only {o}' for o in args.only or [])}`.")
        if not args.json:
            print(text)
        if args.write_readme:
            write_table("megatron-auto-table", text)
        return
    text = (table(rows) + "\n\nThe published split priced as written (the step time a pipeline's 1F1B schedule "
            "simulates; TFLOP/s: the paper's flop count over that time and the GPUs); the paper's: its Table 1's "
            "measured teraFLOP/s per GPU; interleaved: the same split on Megatron's interleaved 1F1B, the "
            "fastest count of chunks per device that fits, of those that divide the layers per stage; CP-SAT on "
            "the same mesh "
            "with the published split as its floor (searched plan: the search's own; where the answer is the "
            "published split, that plan was slower or did not fit). "
            f"Python {platform.python_version()} on {platform.machine()}, "
            f"`python bench/megatron.py{' --search' if args.search else ''}`.")
    if not args.json:
        print(text)
    if args.write_readme:
        write_table("megatron-table", text)


if __name__ == "__main__":
    main()
