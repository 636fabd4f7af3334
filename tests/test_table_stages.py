"""The cost table's stage-by-stage lower bound of a pipelined step
(`costmodel.table_stages`): each stage's terms are at most what its tasks
take in the priced pipeline, they add up to the whole step on one stage,
and the bound is at most every simulated schedule's step (exactly it for
equal stages under 1F1B)."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.pipeline import simulate_schedule
from costmodel.table import CostTable
from costmodel.table_stages import pipeline_lower_bound, stage_seconds
from ir.pipeline import value_stages
from solver.planning.pipelining import pipelined_cost
from solver.planning.planner import plan_spec
from solver.planning.spec import parse_spec

GPT = """
model:
  builder: transformer
  args: {{layers: 5, d_model: 64, heads: 4, head_dim: 16, mlp_hidden: 256, vocab: 512, seq: 32, batch: 16,
          norm: layer, tied_embeddings: true}}
  step: train
mesh: {{{pipeline}batch: 2, model: 2}}
microbatches: 4
hardware: A100-80GB
schedules:
  Megatron:
    tactics:
      - {{manual: {{axis: batch, values: {{batch.tokens: 0}}}}}}
      - manual: {{axis: model, values: {{"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}}
  ZeRO:
    tactics:
      - {{manual: {{axis: batch, values: {{batch.tokens: 0}}}}}}
      - manual: {{axis: model, values: {{"layers.*.mlp.w_up": 0, "layers.*.mlp.w_down": 1}}}}
"""


def _sums(stages: int, schedule: str):
    text = GPT.format(pipeline=f"pipeline: {stages}, " if stages > 1 else "")
    planned = plan_spec(parse_spec(text, "gpt.yaml"), "none", schedule=schedule)
    model, nda, spec = planned.model, planned.nda, planned.spec
    table = CostTable(model.function, nda, spec.sharding_mesh(), spec.hardware_obj())
    timed = table.timed(planned.sharding)
    stage_of = value_stages(model.function, model.forward_ops, dict(model.origins), stages)
    value_stage = np.array([stage_of[v.name] for v in table.values], dtype=np.int64)
    over_batch, _ = table.batch_ops(model.inputs)
    return planned, timed, stage_seconds(table, timed, value_stage, model.forward_ops, over_batch)


@pytest.mark.parametrize("schedule", ["Megatron", "ZeRO"])
def test_on_one_stage_the_terms_are_the_whole_step(schedule):
    _, timed, (total, forward, backward) = _sums(1, schedule)
    assert total[0] == pytest.approx(timed.step_time_s, rel=1e-9)  # no term left out
    assert forward[0] > 0 and backward[0] > 0 and forward[0] + backward[0] < total[0]  # the update runs once


@pytest.mark.parametrize("schedule", ["Megatron", "ZeRO"])
def test_each_stages_terms_are_at_most_its_tasks_in_the_priced_pipeline(schedule):
    """5 layers over 2 stages: 3 and 2, and the head on the last."""
    planned, timed, (total, forward, backward) = _sums(2, schedule)
    spec = planned.spec
    k = spec.microbatch_count
    cost = pipelined_cost(spec, planned.model, planned.nda, planned.plan, spec.hardware_obj())
    assert total.sum() <= timed.step_time_s * (1 + 1e-12)  # the boundary's terms left out
    for s in range(2):
        f, b = cost.tasks[(s, "forward")].step_time_s, cost.tasks[(s, "backward")].step_time_s
        post = cost.tasks[(s, "post")].step_time_s if (s, "post") in cost.tasks else 0.0
        assert forward[s] <= k * f and backward[s] <= k * b
        assert total[s] <= k * (f + b) + post
    assert total[0] > total[1]  # three layers against two and the head
    bound = pipeline_lower_bound(total, forward, backward, k)
    assert max(total) <= bound <= cost.step_time_s
    assert bound > timed.step_time_s / 2  # the busiest stage outweighs the average one


def _tasks(rng, stages):
    return {(s, phase): float(rng.uniform(0.5, 2.0)) for s in range(stages) for phase in ("forward", "backward")} \
        | {(s, "post"): float(rng.uniform(0.0, 1.0)) for s in range(stages)}


@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_the_bound_is_at_most_the_simulated_schedule(schedule, chunks):
    rng = np.random.default_rng(0)
    for stages, k in ((4, 4), (4, 8), (6, 12), (8, 8)):
        for _ in range(5):
            task_s = _tasks(rng, stages)
            f = np.array([task_s[(s, "forward")] for s in range(stages)])
            b = np.array([task_s[(s, "backward")] for s in range(stages)])
            post = np.array([task_s[(s, "post")] for s in range(stages)])
            bound = pipeline_lower_bound(k * (f + b) + post, k * f, k * b, k, chunks)
            makespan = simulate_schedule(stages, k, schedule, task_s, chunks=chunks).makespan_s
            assert bound <= makespan * (1 + 1e-12)


def test_on_equal_stages_the_bound_is_1f1bs_step():
    """P equal stages, K microbatches of forward f and backward b: 1F1B
    takes (K + P - 1)(f + b), and so does the bound: the first microbatch's
    forward reaching the last stage, its K microbatches, the last
    microbatch's backward returning."""
    stages, k, f, b = 4, 8, 1.0, 2.0
    task_s = {(s, phase): t for s in range(stages) for phase, t in (("forward", f), ("backward", b))}
    makespan = simulate_schedule(stages, k, "1f1b", task_s).makespan_s
    ones = np.ones(stages)
    assert makespan == pytest.approx((k + stages - 1) * (f + b))
    assert pipeline_lower_bound(k * (f + b) * ones, k * f * ones, k * b * ones, k) == pytest.approx(makespan)


def test_a_values_stage_is_its_layers_stage():
    """The screen finds each value's stage on P stages from its stage with a
    stage a layer (`mesh_screen._value_layers`, made once a program): the
    same as `value_stages` on P stages, for every P."""
    from solver.planning.mesh_screen import _value_layers

    planned, _, _ = _sums(1, "Megatron")
    model = planned.model
    table = CostTable(model.function, planned.nda, planned.spec.sharding_mesh(), planned.spec.hardware_obj())
    layers, value_layer = _value_layers(table, model)
    assert layers == 5
    for stages in range(1, layers + 1):
        stage_of = value_stages(model.function, model.forward_ops, dict(model.origins), stages)
        assert (value_layer * stages // layers).tolist() == [stage_of[v.name] for v in table.values]


def test_a_mesh_of_more_stages_than_layers_has_no_bound():
    """Its screen prices it (at once: it cannot run) and says why, rather
    than leaving it unpriced behind a bound of a step that does not exist."""
    from solver.planning import mesh_screen
    from solver.planning.planner import prepare

    text = GPT.format(pipeline="pipeline: 8, ").replace("microbatches: 4", "microbatches: 8")
    spec = parse_spec(text, "gpt.yaml")
    built = {}
    plans = mesh_screen._plans(spec, built, prepare, None, True)
    assert [p[2] is not None for p in plans] == [True, True]
    assert mesh_screen.screen_bound(spec, built, plans) == 0.0
    screened = mesh_screen._priced(spec, built, plans, None)
    assert screened.step_time_s is None and "8 pipeline stages need at least 8 layers" in screened.source
