"""Long context: fused attention in a training step and the ways to split
a sequence (Megatron's sequence parallelism, context parallelism by
all-gathered keys and values, DeepSpeed-Ulysses), each executed on the
simulated mesh against the unpartitioned step, with the collectives each
scheme is known for counted."""

import numpy as np
import pytest
from conftest import ROOT
from spmd_check import assert_lowering_matches, assert_pipeline_matches, model_inputs

from ir import ops
from ir.autodiff import training_step
from ir.interpret import run
from ir.models import transformer
from solver.planning.plan_json import plan_report
from solver.planning.planner import (
    SearchOverrides,
    collective_counts,
    plan_spec,
    planned_counts,
    simulate_planned,
)
from solver.planning.scheme import CONTEXT, DATA, RING, SEQUENCE, TENSOR, ULYSSES, ZERO3, ZERO12, axis_roles, ring_axes
from solver.planning.spec import load_spec, parse_spec
from solver.planning.tactics import TacticError


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_a_fused_attention_step_equals_the_dense_one(kv_heads):
    """The same loss, new parameters and optimizer state to rounding: the
    fused op and its two backward kernels compute what the scores, the mask
    and the softmax as separate ops do."""
    steps = [training_step(transformer(layers=2, d_model=16, heads=4, kv_heads=kv_heads, head_dim=4, mlp_hidden=32,
                                       vocab=32, seq=8, batch=2, gated_mlp=True, attention=attention))
             for attention in ("dense", "flash")]
    dense, flash = (s.function for s in steps)
    assert not any(op.kind.startswith("attention") for op in dense.ops)
    fused = [op.kind for op in flash.ops if op.kind.startswith("attention")]
    assert sorted(fused) == ["attention"] * 2 + ["attention_dkv"] * 2 + ["attention_dq"] * 2
    assert [r.name for r in dense.results] == [r.name for r in flash.results]
    inputs = model_inputs(steps[0])
    want = run(dense, inputs, float_dtype=np.float64)
    got = run(flash, inputs, float_dtype=np.float64)
    for r, a, b in zip(dense.results, got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=r.name)


def test_fused_attention_never_holds_the_scores():
    """At 4096 tokens the dense step's largest value is a layer's scores
    ([batch, kv heads, heads per kv head, seq, seq]); the fused step has none
    larger than the logits."""
    sizes = {}
    for attention in ("dense", "flash"):
        fn = transformer(layers=1, d_model=64, heads=4, kv_heads=2, head_dim=16, mlp_hidden=128, vocab=64,
                         seq=4096, batch=1, attention=attention).function
        sizes[attention] = max(r.type.num_elements for op in fn.ops for r in op.results)
    assert sizes["dense"] == 4 * 4096 * 4096
    assert sizes["flash"] == 4096 * 128  # the MLP's hidden activations


MODEL = """
model:
  builder: transformer
  args: {layers: 2, d_model: 16, heads: 4, kv_heads: 2, head_dim: 4, mlp_hidden: 32, vocab: 32, seq: 8, batch: 4,
         gated_mlp: true, attention: flash}
  step: train
"""
SPEC = MODEL + """mesh: {context: 2, model: 2}
hardware: H100-SXM
schedules:
  TP+SP:
    tactics:
      - {manual: {axis: context, values: {batch.tokens: 0}}}
      - &tp {manual: {axis: model, values: {"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}}}
      - &spb {replicate: {axis: model, values: {"layers.*.attn.q": 1, "layers.*.attn.k": 1, "layers.*.attn.v": 1,
                                               "layers.*.mlp.gate": 1, "layers.*.mlp.up": 1}}}
      - &sp {manual: {axis: model, values: {batch.tokens: 1}}}
  CP:
    tactics:
      - &cp {manual: {axis: context, values: {batch.tokens: 1}}}
      - *tp
  CP+SP:
    tactics: [*cp, *tp, *spb, *sp]
  Ulysses:
    tactics:
      - {manual: {axis: model, values: {batch.tokens: 0}}}
      - {replicate: {axis: context, values: {"layers.*.attn.context": 1}}}
      - *cp
      - {manual: {axis: context, values: {"layers.*.attn.context": 2}}}
  Ring:
    tactics: [*cp, *tp, {ring_attention: {axis: context}}]
"""
L, P = 2, 3 + 9 * 2  # layers; trainable tensors (embedding, final norm, unembedding; 9 a layer)


@pytest.mark.parametrize("schedule, counts", [
    # Megatron-SP: no all_reduce over model; per layer in the forward each norm's output gathered for
    # each reader (q, k, v; gate, up) and each block's output reduce_scattered (2), in the backward the
    # norms' outputs gathered again for the weights' gradients (5), the blocks' output cotangents
    # gathered for their two readers (4), and each norm's output cotangent, summed over its readers
    # first (the `replicate` at the projections), reduce_scattered (2): Megatron's four a layer.
    ("TP+SP", {"all_reduce": P + 1, "all_gather": 14 * L, "reduce_scatter": 4 * L}),
    # Llama 3's context parallelism: K and V gathered for the forward and for each backward kernel (6),
    # their stacked gradient reduce_scattered (1); the positions sliced for each kernel (3); Megatron's
    # four all_reduces a layer over model.
    ("CP", {"all_reduce": P + 1 + 4 * L, "all_gather": 6 * L, "reduce_scatter": L, "all_slice": 3 * L}),
    ("CP+SP", {"all_reduce": P + 1, "all_gather": 20 * L, "reduce_scatter": 5 * L, "all_slice": 3 * L}),
    # DeepSpeed-Ulysses: q, k, v from sequence to heads and the context back (4 in the forward); in the
    # backward q, k, v, o and do to heads for each kernel that reads them, o back for wo's gradient, and
    # the gradients back to the sequence at each of their readers (14). No all_gather: nothing whole.
    ("Ulysses", {"all_reduce": P + 1, "all_to_all": 18 * L}),
    # Ring attention on 2 devices: per layer each of K, V and their positions passed once in the forward
    # (3) and once in the backward (3), the blocks' dk, dv twice (around and home); each kernel's key
    # positions sliced to the device's block beside its query positions (4).
    ("Ring", {"all_reduce": P + 1 + 4 * L, "collective_permute": 8 * L, "all_slice": 4 * L}),
])
def test_long_context_schemes_execute_like_the_global_step(schedule, counts):
    planned = plan_spec(parse_spec(SPEC), schedule=schedule)
    got = {k: v for k, v in collective_counts(planned.lowered).items() if v}
    assert got == counts
    assert_lowering_matches(planned.model, planned.lowered)


def test_context_parallelism_with_recomputed_layers_executes_like_the_global_step():
    text = SPEC.replace("  CP+SP:", "  CP+R:\n    tactics: [*cp, *tp, {remat: {values: ['layers.*']}}]\n  CP+SP:")
    planned = plan_spec(parse_spec(text), schedule="CP+R")
    assert sum(op.kind == "attention" for op in planned.model.function.ops) == 2 * L  # forward and recomputed
    assert_lowering_matches(planned.model, planned.lowered)


def test_a_manual_pattern_names_parameters_first_then_op_results():
    spec = parse_spec(SPEC.replace('"layers.*.attn.context": 2}', '"layers.*.attn.nothing": 2}'))
    with pytest.raises(TacticError, match=r"schedule.3.manual: no parameter matches 'layers.\*.attn.nothing'"):
        plan_spec(spec, schedule="Ulysses")


@pytest.mark.parametrize("schedule, roles", [
    ("TP+SP", {"context": [DATA], "model": [TENSOR, SEQUENCE]}),
    ("CP", {"context": [CONTEXT], "model": [TENSOR]}),
    ("CP+SP", {"context": [CONTEXT], "model": [TENSOR, SEQUENCE]}),
    ("Ulysses", {"context": [ULYSSES], "model": [DATA]}),
    ("Ring", {"context": [RING], "model": [TENSOR]}),
])
def test_the_report_names_each_axis_role(schedule, roles):
    planned = plan_spec(parse_spec(SPEC), schedule=schedule)
    assert axis_roles(planned.model, planned.nda, planned.sharding, ring_axes(planned.lowered.function)) == roles
    assert plan_report(planned, "none")["scheme"] == roles


def test_zero_levels_are_named_where_most_weights_take_them():
    """ZeRO-3 when the weights are stored split and read whole; ZeRO-1/2 when
    only their optimizer state is split; an axis that splits nothing has no role."""
    text = SPEC + """
  Z3:
    tactics:
      - {manual: {axis: context, values: {batch.tokens: 0}}}
      - {manual: {axis: context, values: {"*": first_divisible}}}
  Z2:
    tactics:
      - {manual: {axis: context, values: {batch.tokens: 0}}}
      - replicate: {axis: context, values: ["layers.*.new", "embed.table.new", "final_norm.scale.new", "unembed.new"]}
      - {manual: {axis: context, values: {"opt.*": first_divisible}}}
"""
    spec = parse_spec(text)
    z3 = plan_spec(spec, schedule="Z3")
    assert axis_roles(z3.model, z3.nda, z3.sharding) == {"context": [DATA, ZERO3], "model": []}
    z2 = plan_spec(spec, schedule="Z2")
    assert axis_roles(z2.model, z2.nda, z2.sharding) == {"context": [DATA, ZERO12], "model": []}


RING_OF_4 = SPEC.replace("seq: 8, batch: 4", "seq: 16, batch: 2").replace("{context: 2, model: 2}",
                                                                          "{context: 4, model: 2}")


@pytest.mark.parametrize("remat", [False, True])
def test_ring_attention_on_four_devices_executes_like_the_global_step(remat):
    """Each block passes 3 times around a ring of 4 in the forward (and its
    recomputation) and in the backward, whose dq and dkv kernels share the
    passes; dk and dv travel 3 steps with their block and one home."""
    text = RING_OF_4 + ("      - {remat: {values: ['layers.*']}}\n" if remat else "")
    text = text.replace("tactics: [*cp, *tp, {ring_attention: {axis: context}}]",
                        "tactics:\n      - *cp\n      - *tp\n      - {ring_attention: {axis: context}}")
    planned = plan_spec(parse_spec(text), schedule="Ring")
    counts = collective_counts(planned.lowered)
    forward = 3 * 3 * (2 if remat else 1)
    assert counts["collective_permute"] == (forward + 3 * 3 + 4) * L
    assert counts["all_gather"] == counts["reduce_scatter"] == 0
    assert_lowering_matches(planned.model, planned.lowered)


def test_the_simulator_overlaps_the_ring_with_the_blocks():
    """Sequences of 32k tokens, multi-head attention (K and V as large as
    q) on 8 devices over InfiniBand: the ring moves no more bytes than the
    gathers it replaces, and its passes hide behind the blocks' compute."""
    text = """
model:
  builder: transformer
  args: {layers: 2, d_model: 1024, heads: 16, head_dim: 64, mlp_hidden: 4096, vocab: 1024, seq: 32768, batch: 1,
         dtype: bf16, attention: flash}
  step: train
mesh: {context: 8}
hardware: {preset: H100-SXM, links: {context: infiniband}}
schedules:
  CP:
    tactics: [&cp {manual: {axis: context, values: {batch.tokens: 1}}}]
  Ring:
    tactics: [*cp, {ring_attention: {axis: context}}]
"""
    spec = parse_spec(text)
    gathered, ring = (plan_spec(spec, schedule=s) for s in ("CP", "Ring"))
    moved = gathered.assessment.cost.seconds_by_kind
    assert ring.assessment.cost.communication_s <= gathered.assessment.cost.communication_s
    assert ring.assessment.cost.seconds_by_kind["collective_permute"] <= moved["all_gather"] + moved["reduce_scatter"]
    overlapped = simulate_planned(ring)
    assert overlapped.exposed_communication_s < 0.8 * ring.assessment.cost.communication_s
    assert overlapped.makespan_s < simulate_planned(gathered).makespan_s


@pytest.mark.parametrize("remat", [False, True])
def test_ring_attention_under_gradient_accumulation_executes_like_the_global_step(remat):
    """Two microbatches, each a ring: the forward's merged output and
    statistics cross to the backward's task with the stash (or, with every
    layer recomputed, are made again there)."""
    text = RING_OF_4.replace("seq: 16, batch: 2", "seq: 16, batch: 4").replace(
        "mesh: {context: 4, model: 2}", "mesh: {context: 4, model: 2}\nmicrobatches: 2")
    text = text.replace("tactics: [*cp, *tp, {ring_attention: {axis: context}}]",
                        "tactics: [*cp, *tp, {ring_attention: {axis: context}}"
                        + (", {remat: {values: ['layers.*']}}]" if remat else "]"))
    planned = plan_spec(parse_spec(text), schedule="Ring")
    per_microbatch = (3 * 3 * (2 if remat else 1) + 3 * 3 + 4) * L
    assert planned_counts(planned)["collective_permute"] == 2 * per_microbatch
    assert_pipeline_matches(planned.model, planned.pipeline)


def test_ring_attention_in_a_pipeline_executes_like_the_global_step():
    """Two stages, one layer each, two microbatches: the rings run inside
    each stage's tasks, beside the stage-to-stage transfers (2 a microbatch:
    an activation forward, its cotangent back), which the counts add to."""
    text = MODEL.replace("seq: 8", "seq: 16") + """mesh: {pipeline: 2, context: 4}
microbatches: 2
hardware: H100-SXM
schedules:
  Ring:
    tactics:
      - {manual: {axis: context, values: {batch.tokens: 1}}}
      - {ring_attention: {axis: context}}
"""
    planned = plan_spec(parse_spec(text), schedule="Ring")
    assert planned_counts(planned)["collective_permute"] == 2 * (2 + (3 * 3 + 3 * 3 + 4) * L)
    assert_pipeline_matches(planned.model, planned.pipeline)


def test_a_flax_transformer_at_16k_tokens_imports_and_plans_context_parallel():
    """flax.linen's attention (its XLA form: the scores and the causal mask
    as ops) in an nn.scan transformer's training step on one sequence of
    16,384 tokens (tests/fixtures/long_context/, written by
    tools/export_long_context.py): CP-SAT splits the queries over the 8
    devices, and the plan fits."""
    spec = load_spec(ROOT / "tests" / "fixtures" / "long_context" / "scan_train_16k.yaml")
    planned = plan_spec(spec, "cpsat", overrides=SearchOverrides(time_limit_s=20))
    assert axis_roles(planned.model, planned.nda, planned.sharding) == {"context": [CONTEXT]}
    assert planned.assessment.cost.fits


def _megatron_layer_step(width: int, heads: int, seq: int):
    """A two-layer GQA step (8 key/value heads) whose MLP is 3.5x wider than the model."""
    return training_step(transformer(layers=2, d_model=width, heads=heads, kv_heads=8, head_dim=width // heads,
                                     mlp_hidden=width * 7 // 2, vocab=256 * heads, seq=seq, batch=1,
                                     gated_mlp=True, attention="flash", dtype="bf16"))


def test_the_search_chooses_sequence_parallelism_where_memory_binds_and_its_plan_executes():
    """Megatron's regime (d_model 8192, 4096 tokens, one sequence, 8 devices
    over NVLink): with room, CP-SAT's optimum is tensor parallelism; with
    90% of that plan's peak per device it adds the sequence on the same
    axis, LATE (`solver.search.space`), between the tensor-parallel regions:
    sequence parallelism. The same plan on the same program at small shapes
    executes like the global step."""
    from costmodel.hardware import preset_hardware
    from costmodel.table import CostTable
    from ir.core import Mesh
    from ir.lower import lower
    from ir.nda import analyze
    from solver.plan import Plan
    from solver.search import cpsat
    from solver.search.space import LATE, SearchSpace

    mesh = Mesh.of(model=8)
    step = _megatron_layer_step(8192, 64, 4096)
    nda = analyze(step.function, step.params)
    hardware = preset_hardware("H100-SXM", mesh.names)
    results = []
    for memory in (hardware.device.memory, None):
        if memory is None:  # 90% of the unconstrained optimum's peak
            memory = int(0.9 * results[0].cost.peak_memory_bytes)
        hw = hardware.model_copy(update={"device": hardware.device.model_copy(update={"memory": memory})})
        space = SearchSpace(nda, Plan(mesh), mesh.names, data_inputs=step.inputs, optimizer_state=step.state)
        results.append(cpsat.solve(space, CostTable(step.function, nda, mesh, hw)))
    roomy, tight = results
    assert axis_roles(step, nda, roomy.sharding) == {"model": [TENSOR]}
    assert axis_roles(step, nda, tight.sharding) == {"model": [TENSOR, SEQUENCE]}
    assert tight.report.status == "optimal" and tight.cost.fits
    assert tight.cost.step_time_s > roomy.cost.step_time_s  # it is chosen for memory, not time
    late = [d for d in tight.plan.decisions if d.color in space.data_colors]
    assert late and tight.plan.decisions[-len(late):] == tuple(late)  # decided after the heads and the MLP
    assert any(level == LATE for *_, level in space.point_of(tight.sharding).partial)

    small = _megatron_layer_step(32, 16, 16)
    small_nda = analyze(small.function, small.params)
    sharding = tight.plan.materialize(small_nda)
    assert sharding.axes == tight.sharding.axes  # the same plan, every I-class as at full size
    assert_lowering_matches(small, lower(small.function, small_nda, sharding))


def test_a_mirrored_layout_is_the_same_step_on_reordered_tokens():
    """`balance` lays the sequence out in mirrored chunks: the step on tokens
    and targets fed in `mirrored_order` gives the loss, parameters and
    optimizer state of the step in sequence order (causal attention reads
    positions, and nothing else depends on the order)."""
    from ir.opset.layout import mirrored_order

    def step(balance):
        return training_step(transformer(layers=2, d_model=16, heads=4, kv_heads=2, head_dim=4, mlp_hidden=32,
                                         vocab=32, seq=16, batch=2, gated_mlp=True, attention="flash",
                                         balance=balance))

    natural, mirrored = step(0), step(2)
    order = mirrored_order(16, 2)
    assert order.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    inputs = model_inputs(natural)
    reordered = {name: x[:, order] if name.startswith("batch.") else x for name, x in inputs.items()}
    want = run(natural.function, inputs, float_dtype=np.float64)
    got = run(mirrored.function, reordered, float_dtype=np.float64)
    for r, a, b in zip(natural.function.results, got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=r.name)
    with pytest.raises(ValueError, match="does not split into 6 chunks"):
        transformer(seq=16, attention="flash", balance=3)


def test_causal_work_is_priced_on_the_slowest_device():
    """Keys gathered, queries one of k chunks: in sequence order the last
    chunk's (2k - 1) / 2k of the passes; mirrored chunks that split evenly
    over the k devices, half; a ring step half where its blocks are
    balanced, whole where they are not."""
    from ir.core import TensorType
    from ir.opset.attention import causal_share

    keys = TensorType((1, 64, 2, 4), "f32")

    def share(k, balance, stats=False):
        q = TensorType((1, 64 if stats else 64 // k, 2, 1, 4), "f32")
        return causal_share(q, keys, {"causal": True, "stats": stats, "balance": balance})

    assert share(1, 0) == (1, 2)
    assert share(4, 0) == (7, 8) and share(4, 2) == (7, 8) and share(4, 4) == (1, 2) and share(2, 4) == (1, 2)
    assert share(1, 0, stats=True) == (1, 1) and share(1, 3, stats=True) == (1, 2)
    assert causal_share(TensorType((1, 16, 2, 1, 4), "f32"), keys, {"causal": False, "stats": False,
                                                                    "balance": 0}) == (1, 1)


@pytest.mark.parametrize("schedule", ["CP", "Ring"])
def test_mirrored_chunks_balance_context_parallelism_and_execute_like_the_global_step(schedule):
    """With the sequence in mirrored chunks (balance 2 on a context axis of
    2) the attention kernels cost half their passes on every device, where
    in sequence order the slower half of the queries costs 3/4; the plan
    still executes like the global step."""
    flops = {}
    for balance in (0, 2):
        text = SPEC.replace("attention: flash}", f"attention: flash, balance: {balance}}}") if balance else SPEC
        planned = plan_spec(parse_spec(text), schedule=schedule)
        local = planned.lowered.function
        kernels = [op for op in local.ops if op.kind.startswith("attention")]
        flops[balance] = sum(ops.get(op.kind).cost([v.type for v in op.operands], [r.type for r in op.results],
                                                    op.attrs).flops for op in kernels)
        if balance:
            assert_lowering_matches(planned.model, planned.lowered)
    assert flops[0] > flops[2]
