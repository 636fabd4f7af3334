"""Mesh-shape search: a spec may leave the mesh to the planner.

    devices: 16
    mesh: auto                   # batch x model, every split of the devices
    mesh: {batch: auto, model: auto}
    mesh: {data: auto, seq: 2, model: auto}   # some axes fixed
    mesh: {pipeline: auto, batch: auto, model: auto}   # pipeline stages too
    mesh_candidates: [{batch: 8, model: 8}, {batch: 16, model: 4}]   # a list

Every ordered factorization of the devices into the auto axes (after the
fixed ones) is a candidate mesh; an axis of size 1 is left out, so a
candidate may have fewer axes. Each axis of a preset's hardware gets its
link from the preset's topology (`costmodel.hardware.topology_links`: an
axis whose devices lie in one node stays on NVLink, one that spans nodes
pays InfiniBand) unless the spec names its link. Meshes that differ only in
axis names, with the same sizes on the same links, are one problem to a
search over every axis, and only the first is planned. Each candidate is planned
by the search backend over all of its axes (a spec's schedules name axes of
one mesh, so a mesh search has none), and the fastest plan that fits wins.
CP-SAT on each mesh is hinted with the fastest plan of the meshes before
(its decisions on the axes both meshes have), as XLA's auto-sharding
carries hints across the mesh shapes it tries.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from costmodel.hardware import PRESETS, topology_links
from ir.core import Mesh
from ir.lower import LowerOptions
from ir.pipeline import PIPELINE
from solver.plan import Plan
from solver.planning.planner import Planned, Prepared, SearchOverrides, plan_spec, prepare
from solver.planning.spec import SpecError, is_mesh_search, parse_yaml, read_spec_text, validate_spec
from solver.search.report import SILENT, NoPlanFits, Progress

AUTO = "auto"
DEFAULT_AXES = ("batch", "model")  # `mesh: auto`: data x tensor, DistIR's D x T


@dataclass(frozen=True, slots=True)
class MeshTried:
    """One candidate mesh: its axes and links, and its plan (None: no plan fits)."""

    mesh: tuple[tuple[str, int], ...]
    links: tuple[tuple[str, str], ...]  # the link class (or inline link's kind) of each axis
    planned: Planned | None
    message: str  # the search's message, or why no plan fits
    seconds: float

    @property
    def step_time_s(self) -> float | None:
        return self.planned.assessment.cost.step_time_s if self.planned is not None else None

    @property
    def shape(self) -> str:
        return mesh_shape(self.mesh)


@dataclass(frozen=True, slots=True)
class MeshSearch:
    devices: int
    tried: tuple[MeshTried, ...]  # in enumeration order
    best: Planned  # the fastest plan that fits


def mesh_shape(mesh) -> str:
    """`batch=2 x model=8` for (axis, size) pairs."""
    return " x ".join(f"{a}={n}" for a, n in mesh)


def ordered_factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every tuple of `parts` positive integers whose product is `n`."""
    if parts == 0:
        return [()] if n == 1 else []
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in ordered_factorizations(n // d, parts - 1)]


def candidate_meshes(data: dict[str, Any], filename: str) -> list[tuple[tuple[str, int], ...]]:
    """The meshes a mesh-search spec allows (axes major to minor, sizes >= 2)."""
    if "mesh_candidates" in data:
        return _listed_meshes(data, filename)
    devices = data.get("devices")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise SpecError(f"{filename}: devices: a mesh search needs the device count (an integer, e.g. devices: 16)")
    mesh = data["mesh"]
    axes: dict[str, Any] = dict.fromkeys(DEFAULT_AXES, AUTO) if mesh == AUTO else dict(mesh)
    fixed = {a: n for a, n in axes.items() if n != AUTO}
    for axis, size in fixed.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 2:
            raise SpecError(f"{filename}: mesh.{axis}: a size of at least 2, or auto; got {size!r}")
    known = math.prod(fixed.values())
    if devices % known:
        raise SpecError(f"{filename}: mesh: the fixed axes ({' x '.join(map(str, fixed.values()))} = {known} "
                        f"devices) do not divide devices: {devices}")
    free = [a for a in axes if axes[a] == AUTO]
    meshes = []
    for sizes in ordered_factorizations(devices // known, len(free)):
        chosen = {**fixed, **dict(zip(free, sizes))}
        mesh_c = tuple((a, chosen[a]) for a in axes if chosen[a] > 1)
        if mesh_c and mesh_c not in meshes:
            meshes.append(mesh_c)
    if not meshes:
        raise SpecError(f"{filename}: mesh: no mesh of {devices} device(s) shards anything")
    return meshes


def _listed_meshes(data: dict[str, Any], filename: str) -> list[tuple[tuple[str, int], ...]]:
    """`mesh_candidates: [{batch: 8, model: 8}, {batch: 16, model: 4}]`: the meshes to compare, as given."""
    listed = data["mesh_candidates"]
    if "mesh" in data:
        raise SpecError(f"{filename}: give either mesh or mesh_candidates, not both")
    if not isinstance(listed, list) or not listed:
        raise SpecError(f"{filename}: mesh_candidates: a list of meshes, e.g. [{{batch: 8, model: 8}}, "
                        "{batch: 16, model: 4}]")
    meshes = []
    for i, mesh in enumerate(listed):
        if not isinstance(mesh, dict) or not mesh:
            raise SpecError(f"{filename}: mesh_candidates.{i}: a mesh {{axis: size, ...}}; got {mesh!r}")
        for axis, size in mesh.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 2:
                raise SpecError(f"{filename}: mesh_candidates.{i}.{axis}: a size of at least 2; got {size!r}")
        total = math.prod(mesh.values())
        if "devices" in data and total != data["devices"]:
            raise SpecError(f"{filename}: mesh_candidates.{i}: {total} devices, but devices: {data['devices']}")
        if meshes and total != math.prod(n for _, n in meshes[0]):
            raise SpecError(f"{filename}: mesh_candidates.{i}: {total} devices, but mesh_candidates.0 has "
                            f"{math.prod(n for _, n in meshes[0])}: the meshes compared share one cluster")
        meshes.append(tuple(mesh.items()))
    return meshes


def concrete_data(data: dict[str, Any], mesh: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """The spec's data with this mesh, the links of its axes (the spec's, else
    the preset's topology), and no schedules."""
    out = copy.deepcopy({k: v for k, v in data.items() if k not in ("schedule", "schedules", "mesh_candidates")})
    out["mesh"] = dict(mesh)
    axes = {a for a, _ in mesh}
    if PIPELINE not in axes:  # the candidate runs without stages: its `pipeline:` settings have nothing to set
        out.pop("pipeline", None)
    hardware = out.get("hardware")
    if isinstance(hardware, str):
        hardware = {"preset": hardware}
    if isinstance(hardware, dict):
        links = {a: link for a, link in (hardware.get("links") or {}).items() if a in axes}
        if hardware.get("preset") in PRESETS:
            links = {**topology_links(hardware["preset"], mesh), **links}
        hardware["links"] = links
        achievable = hardware.get("achievable")
        if isinstance(achievable, dict) and isinstance(achievable.get("links"), dict):
            achievable["links"] = {a: f for a, f in achievable["links"].items() if a in axes}
        out["hardware"] = hardware
    return out


def plan_meshes(path: str | os.PathLike[str], solver: str, options: LowerOptions | None = None,
                overrides: SearchOverrides | None = None, progress: Progress = SILENT) -> MeshSearch:
    """Plan every candidate mesh of the mesh-search spec at `path` with the
    search backend `solver` and keep the fastest plan that fits."""
    filename = os.fspath(path)
    data = parse_yaml(read_spec_text(path), filename)
    if not is_mesh_search(data):
        raise SpecError(f"{filename}: mesh: not a mesh search (no axis is auto)")
    if solver not in ("cpsat", "mcts"):
        raise SpecError(f"{filename}: mesh: auto plans each mesh with a search backend: add --solver cpsat "
                        "(or mcts)")
    candidates = candidate_meshes(data, filename)
    devices = math.prod(n for _, n in candidates[0])
    tried, seen = [], set()
    prepared = None  # the program, its analysis and its one-device cost do not depend on the mesh
    for mesh in candidates:
        spec = validate_spec(concrete_data(data, mesh), filename)
        hardware = spec.hardware_obj()
        # A search over every axis does not read axis names, so meshes with the same sizes on the same
        # links are one problem (batch=16 and model=16): the first is planned. An imported program's
        # own sharding constraints name axes, so there every mesh is its own.
        same = tuple(sorted((n, repr(hardware.links[a]), a == PIPELINE) for a, n in mesh))
        if "stablehlo" not in (data.get("model") or {}):
            if same in seen:
                continue
            seen.add(same)
        start = time.perf_counter()
        progress.update(f"mesh search: {mesh_shape(mesh)}", force=True)
        prepared = prepared or prepare(spec)
        try:
            planned = plan_spec(spec, solver, options, overrides, progress, prepared=prepared,
                                hint=_seed(tried, prepared, spec.sharding_mesh()))
            message = planned.search[-1].message if planned.search else ""
        except (NoPlanFits, SpecError) as exc:  # SpecError: this mesh cannot run the step (more stages than layers)
            planned, message = None, str(exc).removeprefix(f"{filename}: ")
        links = tuple((a, hardware.links[a].kind) for a, _ in mesh)
        tried.append(MeshTried(mesh, links, planned, message, time.perf_counter() - start))
    progress.clear()
    fitting = [t for t in tried if t.planned is not None and t.planned.assessment.cost.fits]
    if not fitting:
        raise NoPlanFits(f"{filename}: mesh search: no plan fits on any of the {len(tried)} meshes of "
                         f"{devices} devices; " + "; ".join(f"{t.shape}: {t.message}" for t in tried))
    best = min(fitting, key=lambda t: t.step_time_s)  # the first in enumeration order on a tie
    return MeshSearch(devices, tuple(tried), best.planned)


def _seed(tried: list[MeshTried], prepared: Prepared, mesh: Mesh) -> Plan | None:
    """CP-SAT's hint on the next mesh (XLA's hints across mesh shapes): the
    fastest plan so far of the shared program, its decisions on the axes
    this mesh also has. The colors are the shared NDA's, so they carry over."""
    done = [t.planned for t in tried if t.planned is not None and t.planned.nda is prepared.nda
            and t.planned.assessment.cost.fits]
    if not done:
        return None
    best = min(done, key=lambda p: p.assessment.cost.step_time_s).plan
    return Plan(mesh, tuple(d for d in best.decisions if d.axis in mesh.names), best.resolutions,
                tuple((k, a) for k, a in best.replicated if a in mesh.names))


def mesh_search_json(search: MeshSearch) -> list[dict[str, Any]]:
    """The `mesh_search` rows of `shardplan plan --json` (docs/json.md)."""
    rows = []
    for t in search.tried:
        cost = t.planned.assessment.cost if t.planned is not None else None
        rows.append({"mesh": dict(t.mesh), "links": dict(t.links),
                     "step_time_s": cost.step_time_s if cost else None,
                     "peak_memory_bytes": cost.peak_memory_bytes if cost else None,
                     "fits": bool(cost and cost.fits), "best": t.planned is search.best,
                     "search_s": t.seconds, "message": t.message})
    return rows


def format_mesh_search(rows: list[dict[str, Any]], devices: int) -> str:
    """The table `shardplan plan` prints before the best mesh's plan."""
    meshes = f"{len(rows)} mesh" + ("es" if len(rows) != 1 else "")
    shapes = [mesh_shape(r["mesh"].items()) for r in rows]
    links = [", ".join(r["links"].values()) for r in rows]
    wide, wide_links = max([28, *map(len, shapes)]), max([28, *map(len, links)])
    lines = [f"mesh search: {meshes} of {devices} devices, each planned over all its axes", "",
             f"  {'mesh':<{wide}} {'links':<{wide_links}} {'step time':>12} {'peak memory':>12} {'fits':>5} "
             f"{'search':>8}"]
    for r, shape, link in zip(rows, shapes, links):
        step = f"{r['step_time_s'] * 1e3:,.3f} ms" if r["step_time_s"] is not None else "no plan"
        peak = f"{r['peak_memory_bytes'] / 2**30:,.2f} GiB" if r["peak_memory_bytes"] is not None else "-"
        mark = "  <- best" if r["best"] else f"  ({r['message'].split('; ')[0]})" if r["step_time_s"] is None else ""
        lines.append(f"  {shape:<{wide}} {link:<{wide_links}} {step:>12} {peak:>12} {'yes' if r['fits'] else 'no':>5} "
                     f"{r['search_s']:>7.1f}s{mark}")
    return "\n".join(lines) + "\n\n"


__all__ = ["MeshSearch", "MeshTried", "candidate_meshes", "concrete_data", "format_mesh_search", "mesh_shape",
           "mesh_search_json", "ordered_factorizations", "plan_meshes"]
