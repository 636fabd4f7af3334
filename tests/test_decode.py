"""The KV-cached decode step (ir/models/decode.py): its logits and new cache
entries against a numpy implementation and against the training
transformer's own forward over the prompt plus the new token, its names
against transformer()'s, no training step, and its lowerings on a
{batch: 2, model: 2} mesh executed against the global program.

Collective counts are formulas in the number of layers L, checked at
L = 1, 2, 3 for multi-head and multi-query attention.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_collective_counts import counts_by_axes
from test_lower import MESH, Checked, check_lowering, plan
from test_models import gelu, numpy_norm, numpy_qkv, softmax

from ir.autodiff import training_step
from ir.core import Function, IRError
from ir.interpret import random_inputs, run
from ir.models import Model, build
from ir.ops import verify
from ir.text import parse, print_function

DEPTHS = (1, 2, 3)
# Distinct sizes (seq is the cache length: the query attends over seq + 1).
SMALL = dict(d_model=12, heads=3, head_dim=4, mlp_hidden=7, vocab=11, seq=5, batch=2)
CASES = [
    dict(),
    dict(kv_heads=1, gated_mlp=True),
    dict(norm="layer", tied_embeddings=True),
    dict(kv_heads=1, fused_qkv=True, tied_embeddings=True),
    dict(fused_qkv=True, gated_mlp=True, norm="layer"),
]


def case_id(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items()) or "mha"


def float64_inputs(fn: Function, seed: int = 0) -> dict[str, np.ndarray]:
    return {k: x.astype(np.float64) if x.dtype.kind == "f" else x for k, x in random_inputs(fn, seed).items()}


# ----------------------------------------------------------------- forward


def numpy_decode(p, cfg):
    """(logits [batch, vocab], [k, v entries per layer]): each layer appends
    the new token's k and v to its cache and attends over all positions."""
    heads, kv_heads = cfg["heads"], cfg.get("kv_heads") or cfg["heads"]
    norm = cfg.get("norm", "rms")
    h = p["embed.table"][p["batch.tokens"]]
    entries = []
    for layer in range(cfg["layers"]):
        pre = f"layers.{layer}."
        q, k, v = numpy_qkv(numpy_norm(h, p, f"{pre}attn_norm", norm), p, f"{pre}attn.", heads, kv_heads,
                            cfg.get("fused_qkv", False))
        new = [k[:, :, :kv_heads], v[:, :, :kv_heads]]  # numpy_qkv broadcasts MQA's one head to all
        keys, values = (np.concatenate([p[f"cache.{pre}{n}"], e], axis=1) for n, e in zip("kv", new))
        shape = (*keys.shape[:2], heads, keys.shape[3])
        keys, values = np.broadcast_to(keys, shape), np.broadcast_to(values, shape)
        scores = np.einsum("bsnh,btnh->bnst", q, keys) / np.sqrt(cfg["head_dim"])
        context = np.einsum("bnst,btnh->bsnh", softmax(scores), values)
        h = h + np.einsum("bsnh,nhd->bsd", context, p[f"{pre}attn.wo"])
        x = numpy_norm(h, p, f"{pre}mlp_norm", norm)
        hidden = gelu(x @ p[f"{pre}mlp.w_gate"]) * (x @ p[f"{pre}mlp.w_up"]) if cfg.get("gated_mlp") \
            else gelu(x @ p[f"{pre}mlp.w_up"])
        h = h + hidden @ p[f"{pre}mlp.w_down"]
        entries += new
    h = numpy_norm(h, p, "final_norm", norm)
    logits = h @ p["embed.table"].T if cfg.get("tied_embeddings") else h @ p["unembed"]
    return logits[:, 0], entries


@pytest.mark.parametrize("options", CASES, ids=case_id)
def test_decode_matches_numpy(options):
    cfg = dict(SMALL, layers=2, **options)
    model = build("transformer_decode", **cfg)
    p = float64_inputs(model.function)
    logits, *entries = run(model.function, p, float_dtype=np.float64)
    want_logits, want_entries = numpy_decode(p, cfg)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-10)
    assert len(entries) == len(want_entries) == 4
    for got, want in zip(entries, want_entries):
        np.testing.assert_allclose(got, want, rtol=1e-10)


def with_results(fn: Function, names: list[str]) -> Function:
    """`fn` returning the named intermediate values instead of its loss."""
    by_name = {v.name: v for v in fn.values()}
    return verify(Function(fn.name, fn.params, fn.ops, tuple(by_name[n] for n in names), fn.mesh))


@pytest.mark.parametrize("options", CASES, ids=case_id)
def test_decode_continues_the_training_transformers_forward(options):
    # The training transformer over prompt + new token (seq + 1 positions,
    # causal): its last position's logits are the decode step's, and its k and
    # v at the first seq positions, as a cache, give the decode step's entries
    # as its k and v at the last position. Same weights, by name.
    cfg = dict(SMALL, layers=2, **options)
    seq, layers = cfg["seq"], cfg["layers"]
    full = build("transformer", **dict(cfg, seq=seq + 1)).function
    kv_names = [f"layers.{layer}.attn.{n}" for layer in range(layers) for n in "kv"]
    exposed = with_results(full, ["logits", *kv_names])
    p = float64_inputs(full, seed=3)
    logits, *kvs = run(exposed, p, float_dtype=np.float64)
    # The MQA projections have no heads dim; the cache keeps one of size 1.
    kvs = [x if x.ndim == 4 else x[:, :, None, :] for x in kvs]
    decode = build("transformer_decode", **cfg)
    inputs = {"batch.tokens": p["batch.tokens"][:, seq:]}
    inputs |= {name: x[:, :seq] for name, x in zip(decode.state, kvs)}
    inputs |= {name: p[name] for name in decode.params}
    got_logits, *entries = run(decode.function, inputs, float_dtype=np.float64)
    np.testing.assert_allclose(got_logits, logits[:, seq], rtol=1e-10, atol=1e-12)
    for got, x in zip(entries, kvs):
        np.testing.assert_allclose(got, x[:, seq:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("options", CASES, ids=case_id)
def test_names_shapes_and_results(options):
    cfg = dict(SMALL, layers=2, **options)
    decode, train = build("transformer_decode", **cfg), build("transformer", **cfg)
    kv_heads = cfg.get("kv_heads") or cfg["heads"]
    shapes = {p.name: p.type.shape for p in decode.function.params}
    # Same weights, names and shapes as the training program: schedules carry over.
    assert decode.params == train.params
    assert all(shapes[n] == train.function.param(n).type.shape for n in decode.params)
    assert decode.inputs == ("batch.tokens",) and shapes["batch.tokens"] == (2, 1)
    assert decode.state == ("cache.layers.0.k", "cache.layers.0.v", "cache.layers.1.k", "cache.layers.1.v")
    assert all(shapes[n] == (2, 5, kv_heads, 4) for n in decode.state)
    results = [r.type.shape for r in decode.function.results]
    assert results == [(2, 11)] + [(2, 1, kv_heads, 4)] * 4
    assert decode.function.name == "transformer_decode"
    assert parse(print_function(decode.function)) == decode.function


def test_training_step_refuses_a_program_without_a_scalar_loss():
    decode = build("transformer_decode", **SMALL, layers=1)
    with pytest.raises(IRError, match=r"scalar loss, %next_logits is tensor<2x11xf32>"):
        training_step(decode)


# ---------------------------------------------------------------- lowering

LOWER_SIZES = dict(d_model=8, head_dim=4, mlp_hidden=6, vocab=10, seq=3, batch=2)
ATTENTION = {"mha": dict(heads=2), "mqa": dict(heads=2, kv_heads=1, gated_mlp=True)}
BP = [("batch.tokens", 0, "batch")]


def decode_step(layers: int, attention: str) -> Model:
    return build("transformer_decode", layers=layers, **LOWER_SIZES, **ATTENTION[attention])


def megatron(model: Model, layers: int) -> list[tuple[str, int, str]]:
    """Query heads (wq dim 1) and the MLP hidden dim (w_up, w_gate dim 1) on `model`."""
    names = ("attn.wq", "mlp.w_up", "mlp.w_gate")
    return [(f"layers.{l}.{w}", 1, "model") for l in range(layers) for w in names
            if f"layers.{l}.{w}" in model.params]


def param_dims(checked: Checked) -> dict[str, tuple]:
    return {p.name: dims for p, dims in zip(checked.nda.function.params, checked.lowered.param_dims)}


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("layers", DEPTHS)
def test_batch_parallel_decode_needs_no_collective(layers, attention):
    # Inference has no gradients and no loss: every op is per sequence, the
    # cache is split by sequence with its tokens, and the results stay split.
    model = decode_step(layers, attention)
    checked = check_lowering(model, MESH, plan(BP))
    assert checked.counts == Counter()
    dims = param_dims(checked)
    assert all(dims[n][0] == ("batch",) for n in model.state)
    assert all(dims[0] == ("batch",) for dims in checked.lowered.result_dims)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("layers", DEPTHS)
def test_megatron_decode_all_reduces_attention_and_mlp_outputs(layers, attention):
    # Per layer, the attention output projection contracts the model-sharded
    # heads and the MLP down projection the model-sharded hidden dim: 2
    # all_reduces over `model`. Nothing else: the residual stream, the final
    # norm and the (replicated) unembedding see whole d_model, so the logits
    # need nothing, and the new k/v entries are returned as sharded as they
    # are computed. With MHA the key/value heads share the query heads'
    # color, so the cache and the entries are split by heads on `model`;
    # MQA's one key/value head cannot be split: each model shard keeps the
    # whole (batch-split) cache and computes the same k and v.
    model = decode_step(layers, attention)
    checked = check_lowering(model, MESH, plan(BP, megatron(model, layers)))
    assert counts_by_axes(checked) == Counter({("all_reduce", ("model",)): 2 * layers})
    heads = ("model",) if attention == "mha" else ()
    dims = param_dims(checked)
    assert all(dims[n] == (("batch",), (), heads, ()) for n in model.state)
    assert all(dims == (("batch",), (), heads, ()) for dims in checked.lowered.result_dims[1:])
    assert checked.lowered.result_dims[0] == (("batch",), ())


@pytest.mark.parametrize("layers", DEPTHS)
def test_vocabulary_parallel_logits_need_no_gather(layers):
    # With no softmax or loss after them, logits split by vocabulary (unembed
    # dim 1 on `model`) are returned split: still 2 all_reduces per layer.
    model = decode_step(layers, "mha")
    checked = check_lowering(model, MESH, plan(BP, megatron(model, layers), [("unembed", 1, "model")]))
    assert counts_by_axes(checked) == Counter({("all_reduce", ("model",)): 2 * layers})
    assert checked.lowered.result_dims[0] == (("batch",), ("model",))
