"""Training steps of every model builder: the IR gradient against central
finite differences (float64), and the Adam step against numpy."""

import numpy as np
import pytest
from spmd_check import model_inputs

from ir.autodiff import Adam, grad, training_step
from ir.interpret import run
from ir.models import build

# Small sizes, all different, so a swapped dimension shows.
MODELS = {
    "mlp": ("mlp", dict(batch=3, d_in=5, hidden=7, d_out=4)),
    "deep_mlp": ("deep_mlp", dict(layers=3, d_model=5, batch=4)),
    "simplified_attention": ("simplified_attention", dict(seq=5, d_model=4, d_head=3)),
    "attention_single_head": ("attention", dict(batch=2, seq=5, d_model=6, heads=1, head_dim=3)),
    "attention_multi_head_causal": ("attention", dict(batch=2, seq=5, d_model=6, heads=2, head_dim=3, causal=True)),
    "transformer_mha": ("transformer", dict(layers=2, d_model=6, heads=2, head_dim=3, mlp_hidden=7, vocab=11,
                                            seq=5, batch=2)),
    "transformer_mqa_gated_tied": ("transformer", dict(layers=2, d_model=6, heads=3, kv_heads=1, head_dim=2,
                                                       mlp_hidden=7, vocab=11, seq=5, batch=2, gated_mlp=True,
                                                       tied_embeddings=True)),
    "transformer_fused_layernorm": ("transformer", dict(layers=1, d_model=6, heads=2, head_dim=3, mlp_hidden=7,
                                                        vocab=11, seq=4, batch=2, fused_qkv=True, norm="layer")),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    name, sizes = MODELS[request.param]
    return build(name, **sizes)


def test_gradient_matches_central_differences(model):
    fn = model.function
    gradient = grad(fn, model.params)
    inputs = model_inputs(model, seed=1)
    loss, *grads = run(gradient, inputs, float_dtype=np.float64)
    assert np.isfinite(loss)

    def loss_at(name: str, value: np.ndarray) -> float:
        return float(run(fn, {**inputs, name: value}, float_dtype=np.float64)[0])

    rng = np.random.default_rng(2)
    eps = 1e-6
    for name, g in zip(model.params, grads):
        u = rng.standard_normal(g.shape)
        numeric = (loss_at(name, inputs[name] + eps * u) - loss_at(name, inputs[name] - eps * u)) / (2 * eps)
        assert float(np.sum(g * u)) == pytest.approx(numeric, rel=1e-6, abs=1e-9), name


def test_adam_step_matches_numpy(model):
    opt = Adam(lr=0.05, b1=0.85, b2=0.99, eps=1e-7)
    step = training_step(model, optimizer=opt)
    inputs = model_inputs(step, seed=3)  # second moments non-negative, opt.step = 2
    results = run(step.function, inputs, float_dtype=np.float64)
    out = dict(zip((r.name for r in step.function.results), results))
    fwd_inputs = {p.name: inputs[p.name] for p in model.function.params}
    grads = run(grad(model.function, model.params), fwd_inputs, float_dtype=np.float64)[1:]
    t = 3.0
    for name, g in zip(model.params, grads):
        m = opt.b1 * inputs[f"opt.m.{name}"] + (1 - opt.b1) * g
        v = opt.b2 * inputs[f"opt.v.{name}"] + (1 - opt.b2) * g**2
        w = inputs[name] - opt.lr * (m / (1 - opt.b1**t)) / (np.sqrt(v / (1 - opt.b2**t)) + opt.eps)
        np.testing.assert_allclose(out[f"opt.m.{name}.new"], m, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(out[f"opt.v.{name}.new"], v, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(out[f"{name}.new"], w, rtol=1e-12, atol=1e-15)
    assert out["opt.step.new"] == t
    assert np.isclose(results[0], run(model.function, fwd_inputs, float_dtype=np.float64)[0], rtol=1e-14)


def test_training_step_structure(model):
    step = training_step(model)
    fn = step.function
    assert [p.name for p in fn.params][: len(model.function.params)] == [p.name for p in model.function.params]
    assert step.state == tuple(n for p in model.params for n in (f"opt.m.{p}", f"opt.v.{p}")) + ("opt.step",)
    assert [r.name for r in fn.results[1:1 + len(model.params)]] == [f"{p}.new" for p in model.params]
    for p in model.params:  # every updated parameter keeps its type
        assert fn.param(p).type == next(r for r in fn.results if r.name == f"{p}.new").type
