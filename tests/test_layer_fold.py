"""A step priced from shallow copies of itself (`ir.layer_fold`,
`solver.planning.shallow`) costs what the whole step costs: the step's
time, peak memory, flops and collectives unpipelined, and every stage's
time and memory terms pipelined or accumulated, under plans with and
without tensor parallelism, remat and ZeRO. Small layers are the hard
case: their logits hold the peak at 3-5 layers and the activations at 12,
so the peak is extended place by place. A plan that shards one layer its
own way is priced whole."""

from __future__ import annotations

import dataclasses

import pytest
from test_pipeline_fold import GPT

from costmodel.evaluate import evaluate
from ir.layer_fold import extend, shallow_steps
from ir.lower import LowerOptions, lower
from ir.sharding import Decision
from solver.planning import pipelining
from solver.planning.pipelining import pipelined_cost
from solver.planning.planner import plan_spec
from solver.planning.shallow import shallow_step_cost
from solver.planning.spec import parse_spec


def _spec(layers, stages=1, k=1, tied=True):
    """test_pipeline_fold's GPT; with one stage, no pipeline axis (gradient accumulation where k > 1)."""
    text = GPT.format(layers=layers, stages=stages, k=k, tied=str(tied).lower(), devices=4 * stages)
    if stages == 1:
        text = text.replace("mesh: {pipeline: 1, batch: 2, model: 2}", "mesh: {batch: 2, model: 2}")
        text = text.replace(f"pipeline: {{microbatches: {k}}}\n", f"microbatches: {k}\n" if k > 1 else "")
        text = text.replace("  links: {pipeline: infiniband}\n", "")
    return parse_spec(text, "gpt.yaml")


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("schedule", ["BP", "BP+MP+R", "ZeRO"])
def test_a_step_from_shallow_copies_costs_the_whole_step(schedule, tied):
    planned = plan_spec(_spec(14, tied=tied), "none", schedule=schedule)
    hardware = planned.spec.hardware_obj()
    sharding = planned.plan.materialize(planned.nda)
    copies = shallow_steps(planned.model, planned.nda, sharding)
    assert copies is not None and [c.kept for c in copies] == [3, 4, 5] and copies[0].layers == (14,)
    whole = evaluate(lower(planned.model.function, planned.nda, sharding, LowerOptions()).function, hardware)
    priced = shallow_step_cost(planned.model, planned.nda, sharding, hardware)
    assert priced is not None
    assert priced.step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    assert priced.peak_memory_bytes == whole.peak_memory_bytes
    assert (priced.flops, priced.kernels, priced.fused_ops) == (whole.flops, whole.kernels, whole.fused_ops)
    assert dict(priced.collective_counts) == dict(whole.collective_counts)
    assert priced.seconds_by_kind == pytest.approx(dict(whole.seconds_by_kind), rel=1e-9)


# One stage (K = 1 and accumulation), two (equal and unequal stages), four and six (a copy folds its
# inner stages to one; 80 over 6: stages of 13 and 14 layers); two of 17 layers (copies of 4, 5 and 6).
@pytest.mark.parametrize("layers, stages, k, schedule", [
    (14, 1, 1, "BP+MP+R"), (14, 1, 4, "BP"), (14, 1, 4, "BP+MP+R"), (26, 2, 4, "BP"), (29, 2, 2, "BP+MP+R"),
    (54, 4, 4, "BP+MP+R"), (80, 6, 2, "BP"), (34, 2, 2, "ZeRO")])
def test_a_pipelined_step_from_shallow_copies_costs_the_whole_pipeline(layers, stages, k, schedule, monkeypatch):
    # Not made whole: the plan's price is the one from the copies, then the test prices the whole pipeline.
    pipelining._PRICED.clear()
    made = []  # what the shallow copies priced: not None, or the price is the whole pipeline's
    real = pipelining._shallow
    monkeypatch.setattr(pipelining, "_shallow", lambda *a: made.append(real(*a)) or made[-1])
    planned = plan_spec(_spec(layers, stages, k), "none", schedule=schedule, whole=False)
    spec, hardware, priced = planned.spec, planned.spec.hardware_obj(), planned.pipeline_cost
    if priced is None:  # one stage, one microbatch: not a pipelined spec, so the plan was lowered, not priced so
        priced = pipelined_cost(spec, planned.model, planned.nda, planned.plan, hardware, shallow=True)
    assert made and made[-1] is priced
    pipelining._PRICED.clear()
    monkeypatch.setattr(pipelining, "_shallow", lambda *a: None)
    whole = pipelined_cost(spec, planned.model, planned.nda, planned.plan, hardware, shallow=True)
    assert priced.step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    assert priced.memory == whole.memory  # every stage: resident, sums, stash, in flight, transient, update
    assert {k: c.peak_memory_bytes for k, c in priced.tasks.items()} == {
        k: c.peak_memory_bytes for k, c in whole.tasks.items()}
    assert dict(priced.collective_counts) == dict(whole.collective_counts)
    assert priced.transfer_s == pytest.approx(whole.transfer_s, rel=1e-12)
    assert priced.task_s == pytest.approx(dict(whole.task_s), rel=1e-9)
    assert priced.fits == whole.fits


def test_stages_of_more_than_fifteen_layers_are_priced_from_copies_of_four_five_and_six():
    # One more inner layer than copies of 3, 4 and 5 keep (`ir.layer_fold`: the first layers a backward
    # passes can differ from the next), and still the whole step's figures.
    planned = plan_spec(_spec(16), "none", schedule="ZeRO")
    hardware = planned.spec.hardware_obj()
    sharding = planned.plan.materialize(planned.nda)
    assert [c.kept for c in shallow_steps(planned.model, planned.nda, sharding)] == [4, 5, 6]
    whole = evaluate(lower(planned.model.function, planned.nda, sharding, LowerOptions()).function, hardware)
    priced = shallow_step_cost(planned.model, planned.nda, sharding, hardware)
    assert priced is not None and priced.step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    assert (priced.peak_memory_bytes, priced.flops) == (whole.peak_memory_bytes, whole.flops)
    assert dict(priced.collective_counts) == dict(whole.collective_counts)


def test_a_layer_sharded_its_own_way_is_priced_whole():
    planned = plan_spec(_spec(13), "none", schedule="BP")
    nda = planned.nda
    fn = planned.model.function
    w_up = next(p for p in fn.params if p.name == "layers.5.mlp.w_up")
    plan = dataclasses.replace(planned.plan, decisions=planned.plan.decisions
                               + (Decision("model", nda.def_color(w_up, 1)),))
    sharding = plan.materialize(nda)
    assert shallow_steps(planned.model, nda, sharding) is None
    even = planned.plan.materialize(nda)
    assert shallow_steps(planned.model, nda, even) is not None
    assert shallow_steps(planned.model, nda, even, counts=(4, 5, 6)) is None  # 13 layers: no fewer lowered than 15


def test_a_figure_is_extended_only_where_it_is_affine():
    assert extend([(3, 10.0), (4, 12.0), (5, 14.0)], 48) == pytest.approx(100.0)
    assert extend([(3, 10.0), (4, 12.0), (5, 15.0)], 48) is None
    assert extend([(3, 7), (4, 7), (5, 7)], 80) == 7
