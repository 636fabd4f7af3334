"""The mesh search's screen (`solver.planning.mesh_screen`): with more
candidate meshes than it searches, each mesh is priced with the plans it
has (the named schedules whose axes it has, the best searched plan), by
the same cost model, and the best are searched."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import shardplan

from ir.sharding import local_type
from solver.planning.mesh_screen import screen_mesh
from solver.planning.meshes import candidate_meshes, format_mesh_search, mesh_spec, plan_meshes
from solver.planning.pipelining import microbatch_counts, pipelined_cost, search_nda
from solver.planning.planner import complete, prepare
from solver.planning.tactics import apply_schedule

GPT = """
model:
  builder: transformer
  args: {layers: 4, d_model: 64, heads: 4, head_dim: 16, mlp_hidden: 256, vocab: 512, seq: 32, batch: 16,
         norm: layer, tied_embeddings: true}
  step: train
devices: 8
mesh: {pipeline: auto, data: auto, model: auto}
microbatches: auto
hardware: {preset: A100-80GB, links: {pipeline: infiniband, data: infiniband}}
schedules:
  Megatron:
    tactics:
      - {manual: {axis: data, values: {batch.tokens: 0}}}
      - manual: {axis: model, values: {"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}
    expect: {all_reduce: 1}   # written for one mesh: a mesh search leaves it out
  DP:
    tactics:
      - {manual: {axis: data, values: {batch.tokens: 0}}}
"""


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    path = tmp_path_factory.mktemp("screen") / "gpt.yaml"
    path.write_text(GPT)
    return path, plan_meshes(path, "cpsat", searched=2)


def test_mesh_spec_keeps_the_schedules_whose_axes_the_mesh_has():
    data = yaml.safe_load(GPT)
    both = mesh_spec(data, (("data", 4), ("model", 2)), "gpt.yaml")
    assert list(both.schedules) == ["Megatron", "DP"] and all(s.expect is None for s in both.schedules.values())
    assert list(mesh_spec(data, (("pipeline", 2), ("data", 4)), "gpt.yaml").schedules) == ["DP"]
    assert mesh_spec(data, (("model", 8),), "gpt.yaml").schedules == {}


def test_the_screen_prices_each_mesh_as_the_planner_would(screened):
    path, search = screened
    rows = {t.mesh: t for t in search.tried}
    assert len(rows) > 2 and sum(t.searched for t in rows.values()) == 2
    data = yaml.safe_load(GPT)
    for mesh, t in rows.items():
        assert t.screened is not None
        if not t.screened.source.startswith("schedule "):
            continue
        # The screened price is the cost model's for that schedule's plan on that mesh, with the most
        # microbatches its batch splits into (and one, for gradient accumulation).
        spec = mesh_spec(data, mesh, str(path))
        name = t.screened.source.removeprefix("schedule ")
        program = prepare(spec)
        plan = apply_schedule(search_nda(spec, program.model, program.nda), spec.sharding_mesh(), spec.tactics(name))
        most = microbatch_counts(program.nda, program.model, plan)[-1]
        assert t.screened.microbatches in ({most} if spec.stages > 1 else {1, most})
        cost = pipelined_cost(spec, program.model, program.nda, plan, spec.hardware_obj(),
                              microbatches=t.screened.microbatches)
        assert t.screened.step_time_s == pytest.approx(cost.step_time_s, rel=1e-12)


def test_the_best_screened_mesh_is_searched_first_and_the_answer_is_no_worse(screened):
    path, search = screened
    data = yaml.safe_load(GPT)
    by_schedules = {}
    built = {}
    for mesh in candidate_meshes(data, str(path)):
        if any(t.mesh == mesh for t in search.tried):
            by_schedules[mesh] = screen_mesh(mesh_spec(data, mesh, str(path)), built, prepare, None)
    first = min(by_schedules, key=lambda m: by_schedules[m].rank)
    rows = {t.mesh: t for t in search.tried}
    assert rows[first].searched and rows[first].planned is not None
    # Each searched mesh's named schedules are its floor (another mesh's plan only hints its search).
    experts = [t.screened.step_time_s for t in search.tried if t.searched and t.screened.fits
               and t.screened.source.startswith("schedule ")]
    assert experts and search.best.assessment.cost.step_time_s <= min(experts) * (1 + 1e-9)
    for t in search.tried:
        if not t.searched:
            assert t.planned is None and t.message.endswith("not searched")


def test_without_schedules_the_first_mesh_is_searched_and_its_plan_screens_the_rest(tmp_path):
    path = tmp_path / "plain.yaml"
    data = yaml.safe_load(GPT)
    del data["schedules"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    search = plan_meshes(path, "cpsat", searched=2)
    first = search.tried[0]  # searched before any screen, to have a plan to screen with
    assert first.mesh == (("model", 8),) and first.planned is not None and first.screened is None
    screens = [t.screened for t in search.tried[1:]]
    assert all(s is not None for s in screens)
    assert any(s.source == f"the plan of {first.shape}" and s.step_time_s is not None for s in screens)
    assert sum(t.searched for t in search.tried) == 2


def test_cli_mesh_search_shows_the_screen(capsys, screened, monkeypatch):
    """With --jobs 2 the screens run in two processes, and the meshes left to
    search after the first side by side: the same rows and answer."""
    from solver.planning.meshes import _Meshes

    path, _ = screened
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--search-meshes", "3", "--json")
    alone = json.loads(out)
    rows = alone["mesh_search"]
    assert sum(r["searched"] for r in rows) == 3
    side_by_side = []
    real = _Meshes.search_side_by_side

    def spied(self, waiting):
        real(self, waiting)
        for mesh, _ in waiting:  # each plan back with the program and analysis this process holds
            planned = self.tried[mesh].planned
            program = self.built[planned.remat]
            assert planned.model is program.model and planned.nda is program.nda
        side_by_side.append(len(waiting))

    monkeypatch.setattr(_Meshes, "search_side_by_side", spied)
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--search-meshes", "3", "--jobs", "2",
                               "--json")
    assert code == 0, err
    assert side_by_side == [2]  # the first mesh searched alone (its plan screens the others again), then two
    in_processes = json.loads(out)
    assert [(r["mesh"], r["screened"], r["step_time_s"], r["searched"]) for r in in_processes["mesh_search"]] == \
        [(r["mesh"], r["screened"], r["step_time_s"], r["searched"]) for r in rows]
    assert (in_processes["mesh"], in_processes["plan"], in_processes["cost"]) == \
        (alone["mesh"], alone["plan"], alone["cost"])
    # The text form is these rows formatted (`plan` without --json prints it; test_meshes runs that path).
    out = format_mesh_search(rows, 8)
    assert "each screened with the plans it has, the 3 best searched" in out and "not searched)" in out
    assert all(r["screened"]["source"] for r in rows) and any(r["best"] for r in rows)
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--search-meshes", "0")
    assert code == 1 and "a mesh search searches at least one mesh; got 0" in err
    with pytest.raises(SystemExit) as exit_:
        shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--jobs", "0")
    assert exit_.value.code == 2 and "--jobs: must be at least 1" in capsys.readouterr().err


def test_a_plan_whose_weights_alone_exceed_the_memory_is_not_lowered(monkeypatch):
    # 40 GB of f32 weights (a 100k x 100k matrix) on 2 x 2 devices of 80 GB, replicated by a schedule
    # that shards only the batch: it cannot fit, and the screen says so without pricing it.
    import solver.planning.mesh_screen as screen

    text = """
model: {builder: mlp, args: {batch: 64, d_in: 100000, hidden: 100000, d_out: 8}, step: train}
devices: 4
mesh: {batch: 2, model: 2}
hardware: A100-80GB
schedules:
  DP: {tactics: [{manual: {axis: batch, values: {x: 0}}}]}
"""
    from solver.planning.spec import parse_spec

    spec = parse_spec(text, "big.yaml")
    monkeypatch.setattr(screen, "lower", lambda *a, **k: pytest.fail("lowered a plan that cannot fit"))
    screened = screen.screen_mesh(spec, {}, prepare, None)
    assert not screened.fits and screened.step_time_s is None and screened.peak_memory_bytes > 80e9
    assert "weights and state alone exceed a device's memory" in screened.source


def test_a_pipelined_mesh_is_searched_with_its_screens_microbatches(screened):
    _, search = screened
    pipelined = [t for t in search.tried if t.searched and t.planned is not None and t.planned.spec.stages > 1
                 and t.screened is not None and t.screened.microbatches]
    assert pipelined  # the fixture searches a pipelined mesh
    for t in pipelined:
        assert t.planned.spec.microbatches == t.screened.microbatches
        assert t.planned.pipeline_cost.microbatches == t.screened.microbatches


def test_only_the_best_meshs_pipeline_is_made_whole(screened):
    """The other searched meshes keep the folded price their search compared
    (`plan_spec(..., whole=False)`); made whole, it is the same price."""
    _, search = screened
    assert search.best.lowered is not None and [t for t in search.tried if t.planned is search.best]
    others = [t.planned for t in search.tried if t.planned is not None and t.planned is not search.best]
    pipelined = [p for p in others if p.spec.pipelined]
    assert pipelined  # the fixture searches a pipelined mesh that is not the answer
    for planned in pipelined:
        assert planned.lowered is None and planned.pipeline is None
        whole = complete(planned)
        assert whole.lowered is not None and whole.pipeline is not None
        assert whole.assessment.cost.step_time_s == pytest.approx(planned.assessment.cost.step_time_s, rel=1e-12)
        assert whole.assessment.cost.peak_memory_bytes == planned.assessment.cost.peak_memory_bytes
        assert whole.pipeline.microbatches == planned.pipeline_cost.microbatches


def test_a_mesh_is_not_screened_again_with_the_plan_it_was_screened_with(tmp_path, monkeypatch):
    # At Megatron's 1T the searched answer is the published split's plan, so the second screen would
    # price most meshes with the plan their first screen priced already (125 of 157).
    import solver.planning.meshes as meshes
    from solver.planning.planner import plan_spec

    path = tmp_path / "gpt.yaml"
    path.write_text(GPT)
    data = yaml.safe_load(GPT)
    run = meshes._Meshes(str(path), data, "cpsat", None, None, meshes.SILENT,
                         meshes._distinct(data, candidate_meshes(data, str(path)), str(path)))
    run.searched = len(run.meshes)  # every mesh priced (none left out by its bound: tested below)
    screens = {}
    run._screen(screens)
    # The published split searched on one mesh: its answer is the schedule's own plan.
    mesh, spec = next((m, s) for m, s in run.meshes if screens[m][0].fits and screens[m][0].source ==
                      "schedule Megatron" and dict(m).get("pipeline") is None)
    planned = plan_spec(spec, schedule="Megatron", built=run.built, whole=False)
    run.tried[mesh] = meshes.MeshTried(mesh, (), planned, "", 0.0)
    del screens[mesh]
    first = dict(screens)
    import solver.planning.mesh_screen as mesh_screen

    priced = []
    real, priced_with = mesh_screen.screen_mesh, mesh_screen._priced
    monkeypatch.setattr(mesh_screen, "_priced", lambda spec, *a, **kw: priced.append(spec.sharding_mesh())
                        or priced_with(spec, *a, **kw))
    run._screen(screens, again=True)
    skipped = [m for m, s in run.meshes if m in first and s.sharding_mesh() not in priced]
    assert skipped and len(skipped) + len(priced) == len(first)
    for m, s in run.meshes:
        if m not in first:
            continue
        seed, remat = meshes._seed(list(run.tried.values()), run.built, s.sharding_mesh())
        assert (first[m][0].plan == seed) == (m in skipped)
        if m in skipped:  # what the second screen would have priced: the same plan, the same price
            again = real(s, run.built, prepare, ("seed", remat, seed), schedules=False)
            assert screens[m][0] == first[m][0] and again.step_time_s == first[m][0].step_time_s


def test_meshes_screened_in_processes_are_screened_alike(tmp_path):
    # `--jobs 2`: the screens run in two forked processes, in the same order, with the same answers.
    import solver.planning.meshes as meshes

    path = tmp_path / "gpt.yaml"
    path.write_text(GPT)
    data = yaml.safe_load(GPT)
    screens = {}
    for jobs in (1, 2):
        run = meshes._Meshes(str(path), data, "cpsat", None, None, meshes.SILENT,
                             meshes._distinct(data, candidate_meshes(data, str(path)), str(path)), jobs)
        screens[jobs] = {}
        run._screen(screens[jobs])
        if jobs == 2:
            # The first mesh has none of the schedules' axes; their program is still built here, before
            # the processes fork (shared with them, and with the searches after), not in each of them.
            assert not run.meshes[0][1].schedules
            assert list(run.built) == [()]
    assert len(screens[1]) > 2
    assert {m: s for m, (s, _) in screens[1].items()} == {m: s for m, (s, _) in screens[2].items()}


def test_a_searched_meshs_floor_reads_the_pipelines_its_screen_priced(screened, monkeypatch):
    """The floor of a pipelined mesh's search prices its named schedules at
    the screen's count of microbatches: the screen priced them already, and
    the search reads those figures (`Priced`) rather than pricing again."""
    path, search = screened
    _floor_reads_the_screen(search, monkeypatch, stages=lambda n: n > 1)


def test_an_accumulating_meshs_floor_reads_one_microbatch_where_it_fits(tmp_path, monkeypatch):
    # Without a pipeline axis, `microbatches: auto` takes the first count that fits, and one is the
    # first: where the screen priced one microbatch and it fits, the floor reads it.
    path = tmp_path / "gpt.yaml"
    path.write_text(GPT.replace("mesh: {pipeline: auto, data: auto, model: auto}", "mesh: {data: auto, model: auto}"))
    _floor_reads_the_screen(plan_meshes(path, "cpsat", searched=1), monkeypatch, stages=lambda n: n == 1)


def _floor_reads_the_screen(search, monkeypatch, stages) -> None:
    import solver.planning.planner as planner

    tried = [t for t in search.tried if t.searched and t.planned is not None and stages(t.planned.spec.stages)
             and t.planned.floor is not None and t.planned.spec.pipelined]
    assert tried  # the search has such a mesh
    read = 0
    for t in tried:
        known = {(p.remat, p.plan, p.microbatches): p for p in t.screened.priced}
        for expert in t.planned.floor.experts:
            k = 1 if t.planned.spec.microbatches_auto else t.planned.spec.microbatch_count
            p = known.get((expert.remat, expert.plan, k))
            if p is None:
                continue
            read += 1
            assert (expert.step_time_s, expert.peak_memory_bytes, expert.fits) == (p.step_time_s,
                                                                                  p.peak_memory_bytes, p.fits)
            program = prepare(t.planned.spec, expert.remat)
            whole = pipelined_cost(t.planned.spec, program.model, program.nda, expert.plan,
                                   t.planned.spec.hardware_obj())
            assert whole.step_time_s == pytest.approx(p.step_time_s, rel=1e-12) and whole.fits == p.fits
    assert read
    # Searched again with the screen's prices: the same plan, the named schedules not priced again;
    # without them, the floor prices them (the search after it is left out: it is the same search).
    t = tried[0]
    named = {e.plan for e in t.planned.floor.experts if e.plan is not None}
    real = planner.pipelined_cost
    for known, expected in ((t.screened.priced, False), ((), True)):
        priced = []
        monkeypatch.setattr(planner, "pipelined_cost", lambda spec, model, nda, plan, *a, seen=priced, **kw:
                            seen.append(plan) or real(spec, model, nda, plan, *a, **kw))
        if expected:
            monkeypatch.setattr(planner, "_plan", _after_the_floor)
            with pytest.raises(_FloorPriced):
                planner.plan_spec(t.planned.spec, "cpsat", whole=False, known=known)
        else:
            again = planner.plan_spec(t.planned.spec, "cpsat", whole=False, known=known)
            assert again.plan == t.planned.plan
        assert bool(named & set(priced)) == expected


class _FloorPriced(Exception):
    pass


def _after_the_floor(*args, **kwargs):
    raise _FloorPriced


ACCUMULATING = GPT.replace("mesh: {pipeline: auto, data: auto, model: auto}", "mesh: {data: auto, model: auto}")


@pytest.mark.parametrize("text, kind", [(GPT, "pipeline"), (ACCUMULATING, "accumulation"),
                                        (ACCUMULATING.replace("microbatches: auto\n", ""), "one step")])
def test_a_meshs_bound_is_at_most_the_price_of_each_plan_it_screens(tmp_path, text, kind):
    """`screen_bound` of each plan alone, on every candidate mesh, is at most
    the plan's screened price: a pipeline's (1F1B, the most microbatches),
    gradient accumulation's (one microbatch and the most), and where the
    step runs once without a pipeline, the price itself; and
    `screen_memory_bound` at most its peak memory."""
    import solver.planning.mesh_screen as mesh_screen

    path = tmp_path / "gpt.yaml"
    path.write_text(text)
    data = yaml.safe_load(text)
    built, compared = {}, 0
    for mesh in candidate_meshes(data, str(path)):
        spec = mesh_spec(data, mesh, str(path))
        for plan in mesh_screen._plans(spec, built, prepare, None, True):
            screened = mesh_screen._priced(spec, built, [plan], None)
            if screened.step_time_s is None:
                continue
            bound = mesh_screen.screen_bound(spec, built, [plan])
            assert 0 < bound <= screened.step_time_s * (1 + 1e-12), (mesh, plan[0])
            # And of its memory: the weights and optimizer state, and their updates, at most the peak.
            need = mesh_screen.screen_memory_bound(spec, built, [plan])
            assert 0 < need <= screened.peak_memory_bytes, (mesh, plan[0])
            # Its bytes counted over arrays of dimensions are each value's local bytes, added up.
            program, sharding = built[plan[1]], plan[2].materialize(built[plan[1]].nda)
            for values in mesh_screen._state_values(program.model):
                assert mesh_screen._local_bytes(values, program.nda, sharding, spec.sharding_mesh()) == sum(
                    local_type(v.type, sharding.def_dims(program.nda, v), spec.sharding_mesh()).num_bytes
                    for v in values)
            if kind == "one step":
                assert bound == pytest.approx(screened.step_time_s, rel=1e-9)
            if kind == "pipeline" and spec.stages > 1 or kind == "accumulation" and screened.microbatches > 1:
                assert bound < screened.step_time_s  # the bubble, the repeated reads: never the price itself
            compared += 1
    assert compared >= 5


def test_meshes_left_unpriced_by_their_bound_change_nothing_searched(screened, monkeypatch):
    """The search with bounds searches the meshes the search without them
    does, with the same answers; each mesh it left unpriced prices (without
    bounds) at least its bound."""
    import solver.planning.mesh_screen as mesh_screen

    path, bounded = screened
    monkeypatch.setattr(mesh_screen, "screen_bound", lambda *a: 0.0)
    priced = plan_meshes(path, "cpsat", searched=2)
    left = [t for t in bounded.tried if t.screened is not None and t.screened.bound_s is not None]
    assert left and all(t.message.startswith("not priced: at least ") for t in left)
    assert [(t.mesh, t.searched, t.step_time_s) for t in bounded.tried] == \
        [(t.mesh, t.searched, t.step_time_s) for t in priced.tried]
    assert bounded.best.plan == priced.best.plan
    for t in left:
        again = next(p for p in priced.tried if p.mesh == t.mesh).screened
        assert again.step_time_s is None or again.step_time_s >= t.screened.bound_s


def test_meshes_that_cannot_fit_are_priced_last_and_not_at_all_once_enough_fit(tmp_path, monkeypatch):
    """On 2.5 MiB devices the plans of data=8 need 5.3 MiB at least (the
    weights, state and updates of a whole replica): the screen prices it
    after the meshes that may fit and, once two of them do (`keep`), not at
    all; priced, it would not fit, and the other meshes screen as they do
    without memory bounds. (No bounds of time here: they would leave it
    unpriced first.)"""
    import solver.planning.mesh_screen as mesh_screen
    from solver.planning.meshes import _screened
    from solver.planning.plan_text import format_bytes

    text = GPT.replace("hardware: {preset: A100-80GB,", "hardware: {preset: A100-80GB, memory: 2.5MiB,")
    data, path = yaml.safe_load(text), str(tmp_path / "gpt.yaml")
    jobs = [mesh_screen.ScreenJob(mesh, mesh_spec(data, mesh, path), None) for mesh in candidate_meshes(data, path)]
    built: dict = {}
    monkeypatch.setattr(mesh_screen, "screen_bound", lambda *a: 0.0)
    bounded = [s for s, _ in mesh_screen.screen_meshes(jobs, built, prepare, None, keep=2)]
    monkeypatch.setattr(mesh_screen, "screen_memory_bound", lambda *a: 0)
    priced = [s for s, _ in mesh_screen.screen_meshes(jobs, built, prepare, None, keep=2)]
    left = [job.mesh for job, s in zip(jobs, bounded) if s.memory_bound_bytes is not None]
    assert (("data", 8),) in left and sum(s.fits for s in priced) >= 2
    for job, b, p in zip(jobs, bounded, priced):
        if job.mesh in left:
            assert b.step_time_s is None and not b.fits and b.memory_bound_bytes > 2.5 * 2**20
            assert b.source.startswith("not priced: its plans need at least ")
            assert _screened(b.to_json()) == f"> {format_bytes(b.memory_bound_bytes)}"  # "> 5.28 MiB"
            assert not p.fits  # its price's peak, or its weights and state alone (`_price`), exceed the memory
            assert p.step_time_s is None or p.peak_memory_bytes >= b.memory_bound_bytes
        else:
            assert (b.step_time_s, b.peak_memory_bytes, b.fits, b.source) == \
                (p.step_time_s, p.peak_memory_bytes, p.fits, p.source)
