"""Rematerialization (ir/remat.py; issue 25, item 3): a layer's forward
recomputed in its backward computes the same step, keeps less, costs the
forward's flops again, and lowers correctly on the simulated mesh."""

import dataclasses
import json

import numpy as np
import pytest
from test_cpsat import BIG_TRANSFORMER, brute_force, check_consistent
from test_lower import MESH, _transformer, bp_picks, check_lowering, mp_picks, plan
from test_table import hardware_for

from costmodel.evaluate import evaluate, min_peak_memory_bytes, peak_memory_bytes
from costmodel.hardware import preset_hardware
from costmodel.table import CostTable
from ir.autodiff import training_step
from ir.core import IRError, Mesh
from ir.interpret import run
from ir.models import build
from ir.nda import analyze
from ir.ops import verify
from ir.remat import layer_segments, rematerialize, select_layers
from solver.plan import Plan
from solver.planning.planner import ALL_LAYERS, plan_spec
from solver.planning.spec import SpecError, parse_spec
from solver.search.cpsat import CpSatOptions, solve
from solver.search.report import NoPlanFits
from solver.search.space import SearchSpace

SIZES = dict(layers=3, d_model=8, heads=4, kv_heads=2, head_dim=2, mlp_hidden=12, vocab=10, seq=6, batch=4)


def step_and_forward_ops(**options):
    forward = build("transformer", **{**SIZES, **options})
    return training_step(forward), len(forward.function.ops)


def random_args(fn, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 10, p.type.shape).astype(np.int32) if p.type.dtype == "i32"
            else (rng.standard_normal(p.type.shape) * 0.3).astype(np.float32) for p in fn.params]


def test_each_layer_is_found_and_only_its_own_ops_are_in_it():
    step, n = step_and_forward_ops()
    segments = layer_segments(step.function, n)
    assert sorted(segments) == [0, 1, 2]
    ops = step.function.ops
    for layer, members in segments.items():
        assert ops[members[-1]].results[0].name == f"layers.{layer}.out"
        assert all(i < n for i in members)
        # the embedding lookup and the causal mask are computed once, outside every layer
        names = {ops[i].results[0].name for i in members}
        assert not names & {"embed", "causal_mask"}
    assert set(segments[1]).isdisjoint(segments[2])


@pytest.mark.parametrize("layers", [[0, 1, 2], [1]])
def test_the_rematerialized_step_computes_exactly_the_same(layers):
    step, n = step_and_forward_ops()
    fn = step.function
    remat = rematerialize(fn, n, layers)
    verify(remat)
    assert (remat.params, remat.results) == (fn.params, fn.results)
    args = random_args(fn)
    for want, got in zip(run(fn, args), run(remat, args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    copies = [i for i, op in enumerate(remat.ops) if op.results[0].name.endswith(".remat")]
    assert copies and min(copies) > n  # recomputed in the backward, after the whole forward
    segments = layer_segments(fn, n)
    made_in = {fn.ops[i].results[0].name: layer for layer, members in segments.items() for i in members}
    assert {made_in[remat.ops[i].results[0].name.removesuffix(".remat")] for i in copies} == set(layers)


def test_remat_trades_flops_for_memory():
    step, n = step_and_forward_ops(seq=32, batch=16)  # activations dominate the tiny weights
    hw = preset_hardware("A100-80GB", [])
    before, after = evaluate(step.function, hw), evaluate(rematerialize(step.function, n, [0, 1, 2]), hw)
    assert after.peak_memory_bytes < 0.75 * before.peak_memory_bytes
    assert before.flops < after.flops < 1.5 * before.flops  # the forward again, not the backward


def test_the_rematerialized_step_lowers_correctly():
    case = _transformer(heads=4, kv_heads=2, head_dim=2, gated_mlp=True)
    forward = case.build()
    step = training_step(forward)
    remat = dataclasses.replace(step, function=rematerialize(step.function, len(forward.function.ops), [0, 1]))
    checked = check_lowering(remat, MESH, plan(bp_picks(case), mp_picks(case), "zero3:batch"))
    assert checked.counts["all_gather"] > check_lowering(step, MESH, plan(bp_picks(case), mp_picks(case),
                                                                          "zero3:batch")).counts["all_gather"]


def test_layers_are_chosen_by_glob_and_a_miss_is_an_error():
    assert select_layers({0: (), 1: (), 10: (), 11: ()}, ["layers.1?"]) == [10, 11]
    with pytest.raises(IRError, match="no layer matches layers.7"):
        select_layers({0: (), 1: ()}, ["layers.7"])
    step, n = step_and_forward_ops()
    with pytest.raises(IRError, match="no layer 5"):
        rematerialize(step.function, n, [5])


SPEC = """
model:
  builder: transformer
  args: {layers: 2, d_model: 8, heads: 2, head_dim: 4, mlp_hidden: 12, vocab: 10, seq: 16, batch: 8}
  step: STEP
devices: 4
mesh: {batch: 2, model: 2}
hardware: A100-80GB
schedules:
  BP:
    tactics:
      - {manual: {axis: batch, values: {batch.tokens: 0}}}
  BP+R:
    extends: BP
    tactics:
      - {remat: {values: [VALUES]}}
"""


def test_a_spec_pins_remat_in_a_schedule():
    spec = parse_spec(SPEC.replace("STEP", "train").replace("VALUES", '"layers.*"'))
    plain, remat = plan_spec(spec, schedule="BP"), plan_spec(spec, schedule="BP+R")
    assert not any(op.results[0].name.endswith(".remat") for op in plain.model.function.ops)
    assert any(op.results[0].name.endswith(".remat") for op in remat.model.function.ops)
    assert remat.assessment.cost.peak_memory_bytes < plain.assessment.cost.peak_memory_bytes
    assert remat.assessment.cost.flops > plain.assessment.cost.flops
    assert peak_memory_bytes(remat.lowered.function) == remat.assessment.cost.peak_memory_bytes


@pytest.mark.parametrize("step, values, message", [
    ("forward", '"layers.*"', "remat recomputes a layer's forward in the backward; it needs model.step: train"),
    ("train", '"layers.9"', "no layer matches layers.9"),
])
def test_bad_remat_is_named(step, values, message):
    spec = parse_spec(SPEC.replace("STEP", step).replace("VALUES", values))
    with pytest.raises(SpecError, match=message):
        plan_spec(spec, schedule="BP+R")


def test_cpsat_on_a_rematerialized_step_is_optimal_and_exact():
    forward = build("transformer", **dict(BIG_TRANSFORMER, layers=2))
    step = training_step(forward)
    model = dataclasses.replace(step, function=rematerialize(step.function, len(forward.function.ops), [0, 1]))
    mesh = Mesh.of(x=4)
    nda = analyze(model.function, model.params)
    table = CostTable(model.function, nda, mesh, hardware_for(mesh))
    space = SearchSpace(nda, Plan(mesh), mesh.names, data_inputs=model.inputs)
    result = solve(space, table, CpSatOptions(time_limit_s=60))
    check_consistent(model, nda, table, result)
    assert result.cost.step_time_s <= brute_force(space, table) * (1 + 1e-12)


FALLBACK = """
model:
  builder: transformer
  args: {layers: 2, d_model: 8, heads: 2, head_dim: 4, mlp_hidden: 16, vocab: 16, seq: 128, batch: 4}
  step: train
devices: 2
mesh: {x: 2}
hardware:
  device: {name: small, peak_flops: {f32: 100TFLOP/s}, memory: MEMORY, memory_bandwidth: 1TB/s}
  links: {x: {bandwidth: 100GB/s, latency: 1us}}
"""


def remat_schedule(memory: str, values: list[str]) -> str:
    """FALLBACK with a schedule that pins the remat (the search then keeps it)."""
    return FALLBACK.replace("MEMORY", memory) + f"schedule:\n  - remat: {{values: {values}}}\n"


def test_the_search_chooses_the_fastest_remat_that_fits_when_memory_binds():
    # Over every plan of the space the smallest peak is 3,015,224 B as written and 1,753,656 B with
    # every layer rematerialized (brute force over the 1,024 points): 2.5 MB fits only rematerialized.
    planned = plan_spec(parse_spec(FALLBACK.replace("MEMORY", "2.5MB")), "cpsat")
    assert planned.assessment.cost.fits and planned.remat
    assert any(op.results[0].name.endswith(".remat") for op in planned.model.function.ops)
    # Each choice searched on its own (the schedule pins it): the kept one is the fastest that fits.
    pinned = {}
    for values in (["layers.*[02468]"], ["layers.*"]):
        alone = plan_spec(parse_spec(remat_schedule("2.5MB", values)), "cpsat")
        assert alone.remat == tuple(values) and alone.remat_tried == ()  # a pinned remat is not searched
        pinned[tuple(values)] = alone.assessment.cost.step_time_s
    assert planned.remat == min(pinned, key=pinned.get)
    # Memory did not shape every other layer's plan (no memory cut), so every layer is not searched:
    # recomputing more only adds compute, and its own best plan is no faster.
    every_other = ("layers.*[02468]",)
    assert not planned.search[-1].memory_cuts and planned.remat == every_other
    assert dict(planned.remat_tried) == {(): None, every_other: pinned[every_other]}
    assert pinned[ALL_LAYERS] >= pinned[every_other]
    # 3.2 MB: the program fits as written. CP-SAT's optimum fits without a memory cut, so it is the
    # best plan whatever the capacity and remat is not tried; the MCTS priced no faster plan that does
    # not fit, so it does not try remat either (its peak is over 80% of the capacity: no matter).
    exact = plan_spec(parse_spec(FALLBACK.replace("MEMORY", "3.2MB")), "cpsat")
    assert exact.search[0].memory_cuts == 0 and exact.remat_tried == ()
    assert exact.assessment.cost.peak_memory_bytes >= 0.8 * exact.assessment.cost.capacity_bytes
    tight = plan_spec(parse_spec(FALLBACK.replace("MEMORY", "3.2MB")), "mcts")
    assert not tight.search[0].memory_shaped and tight.remat_tried == ()
    assert tight.assessment.cost.step_time_s == pytest.approx(exact.assessment.cost.step_time_s)
    # 3.05 MB: a plan of the program as written fits, but faster ones do not: memory shaped it, and
    # both backends go on to rematerialize every other layer, which is faster.
    for solver in ("cpsat", "mcts"):
        shaped = plan_spec(parse_spec(FALLBACK.replace("MEMORY", "3.05MB")), solver)
        tried = dict(shaped.remat_tried)
        assert shaped.remat == ("layers.*[02468]",) and tried[()] > shaped.assessment.cost.step_time_s
    roomy = plan_spec(parse_spec(FALLBACK.replace("MEMORY", "1GB")), "cpsat")
    assert roomy.remat == () and roomy.remat_tried == ()  # memory does not bind: nothing else is tried
    with pytest.raises(NoPlanFits, match="with layers.\\* rematerialized: "):
        plan_spec(parse_spec(FALLBACK.replace("MEMORY", "1MB")), "cpsat")


def test_the_plan_report_lists_the_remat_search(capsys, tmp_path):
    from conftest import shardplan

    path = tmp_path / "tight.yaml"
    path.write_text(FALLBACK.replace("MEMORY", "2.5MB"))
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "mcts", "--json")
    assert code == 0, err
    report = json.loads(out)
    # Memory did not shape every other layer's plan: every layer is not searched (`_choose_remat`).
    assert [t["remat"] for t in report["remat_search"]] == [[], ["layers.*[02468]"]]
    assert report["remat_search"][0]["step_time_s"] is None  # nothing fits as written
    kept = [t for t in report["remat_search"] if t["remat"] == report["remat"]]
    assert kept[0]["step_time_s"] == pytest.approx(report["cost"]["step_time_s"], rel=1e-12)
    code, out, _ = shardplan(capsys, "plan", str(path), "--solver", "mcts")
    assert "remat searched (memory binds): none no plan fits, layers.*[02468] " in out


def test_the_least_peak_bound_is_below_every_plan_and_tight():
    # `min_peak_memory_bytes`: the program's live bytes split evenly over the devices. Brute force over
    # every point of the space, as written and with every layer rematerialized: no plan's peak (the
    # table's, which equals the lowered program's) is below it, and the smallest is within 0.1% of it.
    from solver.planning.planner import prepare

    spec = parse_spec(FALLBACK.replace("MEMORY", "2.5MB"))
    mesh = spec.sharding_mesh()
    for remat in ((), ("layers.*",)):
        prepared = prepare(spec, remat)
        fn = prepared.model.function
        table = CostTable(fn, prepared.nda, mesh, spec.hardware_obj())
        space = SearchSpace(prepared.nda, Plan(mesh), mesh.names, data_inputs=prepared.model.inputs)
        smallest = min(table.peak_bytes(space.codes(p)) for p in space.points())  # `evaluate`'s peak, unpriced
        bound = min_peak_memory_bytes(fn, mesh.num_devices)
        assert bound <= smallest < bound * 1.001
        assert min_peak_memory_bytes(fn, 1) == peak_memory_bytes(fn)  # one device: the program's own peak


@pytest.mark.parametrize("solver", ["cpsat", "mcts"])
def test_a_remat_program_that_cannot_fit_is_not_even_analyzed(monkeypatch, solver):
    # Three layers at 2.5 MB: the bound is 4.30 MB as written, 3.03 MB with every other layer
    # rematerialized and 1.76 MB with every layer. The planner tells the first two from their programs
    # alone, before the analysis and the search; the answer is the one the searches give.
    import solver.planning.planner as planner

    text = FALLBACK.replace("MEMORY", "2.5MB").replace("layers: 2", "layers: 3")
    analyzed = []
    real = planner.analyze
    monkeypatch.setattr(planner, "analyze", lambda fn, *args: analyzed.append(len(fn.ops)) or real(fn, *args))
    skipped = plan_spec(parse_spec(text), solver)
    assert skipped.remat == ("layers.*",) and skipped.assessment.cost.fits
    assert len(analyzed) == 1  # every layer's program alone
    assert dict(skipped.remat_tried)[("layers.*[02468]",)] is None
    monkeypatch.setattr(planner, "unfit", lambda *args: None)
    searched = plan_spec(parse_spec(text), solver)
    assert len(analyzed) == 1 + 3
    assert skipped.remat_tried == searched.remat_tried
    assert skipped.plan == searched.plan and skipped.remat == searched.remat
    assert skipped.assessment.cost.step_time_s == searched.assessment.cost.step_time_s


@pytest.mark.parametrize("solver", ["cpsat", "mcts"])
def test_a_program_that_cannot_fit_is_not_searched_and_nothing_changes(monkeypatch, solver):
    # At 2.5 MB the program as written cannot fit (its bound is 3.01 MB): the remat search skips its
    # search, and answers exactly what it answers when that program is searched to find nothing.
    import solver.planning.planner as planner
    from solver.search import cpsat, mcts

    backend = mcts if solver == "mcts" else cpsat
    calls = []
    real = backend.solve
    monkeypatch.setattr(backend, "solve", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    spec = parse_spec(FALLBACK.replace("MEMORY", "2.5MB"))
    skipped = plan_spec(spec, solver)
    searches = len(calls)
    monkeypatch.setattr(planner, "unfit", lambda *args: None)
    searched = plan_spec(spec, solver)
    # Every other layer (memory did not shape its plan, so not every layer); then the first, too.
    assert (searches, len(calls) - searches) == (1, 2)
    assert skipped.remat_tried == searched.remat_tried and skipped.remat_tried[0] == ((), None)
    assert skipped.plan == searched.plan and skipped.remat == searched.remat
    assert skipped.assessment.cost.step_time_s == searched.assessment.cost.step_time_s
    monkeypatch.undo()
    with pytest.raises(NoPlanFits, match="every plan's peak is at least 2.87 MiB \\(the program's live bytes"):
        plan_spec(parse_spec(FALLBACK.replace("MEMORY", "1MB")), solver)


def test_a_named_schedule_no_plan_of_whose_program_fits_is_not_priced_for_the_floor(monkeypatch):
    # At 2.5 MB no plan of the program as written fits (its bound is 3.01 MB): its named schedule cannot
    # be the floor, so the floor neither analyzes that program nor prices the schedule, and says why;
    # the floor's best and the answer are the ones it gives when it prices it.
    import solver.planning.planner as planner

    text = FALLBACK.replace("MEMORY", "2.5MB") + """schedules:
  DP:
    tactics:
      - {manual: {axis: x, values: {batch.tokens: 0}}}
  DP+R:
    extends: DP
    tactics:
      - remat: {values: ["layers.*"]}
"""
    analyzed = []
    real = planner.analyze
    monkeypatch.setattr(planner, "analyze", lambda fn, *args: analyzed.append(len(fn.ops)) or real(fn, *args))
    skipped = plan_spec(parse_spec(text), "mcts")
    dp, dp_r = skipped.floor.experts
    assert (dp.schedule, dp.step_time_s, dp.fits) == ("DP", None, False)
    assert dp.error.startswith("no plan fits: 2.38 MiB per device")
    assert dp_r.fits and skipped.floor.best is dp_r
    assert len(analyzed) == 2  # the recomputed programs (every other layer, every layer) alone
    monkeypatch.setattr(planner, "unfit", lambda *args: None)
    priced = plan_spec(parse_spec(text), "mcts")
    assert len(analyzed) == 2 + 3  # and the program as written
    dp_priced = priced.floor.experts[0]
    assert dp_priced.step_time_s is not None and not dp_priced.fits and not dp_priced.error
    assert priced.floor.best.schedule == "DP+R" and priced.floor.best.step_time_s == dp_r.step_time_s
    assert priced.plan == skipped.plan and priced.remat == skipped.remat
