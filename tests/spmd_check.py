"""Execution check shared by the lowering tests: run a program globally and
its device-local lowering on the simulated mesh, and compare."""

from __future__ import annotations

import numpy as np

from ir.interpret import run, run_spmd, shard, unshard
from ir.lower import Lowered
from ir.models.base import Model
from ir.ops import verify


def model_inputs(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 inputs; token ids valid for the embedding; Adam's second moments non-negative."""
    fn = model.function
    rng = np.random.default_rng(seed)
    vocab = min((op.operands[0].type.shape[0] for op in fn.ops if op.kind == "gather"), default=1)
    out = {}
    for p in fn.params:
        if p.type.dtype == "i32":
            out[p.name] = rng.integers(0, vocab, p.type.shape).astype(np.int32)
        elif p.name == "opt.step":
            out[p.name] = np.array(2.0)
        else:
            x = rng.uniform(0.5, 1.5, p.type.shape) * rng.choice([-1.0, 1.0], p.type.shape)
            out[p.name] = x * x if p.name.startswith("opt.v.") else x
    if fn.name.startswith("simplified_attention"):  # its mock softmax divides by a mean: keep it away from 0
        out = {k: np.abs(v) for k, v in out.items()}
    return out


def assert_lowering_matches(model: Model, lowered: Lowered, seed: int = 0, rtol: float = 1e-9) -> None:
    """The device-local program reproduces the global one on every result."""
    fn, local = model.function, lowered.function
    verify(local)
    mesh = local.mesh
    inputs = model_inputs(model, seed)
    want = run(fn, inputs, float_dtype=np.float64)
    sharded = {p.name: shard(inputs[p.name], dims, mesh) for p, dims in zip(fn.params, lowered.param_dims)}
    got = run_spmd(local, sharded, float_dtype=np.float64)
    for r, blocks, dims, expected in zip(fn.results, got, lowered.result_dims, want):
        actual = unshard(blocks, dims, mesh, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol, err_msg=f"result %{r.name}")


def assert_pipeline_matches(model: Model, pipeline, seed: int = 3) -> None:
    """Run a pipelined (or accumulated) step's tasks in schedule order on the
    simulated mesh and compare every result with the unpartitioned step."""
    from ir.interpret import random_inputs
    from ir.pipeline_run import run_pipeline

    inputs = random_inputs(model.function, seed=seed)
    expected = run(model.function, inputs, float_dtype=np.float64)
    got = run_pipeline(pipeline, inputs, float_dtype=np.float64)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)
