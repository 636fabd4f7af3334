"""Pipeline parallelism (`ir.pipeline`, `costmodel.pipeline`): the pipelined
step, executed stage by stage on the simulated mesh with its transfers and
its sums over microbatches, computes what the unpartitioned step computes;
the simulated schedule's idle share is GPipe's bubble formula; stages,
transfers and memory follow the rules the modules state."""

from __future__ import annotations

import dataclasses

import pytest
from spmd_check import assert_pipeline_matches

from costmodel.evaluate import evaluate
from costmodel.hardware import preset_hardware
from costmodel.pipeline import live_peak_bytes, pipeline_cost, simulate_schedule, unnamed
from ir.autodiff import SGD, Adam, training_step
from ir.builder import Builder
from ir.core import Mesh
from ir.interpret import InterpretError, random_inputs
from ir.models.mlp import deep_mlp
from ir.models.transformer import transformer
from ir.nda import analyze
from ir.pipeline import PIPELINE, PipelineError, bubble_fraction, pipeline_step, value_stages
from ir.pipeline_run import run_order, run_pipeline, stage_sequences
from ir.remat import rematerialize
from ir.sharding import Decision

SUB = Mesh.of(batch=2, model=2)


def _mlp(layers: int = 4, optimizer=None):
    return training_step(deep_mlp(layers=layers, d_model=8, batch=16), optimizer=optimizer or SGD())


def _dp_hp(model, first_weight: str) -> list[Decision]:
    """Data parallel on `batch`, Megatron (column, then row) on `model`."""
    nda = analyze(model.function)
    fn = model.function
    return [Decision("batch", nda.def_color(fn.param(model.inputs[0]), 0)),
            Decision("model", nda.def_color(fn.param(first_weight), 1))]


def _pipelined(model, first_weight: str, stages: int, microbatches: int, schedule: str = "gpipe"):
    nda = analyze(model.function)
    return pipeline_step(model, nda, SUB, _dp_hp(model, first_weight), stages=stages,
                         microbatches=microbatches, schedule=schedule)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("microbatches", [1, 2, 4])
@pytest.mark.parametrize("stages", [2, 4])
def test_pipelined_deep_mlp_equals_the_reference(stages, microbatches, schedule):
    model = _mlp()
    assert_pipeline_matches(model, _pipelined(model, "layers.0.w", stages, microbatches, schedule))


@pytest.mark.parametrize("stages,microbatches,tied", [(2, 1, False), (2, 4, True), (4, 2, False), (4, 4, True)])
def test_pipelined_transformer_with_adam_equals_the_reference(stages, microbatches, tied):
    # Adam's update reads the gradient summed over every microbatch; tied
    # embeddings send the head's gradient contribution back to stage 0.
    model = training_step(transformer(layers=4, batch=8, tied_embeddings=tied), optimizer=Adam())
    pipeline = _pipelined(model, "layers.0.attn.wq", stages, microbatches, "1f1b")
    assert_pipeline_matches(model, pipeline)
    if tied:
        assert any(t.src == stages - 1 and t.dst == 0 and t.phase == "backward" for t in pipeline.transfers)


def test_each_stage_makes_its_own_adam_corrections_from_the_step_count():
    # The step computes the bias corrections once (as optax does) and every parameter's update reads
    # them; cut into stages, each stage's update makes its own from `opt.step`, which every device
    # holds, rather than receiving them from the stage that read them first.
    model = training_step(transformer(layers=4, batch=8), optimizer=Adam())
    assert sum(op.kind == "exp" and not op.results[0].type.shape for op in model.function.ops) == 2
    pipeline = _pipelined(model, "layers.0.attn.wq", 4, 2)
    assert pipeline.collective_counts()["collective_permute"] == 2 * 3 * 2
    assert all(t.per_microbatch for t in pipeline.transfers)
    for stage in range(4):
        post = pipeline.task(stage, "post").function
        assert [op.kind for op in post.ops].count("exp") == 2
        assert "opt.step" in {p.name for p in post.params}


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 4])
def test_transfers_are_one_activation_and_one_cotangent_per_boundary_and_microbatch(stages, microbatches):
    pipeline = _pipelined(_mlp(8), "layers.0.w", stages, microbatches)
    assert pipeline.collective_counts()["collective_permute"] == 2 * (stages - 1) * microbatches
    forward = sorted((t.src, t.dst) for t in pipeline.transfers if t.phase == "forward")
    backward = sorted((t.src, t.dst) for t in pipeline.transfers if t.phase == "backward")
    assert forward == [(s, s + 1) for s in range(stages - 1)]
    assert backward == [(s + 1, s) for s in range(stages - 1)]
    assert all(t.per_microbatch for t in pipeline.transfers)


def test_the_sums_are_the_gradients_and_the_loss():
    pipeline = _pipelined(_mlp(4), "layers.0.w", 2, 4)
    # One sum per weight gradient and the loss; every other collective runs on the stage's own axes.
    assert len(pipeline.sums) == 5
    for task in pipeline.tasks:
        assert task.function.mesh == SUB
        for op in task.function.ops:
            assert "micro" not in op.attrs.get("axes", ())


def test_stages_split_the_layers_and_follow_them_into_the_backward():
    model = _mlp(8)
    fn = model.function
    stage = value_stages(fn, model.forward_ops, dict(model.origins), 4)
    assert [stage[f"layers.{i}.w"] for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [stage[f"layers.{i}.w.new"] for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert stage["loss"] == 3
    # SGD: w.new = w - mul(g, lr); layer 5's gradient g (x^T dy) is computed on layer 5's stage.
    made = {op.result.name: op for op in fn.ops}
    step = made[made["layers.5.w.new"].operands[1].name]
    assert step.kind == "mul" and stage[step.operands[0].name] == 2
    with pytest.raises(PipelineError, match="at least 9 layers"):
        value_stages(fn, model.forward_ops, dict(model.origins), 9)


def test_pipelining_errors_name_the_cause():
    model = _mlp(4)
    nda = analyze(model.function)
    with pytest.raises(PipelineError, match="does not split into 3 microbatches"):
        pipeline_step(model, nda, SUB, _dp_hp(model, "layers.0.w"), stages=2, microbatches=3)
    # 16 rows split 16 ways leave none for the plan's batch axis: a microbatch's plan keeps its row whole.
    single = pipeline_step(model, nda, SUB, _dp_hp(model, "layers.0.w"), stages=2, microbatches=16)
    assert single.local.param_dims[0][0] == ("micro",)
    pipeline_step(model, nda, SUB, _dp_hp(model, "layers.0.w"), stages=2, microbatches=8)  # 16 = 8 x 2
    forward = deep_mlp(layers=4, d_model=8, batch=16)
    with pytest.raises(PipelineError, match="not a training step"):
        pipeline_step(forward, analyze(forward.function), SUB, [], stages=2, microbatches=2)
    with pytest.raises(PipelineError, match="unknown pipeline schedule"):
        pipeline_step(model, nda, SUB, [], stages=2, microbatches=2, schedule="zigzag")


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 4, 8, 16])
def test_simulated_idle_share_is_the_bubble_formula(stages, microbatches, schedule):
    f, b = 1.0, 2.0
    task_s = {(s, phase): t for s in range(stages) for phase, t in (("forward", f), ("backward", b))}
    times = simulate_schedule(stages, microbatches, schedule, task_s)
    assert times.makespan_s == pytest.approx((microbatches + stages - 1) * (f + b))
    assert times.idle_fraction == pytest.approx(bubble_fraction(stages, microbatches))
    assert bubble_fraction(stages, microbatches) == pytest.approx((stages - 1) / (microbatches + stages - 1))


@pytest.mark.parametrize("stages,microbatches", [(2, 1), (4, 2), (4, 8), (3, 5)])
def test_1f1b_holds_at_most_p_minus_s_microbatches_and_gpipe_all(stages, microbatches):
    task_s = {(s, p): 1.0 for s in range(stages) for p in ("forward", "backward")}
    assert simulate_schedule(stages, microbatches, "gpipe", task_s).in_flight == (microbatches,) * stages
    assert simulate_schedule(stages, microbatches, "1f1b", task_s).in_flight == tuple(
        min(stages - s, microbatches) for s in range(stages))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_run_order_keeps_every_stage_sequence_and_dependency(schedule):
    stages, microbatches = 4, 6
    order = run_order(stages, microbatches, schedule)
    seqs = stage_sequences(stages, microbatches, schedule)
    for s in range(stages):
        assert [(p, k) for st, p, k in order if st == s] == seqs[s]
    position = {task: i for i, task in enumerate(order)}
    for s in range(1, stages):
        for k in range(microbatches):
            assert position[(s - 1, "forward", k)] < position[(s, "forward", k)]
            assert position[(s, "backward", k)] < position[(s - 1, "backward", k)]


def test_the_executor_refuses_a_schedule_that_reads_too_early(monkeypatch):
    model = _mlp(4)
    pipeline = _pipelined(model, "layers.0.w", 2, 2)
    backwards_first = [(s, p, k) for s, p, k in run_order(2, 2, "gpipe") if p != "forward"]
    monkeypatch.setattr("ir.pipeline_run.run_order", lambda *args: backwards_first)
    with pytest.raises(InterpretError, match="before"):
        run_pipeline(pipeline, random_inputs(model.function))


# ------------------------------------------------------------------- cost


def test_cost_prices_transfers_bubble_and_1f1b_memory():
    hardware = preset_hardware("V100-32GB", [PIPELINE, "batch", "model"])
    # Activations outweigh the weights, so the microbatches in flight set each stage's peak.
    model = training_step(deep_mlp(layers=8, d_model=32, batch=1024), optimizer=SGD())
    gpipe = pipeline_cost(_pipelined(model, "layers.0.w", 4, 8, "gpipe"), hardware)
    one_f = pipeline_cost(_pipelined(model, "layers.0.w", 4, 8, "1f1b"), hardware)
    assert [m.in_flight for m in gpipe.memory] == [8, 8, 8, 8]
    assert [m.in_flight for m in one_f.memory] == [4, 3, 2, 1]
    # Same tasks, same time; only the stash held at once differs: K - min(P - s, K) microbatches of it.
    assert gpipe.task_s == one_f.task_s
    for s, (g, o) in enumerate(zip(gpipe.memory, one_f.memory)):
        # A microbatch of 1024 / 8 rows over 2 batch devices is 64 rows; each stage keeps at least the
        # output of its last layer, [64, 32] f32, for its backward.
        assert g.stash_bytes == o.stash_bytes >= 64 * 32 * 4
        assert g.peak_bytes - o.peak_bytes == (8 - min(4 - s, 8)) * g.stash_bytes
    assert gpipe.collective_counts["collective_permute"] == 2 * 3 * 8
    assert gpipe.transfer_s > 0
    # The step is at least the slowest stage's work, and the bubble is never less than GPipe's.
    busiest = max(sum(t * (8 if p in ("forward", "backward") else 1) for (s, p), t in gpipe.task_s.items() if s == st)
                  for st in range(4))
    assert gpipe.step_time_s >= busiest
    assert gpipe.bubble_fraction >= bubble_fraction(4, 8) - 0.05


def test_tasks_equal_up_to_names_are_priced_once_and_alike(monkeypatch):
    """A uniform model's inner stages run the same tasks under other names:
    `unnamed` makes them one key, and the cost of each task is its own
    `evaluate`, shared or not."""
    hardware = preset_hardware("V100-32GB", [PIPELINE, "batch", "model"])
    model = training_step(deep_mlp(layers=8, d_model=32, batch=1024), optimizer=SGD())
    pipeline = _pipelined(model, "layers.0.w", 4, 8, "1f1b")
    task = {(t.stage, t.phase): t.function for t in pipeline.tasks}
    assert task[(1, "forward")].params != task[(2, "forward")].params  # other names,
    assert unnamed(task[(1, "forward")]) == unnamed(task[(2, "forward")])  # the same work
    assert unnamed(task[(1, "backward")]) == unnamed(task[(2, "backward")])
    assert unnamed(task[(0, "forward")]) != unnamed(task[(1, "forward")])  # the first stage reads the batch
    assert unnamed(task[(1, "forward")]) != unnamed(task[(1, "backward")])
    priced = []
    monkeypatch.setattr("costmodel.pipeline.evaluate", lambda fn, hw: priced.append(fn) or evaluate(fn, hw))
    cost = pipeline_cost(pipeline, hardware)
    assert len(priced) == len({unnamed(fn) for fn in task.values()}) < len(task)
    assert cost.tasks == {key: evaluate(fn, hardware) for key, fn in task.items()}


def test_live_peak_frees_parameters_after_their_last_use():
    b = Builder("f")
    x, y = b.param("x", [4, 4]), b.param("y", [4, 4])
    t = b.add(x, x)  # x dies here: 64 B
    u = b.mul(t, y)  # t dies here
    fn = b.build([u])
    # x + t (64 + 64) at the add; t + y + u (3 x 64) at the mul, y held elsewhere: t + u.
    assert live_peak_bytes(fn, set()) == 3 * 64
    assert live_peak_bytes(fn, {"y"}) == 2 * 64


def test_rematerialized_layers_pipeline_and_stash_only_their_inputs():
    # Remat copies (`<name>.remat`) go to their forward op's stage; the stash shrinks to each layer's input.
    model = training_step(deep_mlp(layers=4, d_model=32, batch=256), optimizer=SGD())
    remat = dataclasses.replace(model, function=rematerialize(model.function, model.forward_ops, [0, 1, 2, 3]))
    hardware = preset_hardware("V100-32GB", [PIPELINE, "batch", "model"])
    plain, recomputed = (_pipelined(m, "layers.0.w", 2, 4, "1f1b") for m in (model, remat))
    assert_pipeline_matches(remat, recomputed)
    before, after = (pipeline_cost(p, hardware).memory for p in (plain, recomputed))
    assert all(a.stash_bytes < b.stash_bytes for a, b in zip(after, before))


def test_ops_the_sum_over_microbatches_makes_anew_have_their_types_checked():
    """A pipeline's tasks are verified for SSA alone (`ir.pipeline._function`):
    the ops `_accumulate` makes anew (the collectives after a sum over the
    microbatches) have their declared types checked where they are made."""
    from ir.core import Attrs, Op, Value, tensor
    from ir.pipeline import _typed

    mesh = Mesh.of(micro=2, model=2)
    total = Value("g.sum", tensor([4, 6]))
    attrs = Attrs.of({"axes": ("model",), "combiner": "sum"})
    reduced = Op("all_reduce", (total,), (Value("g.reduced", tensor([4, 6])),), attrs)
    assert _typed(reduced, mesh) is reduced
    with pytest.raises(PipelineError, match="its operands give tensor<4x6xf32>"):
        _typed(Op("all_reduce", (total,), (Value("g.reduced", tensor([2, 6])),), attrs), mesh)
