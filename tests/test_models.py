"""Model builders: each forward loss matches an independent numpy
implementation written here, parameters have the specified names, shapes and
order, and the full-size presets build with their published sizes.

Sizes are distinct (d_model 12, heads 3, head_dim 4, seq 5, batch 2, vocab
11, ...) so a swapped dimension shows as a shape error or a wrong loss.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ir.interpret import random_inputs, run
from ir.models import BUILDERS, PRESETS, build, build_preset
from ir.models.attention import attention, simplified_attention
from ir.models.mlp import deep_mlp, mlp
from ir.models.transformer import transformer
from ir.text import parse, print_function

# The builder's normalization epsilons (Builder.rms_norm, Builder.layer_norm defaults).
RMS_EPS = 1e-6
LAYER_NORM_EPS = 1e-5

SMALL = dict(d_model=12, heads=3, head_dim=4, mlp_hidden=7, vocab=11, seq=5, batch=2)


def forward(model, seed=0, overrides=None):
    """Run the model's forward in float64; returns (loss, the inputs used)."""
    inputs = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
              for k, v in random_inputs(model.function, seed).items()}
    inputs.update(overrides or {})
    (loss,) = run(model.function, inputs, float_dtype=np.float64)
    assert loss.shape == () and np.isfinite(loss)
    return float(loss), inputs


def shapes(model):
    return {p.name: p.type.shape for p in model.function.params}


def mse(y, target):
    return np.mean((y - target) ** 2)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


# --------------------------------------------------------------------- MLPs


def test_mlp_matches_numpy():
    model = mlp(batch=3, d_in=5, hidden=7, d_out=2)
    loss, p = forward(model)
    y = np.maximum(p["x"] @ p["w1"], 0) @ p["w2"]
    np.testing.assert_allclose(loss, mse(y, p["target"]), rtol=1e-12)
    assert list(shapes(model).items()) == [("x", (3, 5)), ("target", (3, 2)), ("w1", (5, 7)), ("w2", (7, 2))]
    assert (model.function.name, model.params, model.inputs) == ("mlp", ("w1", "w2"), ("x", "target"))


def test_deep_mlp_matches_numpy():
    model = deep_mlp(layers=3, d_model=6, batch=5)
    loss, p = forward(model)
    h = p["x"]
    for i in range(3):
        h = h @ p[f"layers.{i}.w"]
        h = np.maximum(h, 0) if i < 2 else h  # no relu after the last layer
    np.testing.assert_allclose(loss, mse(h, p["target"]), rtol=1e-12)
    assert model.params == ("layers.0.w", "layers.1.w", "layers.2.w")
    assert model.function.name == "deep_mlp"
    assert all(shapes(model)[n] == (6, 6) for n in model.params)


# ---------------------------------------------------------------- attention


def test_simplified_attention_matches_numpy():
    model = simplified_attention(seq=5, d_model=7, d_head=3)
    loss, p = forward(model)
    q, k, v = (p["x"] @ p[w] for w in ("wq", "wk", "wv"))
    a = k @ q.T
    s = a / a.mean(axis=0, keepdims=True)
    np.testing.assert_allclose(loss, mse(s @ v, p["target"]), rtol=1e-10)
    assert model.params == ("wq", "wk", "wv") and model.inputs == ("x", "target")


def test_simplified_attention_emits_exactly_the_papers_ops():
    fn = simplified_attention(seq=5, d_model=7, d_head=3).function
    kinds = [op.kind for op in fn.ops]
    assert kinds == ["dot_general"] * 3 + ["transpose", "dot_general", "reduce", "full", "mul", "broadcast_in_dim",
                                           "div", "dot_general", "sub", "mul", "reduce", "full", "mul"]
    named = {op.result.name: op.result.type.shape for op in fn.ops if not op.result.name.isdigit()}
    assert {k: named[k] for k in ("q", "k", "v", "qt", "a", "s", "z")} == {
        "q": (5, 3), "k": (5, 3), "v": (5, 3), "qt": (3, 5), "a": (5, 5), "s": (5, 5), "z": (5, 3)}


def numpy_attention(p, heads, causal):
    """Softmax attention over keys with output projection, heads as a loop."""
    x = p["x"]
    weights = {w: p[w] if heads > 1 else p[w][:, None, :] for w in ("wq", "wk", "wv")}
    wo = p["wo"] if heads > 1 else p["wo"][None]
    seq, head_dim = x.shape[1], wo.shape[1]
    y = 0
    for n in range(heads):
        q, k, v = (x @ weights[w][:, n] for w in ("wq", "wk", "wv"))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim)
        if causal:
            scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
        y = y + softmax(scores) @ v @ wo[n]
    return y


@pytest.mark.parametrize("heads, causal", [(1, False), (1, True), (3, False), (3, True)])
def test_attention_matches_numpy(heads, causal):
    model = attention(batch=2, seq=5, d_model=7, heads=heads, head_dim=4, causal=causal)
    loss, p = forward(model)
    np.testing.assert_allclose(loss, mse(numpy_attention(p, heads, causal), p["target"]), rtol=1e-10)
    head_shape = (4,) if heads == 1 else (3, 4)
    assert shapes(model) == {"x": (2, 5, 7), "target": (2, 5, 7), "wq": (7, *head_shape), "wk": (7, *head_shape),
                             "wv": (7, *head_shape), "wo": (*head_shape, 7)}
    assert model.params == ("wq", "wk", "wv", "wo")


# -------------------------------------------------------------- transformer


def numpy_norm(x, p, name, norm):
    if norm == "rms":
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + RMS_EPS) * p[f"{name}.scale"]
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt(x.var(-1, keepdims=True) + LAYER_NORM_EPS) * p[f"{name}.scale"] + p[f"{name}.bias"]


def numpy_qkv(x, p, prefix, heads, kv_heads, fused):
    """q, k, v as [batch, seq, heads, head_dim]; each k/v head repeated for its
    heads / kv_heads query heads (GQA; MQA's one head for all of them)."""
    if fused:
        qkv = np.einsum("bsd,dnh->bsnh", x, p[f"{prefix}wqkv"])
        q, k, v = qkv[:, :, :heads], qkv[:, :, heads:heads + kv_heads], qkv[:, :, heads + kv_heads:]
    else:
        w = {n: p[f"{prefix}{n}"] for n in ("wq", "wk", "wv")}
        w = {n: m if m.ndim == 3 else m[:, None, :] for n, m in w.items()}
        q, k, v = (np.einsum("bsd,dnh->bsnh", x, w[n]) for n in ("wq", "wk", "wv"))
    group = heads // k.shape[2]
    return q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)


def numpy_transformer(p, cfg):
    heads, kv_heads = cfg["heads"], cfg.get("kv_heads") or cfg["heads"]
    norm, seq = cfg.get("norm", "rms"), cfg["seq"]
    h = p["embed.table"][p["batch.tokens"]]
    for layer in range(cfg["layers"]):
        pre = f"layers.{layer}."
        q, k, v = numpy_qkv(numpy_norm(h, p, f"{pre}attn_norm", norm), p, f"{pre}attn.", heads, kv_heads,
                            cfg.get("fused_qkv", False))
        scores = np.einsum("bsnh,btnh->bnst", q, k) / np.sqrt(cfg["head_dim"])
        if cfg.get("causal", True):
            scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
        context = np.einsum("bnst,btnh->bsnh", softmax(scores), v)
        h = h + np.einsum("bsnh,nhd->bsd", context, p[f"{pre}attn.wo"])
        x = numpy_norm(h, p, f"{pre}mlp_norm", norm)
        hidden = gelu(x @ p[f"{pre}mlp.w_gate"]) * (x @ p[f"{pre}mlp.w_up"]) if cfg.get("gated_mlp") \
            else gelu(x @ p[f"{pre}mlp.w_up"])
        h = h + hidden @ p[f"{pre}mlp.w_down"]
    h = numpy_norm(h, p, "final_norm", norm)
    logits = h @ p["embed.table"].T if cfg.get("tied_embeddings") else h @ p["unembed"]
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs = log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, p["batch.targets"][..., None], -1).mean()


TRANSFORMER_CASES = [
    dict(),
    dict(kv_heads=1),
    dict(kv_heads=3, gated_mlp=True, norm="layer"),
    dict(kv_heads=1, gated_mlp=True, tied_embeddings=True, fused_qkv=True),
    dict(fused_qkv=True, causal=False, norm="layer"),
    dict(kv_heads=1, causal=False, tied_embeddings=True),
    dict(gated_mlp=True, fused_qkv=True, tied_embeddings=True, norm="layer"),
    dict(heads=6, kv_heads=2, gated_mlp=True),  # grouped-query: 3 query heads per key/value head
    dict(heads=6, kv_heads=3, fused_qkv=True, causal=False),
]


@pytest.mark.parametrize("options", TRANSFORMER_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_transformer_matches_numpy(options):
    cfg = dict(SMALL, layers=2, **options)
    model = transformer(**cfg)
    targets = np.random.default_rng(1).integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"])).astype(np.int32)
    loss, p = forward(model, overrides={"batch.targets": targets})
    np.testing.assert_allclose(loss, numpy_transformer(p, cfg), rtol=1e-10)


def expected_transformer_shapes(d, heads, head_dim, hidden, vocab, kv_heads, gated, tied, fused, layer_norm):
    """Parameter names and shapes as specified, in Function order (after the batch inputs)."""
    kv_shape = (d, head_dim) if kv_heads == 1 and heads > 1 else (d, kv_heads, head_dim)

    def norm(name):
        return [(f"{name}.scale", (d,))] + ([(f"{name}.bias", (d,))] if layer_norm else [])

    out = [("embed.table", (vocab, d))]
    for layer in range(2):
        pre = f"layers.{layer}."
        out += norm(f"{pre}attn_norm")
        out += [(f"{pre}attn.wqkv", (d, heads + 2 * kv_heads, head_dim))] if fused else [
            (f"{pre}attn.wq", (d, heads, head_dim)), (f"{pre}attn.wk", kv_shape), (f"{pre}attn.wv", kv_shape)]
        out += [(f"{pre}attn.wo", (heads, head_dim, d))]
        out += norm(f"{pre}mlp_norm")
        out += [(f"{pre}mlp.w_gate", (d, hidden))] if gated else []
        out += [(f"{pre}mlp.w_up", (d, hidden)), (f"{pre}mlp.w_down", (hidden, d))]
    return out + norm("final_norm") + ([] if tied else [("unembed", (d, vocab))])


@pytest.mark.parametrize("options", TRANSFORMER_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_transformer_parameters_are_named_shaped_and_ordered(options):
    model = transformer(**{**SMALL, "layers": 2, **options})
    params = [(p.name, p.type.shape) for p in model.function.params]
    assert params[:2] == [("batch.tokens", (2, 5)), ("batch.targets", (2, 5))]
    assert all(p.type.dtype == "i32" for p in model.function.params[:2])
    heads = options.get("heads", SMALL["heads"])
    kv_heads = options.get("kv_heads") or heads
    assert params[2:] == expected_transformer_shapes(
        12, heads, 4, 7, 11, kv_heads, options.get("gated_mlp", False), options.get("tied_embeddings", False),
        options.get("fused_qkv", False), options.get("norm") == "layer")
    assert model.params == tuple(name for name, _ in params[2:])
    assert model.inputs == ("batch.tokens", "batch.targets") and model.state == ()
    assert model.function.name == "transformer"


def test_transformer_rejects_kv_heads_not_dividing_heads_and_unknown_norms():
    with pytest.raises(ValueError, match="kv_heads must divide heads"):
        transformer(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="norm"):
        transformer(norm="batch")


# ------------------------------------------------------------ every builder


SMALL_MODELS = {
    "mlp": dict(batch=3, d_in=5, hidden=7, d_out=2),
    "deep_mlp": dict(layers=3, d_model=6, batch=5),
    "simplified_attention": dict(seq=5, d_model=7, d_head=3),
    "attention": dict(batch=2, seq=5, d_model=7, heads=3, head_dim=4, causal=True),
    "transformer": dict(SMALL, layers=2, kv_heads=1, gated_mlp=True, norm="layer"),
    "transformer_decode": dict(SMALL, layers=2, kv_heads=1, gated_mlp=True, norm="layer"),
    "moe_transformer": dict(layers=2, d_model=6, heads=2, head_dim=3, experts=3, top_k=2, expert_hidden=5,
                            shared_experts=1, seq=5, batch=2, vocab=11, kv_heads=1),
    "gns": dict(nodes=5, edges=7, node_features=3, edge_features=2, latent=4, hidden=6, mlp_layers=2, steps=2),
    "unet": dict(batch=2, size=4, channels_in=2, base_channels=4, levels=1, heads=2),
}
# Builders of inference programs: their first result is a prediction, not a scalar loss.
INFERENCE = {"transformer_decode"}


def test_every_builder_has_a_small_case():
    assert set(SMALL_MODELS) == set(BUILDERS)


@pytest.mark.parametrize("name", sorted(SMALL_MODELS))
def test_metadata_partitions_the_parameters_and_text_round_trips(name):
    model = build(name, **SMALL_MODELS[name])
    names = [p.name for p in model.function.params]
    assert sorted(model.params + model.inputs + model.state) == sorted(names)
    assert not set(model.params) & set(model.inputs)
    assert model.function.name == name
    if name in INFERENCE:
        assert model.function.results[0].type.rank >= 1
    else:
        assert len(model.function.results) == 1 and model.function.results[0].type.shape == ()
    assert parse(print_function(model.function)) == model.function


def test_build_names_unknown_builders_and_arguments():
    with pytest.raises(ValueError, match=r"'resnet'.*mlp, deep_mlp, simplified_attention, attention, transformer"):
        build("resnet")
    with pytest.raises(ValueError, match=r"hiddn.*valid arguments: batch, d_in, hidden, d_out, dtype"):
        build("mlp", hiddn=4)
    with pytest.raises(ValueError, match="unknown preset 'gemma_9b'"):
        build_preset("gemma_9b")


# ------------------------------------------------------------------ presets


@pytest.mark.parametrize("name, published", [("gemma_2b", 2.51e9), ("gemma_7b", 8.54e9), ("chinchilla_32l", None)])
def test_presets_build_full_size_with_published_parameter_counts(name, published):
    model = build_preset(name)
    assert model.function.params[2].type.dtype == "bf16"
    assert len(model.function.ops) < 5000
    assert model.function.param("batch.tokens").type.shape == (PRESETS[name]["batch"], 2048)
    if published is not None:
        assert abs(model.parameter_elements / published - 1) < 0.05
    else:  # 32 layers of 4 * 4096**2 attention + 2 * 4096 * 16384 MLP weights, plus embed and unembed
        assert model.parameter_elements == pytest.approx(32 * (4 + 8) * 4096**2 + 2 * 32000 * 4096, rel=1e-3)


@pytest.mark.parametrize("kwargs,message", [
    ({"batch": 0}, "mlp: batch must be a positive integer, got 0"),
    ({"hidden": -3}, "mlp: hidden must be a positive integer, got -3"),
    ({"d_in": 2.5}, "mlp: d_in must be a positive integer, got 2.5"),
    ({"dtype": 3}, "mlp: dtype must be a string, got 3"),
])
def test_build_checks_argument_values(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build("mlp", **kwargs)


def test_build_checks_flags():
    with pytest.raises(ValueError, match="transformer: causal must be true or false, got 'yes'"):
        build("transformer", causal="yes")
