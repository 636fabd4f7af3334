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
by the search backend over all of its axes, with the spec's named schedules
whose axes it has as its expert floor (`mesh_spec`), and the fastest plan
that fits wins. CP-SAT on each mesh is hinted with the fastest plan of the
meshes before (its decisions on the axes both meshes have), as XLA's
auto-sharding carries hints across the mesh shapes it tries. With more
candidates than the meshes to search (`SEARCHED`, `--search-meshes`), every
mesh is screened first and the best are searched (`_Meshes.screen_and_search`,
`solver.planning.mesh_screen`); with `--jobs`, those after the first side
by side (`_Meshes.search_side_by_side`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from costmodel.hardware import PRESETS, topology_links
from ir.core import IRError, Mesh
from ir.lower import LowerOptions
from ir.pipeline import PIPELINE
from solver.plan import Plan
from solver.planning.floor import manual_schedules
from solver.planning.mesh_screen import Screened, ScreenJob, mesh_shape, screen_meshes
from solver.planning.plan_text import format_bytes
from solver.planning.planner import Planned, Prepared, SearchOverrides, complete, plan_spec, prepare
from solver.planning.spec import Spec, SpecError, is_mesh_search, parse_yaml, read_spec_text, validate_spec
from solver.search.forked import forked_map, forks
from solver.search.report import SILENT, NoPlanFits, Progress

AUTO = "auto"
SEARCHED = 4  # a larger mesh search screens every mesh and searches this many (`--search-meshes`)
DEFAULT_AXES = ("batch", "model")  # `mesh: auto`: data x tensor, DistIR's D x T


@dataclass(frozen=True, slots=True)
class MeshTried:
    """One candidate mesh: its axes and links, and its plan (None: no plan fits)."""

    mesh: tuple[tuple[str, int], ...]
    links: tuple[tuple[str, str], ...]  # the link class (or inline link's kind) of each axis
    planned: Planned | None  # None: no plan fits, or the mesh was screened and not searched
    message: str  # the search's message, or why no plan fits
    seconds: float
    screened: Screened | None = None  # its screen (`solver.planning.mesh_screen`), if it had one
    searched: bool = True  # False: screened only

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


def mesh_spec(data: dict[str, Any], mesh: tuple[tuple[str, int], ...], filename: str) -> Spec:
    """The spec on this mesh (`concrete_data`) with the named schedules that
    apply to it (those whose axes it has; their `expect:` blocks, written
    for one mesh, left out): the screen's plans and each search's floor."""
    concrete = concrete_data(data, mesh)
    schedules: dict[str, Any] = {}
    for name, body in (data.get("schedules") or {}).items():
        body = {k: v for k, v in body.items() if k != "expect"} if isinstance(body, dict) else body
        try:
            validate_spec({**concrete, "schedules": {**schedules, name: body}}, filename).tactics(name)
        except (SpecError, IRError):  # an axis this mesh lacks, or a schedule it extends that did
            continue
        schedules[name] = body
    return validate_spec({**concrete, "schedules": schedules} if schedules else concrete, filename)


def plan_meshes(path: str | os.PathLike[str], solver: str, options: LowerOptions | None = None,
                overrides: SearchOverrides | None = None, progress: Progress = SILENT,
                searched: int = SEARCHED) -> MeshSearch:
    """Plan the candidate meshes of the mesh-search spec at `path` with the
    search backend `solver` and keep the fastest plan that fits. With more
    than `searched` meshes, every mesh is screened first
    (`solver.planning.mesh_screen`, in the overrides' `jobs` processes) and
    the `searched` best are searched."""
    filename = os.fspath(path)
    data = parse_yaml(read_spec_text(path), filename)
    if not is_mesh_search(data):
        raise SpecError(f"{filename}: mesh: not a mesh search (no axis is auto)")
    if solver not in ("cpsat", "mcts"):
        raise SpecError(f"{filename}: mesh: auto plans each mesh with a search backend: add --solver cpsat "
                        "(or mcts)")
    if searched < 1:
        raise SpecError(f"{filename}: a mesh search searches at least one mesh; got {searched}")
    candidates = candidate_meshes(data, filename)
    devices = math.prod(n for _, n in candidates[0])
    jobs = (overrides or SearchOverrides()).jobs
    if jobs < 1:
        raise SpecError(f"{filename}: a mesh search screens in at least one process; got {jobs} jobs")
    run = _Meshes(filename, data, solver, options, overrides, progress, _distinct(data, candidates, filename), jobs)
    if len(run.meshes) <= searched:
        for mesh, spec in run.meshes:
            run.search(mesh, spec)
    else:
        run.screen_and_search(searched)
    progress.clear()
    rows = tuple(run.tried[mesh] for mesh, _ in run.meshes)
    fitting = [t for t in rows if t.planned is not None and t.planned.assessment.cost.fits]
    if not fitting:
        raise NoPlanFits(f"{filename}: mesh search: no plan fits on any of the {len(rows)} meshes of "
                         f"{devices} devices; " + "; ".join(f"{t.shape}: {t.message}" for t in rows))
    best = min(fitting, key=lambda t: t.step_time_s)  # the first in enumeration order on a tie
    # Only the answer's pipeline is made whole (lowered, every stage cut): the other meshes' prices are the
    # folded ones their searches compared, the same prices (`ir.pipeline_fold`).
    answer = complete(best.planned, options)
    return MeshSearch(devices, tuple(dataclasses.replace(t, planned=answer) if t is best else t for t in rows), answer)


def _distinct(data: dict[str, Any], candidates: list, filename: str) -> list[tuple[tuple, Spec]]:
    """Each candidate mesh with its spec, meshes that are one problem once."""
    meshes, seen = [], set()
    for mesh in candidates:
        spec = mesh_spec(data, mesh, filename)
        hardware = spec.hardware_obj()
        # A search over every axis does not read axis names, so meshes with the same sizes on the same
        # links are one problem (batch=16 and model=16): the first is planned. An imported program's
        # own sharding constraints name axes, so there every mesh is its own.
        same = tuple(sorted((n, repr(hardware.links[a]), a == PIPELINE) for a, n in mesh))
        if "stablehlo" not in (data.get("model") or {}):
            if same in seen:
                continue
            seen.add(same)
        meshes.append((mesh, spec))
    return meshes


class _Meshes:
    """One mesh search's meshes, their programs (shared: they do not depend
    on the mesh) and what was tried on each."""

    def __init__(self, filename: str, data: dict[str, Any], solver: str, options: LowerOptions | None,
                 overrides: SearchOverrides | None, progress: Progress, meshes: list[tuple[tuple, Spec]],
                 jobs: int = 1) -> None:
        self.filename, self.data, self.solver, self.options, self.overrides = filename, data, solver, options, overrides
        self.progress, self.meshes = progress, meshes
        self.jobs = jobs  # processes that screen meshes side by side (`mesh_screen.screen_meshes`)
        self.built: dict[tuple[str, ...], Prepared] = {}
        self.tried: dict[tuple, MeshTried] = {}
        self.searched = SEARCHED  # meshes searched in all (`screen_and_search`)

    def search(self, mesh: tuple, spec: Spec, screened: Screened | None = None) -> None:
        """Plan the mesh with the search backend, hinted with the best plan so far (or its screen's)."""
        self.progress.update(f"mesh search: {mesh_shape(mesh)}", force=True)
        self.tried[mesh] = self._searched(mesh, spec, screened, self.overrides, self.progress)

    def _searched(self, mesh: tuple, spec: Spec, screened: Screened | None, overrides: SearchOverrides | None,
                  progress: Progress) -> MeshTried:
        """`search`'s plan of the mesh. A pipeline whose microbatches are `auto` is searched with its
        screen's count: the search sees one microbatch's memory, not the whole batch's (whose plans a
        deep pipeline rarely fits)."""
        start = time.perf_counter()
        if screened is not None and screened.microbatches and spec.microbatches_auto and spec.stages > 1:
            spec = mesh_spec({**self.data, "microbatches": screened.microbatches}, mesh, self.filename)
        hint, hint_remat = _seed(list(self.tried.values()), self.built, spec.sharding_mesh())
        if hint is None and screened is not None and screened.plan is not None and screened.fits:
            hint, hint_remat = screened.plan, screened.remat
        try:
            planned = plan_spec(spec, self.solver, self.options, overrides, progress, built=self.built,
                                hint=hint, hint_remat=hint_remat, whole=False,
                                known=screened.priced if screened is not None else ())
            message = planned.search[-1].message if planned.search else ""
        except (NoPlanFits, SpecError) as exc:  # SpecError: this mesh cannot run the step (more stages than layers)
            planned, message = None, str(exc).removeprefix(f"{self.filename}: ")
        return MeshTried(mesh, _links(spec, mesh), planned, message, time.perf_counter() - start, screened)

    def search_side_by_side(self, waiting: list[tuple[tuple, Screened]]) -> None:
        """`search` each mesh, in `jobs` processes (each search in one): a
        search runs in one process but for its re-ranking, so two side by
        side take about the time of one. Each is hinted with the best plan
        searched before them all (one after another, a search is hinted
        with the searches just before it too: CP-SAT's optimum is the same,
        which of equal plans it answers with may not be). A child sends its
        plan back without the program and its analysis, which the meshes
        share (`built`), and this process puts them back."""
        specs = dict(self.meshes)
        overrides = dataclasses.replace(self.overrides or SearchOverrides(), jobs=1)
        self.progress.update(f"mesh search: {', '.join(mesh_shape(m) for m, _ in waiting)} ({self.jobs} processes)",
                             force=True)

        def one(k: int) -> MeshTried:
            mesh, screened = waiting[k]
            tried = self._searched(mesh, specs[mesh], screened, overrides, SILENT)
            if tried.planned is None:
                return tried
            return dataclasses.replace(tried, planned=dataclasses.replace(tried.planned, model=None, nda=None))

        for tried in forked_map(one, len(waiting), self.jobs):
            if tried.planned is not None:
                remat = tried.planned.remat
                if remat not in self.built:  # a program the child built for itself
                    self.built[remat] = prepare(tried.planned.spec, remat)
                program = self.built[remat]
                tried = dataclasses.replace(tried, planned=dataclasses.replace(tried.planned, model=program.model,
                                                                                nda=program.nda))
            self.tried[tried.mesh] = tried

    def screen_and_search(self, searched: int) -> None:
        """Screen every mesh with its named schedules and search the best; screen
        the others again with that mesh's searched plan, and search the next
        best until `searched` meshes are. (Where no named schedule applies to
        any mesh, the first mesh is searched first to have a plan to screen with.)"""
        if not any(manual_schedules(spec) for _, spec in self.meshes):
            for mesh, spec in self.meshes[:searched]:  # in order, until one has a plan that fits
                self.search(mesh, spec)
                if self._has_seed():
                    break
        self.searched = searched
        screens: dict[tuple, tuple[Screened, float]] = {}
        self._screen(screens)
        rescreened = self._has_seed()  # the first screen had a searched plan already
        while True:
            ranked = sorted(screens, key=lambda m: screens[m][0].rank)
            waiting = [m for m in ranked if m not in self.tried]
            if not waiting or len(self.tried) >= searched:
                break
            if rescreened and forks(self.jobs, min(len(waiting), searched - len(self.tried))):
                # The screens are final, so are the meshes left to search: side by side.
                self.search_side_by_side([(m, screens[m][0]) for m in waiting[:searched - len(self.tried)]])
                break
            self.search(waiting[0], dict(self.meshes)[waiting[0]], screens[waiting[0]][0])
            if not rescreened and self._has_seed():
                self._screen(screens, again=True)
                rescreened = True
        for mesh, spec in self.meshes:
            if mesh not in self.tried:
                screened, seconds = screens[mesh]
                if screened.bound_s is not None:
                    why = f"not priced: at least {screened.bound_s * 1e3:,.3f} ms, after the {searched} best screened"
                elif screened.memory_bound_bytes is not None:
                    why = (f"not priced: its plans need at least {format_bytes(screened.memory_bound_bytes)} a "
                           f"device (more than there is), after the {searched} best screened")
                else:
                    why = f"screened {ranked.index(mesh) + 1} of {len(ranked)}"
                self.tried[mesh] = MeshTried(mesh, _links(spec, mesh), None, f"{why}, not searched",
                                             seconds, screened, searched=False)

    def _has_seed(self) -> bool:
        """Some searched mesh has a plan that fits (the screen's second source)."""
        return _source(list(self.tried.values()), self.built) is not None

    def _screen(self, screens: dict[tuple, tuple[Screened, float]], again: bool = False) -> None:
        """Screen the meshes not searched: with their named schedules and the
        best plan searched so far, or (`again`) with that plan alone, keeping
        the faster screen; not again where it is the plan screened there
        (Megatron's 1T: 125 of 157 meshes, the searched answer being the
        published split's plan). The meshes are independent: with jobs,
        they are screened in that many processes (`mesh_screen.screen_meshes`)."""
        todo: list[ScreenJob] = []
        for mesh, spec in self.meshes:
            if mesh in self.tried or (not again and mesh in screens):
                continue
            seed, seed_remat = _seed(list(self.tried.values()), self.built, spec.sharding_mesh())
            source = _source(list(self.tried.values()), self.built)
            with_seed = (f"the plan of {source.shape}", seed_remat, seed) if source is not None else None
            if again and with_seed is None:
                continue
            if again and (screens[mesh][0].plan, screens[mesh][0].remat) == (seed, seed_remat):
                continue  # the searched plan is the one screened here already (a published split that won)
            todo.append(ScreenJob(mesh, spec, with_seed, schedules=not again))
        # Only the best `keep` screens of the meshes not searched yet can be searched: a mesh whose bound
        # ranks it after them is not priced (`mesh_screen.screen_meshes`).
        keep = self.searched - len(self.tried)
        known = {m: s.step_time_s for m, (s, _) in screens.items()
                 if m not in self.tried and s.fits and s.step_time_s is not None}
        done = screen_meshes(todo, self.built, prepare, self.options, self.jobs, self.progress,
                             keep=keep if keep > 0 else None, known=known)
        for job, (screened, seconds) in zip(todo, done):
            if job.mesh in screens:
                before, spent = screens[job.mesh]
                # Of two without a price, the one with a bound says more, and the smaller bound is the mesh's.
                kept = min((before, screened), key=lambda x: (x.rank, x.bound_s is None, x.bound_s or 0.0))
                screens[job.mesh] = (dataclasses.replace(kept, priced=before.priced + screened.priced),
                                     spent + seconds)
            else:
                screens[job.mesh] = (screened, seconds)


def _links(spec: Spec, mesh: tuple) -> tuple[tuple[str, str], ...]:
    hardware = spec.hardware_obj()
    return tuple((a, hardware.links[a].kind) for a, _ in mesh)


def _seed(tried: list[MeshTried], built: dict[tuple[str, ...], Prepared],
          mesh: Mesh) -> tuple[Plan | None, tuple[str, ...] | None]:
    """CP-SAT's hint on the next mesh (XLA's hints across mesh shapes) and the
    rematerialized layers of its program: the fastest plan so far that fits,
    its decisions on the axes this mesh also has. The colors are those of the
    shared program's analysis (`built`), so they carry over."""
    source = _source(tried, built)
    if source is None:
        return None, None
    best = source.planned
    return Plan(mesh, tuple(d for d in best.plan.decisions if d.axis in mesh.names), best.plan.resolutions,
                tuple((k, a) for k, a in best.plan.replicated if a in mesh.names)), best.remat


def _source(tried: list[MeshTried], built: dict[tuple[str, ...], Prepared]) -> MeshTried | None:
    """The searched mesh whose plan seeds the others: the fastest that fits,
    of a program the meshes share."""
    done = [t for t in tried if t.planned is not None and t.planned.assessment.cost.fits
            and t.planned.remat in built and t.planned.nda is built[t.planned.remat].nda]
    return min(done, key=lambda t: t.step_time_s) if done else None


def mesh_search_json(search: MeshSearch) -> list[dict[str, Any]]:
    """The `mesh_search` rows of `shardplan plan --json` (docs/json.md)."""
    rows = []
    for t in search.tried:
        cost = t.planned.assessment.cost if t.planned is not None else None
        rows.append({"mesh": dict(t.mesh), "links": dict(t.links),
                     "step_time_s": cost.step_time_s if cost else None,
                     "peak_memory_bytes": cost.peak_memory_bytes if cost else None,
                     "fits": bool(cost and cost.fits), "best": t.planned is search.best,
                     "searched": t.searched,
                     "search_s": t.seconds, "message": t.message,
                     "screened": t.screened.to_json() if t.screened is not None else None})
    return rows


def format_mesh_search(rows: list[dict[str, Any]], devices: int) -> str:
    """The table `shardplan plan` prints before the best mesh's plan."""
    meshes = f"{len(rows)} mesh" + ("es" if len(rows) != 1 else "")
    shapes = [mesh_shape(r["mesh"].items()) for r in rows]
    links = [", ".join(r["links"].values()) for r in rows]
    wide, wide_links = max([28, *map(len, shapes)]), max([28, *map(len, links)])
    screened = any(r["screened"] for r in rows)
    searched = sum(1 for r in rows if r["searched"])
    how = (f"each screened with the plans it has, the {searched} best searched over all their axes" if screened
           else "each planned over all its axes")
    lines = [f"mesh search: {meshes} of {devices} devices, {how}", "",
             f"  {'mesh':<{wide}} {'links':<{wide_links}} " + (f"{'screened':>12} " if screened else "")
             + f"{'step time':>12} {'peak memory':>12} {'fits':>5} {'time':>8}"]
    for r, shape, link in zip(rows, shapes, links):
        step = f"{r['step_time_s'] * 1e3:,.3f} ms" if r["step_time_s"] is not None else "no plan"
        peak = f"{r['peak_memory_bytes'] / 2**30:,.2f} GiB" if r["peak_memory_bytes"] is not None else "-"
        mark = "  <- best" if r["best"] else f"  ({r['message'].split('; ')[0]})" if r["step_time_s"] is None else ""
        screen = (f"{_screened(r['screened']):>12} " if screened else "")
        lines.append(f"  {shape:<{wide}} {link:<{wide_links}} {screen}{step:>12} {peak:>12} "
                     f"{'yes' if r['fits'] else 'no' if r['searched'] else '-':>5} {r['search_s']:>7.1f}s{mark}")
    return "\n".join(lines) + "\n\n"


def _screened(screen: dict[str, Any] | None) -> str:
    """A screened step time, marked when its plan does not fit."""
    if screen is None:
        return "-"
    if screen["step_time_s"] is None:
        if screen.get("memory_bound_bytes") is not None:
            return f"> {format_bytes(screen['memory_bound_bytes'])}"
        if screen.get("bound_s") is None:
            return "no plan"
        ms = screen["bound_s"] * 1e3
        return f"> {ms:,.0f} ms" if ms >= 100 else f"> {ms:.3g} ms"  # not "> 0 ms"
    return f"{screen['step_time_s'] * 1e3:,.3f} ms" + ("" if screen["fits"] else "*")


__all__ = ["MeshSearch", "MeshTried", "candidate_meshes", "concrete_data", "format_mesh_search", "mesh_shape",
           "mesh_search_json", "ordered_factorizations", "plan_meshes"]
