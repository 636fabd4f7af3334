"""DistIR's grid: every data x tensor x pipeline split of the devices and
every microbatch count, with its step time, peak memory and fit, sorted.

    shardplan plan specs/mesh_search/deep_mlp_16384x64.yaml --solver cpsat --grid [--stages 1,2,4] [--microbatches 1-32]

The spec is a mesh search (`solver.planning.meshes`); its axes are the
tensor axes, and the grid adds a `pipeline` axis in front when the spec has
none. Each mesh D x T x P is planned once by the search backend (the plan
shards each stage's D x T devices; `solver.planning.pipelining`), and that
plan is then pipelined with every microbatch count K: the search, its cost
table and the program's analysis are shared by every K of a mesh, and one
K costs one lowering and the pricing of its stage tasks. With P = 1 and K > 1
the microbatches are gradient accumulation: less memory, the same weights'
work K times smaller. A K that does not split the batch over the data axis
is left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ir.lower import LowerOptions
from ir.pipeline import PIPELINE
from solver.planning.meshes import AUTO, DEFAULT_AXES, candidate_meshes, concrete_data, mesh_shape
from solver.planning.pipelining import microbatch_counts, pipelined
from solver.planning.planner import Planned, SearchOverrides, plan_spec, prepare
from solver.planning.spec import SpecError, is_mesh_search, parse_yaml, read_spec_text, validate_spec
from solver.search.report import SILENT, NoPlanFits, Progress

STAGES = (1, 2, 4)  # DistIR's pipeline degrees
MICROBATCHES = tuple(range(1, 33))


@dataclass(frozen=True, slots=True)
class GridRow:
    mesh: tuple[tuple[str, int], ...]
    data: int  # D: the devices of a stage its plan splits the batch over
    tensor: int  # T: the rest of a stage's devices (they split the weights' work)
    stages: int  # P
    microbatches: int  # K
    step_time_s: float | None  # None: no plan (the message says why)
    peak_memory_bytes: int | None
    fits: bool
    bubble_fraction: float
    message: str = ""
    schedule: str = ""  # gpipe or 1f1b; empty without microbatches

    @staticmethod
    def from_json(row: dict[str, Any]) -> GridRow:
        return GridRow(tuple(row["mesh"].items()), row["data"], row["tensor"], row["stages"], row["microbatches"],
                       row["step_time_s"], row["peak_memory_bytes"], row["fits"], row["bubble_fraction"],
                       row["message"], row["schedule"])

    def to_json(self) -> dict[str, Any]:
        return {"mesh": dict(self.mesh), "data": self.data, "tensor": self.tensor, "stages": self.stages,
                "microbatches": self.microbatches,
                "step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits,
                "bubble_fraction": self.bubble_fraction, "schedule": self.schedule, "message": self.message}


def grid_data(data: dict[str, Any], filename: str) -> dict[str, Any]:
    """The mesh search with a pipeline axis (`auto`) in front, if it has none."""
    if not is_mesh_search(data) or "mesh_candidates" in data:
        raise SpecError(f"{filename}: --grid needs a mesh search with devices: N and mesh: auto (or axes sized "
                        "auto), e.g. mesh: {batch: auto, model: auto}")
    mesh = dict.fromkeys(DEFAULT_AXES, AUTO) if data["mesh"] == AUTO else dict(data["mesh"])
    if PIPELINE not in mesh:
        mesh = {PIPELINE: AUTO, **mesh}
    return {**data, "mesh": mesh}


def plan_grid(path: str | os.PathLike[str], solver: str, stages: tuple[int, ...] = STAGES,
              microbatches: tuple[int, ...] = MICROBATCHES, options: LowerOptions | None = None,
              overrides: SearchOverrides | None = None, progress: Progress = SILENT,
              data: dict[str, Any] | None = None) -> list[GridRow]:
    """Every mesh D x T x P (P in `stages`) and K in `microbatches` of the
    spec at `path` (module docstring), fitting plans first, fastest first.
    `data`: the spec's parsed YAML, if the caller has it (a bench that
    changes the batch); `path` then only names it."""
    filename = os.fspath(path)
    if solver not in ("cpsat", "mcts"):
        raise SpecError(f"{filename}: --grid plans each mesh with a search backend: add --solver cpsat (or mcts)")
    data = grid_data(data if data is not None else parse_yaml(read_spec_text(path), filename), filename)
    rows: list[GridRow] = []
    prepared, seen = None, set()
    for mesh in candidate_meshes(data, filename):
        p = dict(mesh).get(PIPELINE, 1)
        if p not in stages:
            continue
        spec = validate_spec(concrete_data(data, mesh), filename)
        hardware = spec.hardware_obj()
        # As in the mesh search: the same sizes on the same links are one problem to the search.
        same = (p, tuple(sorted((n, repr(hardware.links[a])) for a, n in mesh if a != PIPELINE)))
        if same in seen:
            continue
        seen.add(same)
        prepared = prepared or prepare(spec)
        progress.update(f"grid: {mesh_shape(mesh)}", force=True)
        try:
            planned = plan_spec(spec, solver, options, overrides, progress, prepared=prepared,
                                floor=False)  # the grid compares searched meshes; experts have their columns
        except NoPlanFits as exc:
            # One row for the mesh: its plan is what every K would pipeline.
            rows.append(GridRow(mesh, 0, spec.sharding_mesh().num_devices, p, microbatches[0], None, None, False,
                                0.0, str(exc)))
            continue
        rows += _pipelined_rows(planned, mesh, p, microbatches, options)
    progress.clear()
    return sorted(rows, key=lambda r: (not r.fits, r.step_time_s is None, r.step_time_s or 0.0))


def _pipelined_rows(planned: Planned, mesh, stages: int, microbatches: tuple[int, ...],
                    options: LowerOptions | None) -> list[GridRow]:
    """The mesh's plan pipelined with each K (P = 1, K = 1: the plan as it is)."""
    spec, plan, hardware = planned.spec, planned.plan, planned.spec.hardware_obj()
    d, t = data_and_tensor(planned)
    rows = []
    splits = set(microbatch_counts(planned.nda, planned.model, plan))
    for k in microbatches:
        if k not in splits:
            continue  # K does not split the batch (times the plan's split): not a configuration
        if stages == 1 and k == 1:
            cost = planned.assessment.cost
            rows.append(GridRow(mesh, d, t, 1, 1, cost.step_time_s, cost.peak_memory_bytes, cost.fits, 0.0))
            continue
        try:
            pipeline, cost = pipelined(spec, planned.model, planned.nda, plan, hardware, options, microbatches=k)
        except SpecError:
            continue  # a step that needs the whole batch at once (batch statistics): not a configuration
        rows.append(GridRow(mesh, d, t, stages, k, cost.step_time_s, max(cost.peak_memory_bytes), cost.fits,
                            cost.bubble_fraction, schedule=pipeline.schedule))
    return rows


def data_and_tensor(planned: Planned) -> tuple[int, int]:
    """(D, T) of a plan: the devices of one stage that split the batch (the
    axes of the first batch input's first dimension), and the others."""
    mesh = planned.sharding.mesh
    first = planned.model.function.param(planned.model.inputs[0])
    d = mesh.group_size(planned.sharding.def_dims(planned.nda, first)[0]) if first.type.rank else 1
    return d, mesh.num_devices // d


def grid_json(rows: list[GridRow], path: str, solver: str, seconds: float) -> dict[str, Any]:
    """The `shardplan plan --grid --json` object (docs/json.md)."""
    return {"source": path, "solver": solver, "time_s": seconds, "grid": [r.to_json() for r in rows]}


def format_grid(rows: list[GridRow], path: str, seconds: float, shown: int | None = None) -> str:
    """DistIR's table: one row per configuration, fitting ones first, fastest first."""
    lines = [f"{path}: grid of {len(rows)} configurations ({seconds:.1f} s); D x T x P: the devices a stage's plan "
             "splits the batch over, the rest of a stage's, the stages", "",
             f"  {'D x T x P':<12} {'K':>3} {'schedule':<9}{'mesh':<34} {'step time':>12} {'bubble':>7} "
             f"{'peak memory':>12} {'fits':>5}"]
    for r in rows[:shown]:
        step = f"{r.step_time_s * 1e3:,.2f} ms" if r.step_time_s is not None else "no plan"
        peak = f"{r.peak_memory_bytes / 2**30:,.2f} GiB" if r.peak_memory_bytes is not None else "-"
        lines.append(f"  {dtp(r):<12} {r.microbatches:>3} {r.schedule or '-':<9}{mesh_shape(r.mesh):<34} {step:>12} "
                     f"{r.bubble_fraction:>6.1%} {peak:>12} {'yes' if r.fits else 'no':>5}")
    if shown is not None and len(rows) > shown:
        lines.append(f"  ... and {len(rows) - shown} more (--json lists them all)")
    return "\n".join(lines) + "\n"


def dtp(row: GridRow) -> str:
    return f"{row.data} x {row.tensor} x {row.stages}" if row.data else f"? x ? x {row.stages}"


__all__ = ["GridRow", "MICROBATCHES", "STAGES", "format_grid", "grid_json", "plan_grid"]
