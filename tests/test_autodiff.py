"""Reverse-mode autodiff and training steps (per-op VJPs are checked in test_ops)."""

import numpy as np
import pytest

from ir.autodiff import SGD, Adam, grad, training_step
from ir.builder import Builder
from ir.core import IRError, Mesh
from ir.interpret import random_inputs, run
from ir.models.base import Model


def mlp_forward():
    b = Builder("mlp")
    x, target = b.param("x", [4, 3]), b.param("target", [4, 2])
    w1, w2 = b.param("w1", [3, 5]), b.param("w2", [5, 2])
    err = b.sub(b.matmul(b.relu(b.matmul(x, w1)), w2), target)
    loss = b.mean(b.mul(err, err), [0, 1])
    return Model(b.build([loss]), ("w1", "w2"), ("x", "target"))


def numpy_mlp(x, target, w1, w2):
    """Loss and hand-derived gradients of the MLP."""
    h = x @ w1
    a = np.maximum(h, 0)
    err = a @ w2 - target
    dy = 2 * err / err.size
    return np.mean(err**2), x.T @ ((dy @ w2.T) * (h > 0)), a.T @ dy


def f64_inputs(fn, seed=0):
    return {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in random_inputs(fn, seed).items()}


def test_grad_matches_hand_derived_mlp_gradients():
    model = mlp_forward()
    g = grad(model.function, ["w1", "w2"])
    inputs = f64_inputs(model.function)
    loss, dw1, dw2 = run(g, inputs, float_dtype=np.float64)
    want = numpy_mlp(inputs["x"], inputs["target"], inputs["w1"], inputs["w2"])
    for got, expected in zip((loss, dw1, dw2), want):
        np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_backward_does_no_dead_work():
    # Two forward matmuls; backward: d w2, d a (to reach w1), d w1 and no d x.
    g = grad(mlp_forward().function, ["w1", "w2"])
    assert sum(op.kind == "dot_general" for op in g.ops) == 5
    # Differentiating w2 alone needs one backward matmul and nothing below it.
    g2 = grad(mlp_forward().function, ["w2"])
    assert sum(op.kind == "dot_general" for op in g2.ops) == 3
    assert not any(op.kind == "select" for op in g2.ops)


def test_fan_out_gradients_accumulate():
    # loss = sum(w * w + exp(w)): w is used three times.
    b = Builder("fan")
    w = b.param("w", [3])
    loss = b.sum(b.add(b.mul(w, w), b.exp(w)), 0)
    g = grad(b.build([loss]), ["w"])
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(run(g, [x], float_dtype=np.float64)[1], 2 * x + np.exp(x), rtol=1e-12)


def test_integer_inputs_get_no_gradient_and_cannot_be_differentiated():
    b = Builder("embed")
    table, tokens = b.param("table", [5, 3]), b.param("tokens", [4], "i32")
    loss = b.sum(b.gather(table, tokens), [0, 1])
    fn = b.build([loss])
    g = grad(fn, ["table"])
    counts = run(g, {"table": np.zeros((5, 3)), "tokens": np.array([1, 1, 4, 0], np.int32)},
                 float_dtype=np.float64)[1]
    np.testing.assert_array_equal(counts[:, 0], [1, 2, 0, 0, 1])
    with pytest.raises(IRError, match="not a float tensor"):
        grad(fn, ["tokens"])
    with pytest.raises(IRError, match="has no parameter 'nope'; parameters: \\['table', 'tokens'\\]"):
        grad(fn, ["nope"])


def test_unused_parameter_gets_a_zero_gradient():
    b = Builder("unused")
    w = b.param("w", [2])
    b.param("u", [3])
    g = grad(b.build([b.sum(w, 0)]), ["w", "u"])
    np.testing.assert_array_equal(run(g, [np.ones(2), np.ones(3)])[2], np.zeros(3))


def test_loss_must_be_a_float_scalar_and_collectives_are_refused():
    b = Builder("vector")
    w = b.param("w", [2])
    with pytest.raises(IRError, match="float scalar loss"):
        grad(b.build([b.neg(w)]), ["w"])
    b = Builder("local", Mesh.of(x=2))
    w = b.param("w", [2])
    fn = b.build([b.sum(b.op("all_reduce", [w], axes=["x"]), 0)])
    with pytest.raises(NotImplementedError, match="no VJP for all_reduce"):
        grad(fn, ["w"])


def test_sgd_step_matches_numpy():
    model = mlp_forward()
    step = training_step(model, optimizer=SGD(lr=0.1))
    assert step.state == () and step.params == ("w1", "w2") and step.inputs == ("x", "target")
    inputs = f64_inputs(model.function, seed=2)
    loss, w1, w2 = run(step.function, inputs, float_dtype=np.float64)
    ref_loss, dw1, dw2 = numpy_mlp(inputs["x"], inputs["target"], inputs["w1"], inputs["w2"])
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    np.testing.assert_allclose(w1, inputs["w1"] - 0.1 * dw1, rtol=1e-12)
    np.testing.assert_allclose(w2, inputs["w2"] - 0.1 * dw2, rtol=1e-12)
    assert [r.name for r in step.function.results[1:]] == ["w1.new", "w2.new"]


def numpy_adam(w, g, m, v, step, opt):
    t = step + 1
    m = opt.b1 * m + (1 - opt.b1) * g
    v = opt.b2 * v + (1 - opt.b2) * g * g
    m_hat, v_hat = m / (1 - opt.b1**t), v / (1 - opt.b2**t)
    return w - opt.lr * m_hat / (np.sqrt(v_hat) + opt.eps), m, v


def test_adam_step_matches_numpy():
    opt = Adam(lr=0.01, b1=0.8, b2=0.95, eps=1e-6)
    model = mlp_forward()
    step = training_step(model, optimizer=opt)
    assert step.state == ("opt.m.w1", "opt.v.w1", "opt.m.w2", "opt.v.w2", "opt.step")
    inputs = f64_inputs(step.function, seed=4)
    inputs["opt.v.w1"], inputs["opt.v.w2"] = inputs["opt.v.w1"] ** 2, inputs["opt.v.w2"] ** 2  # v >= 0
    inputs["opt.step"] = np.array(3.0)
    out = dict(zip([r.name for r in step.function.results], run(step.function, inputs, float_dtype=np.float64)))
    _, dw1, dw2 = numpy_mlp(inputs["x"], inputs["target"], inputs["w1"], inputs["w2"])
    for name, g in (("w1", dw1), ("w2", dw2)):
        w, m, v = numpy_adam(inputs[name], g, inputs[f"opt.m.{name}"], inputs[f"opt.v.{name}"], 3.0, opt)
        np.testing.assert_allclose(out[f"{name}.new"], w, rtol=1e-12)
        np.testing.assert_allclose(out[f"opt.m.{name}.new"], m, rtol=1e-12)
        np.testing.assert_allclose(out[f"opt.v.{name}.new"], v, rtol=1e-12)
    assert out["opt.step.new"] == 4.0


def test_training_step_of_a_bare_function_needs_params():
    fn = mlp_forward().function
    with pytest.raises(IRError, match="needs the names of the parameters"):
        training_step(fn)
    step = training_step(fn, ["w2"], SGD())
    assert step.params == ("w2",) and set(step.inputs) == {"x", "target", "w1"}
