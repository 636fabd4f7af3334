"""Gradient accumulation: `microbatches: K` on a training step without a
pipeline axis (one stage of `ir.pipeline`), and the microbatch-aware view
of the program the searches plan on (`ir.pipeline.microbatch_nda`), which
keeps every searched plan one the pipeline can run."""

from __future__ import annotations

import pytest
from spmd_check import assert_pipeline_matches

from ir.autodiff import SGD, Adam, training_step
from ir.core import Mesh
from ir.models.mlp import deep_mlp, mlp
from ir.models.transformer import transformer
from ir.nda import analyze
from ir.pipeline import PipelineError, microbatch_nda, pipeline_step
from ir.sharding import Decision
from solver.plan import Plan
from solver.planning.planner import plan_spec
from solver.planning.spec import SpecError, parse_spec, parse_yaml, validate_spec
from solver.search.space import SearchSpace

MESH = Mesh.of(batch=2, model=2)


def _decisions(model, weight: str, dim: int) -> list[Decision]:
    nda = analyze(model.function)
    fn = model.function
    return [Decision("batch", nda.def_color(fn.param(model.inputs[0]), 0)),
            Decision("model", nda.def_color(fn.param(weight), dim))]


@pytest.mark.parametrize("model,weight,dim", [
    (training_step(deep_mlp(layers=3, d_model=8, batch=16), optimizer=SGD()), "layers.0.w", 1),
    (training_step(mlp(batch=16), optimizer=Adam()), "w1", 1),  # no repeated layers at all
    (training_step(transformer(layers=2, batch=8), optimizer=Adam()), "layers.0.attn.wq", 1),
], ids=["deep_mlp", "mlp", "transformer"])
@pytest.mark.parametrize("microbatches", [2, 4])
def test_accumulated_step_equals_the_whole_batch_step(model, weight, dim, microbatches):
    nda = analyze(model.function)
    pipeline = pipeline_step(model, nda, MESH, _decisions(model, weight, dim), stages=1,
                             microbatches=microbatches, schedule="1f1b")
    assert [t.phase for t in pipeline.tasks] == ["forward", "backward", "post"]
    assert not pipeline.transfers
    assert_pipeline_matches(model, pipeline, seed=5)


@pytest.mark.parametrize("stages", [1, 2])
def test_zero_gradients_are_summed_first_then_reduce_scattered_once(stages):
    # ZeRO-3 on the batch axis: each weight and its moments sharded over the devices of a replica
    # group, each gradient reduce_scattered to the weight's shard. Over K microbatches the sum goes
    # first and the reduce_scatter runs once, in the update's task (Megatron's distributed optimizer).
    model = training_step(deep_mlp(layers=4, d_model=8, batch=16), optimizer=Adam())
    nda = analyze(model.function)
    fn = model.function
    decisions = [Decision("batch", nda.def_color(fn.param("x"), 0))]
    decisions += [Decision("batch", nda.def_color(fn.param(f"layers.{i}.w"), 0)) for i in range(4)]
    pipeline = pipeline_step(model, nda, MESH, decisions, stages=stages, microbatches=4, schedule="1f1b")
    assert_pipeline_matches(model, pipeline, seed=5)
    scatters = [(t.phase, op) for t in pipeline.tasks for op in t.function.ops if op.kind == "reduce_scatter"]
    assert len(scatters) == 4 and all(phase == "post" for phase, _ in scatters)
    assert pipeline.collective_counts()["reduce_scatter"] == 4  # once a step, not once per microbatch


def test_the_microbatch_view_splits_the_batch_only_as_far_as_a_microbatch():
    model = training_step(deep_mlp(layers=2, d_model=8, batch=16), optimizer=SGD())
    nda = analyze(model.function)
    view = microbatch_nda(nda, model.inputs, 8)
    batch = nda.def_color(model.function.param(model.inputs[0]), 0)
    assert {view.iclasses[k].size for k in view.color_iclasses[batch]} == {2}
    assert all(v.size == n.size for v, n in zip(view.iclasses, nda.iclasses) if v.color != batch)
    assert microbatch_nda(nda, model.inputs, 1) is nda
    with pytest.raises(PipelineError, match="does not split into 3 microbatches"):
        microbatch_nda(nda, model.inputs, 3)
    # 16 rows in 8 microbatches of 2: the batch splits over one of the two axes, not both.
    plan = Plan(MESH).with_decisions(Decision("batch", batch), Decision("model", batch))
    assert plan.materialize(nda).def_dims(nda, model.function.param("x"))[0] == ("batch", "model")
    assert plan.materialize(view).def_dims(view, model.function.param("x"))[0] == ("batch",)


@pytest.mark.parametrize("stages", [1, 2])
def test_every_plan_of_the_view_pipelines_as_the_search_priced_it(stages):
    # The search's whole space on the view: each point's plan runs with K microbatches, and every
    # stage holds each step input as the view's plan shards it (micro in front of the batch).
    model = training_step(deep_mlp(layers=2, d_model=8, batch=8), optimizer=SGD())
    nda = analyze(model.function)
    mesh = Mesh.of(data=2, model=2)
    view = microbatch_nda(nda, model.inputs, 4)
    space = SearchSpace(view, Plan(mesh), mesh.names, data_inputs=model.inputs)
    changed = 0
    for point in space.points():
        plan = space.plan(point)
        pipeline = pipeline_step(model, nda, mesh, plan.decisions, stages=stages, microbatches=4,
                                 resolutions=dict(plan.resolutions), replicated=plan.replicated)
        searched = plan.materialize(view)
        for p, dims in zip(model.function.params, pipeline.local.param_dims):
            assert tuple(tuple(a for a in axes if a != "micro") for axes in dims) == searched.def_dims(view, p)
        changed += plan.materialize(nda).axes != searched.axes
    assert changed  # some plans split the whole batch further than a microbatch


SPEC = """
model: {{builder: transformer, args: {{layers: 2, d_model: 32, heads: 4, head_dim: 8, mlp_hidden: 64, vocab: 64,
        seq: 16, batch: 8}}}}
mesh: {{data: 4, model: 2}}
hardware: A100-80GB
{extra}
schedules:
  DP+MP:
    tactics:
      - {{manual: {{axis: data, values: {{batch.tokens: 0}}}}}}
      - {{manual: {{axis: model, values: {{"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}}}}
"""


def _spec(extra: str, name: str = "acc"):
    return parse_spec(SPEC.format(extra=extra), f"{name}.yaml")


def test_microbatches_without_a_pipeline_accumulate_gradients():
    whole = plan_spec(_spec(""), schedule="DP+MP")
    acc = plan_spec(_spec("microbatches: 2"), schedule="DP+MP")
    assert whole.pipeline is None
    assert (acc.pipeline.stages, acc.pipeline.microbatches, acc.pipeline.schedule) == (1, 2, "1f1b")
    # One microbatch's activations live instead of the whole batch's; the weights' state is the same.
    assert acc.assessment.cost.peak_memory_bytes < whole.assessment.cost.peak_memory_bytes
    counts = acc.pipeline.collective_counts()
    # Megatron's all_reduces run per microbatch; each gradient's over data once, after the sum.
    assert counts["all_reduce"] > sum(1 for op in whole.lowered.function.ops if op.kind == "all_reduce")


def test_an_answer_with_the_specs_own_microbatches_is_made_whole_without_a_folded_price(monkeypatch):
    # The answer's pipeline is made whole, which prices it; its folded price was asked first only for
    # the count of microbatches, which a spec that sets it does not need (`planner._made_whole`).
    import solver.planning.planner as planner

    priced = plan_spec(_spec("microbatches: 2"), schedule="DP+MP")

    def refuse(*args, **kwargs):
        raise AssertionError("the answer was priced folded before it was made whole")

    monkeypatch.setattr(planner, "pipelined_cost", refuse)
    again = plan_spec(_spec("microbatches: 2"), schedule="DP+MP")
    assert again.pipeline_cost == priced.pipeline_cost and again.plan == priced.plan
    with pytest.raises(AssertionError, match="priced folded"):  # microbatches: auto still needs its price
        plan_spec(_spec("microbatches: auto"), schedule="DP+MP")


def test_a_searched_plan_always_pipelines_with_its_microbatches():
    # 8 sequences in 4 microbatches of 2: a microbatch cannot split over data (4). The search's best
    # plan of the whole batch puts the batch on data, which its own pipeline then refused (issue 34).
    planned = plan_spec(_spec("microbatches: 4"), solver="cpsat", floor=False)
    assert planned.pipeline is not None and planned.pipeline.microbatches == 4
    tokens = planned.model.function.param("batch.tokens")
    assert "data" not in planned.sharding.def_dims(planned.nda, tokens)[0]


def _with_memory(capacity_bytes: int, text: str | None = None):
    """The auto spec (or the spec `text`) on an A100-80GB's figures with `capacity_bytes` of memory."""
    a100 = _spec("").hardware_obj()
    data = parse_yaml(text or SPEC.format(extra="microbatches: auto"), "small.yaml")
    data["hardware"] = {
        "device": {"name": "small", "peak_flops": {k: f"{v}FLOP/s" for k, v in a100.device.peak_flops.items()},
                   "memory": f"{capacity_bytes}B", "memory_bandwidth": f"{a100.device.memory_bandwidth}B/s"},
        "links": {a: {"bandwidth": f"{link.bandwidth}B/s", "latency": f"{link.latency}s"}
                  for a, link in a100.links.items()}}
    return validate_spec(data, "small.yaml")


def test_microbatches_auto_chooses_a_count_that_splits_the_batch():
    planned = plan_spec(_spec("microbatches: auto"), schedule="DP+MP")
    # Everything fits at K = 1, and a microbatched step is never faster: the whole batch at once.
    assert planned.pipeline.microbatches == 1
    whole = planned.assessment.cost.peak_memory_bytes
    halves = plan_spec(_spec("microbatches: 2"), schedule="DP+MP").assessment.cost.peak_memory_bytes
    tight = plan_spec(_with_memory((whole + halves) // 2), schedule="DP+MP")
    # The whole batch no longer fits; two microbatches of the 2 sequences a device holds do.
    assert tight.pipeline.microbatches == 2 and tight.assessment.cost.fits


ACCUMULATED = """
model: {builder: transformer, args: {layers: 2, d_model: 32, heads: 4, head_dim: 8, mlp_hidden: 64, vocab: 64,
        seq: 16, batch: 32}}
mesh: {data: 4, model: 2}
hardware: A100-80GB
microbatches: auto
schedules:
  DP+MP:
    tactics:
      - {manual: {axis: data, values: {batch.tokens: 0}}}
      - {manual: {axis: model, values: {"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}
  DP+Z3:
    tactics:
      - {manual: {axis: data, values: {batch.tokens: 0}}}
      - {manual: {axis: data, values: {"*": first_divisible}}}
  DP+MP+Z2:
    tactics:
      - {manual: {axis: data, values: {batch.tokens: 0}}}
      - {manual: {axis: model, values: {"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}
      - replicate: {axis: data, values: ["layers.*.new", "embed.table.new", "final_norm.scale.new", "unembed.new"]}
      - {manual: {axis: data, values: {"opt.*": first_divisible}}}
"""


@pytest.mark.parametrize("schedule", ["DP+MP", "DP+Z3"])
def test_accumulation_is_never_faster_with_more_microbatches(schedule, monkeypatch):
    # What lets `choose_microbatches` take the fewest microbatches that fit with one stage: every count
    # priced, the step time does not fall as K grows (Megatron's split, and ZeRO-3, whose weights are
    # gathered again for each microbatch). With the memory between two counts' peaks the choice is the
    # exhaustive one, and no count above it is priced.
    import solver.planning.pipelining as pipelining

    spec = parse_spec(ACCUMULATED, "acc.yaml")
    planned = plan_spec(spec, schedule=schedule)
    model, nda, plan, hardware = planned.model, planned.nda, planned.plan, spec.hardware_obj()
    counts = pipelining.microbatch_counts(nda, model, plan, spec)
    assert counts == [1, 2, 4, 8]
    costs = [pipelining.pipelined_cost(spec, model, nda, plan, hardware, microbatches=k) for k in counts]
    times = [c.step_time_s for c in costs]
    assert times == sorted(times) and times[0] < times[-1]
    peaks = [max(c.peak_memory_bytes) for c in costs]
    assert peaks == sorted(peaks, reverse=True) and peaks[2] < peaks[1]
    tight = _with_memory((peaks[1] + peaks[2]) // 2, ACCUMULATED)
    priced = []
    real = pipelining.pipelined_cost
    monkeypatch.setattr(pipelining, "pipelined_cost", lambda *a, microbatches, **kw:
                        priced.append(microbatches) or real(*a, microbatches=microbatches, **kw))
    assert pipelining.choose_microbatches(tight, model, nda, plan, tight.hardware_obj()) == 4
    assert priced == [1, 2, 4]
    assert pipelining.choose_microbatches(spec, model, nda, plan, hardware) == 1


# Weights larger than the activations: a step whose peak the gradients make.
WEIGHTY = ACCUMULATED.replace("d_model: 32, heads: 4, head_dim: 8, mlp_hidden: 64",
                              "d_model: 128, heads: 4, head_dim: 32, mlp_hidden: 512").replace(
    "seq: 16, batch: 32", "seq: 2, batch: 8")


@pytest.mark.parametrize("schedule, text", [pytest.param("DP+MP", ACCUMULATED, id="DP+MP"),
                                            pytest.param("DP+Z3", ACCUMULATED, id="DP+Z3"),
                                            pytest.param("DP+MP+Z2", WEIGHTY, id="DP+MP+Z2-weights")])
def test_one_microbatch_peaks_where_the_whole_step_does(schedule, text):
    # A one-stage step of one microbatch runs the whole step's ops: its priced peak is the whole step's
    # lowered peak. It was above it: every layer's causal mask was made at the backward's start and held
    # until its layer; the backward's stash counted whole after it had freed it; the gradient sums counted
    # during the forward; ZeRO-2's gradients were held whole to the update, their reduce_scatters moved
    # after a sum over one microbatch.
    import solver.planning.pipelining as pipelining
    from costmodel.evaluate import evaluate

    accumulated = parse_spec(text, "acc.yaml")
    whole = plan_spec(parse_spec(text.replace("microbatches: auto", ""), "whole.yaml"), schedule=schedule)
    planned = plan_spec(accumulated, schedule=schedule)
    hardware = accumulated.hardware_obj()
    cost = pipelining.pipelined_cost(accumulated, planned.model, planned.nda, planned.plan, hardware, microbatches=1)
    assert cost.memory[0].accumulated_bytes == 0
    assert cost.peak_memory_bytes == (evaluate(whole.lowered.function, hardware).peak_memory_bytes,)


@pytest.mark.parametrize("microbatches", ["auto", "4"])
def test_the_reranking_of_accumulation_scores_only_plans_that_could_win(microbatches, monkeypatch):
    # Without a pipeline a plan's accumulated step is never faster than the whole batch's step the
    # search priced; the re-ranking skips a plan whose step time alone is no faster than the best score.
    # Every plan scored anyway: the bound holds, and the winner is the same.
    import dataclasses

    from solver.search import cpsat

    everything = []
    real = cpsat._scores

    def scores(found, options, table):
        everything.append((found, real(found, dataclasses.replace(options, score_at_least_step_time=False), table)))
        assert options.score_at_least_step_time
        return real(found, options, table)

    monkeypatch.setattr(cpsat, "_scores", scores)
    spec = parse_spec(ACCUMULATED.replace("microbatches: auto", f"microbatches: {microbatches}"), "acc.yaml")
    (report,) = plan_spec(spec, "cpsat", floor=False).search
    ((found, every),), kept = everything, report.rerank_makespans_s
    assert len(found) == 4 and all(score >= cost.step_time_s for (_, _, cost, *_), score in zip(found, every))
    assert None in kept and "not scored" in report.message
    assert all(k == e for k, e in zip(kept, every) if k is not None)
    best = min(k for k in kept if k is not None)
    assert all(found[i][2].step_time_s >= best for i, k in enumerate(kept) if k is None)
    assert every[report.rerank_winner] == min(every)


@pytest.mark.parametrize("extra,message", [
    ("microbatches: 3", r"acc.yaml: microbatches: the batch of %batch.tokens \(8\) does not split into 3 microbatches"),
    ("microbatches: 0", "acc.yaml: microbatches"),
])
def test_microbatch_errors_name_the_field(extra, message):
    with pytest.raises(SpecError, match=message):
        plan_spec(_spec(extra), schedule="DP+MP")


def test_microbatches_need_a_training_step_and_are_given_once():
    with pytest.raises(SpecError, match="microbatches: .*needs model.step: train"):
        parse_spec(SPEC.format(extra="microbatches: 2").replace("batch: 8}}", "batch: 8}, step: forward}"), "f.yaml")
    with pytest.raises(SpecError, match="given twice"):
        parse_spec(SPEC.format(extra="microbatches: 2\npipeline: {microbatches: 2}").replace(
            "{data: 4, model: 2}", "{pipeline: 2, data: 2, model: 2}"), "p.yaml")


def test_plans_that_shard_alike_are_priced_once(monkeypatch):
    # Plans may differ only in decisions that split nothing more; the re-ranking, the floor and the
    # choice of K then price the same step. It is lowered once per microbatch sharding
    # and count, and the price is the one priced afresh.
    import solver.planning.pipelining as pipelining

    spec = _spec("microbatches: auto")
    planned = plan_spec(spec, schedule="DP+MP")
    model, nda, plan, hardware = planned.model, planned.nda, planned.plan, spec.hardware_obj()
    alike = plan.with_decisions(plan.decisions[0])  # taken already: the same sharding
    assert alike != plan and alike.materialize(nda) == plan.materialize(nda)
    lowered = []
    real = pipelining.pipeline_step
    monkeypatch.setattr(pipelining, "pipeline_step", lambda *a, **kw: lowered.append(kw["microbatches"])
                        or real(*a, **kw))
    monkeypatch.setattr(pipelining, "_PRICED", {})
    once = pipelining.pipelined_cost(spec, model, nda, plan, hardware, microbatches=2)
    again = pipelining.pipelined_cost(spec, model, nda, alike, spec.hardware_obj(), microbatches=2)
    other = pipelining.pipelined_cost(spec, model, nda, alike, hardware, microbatches=4)
    assert again is once and lowered == [2, 4]
    monkeypatch.setattr(pipelining, "_PRICED", {})
    assert pipelining.pipelined_cost(spec, model, nda, alike, hardware, microbatches=2) == once
    assert pipelining.pipelined_cost(spec, model, nda, plan, hardware, microbatches=4) == other != once


@pytest.mark.parametrize("microbatches", [1, 2, 4])
def test_the_microbatch_sharding_is_the_plans_on_the_microbatch_view(microbatches):
    # `microbatch_sharding` skips materializing the plan on `microbatch_nda` where `micro` took every
    # batch I-class: the rest must then be exactly that materialization. Random plans, some of which
    # the rules cut short (an axis taken already, a size that does not divide).
    import random

    from ir.pipeline import MICRO, microbatch_sharding
    from ir.sharding import materialize

    model = training_step(transformer(layers=2, batch=8), optimizer=Adam())
    nda = analyze(model.function)
    mesh = Mesh.of(data=2, model=2, seq=2)
    rng = random.Random(microbatches)
    checked = 0
    for _ in range(40):
        decisions = [Decision(rng.choice(mesh.names), rng.randrange(nda.num_colors))
                     for _ in range(rng.randint(1, 6))]
        try:
            sharding = microbatch_sharding(model, nda, mesh, decisions, microbatches)
        except PipelineError:
            continue
        view = materialize(microbatch_nda(nda, model.inputs, microbatches), mesh, decisions)
        assert tuple(tuple(a for a in axes if a != MICRO) for axes in sharding.axes) == view.axes
        checked += all(sharding.axes[k][:1] == (MICRO,) for k in nda.color_iclasses[_batch_color(nda, model)])
    assert checked >= 30  # plans whose view the shortcut stood for


def _batch_color(nda, model) -> int:
    """The batch color (`ir.pipeline.microbatch_decision`'s)."""
    from ir.pipeline import microbatch_decision

    return microbatch_decision(nda, model.inputs).color


def test_the_reranking_prices_the_plans_after_the_first_at_its_count(monkeypatch):
    # Under `microbatches: auto` the first plan the re-ranking scores (the optimum) chooses its count;
    # a later plan that can run that count is priced at it, one that cannot chooses its own.
    import solver.planning.pipelining as pipelining
    from solver.planning import planner

    whole = plan_spec(_spec("microbatches: auto"), schedule="DP+MP").assessment.cost.peak_memory_bytes
    halves = plan_spec(_spec("microbatches: 2"), schedule="DP+MP").assessment.cost.peak_memory_bytes
    spec = _with_memory((whole + halves) // 2)
    first = plan_spec(spec, schedule="DP+MP")
    assert first.pipeline.microbatches == 2
    programs = planner._Programs(spec, None)
    nda, model = programs(()).nda, programs(()).model
    batch = nda.def_color(model.function.param("batch.tokens"), 0)
    on_data = Plan(first.plan.mesh, tuple(d for d in first.plan.decisions if d.axis == "data"))  # no Megatron
    assert on_data.materialize(nda) != first.plan.materialize(nda)
    everywhere = first.plan.with_decisions(Decision("model", batch))  # 1 sequence a device: only K = 1
    chose = []
    real = pipelining.choose_microbatches
    monkeypatch.setattr(pipelining, "choose_microbatches", lambda *a, **kw: chose.append(a[3]) or real(*a, **kw))
    score = planner._reranking_score(spec, programs, (), None)
    assert score(first.plan, None) == pytest.approx(first.assessment.cost.step_time_s, rel=1e-12)
    assert len(chose) == 1
    hardware = spec.hardware_obj()
    at_two = pipelining.pipelined_cost(spec, model, nda, on_data, hardware, microbatches=2)
    assert score(on_data, None) == (at_two.step_time_s if at_two.fits else float("inf"))
    assert len(chose) == 1  # priced at the optimum's count: no count chosen
    own = score(everywhere, None)
    assert len(chose) == 2 and chose[-1] is everywhere
    assert own == pipelining.pipelined_step_s(lambda: programs.priced((), everywhere, None))
