"""PartIR's Table 2: collective counts are predictable per strategy.

Transformer Adam training steps (multi-head attention, RMSNorm, untied
embeddings) at depths L = 1, 2, 3 on a {batch: 2, model: 2} mesh. Each count
is a formula written from the model's structure and the strategy, not a
number copied from a run; checking three depths also shows each count is
affine in L. Every lowering is executed and compared with the global program
(`check_lowering`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from test_lower import (
    MESH,
    NO_REUSE,
    REUSE,
    Checked,
    check_lowering,
    color_decisions,
    pinned_decisions,
    plan,
    zero3_picks,
)

from ir.autodiff import training_step
from ir.core import Function, users
from ir.models import Model, build

DEPTHS = (1, 2, 3)
SIZES = dict(d_model=8, heads=2, head_dim=4, mlp_hidden=12, vocab=10, seq=4, batch=4)
LAYER_PARAMS = ("attn_norm.scale", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp_norm.scale", "mlp.w_up",
                "mlp.w_down")
# The weights of a matmul (einsum): the backward pass uses them again to
# propagate the cotangent to the matmul's input.
MATMUL_WEIGHTS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_up", "mlp.w_down")


def step(layers: int) -> Model:
    return training_step(build("transformer", layers=layers, kv_heads=None, norm="rms", tied_embeddings=False,
                               **SIZES))


_STEPS = {L: step(L) for L in DEPTHS}

BP = [("batch.tokens", 0, "batch")]


def megatron(layers: int) -> list[tuple[str, int, str]]:
    """Attention heads (wq dim 1) and the MLP hidden dim (w_up dim 1) on `model`."""
    return [(f"layers.{l}.{w}", 1, "model") for l in range(layers) for w in ("attn.wq", "mlp.w_up")]


def counts_by_axes(checked: Checked) -> Counter:
    """(kind, axes) of every collective."""
    return Counter((op.kind, op.attrs["axes"]) for op in checked.function.ops if "axes" in op.attrs)


def trainable(layers: int) -> int:
    """The trainable parameters, from the builder: embed.table, final_norm.scale,
    unembed, and per layer 2 norm scales and 6 matmul weights."""
    n = len(_STEPS[layers].params)
    assert n == 3 + 8 * layers
    assert set(_STEPS[layers].params) == {"embed.table", "final_norm.scale", "unembed"} | {
        f"layers.{l}.{p}" for l in range(layers) for p in LAYER_PARAMS}
    return n


@pytest.mark.parametrize("layers", DEPTHS)
def test_batch_parallel_needs_one_all_reduce_per_gradient_and_the_loss(layers):
    checked = check_lowering(_STEPS[layers], MESH, plan(BP))
    assert checked.counts == Counter(all_reduce=trainable(layers) + 1)
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): trainable(layers) + 1})


@pytest.mark.parametrize("layers", DEPTHS)
def test_megatron_adds_two_all_reduces_per_layer_forward_and_two_backward(layers):
    checked = check_lowering(_STEPS[layers], MESH, plan(BP, megatron(layers)))
    # Forward: the attention output projection and the MLP down projection
    # contract a model-sharded dim (heads, hidden): 2 per layer. Backward: the
    # cotangents of the two normed inputs (each feeding model-sharded
    # projections) are partial over model: 2 per layer. Gradients and loss are
    # as under batch parallelism.
    bp = trainable(layers) + 1
    assert checked.counts == Counter(all_reduce=bp + 4 * layers)
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): bp,
                                               ("all_reduce", ("model",)): 4 * layers})


def zero3_plan(layers: int, propagation: str):
    """BP, Megatron, then ZeRO-3: every trainable parameter and its Adam state
    pinned on `batch` at its first dimension divisible by 2 and not already
    sharded by Megatron, then each pin propagated either along its whole color
    (the pins' colors, in pin order) or, with `spread`, from the pin along map
    M, stopping where `batch` is taken (the manual tactic's propagation)."""

    def decide(nda, model, mesh):
        before = color_decisions(nda, BP + megatron(layers))
        picks = zero3_picks(model, nda, mesh, before, "batch")
        if propagation == "color":
            return before + pinned_decisions(nda, picks)
        pins = pinned_decisions(nda, picks)[:len(picks)]
        return before + pins + [replace(d, spread=True) for d in pins]

    return decide


def uses(step_fn: Function, forward_ops: int, name: str) -> tuple[int, int]:
    """How many forward and backward ops use a parameter directly (its Adam
    update, an op whose result is a result of the step, is neither)."""
    p = step_fn.param(name)
    index = {id(op): i for i, op in enumerate(step_fn.ops)}
    results = {id(r) for r in step_fn.results}
    ops_using = [op for op in users(step_fn)[p] if not any(id(r) in results for r in op.results)]
    forward = sum(index[id(op)] < forward_ops for op in ops_using)
    return forward, len(ops_using) - forward


def zero3_counts(layers: int, propagation: str, options) -> Counter:
    model = _STEPS[layers]
    checked = check_lowering(model, MESH, zero3_plan(layers, propagation), options=options)
    fn = model.function
    state = set(model.params) | {n for n in model.state if n != "opt.step"}
    sharded = {p.name for p, dims in zip(fn.params, checked.lowered.param_dims)
               if p.name in state and any("batch" in axes for axes in dims)}
    # Every parameter has a dim that divides by 2 and that Megatron left alone:
    # the pins shard all of them, and all their Adam moments.
    assert sharded == state
    params = set(model.params)
    forward_ops = len(build("transformer", layers=layers, **SIZES).function.ops)
    both = {n for n in params if uses(fn, forward_ops, n) == (1, 1)}
    forward_only = {n for n in params if uses(fn, forward_ops, n) == (1, 0)}
    # Matmul weights are used by the forward matmul and by the backward one
    # that propagates the cotangent to its input. A norm scale's backward
    # reuses the broadcast scale of the forward, and the embedding's backward
    # (scatter_add) needs only the token ids: both are used in the forward only.
    assert both == {"unembed"} | {f"layers.{l}.{w}" for l in range(layers) for w in MATMUL_WEIGHTS}
    assert forward_only == params - both
    counts = checked.counts
    if options.reuse_resharded:
        # XLA's choice: each parameter gathered once, the backward reuses it.
        assert counts["all_gather"] == len(params)
    else:
        # PartIR's choice: regathered at each use, so once in the forward and
        # once more in the backward for the parameters used in both.
        assert counts["all_gather"] == 2 * len(both) + len(forward_only)
    # Every gradient was all_reduced over batch under BP+MP; now it is
    # reduce_scattered into its parameter's shard, and only the loss's
    # all_reduce over batch and Megatron's 4 per layer remain.
    by_axes = counts_by_axes(checked)
    assert by_axes[("reduce_scatter", ("batch",))] == counts["reduce_scatter"] == len(params)
    assert by_axes[("all_reduce", ("batch",))] == 1
    assert by_axes[("all_reduce", ("model",))] == counts["all_reduce"] - 1 == 4 * layers
    if propagation == "color":
        # wo [heads, head_dim, d_model] is pinned at head_dim (Megatron took the
        # heads), but d_model's color (the norm scales', pinned first) claims
        # `batch` on its Adam update ops first: wo and both its moments are
        # each moved by one all_to_all to d_model.
        assert counts["all_to_all"] == 3 * layers
    else:
        assert counts["all_to_all"] == 0
    assert set(counts) <= {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}
    return counts


@pytest.mark.parametrize("options", [NO_REUSE, REUSE], ids=["regather", "reuse"])
@pytest.mark.parametrize("propagation", ["color", "spread"])
def test_zero3_gathers_parameters_and_reduce_scatters_gradients(propagation, options):
    counts = [zero3_counts(layers, propagation, options) for layers in DEPTHS]
    for kind in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        c1, c2, c3 = (c[kind] for c in counts)
        assert c3 - c2 == c2 - c1, (kind, c1, c2, c3)  # affine in L
    if not options.reuse_resharded:
        # 2 * (6L + 1) gathers of matmul weights + (2L + 2) of the rest: slope 14.
        assert [c["all_gather"] for c in counts] == [14 * L + 4 for L in DEPTHS]
