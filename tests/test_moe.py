"""Mixtures of experts (ir/models/moe.py) and expert parallelism: the
routing against a loop over tokens written here, the builder's checks, and
the expert-parallel plans, GShard's all_to_all and the all-gather form,
executed on the simulated mesh against the unpartitioned training step."""

import math

import numpy as np
import pytest
from spmd_check import assert_lowering_matches

from ir.builder import Builder
from ir.interpret import run
from ir.models import build
from ir.models.moe import _moe
from ir.models.transformer import _Layout
from solver.planning.planner import collective_counts, plan_spec
from solver.planning.spec import SpecError, parse_spec
from solver.planning.tactics import TacticError


def reference_moe(x, router, w_gate, w_up, w_down, top_k, capacity):
    """GShard's routing one token at a time: every first choice of a group
    (a sequence) before any second choice; a choice past its expert's
    capacity is dropped."""
    batch, seq, _ = x.shape
    experts = router.shape[1]
    logits = x @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[..., :top_k]
    gates = np.take_along_axis(probs, chosen, -1)
    gates /= gates.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for b in range(batch):
        taken = np.zeros(experts, int)
        for j in range(top_k):
            for s in range(seq):
                e = chosen[b, s, j]
                taken[e] += 1
                if taken[e] <= capacity:
                    g, u = x[b, s] @ w_gate[e], x[b, s] @ w_up[e]
                    out[b, s] += gates[b, s, j] * ((g / (1 + np.exp(-g)) * u) @ w_down[e])
    share = np.bincount(chosen.ravel(), minlength=experts) / chosen.size
    return out, experts * np.sum(share * probs.mean((0, 1)))


@pytest.mark.parametrize("top_k, capacity", [(2, 3), (1, 8), (3, 2)])
def test_routing_dispatch_and_combine_match_a_loop_over_tokens(top_k, capacity):
    batch, seq, d, experts, hidden = 2, 8, 6, 4, 5
    layout = _Layout(d, 1, 1, d, hidden, "rms", True, False, "f32")
    b = Builder("moe")
    x = b.param("x", [batch, seq, d])
    out, balance = _moe(b, layout, x, experts, top_k, capacity, "moe.")
    fn = b.build([out, balance])
    rng = np.random.default_rng(top_k)
    inputs = {p.name: rng.standard_normal(p.type.shape) for p in fn.params}
    got = run(fn, [inputs[p.name] for p in fn.params], float_dtype=np.float64)
    want = reference_moe(*(inputs[n] for n in ("x", "moe.router", "moe.w_gate", "moe.w_up", "moe.w_down")),
                         top_k, capacity)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10)
    if capacity * experts < seq * top_k:  # some choices were dropped: the capacity did bind
        assert np.abs(got[0]).sum() > 0


def test_the_builder_checks_its_arguments():
    with pytest.raises(ValueError, match=r"top_k=5 with experts=4: each token picks 1 to 4 experts"):
        build("moe_transformer", experts=4, top_k=5)
    model = build("moe_transformer", layers=2, experts=4, top_k=2, shared_experts=1, seq=8, capacity_factor=1.0)
    names = set(model.params)
    assert {"layers.1.moe.router", "layers.1.moe.w_gate", "layers.1.shared.0.w_down"} <= names
    expert_in = next(r for op in model.function.ops for r in op.results if r.name == "layers.0.moe.expert_in")
    assert expert_in.type.shape == (2, 4, math.ceil(8 * 2 / 4), 16)  # [batch, experts, capacity, d_model]


SPEC = """
model:
  builder: moe_transformer
  args: {layers: 2, seq: 8, batch: 8, experts: 8, top_k: 2, d_model: 16, expert_hidden: 16, heads: 4, head_dim: 4,
         kv_heads: 2, vocab: 32, shared_experts: 1}
  step: train
mesh: {data: 2, expert: 4}
hardware: H100-SXM
schedules:
  DP:
    tactics:
      - manual: {axis: data, values: {batch.tokens: 0}}
      - manual: {axis: expert, values: {batch.tokens: 0}}
  EP-gather:
    tactics:
      - manual: {axis: data, values: {batch.tokens: 0}}
      - manual: {axis: expert, values: {"layers.*.moe.w_*": 0}}
      - manual: {axis: expert, values: {batch.tokens: 0}}
  EP:
    tactics:
      - manual: {axis: data, values: {batch.tokens: 0}}
      - replicate: {axis: expert, values: {"layers.*.moe.expert_in": 1, "layers.*.moe.returned": 1}}
      - manual: {axis: expert, values: {"layers.*.moe.w_*": 0}}
      - manual: {axis: expert, values: {batch.tokens: 0}}
"""


@pytest.mark.parametrize("schedule, all_to_all", [("DP", 0), ("EP-gather", 0), ("EP", 7 * 2)])
def test_expert_parallel_plans_execute_like_the_global_step(schedule, all_to_all):
    """EP: GShard's layout. The tokens stay on the batch up to the dispatch,
    the experts' inputs move to the experts (all_to_all) for the expert MLPs
    and back for the combine; in the backward the same in reverse. Per
    layer: the forward's expert_in to each of its two readers and the
    outputs back, the backward's cotangents of both and expert_in again for
    the weights' gradients: 7. EP-gather leaves the dispatch on the experts'
    side: the tokens are gathered whole (Megatron's all-gather dispatcher)."""
    planned = plan_spec(parse_spec(SPEC), schedule=schedule)
    counts = collective_counts(planned.lowered)
    assert counts["all_to_all"] == all_to_all
    dims = dict(zip((p.name for p in planned.model.function.params), planned.lowered.param_dims))
    expert_sharded = dims["layers.0.moe.w_up"][0] == ("expert",)
    assert expert_sharded == (schedule != "DP")
    if schedule == "EP":
        assert counts["all_gather"] == 0  # no token is gathered: each device routes its own tokens
    assert_lowering_matches(planned.model, planned.lowered)


@pytest.mark.parametrize("values, message", [
    ('{"layers.*.moe.nope": 1}', r"schedule.1.replicate: no value of the program matches 'layers.\*.moe.nope'"),
    ('{"layers.0.moe.expert_in": 4}', r"%layers.0.moe.expert_in is tensor<8x8x3x16xf32>: dimension 4 is not one of"),
])
def test_a_replicated_dimension_must_name_a_value_and_one_of_its_dimensions(values, message):
    text = SPEC.replace('{"layers.*.moe.expert_in": 1, "layers.*.moe.returned": 1}', values)
    with pytest.raises((TacticError, SpecError), match=message):
        plan_spec(parse_spec(text), schedule="EP")
