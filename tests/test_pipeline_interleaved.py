"""Megatron's interleaved 1F1B (`ir.pipeline_run.device_sequences`,
`costmodel.pipeline`): each device on the pipeline axis runs `chunks`
stages; the pipelined step, executed device by device in that order,
computes what the unpartitioned step computes; the simulated idle share
is (P - 1) / (v K + P - 1); a device's memory holds its chunks' inputs,
sums and the stash its order keeps; the spec's `pipeline.schedule:
interleaved` and its errors."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
from conftest import shardplan
from spmd_check import assert_pipeline_matches
from test_pipeline import SUB, _dp_hp, _mlp, _pipelined
from test_pipeline_plan import SMALL

from costmodel.hardware import preset_hardware
from costmodel.pipeline import pipeline_cost, schedule_trace, simulate_schedule
from ir.autodiff import Adam, training_step
from ir.models.mlp import deep_mlp
from ir.models.transformer import transformer
from ir.nda import analyze
from ir.pipeline import PIPELINE, PipelineError, bubble_fraction, pipeline_step, pipeline_text, transfer_function
from ir.pipeline_run import device_sequences, run_order
from solver.frontend.check import formula_names
from solver.planning.expect import evaluate_formula
from solver.planning.pipelining import microbatch_counts, pipelined, pipelined_cost
from solver.planning.planner import plan_spec
from solver.planning.spec import SpecError, parse_spec


def _interleaved(model, first_weight: str, devices: int, chunks: int, microbatches: int):
    return pipeline_step(model, analyze(model.function), SUB, _dp_hp(model, first_weight), stages=devices * chunks,
                         microbatches=microbatches, schedule="interleaved", chunks=chunks)


# --------------------------------------------------------------- execution


@pytest.mark.parametrize("devices,chunks,microbatches", [(2, 2, 2), (2, 2, 4), (2, 4, 2), (4, 2, 4)])
def test_interleaved_deep_mlp_equals_the_reference(devices, chunks, microbatches):
    model = _mlp(8)
    pipeline = _interleaved(model, "layers.0.w", devices, chunks, microbatches)
    assert (pipeline.stages, pipeline.devices, pipeline.mesh.size(PIPELINE)) == (devices * chunks, devices, devices)
    assert_pipeline_matches(model, pipeline)


def test_interleaved_transformer_with_adam_and_tied_embeddings_equals_the_reference():
    model = training_step(transformer(layers=4, batch=8, tied_embeddings=True), optimizer=Adam())
    pipeline = _interleaved(model, "layers.0.attn.wq", 2, 2, 4)
    assert_pipeline_matches(model, pipeline)
    # The head's gradient of the tied table goes from the last stage (device 1) back to stage 0 (device 0).
    assert any(t.src == 3 and t.dst == 0 and not pipeline.same_device(t) for t in pipeline.transfers)


def test_transfers_cross_every_stage_boundary_and_wrap_from_the_last_device_to_the_first():
    devices, chunks, k = 4, 2, 4
    pipeline = _interleaved(_mlp(8), "layers.0.w", devices, chunks, k)
    stages = devices * chunks
    assert sorted((t.src, t.dst) for t in pipeline.transfers if t.phase == "forward") == [
        (s, s + 1) for s in range(stages - 1)]
    # An activation and a cotangent per boundary and microbatch, v times GPipe's on the same devices.
    assert pipeline.collective_counts()["collective_permute"] == 2 * (stages - 1) * k
    shifts = {op.attrs["shift"] for op in transfer_function(pipeline.transfers, pipeline).ops}
    assert shifts == {1, -1, devices - 1, -(devices - 1)}  # stage 3 -> 4 is device 3 -> device 0
    text = pipeline_text(pipeline)
    assert "8 stages (2 per device: stage s on device s mod 4)" in text and "interleaved" in text


# --------------------------------------------------------------- schedule


@pytest.mark.parametrize("devices", [2, 3, 4, 8])
@pytest.mark.parametrize("chunks", [2, 3, 4])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_simulated_idle_share_is_the_interleaved_bubble(devices, chunks, rounds):
    stages, k, f, b = devices * chunks, devices * rounds, 1.0, 2.0
    task_s = {(s, phase): t for s in range(stages) for phase, t in (("forward", f), ("backward", b))}
    times = simulate_schedule(stages, k, "interleaved", task_s, chunks=chunks)
    assert times.makespan_s == pytest.approx((chunks * k + devices - 1) * (f + b))
    assert times.idle_fraction == pytest.approx(bubble_fraction(stages, k, chunks))
    assert bubble_fraction(stages, k, chunks) < bubble_fraction(devices, k)  # v times smaller fill and drain
    # Megatron's warm-up: (P - d - 1) x 2 + (v - 1) x P forwards ahead, then one more; every one when K = P.
    expected = [k * chunks if k == devices else (devices - d - 1) * 2 + (chunks - 1) * devices + 1
                for d in range(devices)]
    assert list(times.in_flight) == expected


@pytest.mark.parametrize("devices,chunks,k", [(2, 2, 6), (3, 2, 9), (4, 3, 8)])
def test_each_device_runs_its_chunks_every_microbatch_once_in_a_valid_order(devices, chunks, k):
    stages = devices * chunks
    seqs = device_sequences(stages, k, "interleaved", chunks)
    for d, seq in enumerate(seqs):
        own = range(d, stages, devices)
        assert sorted(seq) == sorted([(s, p, m) for s in own for p in ("forward", "backward") for m in range(k)]
                                     + [(s, "post", 0) for s in own])
    assert seqs[0][:2 * devices] == [(0, "forward", m) for m in range(devices)] + [
        (devices, "forward", m) for m in range(devices)]  # a round of P microbatches per chunk
    order = run_order(stages, k, "interleaved", chunks)
    position = {task: i for i, task in enumerate(order)}
    for s in range(1, stages):
        for m in range(k):
            assert position[(s - 1, "forward", m)] < position[(s, "forward", m)]
            assert position[(s, "backward", m)] < position[(s - 1, "backward", m)]


def test_schedule_errors_name_the_cause():
    with pytest.raises(PipelineError, match="not a multiple of 2"):
        device_sequences(4, 3, "interleaved", 2)
    with pytest.raises(PipelineError, match="at least 2 chunks on each of at least 2 devices"):
        device_sequences(4, 4, "interleaved", 4)
    with pytest.raises(PipelineError, match="runs one stage per device, not 2"):
        device_sequences(4, 4, "1f1b", 2)
    model = _mlp(4)
    with pytest.raises(PipelineError, match="at least 8 layers"):
        _interleaved(model, "layers.0.w", 4, 2, 4)


# ------------------------------------------------------------------- cost


def test_interleaving_shrinks_the_bubble_and_a_device_holds_its_chunks():
    hardware = preset_hardware("V100-32GB", [PIPELINE, "batch", "model"])
    model = training_step(deep_mlp(layers=8, d_model=256, batch=2048), optimizer=Adam())
    one_f = pipeline_cost(_pipelined(model, "layers.0.w", 2, 8, "1f1b"), hardware)
    pipeline = _interleaved(model, "layers.0.w", 2, 2, 8)
    inter = pipeline_cost(pipeline, hardware)
    assert inter.bubble_fraction < one_f.bubble_fraction
    assert inter.step_time_s < one_f.step_time_s
    assert len(inter.memory) == 2
    for d, memory in enumerate(inter.memory):
        own = [t for t in pipeline.tasks if pipeline.device(t.stage) == d]
        inputs = {p.name: p.type for t in own for p in t.function.params
                  if p.name in {q.name for q in pipeline.local.function.params}}
        weights = sum(ty.num_bytes for name, ty in inputs.items() if name not in pipeline.varying)
        # Its stages' inputs and sums (the batch with every microbatch), summed: an input two of them read
        # counts twice, here only Adam's step counter, a scalar (an upper bound by its 4 bytes).
        assert memory.resident_bytes == sum(_stage(pipeline, s).memory.resident_bytes for s in range(d, 4, 2))
        reads = Counter(name for s in range(d, 4, 2) for name in _stage(pipeline, s).inputs)
        assert {name for name, n in reads.items() if n > 1} == {"opt.step"}
        assert memory.resident_bytes >= weights
        assert memory.accumulated_bytes == sum(_stage(pipeline, s).memory.accumulated_bytes for s in range(d, 4, 2))
        # The stash its order holds at its peak: a chunk microbatch in flight holds its own chunk's.
        held = most = 0
        stash: dict[int, int] = {}
        for s, phase, _ in device_sequences(4, 8, "interleaved", 2)[d]:
            stash.setdefault(s, _stage(pipeline, s).memory.stash_bytes)
            held += {"forward": stash[s], "backward": -stash[s]}.get(phase, 0)
            most = max(most, held)
        assert memory.held == most > 0
        assert memory.peak_bytes == memory.resident_bytes + max(
            memory.accumulated_bytes + most + memory.transient_bytes, memory.update_bytes)
    # 1F1B's device 0 holds P = 2 microbatches of two layers; interleaved, (P - 1) x 2 + P + 1 = 5 of one.
    assert [m.in_flight for m in inter.memory] == [5, 3]


def _stage(pipeline, stage: int) -> SimpleNamespace:
    """One stage's own memory terms and the step inputs its tasks read."""
    from costmodel.pipeline import _stage_memory

    inputs = {q.name for q in pipeline.local.function.params}
    return SimpleNamespace(memory=_stage_memory(pipeline, stage, 0), inputs={
        p.name for t in pipeline.tasks if t.stage == stage for p in t.function.params if p.name in inputs})


def test_the_trace_has_a_track_per_device_and_names_the_stage():
    task_s = {(s, p): 1.0 for s in range(4) for p in ("forward", "backward")}
    trace = schedule_trace(simulate_schedule(4, 2, "interleaved", task_s, chunks=2))
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {"device 0", "device 1"}
    assert {e["name"] for e in trace["traceEvents"] if e.get("tid") == 1 and e["ph"] == "X"} >= {
        "forward 0 (stage 0)", "forward 0 (stage 2)"}


# ------------------------------------------------------------------- specs

# test_pipeline_plan's small step, 8 layers deep, on a pipeline of 2 devices.
SPEC = SMALL.replace("layers: 4,", "layers: 8,") + """mesh: {pipeline: 2, batch: 2, model: 2}
schedule: [{manual: {axis: batch, values: {x: 0}}}]
"""


@pytest.mark.parametrize("text, expected", [
    ("pipeline: {chunks: 2}", "pipeline.chunks: only the interleaved schedule runs several chunks"),
    ("pipeline: {schedule: interleaved, chunks: 1}", "pipeline.chunks: Input should be greater than 1"),
    ("pipeline: {schedule: interleaved, microbatches: 3}",
     "pipeline.microbatches: the interleaved schedule runs the microbatches in rounds of the 2 pipeline devices; "
     "3 is not a multiple of 2"),
])
def test_interleaved_spec_errors_name_the_field(text, expected):
    with pytest.raises(SpecError, match=expected):
        parse_spec(SPEC + text, "p.yaml")


def test_plan_runs_the_interleaved_schedule_and_reports_devices(capsys, tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text(SPEC + "pipeline: {schedule: interleaved, microbatches: 4}\n")
    spec = parse_spec(path.read_text(), str(path))
    assert spec.chunks == 2
    planned = plan_spec(spec)
    assert (planned.pipeline.stages, planned.pipeline.chunks, planned.pipeline.schedule) == (4, 2, "interleaved")
    built = spec.build()
    # On two devices an interleaved pipeline is priced whole: the cost the floor and re-ranking use is the answer's.
    whole = pipelined(spec, built, analyze(built.function), planned.plan, spec.hardware_obj())[1]
    assert pipelined_cost(spec, built, analyze(built.function), planned.plan,
                          spec.hardware_obj()).step_time_s == whole.step_time_s
    code, out, err = shardplan(capsys, "plan", path)
    assert code == 0, err
    assert "pipeline: 4 stages (2 per device on 2 devices) x 4 microbatches, interleaved" in out
    assert "stage 2 (device 0)" in out and "device 1: stages 1, 3; peak" in out
    code, out, _ = shardplan(capsys, "plan", path, "--json")
    report = json.loads(out)["pipeline"]
    assert report["chunks"] == 2 and [s["device"] for s in report["per_stage"]] == [0, 1, 0, 1]


def test_auto_microbatches_are_multiples_of_the_devices():
    spec = parse_spec(SPEC + "microbatches: auto\npipeline: {schedule: interleaved}\n", "p.yaml")
    built = spec.build()
    nda = analyze(built.function)
    planned = plan_spec(spec)
    counts = microbatch_counts(nda, built, planned.plan, spec)
    assert counts and all(k % 2 == 0 for k in counts)
    assert planned.pipeline.microbatches in counts


def test_count_formulas_name_the_stages_per_device():
    spec = parse_spec(SPEC + "pipeline: {schedule: interleaved, chunks: 2, microbatches: 4}\n", "p.yaml")
    planned = plan_spec(spec)
    names = formula_names(planned)
    assert (names["P"], names["V"], names["K"]) == (2, 2, 4)
    # An activation and a cotangent per boundary of the P x V stages and microbatch.
    assert evaluate_formula("2 * (P * V - 1) * K", names) == planned.pipeline.collective_counts()[
        "collective_permute"] == 24
