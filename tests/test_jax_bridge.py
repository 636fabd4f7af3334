"""plan_jax (solver/frontend/jax_bridge.py): a jax function in, its plan compiled by
XLA out, on 8 simulated CPU devices in a process of its own (XLA reads the
device count when jax is first imported); skipped without the `jax` extra."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("jax")

SCRIPT = r'''
import json, sys
import numpy as np, jax, jax.numpy as jnp
from solver.frontend.jax_bridge import auto_mesh, plan_jax, xla_collectives

def loss(params, batch):
    h = jax.nn.relu(batch["x"] @ params["w1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)

def step(params, batch):
    value, grads = jax.value_and_grad(loss)(params, batch)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

rng = np.random.default_rng(0)
params = {"w1": jnp.asarray(rng.normal(size=(16, 64)), jnp.float32),
          "w2": jnp.asarray(rng.normal(size=(64, 8)), jnp.float32)}
batch = {"x": jnp.asarray(rng.normal(size=(32, 16)), jnp.float32),
         "y": jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)}
plan = plan_jax(step, (params, batch), mesh=auto_mesh((4, 2), ("batch", "model")), hardware="A100-80GB",
                solver="none", inputs=["1.*"], workdir=sys.argv[1])
got, want = plan.function(params, batch), jax.jit(step)(params, batch)
print(json.dumps({
    "diff": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))),
    "in": [str(s.spec) for s in jax.tree.leaves(plan.in_shardings)],
    "out": [str(s.spec) for s in jax.tree.leaves(plan.out_shardings)],
    "xla": xla_collectives(plan.function.as_text()),
    "summary": plan.summary(),
}))
'''


def test_plan_jax_runs_the_plan_under_xla(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["diff"] < 1e-5  # the sharded step computes what jax.jit computes
    # Arguments are named by pytree path: 1.x and 1.y are the batch, sharded on its rows.
    assert report["in"] == ["P(None, None)", "P(None, None)", "P('batch', None)", "P('batch', None)"]
    assert report["out"] == ["P()", "P(None, None)", "P(None, None)"]
    # Batch parallelism: one all-reduce per gradient and one for the loss, as planned.
    assert report["xla"]["all_reduce"]["tensors"] == 3 and set(report["xla"]) == {"all_reduce"}
    assert "collectives all_reduce 3" in report["summary"]
    spec = (tmp_path / "step.yaml").read_text()
    assert "param_names: [\"0.w1\", \"0.w2\", \"1.x\", \"1.y\"]" in spec and (tmp_path / "step.annotated.mlir").exists()
