"""The tracing builder: helpers emit the right ops and compute the right values."""

import numpy as np
import pytest

from ir.builder import Builder
from ir.core import IRError
from ir.interpret import random_inputs, run


def run_one(build, shapes, seed=0, **kw):
    """Build a function from `build(b, *params)` and run it in float64."""
    b = Builder("t")
    params = [b.param(f"p{i}", s) for i, s in enumerate(shapes)]
    fn = b.build([build(b, *params)])
    inputs = {k: v.astype(np.float64) for k, v in random_inputs(fn, seed).items()}
    return run(fn, inputs, float_dtype=np.float64)[0], [inputs[p.name] for p in params], fn


def test_softmax_and_log_softmax():
    got, (x,), _ = run_one(lambda b, x: b.softmax(x, axis=1), [(3, 5, 7)])
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-12)
    got, (x,), _ = run_one(lambda b, x: b.log_softmax(x), [(3, 5)])
    np.testing.assert_allclose(got, x - x.max(-1, keepdims=True)
                               - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)), rtol=1e-12)


def test_layer_norm_and_rms_norm():
    got, (x, g, beta), _ = run_one(lambda b, x, g, bb: b.layer_norm(x, g, bb, eps=1e-5), [(3, 5, 7), (7,), (7,)])
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5) * g + beta, rtol=1e-10)
    got, (x, g), _ = run_one(lambda b, x, g: b.rms_norm(x, g, eps=1e-6), [(3, 7), (7,)])
    np.testing.assert_allclose(got, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * g, rtol=1e-10)


def test_mean_and_keepdims_reductions():
    got, (x,), _ = run_one(lambda b, x: b.mean(x, [0, 2]), [(3, 5, 7)])
    np.testing.assert_allclose(got, x.mean((0, 2)), rtol=1e-12)
    got, (x,), _ = run_one(lambda b, x: b.max(x, 1, keepdims=True), [(3, 5)])
    np.testing.assert_allclose(got, x.max(1, keepdims=True))


@pytest.mark.parametrize("spec,shapes", [
    ("bsd,df->bsf", [(2, 3, 5), (5, 7)]),
    ("bsd,bd->bs", [(2, 3, 5), (2, 5)]),
    ("ij,kj->ki", [(3, 5), (7, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 7, 4)]),
    ("ij,ij->i", [(3, 5), (3, 5)]),
])
def test_einsum_matches_numpy(spec, shapes):
    got, (a, c), fn = run_one(lambda b, x, y: b.einsum(spec, x, y, name="out"), shapes)
    np.testing.assert_allclose(got, np.einsum(spec, a, c), rtol=1e-12)
    assert fn.results[0].name == "out"


def test_einsum_rejects_single_operand_sums():
    b = Builder("t")
    x, y = b.param("x", [3, 5]), b.param("y", [5, 7])
    with pytest.raises(IRError, match="summing"):
        b.einsum("ij,jk->j", x, y)


def test_matmul_batched_and_2d():
    got, (a, c), _ = run_one(lambda b, x, y: b.matmul(x, y), [(2, 3, 5), (2, 5, 7)])
    np.testing.assert_allclose(got, a @ c, rtol=1e-12)
    got, (a, c), _ = run_one(lambda b, x, y: b.matmul(x, y), [(2, 3, 5), (5, 7)])
    np.testing.assert_allclose(got, a @ c, rtol=1e-12)


def test_binary_ops_broadcast_numpy_style_and_lift_scalars():
    got, (x, y), fn = run_one(lambda b, x, y: b.add(b.mul(x, 3.0), y), [(3, 5), (5,)])
    np.testing.assert_allclose(got, 3 * x + y, rtol=1e-12)
    kinds = [op.kind for op in fn.ops]
    assert kinds == ["full", "mul", "broadcast_in_dim", "add"]
    got, (x,), _ = run_one(lambda b, x: b.select(b.compare(x, 0.0, "gt"), x, 0.0), [(3, 5)])
    np.testing.assert_allclose(got, np.maximum(x, 0))


def test_value_names_are_checked():
    b = Builder("t")
    x = b.param("x", [3])
    with pytest.raises(IRError, match="already used"):
        b.param("x", [3])
    with pytest.raises(IRError, match="invalid value name"):
        b.neg(x, name="has space")
    y = b.neg(x, name="0")  # an explicit numeric name: auto names skip it
    assert b.neg(y).name == "1"


def test_shape_errors_surface_at_the_builder_call():
    b = Builder("t")
    x, w = b.param("x", [3, 5]), b.param("w", [4, 7])
    with pytest.raises(IRError, match="contracting dimension sizes differ"):
        b.matmul(x, w)
    with pytest.raises(IRError, match="cannot reshape"):
        b.reshape(x, [4, 4])


def test_build_checks_the_types_of_ops_it_did_not_make_and_the_order_of_all():
    # `emit` inferred its ops' types, so `build` checks them for SSA and order alone; an op put in the
    # body otherwise (ring attention rewires ops so) is checked in full.
    from ir.core import Op, TensorType, Value, VerifyError

    b = Builder("t")
    x = b.param("x", (4, 8))
    y = b.exp(x, "y")
    wrong = Value("z", TensorType((8, 4), "f32"))  # exp keeps its operand's shape
    b.take_name("z")
    b.body.append(Op("exp", (y,), (wrong,), b.body[-1].attrs))
    with pytest.raises(VerifyError, match="type mismatch in op #1 .*exp gives tensor<4x8xf32>"):
        b.build([wrong])
    b.body[-1] = Op("exp", (y,), (Value("z", TensorType((4, 8), "f32")),), b.body[-1].attrs)
    assert b.build([b.body[-1].results[0]]).ops[-1].kind == "exp"
    # An emitted op out of order is still an error: its operand is used before it is defined.
    b.body.reverse()
    with pytest.raises(VerifyError, match="used before it is defined"):
        b.build([y])
