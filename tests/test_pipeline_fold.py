"""A pipeline priced from its distinct stages (`ir.pipeline_fold`) costs
exactly what the whole pipeline costs: step time, every stage's memory, the
collectives and the transfers, whether its inner stages are all alike (a
uniform pipeline: three stages) or come in two sizes (layers that the
stages do not divide); a pipeline whose inner stages all differ is not
folded."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from costmodel.pipeline import pipeline_cost
from ir.lower import LoweringError, lower_ops
from ir.pipeline import pipeline_step
from ir.pipeline_fold import fold_pipeline
from solver.plan import Plan
from solver.planning.pipelining import pipelined, pipelined_cost
from solver.planning.planner import plan_spec
from solver.planning.spec import parse_spec

GPT = """
model:
  builder: transformer
  args: {{layers: {layers}, d_model: 64, heads: 4, head_dim: 16, mlp_hidden: 256, vocab: 512, seq: 32, batch: 16,
          norm: layer, tied_embeddings: {tied}}}
  step: train
devices: {devices}
mesh: {{pipeline: {stages}, batch: 2, model: 2}}
pipeline: {{microbatches: {k}}}
hardware:
  preset: A100-80GB
  links: {{pipeline: infiniband}}
schedules:
  BP:
    tactics:
      - {{manual: {{axis: batch, values: {{batch.tokens: 0}}}}}}
  BP+MP+R:
    tactics:
      - {{manual: {{axis: batch, values: {{batch.tokens: 0}}}}}}
      - manual: {{axis: model, values: {{"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}}
      - remat: {{values: ["layers.*"]}}
  ZeRO:
    tactics:
      - {{manual: {{axis: batch, values: {{batch.tokens: 0}}}}}}
      - manual: {{axis: model, values: {{"layers.*.mlp.w_up": 0, "layers.*.mlp.w_down": 1}}}}
"""


def _spec(layers=8, stages=4, k=4, tied=True):
    return parse_spec(GPT.format(layers=layers, stages=stages, k=k, tied=str(tied).lower(), devices=4 * stages),
                      "gpt.yaml")


def _both(planned, schedule):
    spec, plan = planned.spec, planned.plan
    args = dict(stages=spec.stages, microbatches=spec.microbatch_count, schedule=schedule,
                resolutions=dict(plan.resolutions), replicated=plan.replicated)
    whole = pipeline_step(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    folded = fold_pipeline(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    return whole, folded


@pytest.mark.parametrize("layers, stages, k, tied", [(8, 4, 4, True), (8, 8, 2, True), (12, 6, 8, False)])
@pytest.mark.parametrize("schedule_name", ["BP", "BP+MP+R", "ZeRO"])
def test_folded_price_is_the_whole_pipelines(layers, stages, k, tied, schedule_name):
    planned = plan_spec(_spec(layers, stages, k, tied), "none", schedule=schedule_name)
    hardware = planned.spec.hardware_obj()
    for schedule in ("gpipe", "1f1b"):
        whole, folded = _both(planned, schedule)
        assert folded is not None and folded.pipeline.stages == 3
        assert folded.stage_map == (0,) + (1,) * (stages - 2) + (2,)
        exact, priced = pipeline_cost(whole, hardware), pipeline_cost(folded.pipeline, hardware, folded.stage_map)
        assert priced.step_time_s == pytest.approx(exact.step_time_s, rel=1e-12)
        assert priced.bubble_fraction == pytest.approx(exact.bubble_fraction, rel=1e-12)
        assert priced.transfer_s == pytest.approx(exact.transfer_s, rel=1e-12)
        assert priced.memory == exact.memory  # every stage: resident, sums, stash, in flight, transient, update
        assert dict(priced.collective_counts) == dict(exact.collective_counts)
        assert priced.task_s == pytest.approx(exact.task_s, rel=1e-12)
        assert priced.schedule.in_flight == exact.schedule.in_flight
        # Three stages lowered instead of P: fewer ops, the more so the deeper the pipeline.
        assert len(folded.pipeline.local.function.ops) < len(whole.local.function.ops)


def _same_price(folded, whole, hardware, chunks=1):
    exact = pipeline_cost(whole, hardware)
    pipeline = folded.pipeline if chunks == 1 else dataclasses.replace(folded.pipeline, schedule="interleaved")
    priced = pipeline_cost(pipeline, hardware, folded.stage_map, chunks)
    assert priced.step_time_s == pytest.approx(exact.step_time_s, rel=1e-12)
    assert priced.bubble_fraction == pytest.approx(exact.bubble_fraction, rel=1e-12)
    assert priced.transfer_s == pytest.approx(exact.transfer_s, rel=1e-12)
    assert priced.memory == exact.memory
    assert dict(priced.collective_counts) == dict(exact.collective_counts)
    assert priced.schedule.in_flight == exact.schedule.in_flight


# (layers, stages, a schedule): the stages' layer counts (`ir.pipeline.layer_stages`) and the stages kept.
UNEVEN = [
    (14, 8, "BP+MP+R", (2, 2, 2, 1, 2, 2, 2, 1), (0, 1, 3, 4, 7)),  # stage 3's backward reads from 4: kept
    (13, 7, "BP", (2, 2, 2, 2, 2, 2, 1), (0, 1, 6)),  # the inner stages alike: three, as a uniform pipeline
    (11, 6, "ZeRO", (2, 2, 2, 2, 2, 1), (0, 1, 5)),
    (18, 8, "BP", (3, 2, 2, 2, 3, 2, 2, 2), (0, 1, 4, 5, 7)),
]


@pytest.mark.parametrize("layers, stages, schedule_name, sizes, kept", UNEVEN)
def test_stages_of_two_sizes_fold_to_one_of_each(layers, stages, schedule_name, sizes, kept):
    from ir.pipeline import layer_stages

    assert tuple(Counter(layer_stages(range(layers), stages).values()).values()) == sizes
    planned = plan_spec(_spec(layers, stages, 4), "none", schedule=schedule_name)
    hardware = planned.spec.hardware_obj()
    for schedule in ("gpipe", "1f1b"):
        whole, folded = _both(planned, schedule)
        assert folded is not None and folded.pipeline.stages == len(kept)
        assert sorted(set(folded.stage_map)) == list(range(len(kept)))
        assert [folded.stage_map[s] for s in kept] == list(range(len(kept)))  # a kept stage runs as itself
        _same_price(folded, whole, hardware)


def test_stages_that_all_need_keeping_are_not_folded():
    # 12 layers over 5 stages: 3, 2, 3, 2, 2. Stage 2 (the only one of 3 layers inside) reads its backward
    # from stage 3, which only stage 3 itself makes before it: every stage is kept, so none is left out.
    planned = plan_spec(_spec(12, 5, 4), "none", schedule="BP")
    assert _both(planned, "1f1b")[1] is None


def test_interleaved_stages_of_two_sizes_fold():
    # 18 layers as 4 devices x 2 chunks: stages of 3 and 2 layers.
    planned = plan_spec(_spec(18, 4, 4), "none", schedule="BP+MP+R")
    hardware, plan = planned.spec.hardware_obj(), planned.plan
    args = dict(stages=8, microbatches=4, schedule="interleaved", resolutions=dict(plan.resolutions),
                replicated=plan.replicated, chunks=2)
    whole = pipeline_step(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    folded = fold_pipeline(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    assert folded is not None and folded.pipeline.stages < 8
    _same_price(folded, whole, hardware, chunks=2)


@pytest.mark.parametrize("layers, devices, chunks, k, tied", [(16, 4, 2, 4, True), (16, 4, 2, 8, False),
                                                              (12, 4, 3, 4, True)])
@pytest.mark.parametrize("schedule_name", ["BP", "BP+MP+R", "ZeRO"])
def test_folded_interleaved_price_is_the_whole_pipelines(layers, devices, chunks, k, tied, schedule_name):
    planned = plan_spec(_spec(layers, devices, k, tied), "none", schedule=schedule_name)
    hardware, plan = planned.spec.hardware_obj(), planned.plan
    args = dict(stages=devices * chunks, microbatches=k, schedule="interleaved", resolutions=dict(plan.resolutions),
                replicated=plan.replicated, chunks=chunks)
    whole = pipeline_step(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    folded = fold_pipeline(planned.model, planned.nda, plan.mesh, plan.decisions, **args)
    assert folded is not None and folded.chunks == chunks and len(folded.stage_map) == devices * chunks
    exact = pipeline_cost(whole, hardware)
    priced = pipeline_cost(dataclasses.replace(folded.pipeline, schedule="interleaved"), hardware, folded.stage_map,
                           folded.chunks)
    assert priced.step_time_s == pytest.approx(exact.step_time_s, rel=1e-12)
    assert priced.transfer_s == pytest.approx(exact.transfer_s, rel=1e-12)
    assert priced.memory == exact.memory  # every device: its chunks' inputs, sums, the stash its order holds
    assert dict(priced.collective_counts) == dict(exact.collective_counts)
    assert priced.schedule.in_flight == exact.schedule.in_flight


def test_interleaved_on_two_devices_is_not_folded():
    planned = plan_spec(_spec(8, 2, 4), "none", schedule="BP")
    plan = planned.plan
    assert fold_pipeline(planned.model, planned.nda, plan.mesh, plan.decisions, stages=4, microbatches=4,
                         schedule="interleaved", chunks=2) is None


def test_pipelined_cost_is_pipelined_s_cost():
    planned = plan_spec(_spec(), "none", schedule="BP+MP+R")
    spec, hardware = planned.spec, planned.spec.hardware_obj()
    exact = pipelined(spec, planned.model, planned.nda, planned.plan, hardware)[1]
    priced = pipelined_cost(spec, planned.model, planned.nda, planned.plan, hardware)
    assert priced.step_time_s == pytest.approx(exact.step_time_s, rel=1e-12)
    assert priced.peak_memory_bytes == exact.peak_memory_bytes


def test_three_stages_or_fewer_are_not_folded():
    planned = plan_spec(_spec(layers=6, stages=3), "none", schedule="BP")
    assert _both(planned, "gpipe")[1] is None


def test_inner_stages_sharded_differently_are_not_folded():
    # One inner layer's MLP sharded on model, the others' not: stage 2 differs from stage 1.
    planned = plan_spec(_spec(), "none", schedule="BP")
    nda, model = planned.nda, planned.model
    w_up = model.function.param("layers.4.mlp.w_up")
    color = nda.def_color(w_up, 1)
    assert color != nda.def_color(model.function.param("layers.2.mlp.w_up"), 1)  # per-layer colors
    plan = Plan(planned.plan.mesh, planned.plan.decisions + (planned.plan.decisions[0].__class__("model", color),),
                planned.plan.resolutions, planned.plan.replicated)
    args = dict(stages=4, microbatches=4, resolutions=dict(plan.resolutions), replicated=plan.replicated)
    assert fold_pipeline(model, nda, plan.mesh, plan.decisions, **args) is None
    # and pricing it falls back to the whole pipeline
    spec, hardware = planned.spec, planned.spec.hardware_obj()
    exact = pipeline_cost(pipeline_step(model, nda, plan.mesh, plan.decisions, schedule="gpipe", **args), hardware)
    assert pipelined_cost(spec, model, nda, plan, hardware).step_time_s == pytest.approx(exact.step_time_s)


def test_lower_ops_needs_a_stand_in_for_what_it_leaves_out():
    planned = plan_spec(_spec(), "none", schedule="BP")
    fn = planned.model.function
    with pytest.raises(LoweringError, match="made by an op left out and has no stand-in"):
        lower_ops(fn, planned.nda, planned.sharding, [len(fn.ops) - 1], {})


def test_auto_microbatches_price_only_counts_their_bound_leaves_in(monkeypatch):
    # The count chosen is the exhaustive choice's; counts whose bound ((K + P - 1) / K times the least
    # compute) exceeds the best step found are not priced.
    import solver.planning.pipelining as pipelining

    text = GPT.format(layers=8, stages=8, k=2, tied="true", devices=32).replace(
        "pipeline: {microbatches: 2}", "microbatches: auto").replace(  # compute-bound shapes: the bound bites
        "d_model: 64, heads: 4, head_dim: 16, mlp_hidden: 256, vocab: 512, seq: 32, batch: 16",
        "d_model: 8192, heads: 64, head_dim: 128, mlp_hidden: 32768, vocab: 512, seq: 128, batch: 64, dtype: bf16")
    spec = parse_spec(text, "gpt.yaml")
    planned = plan_spec(spec, "none", schedule="BP+MP+R")
    hardware, counts = spec.hardware_obj(), pipelining.microbatch_counts(planned.nda, planned.model, planned.plan)
    costs = {k: pipelined_cost(spec, planned.model, planned.nda, planned.plan, hardware, microbatches=k)
             for k in counts}
    exhaustive = min(counts, key=lambda k: (not costs[k].fits, costs[k].step_time_s, k))
    priced = []
    real = pipelining.pipelined_cost
    monkeypatch.setattr(pipelining, "pipelined_cost", lambda *a, microbatches, **kw:
                        priced.append(microbatches) or real(*a, microbatches=microbatches, **kw))
    assert pipelining.choose_microbatches(spec, planned.model, planned.nda, planned.plan, hardware) == exhaustive
    assert set(priced) < set(counts) and exhaustive in priced
