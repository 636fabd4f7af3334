"""plan_jax (solver/frontend/jax_bridge.py): a jax function in, its plan compiled by
XLA out, on 8 simulated CPU devices in a process of its own (XLA reads the
device count when jax is first imported); skipped without the `jax` extra."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, needs

needs("jax", module_level=True)

def run_on_8_devices(argv: list[str]) -> str:
    """stdout of Python running `argv` in a process of its own, on 8 simulated
    CPU devices (XLA reads the count when jax is first imported)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


# A step of a 2-layer MLP, its parameters and a batch: what both scripts plan.
PRELUDE = r'''
import json, sys
import numpy as np, jax, jax.numpy as jnp
from solver.frontend.jax_bridge import auto_mesh, batch_inputs, plan_jax, xla_collectives

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


def diff(got, want):
    """The largest difference of two pytrees, relative to the magnitude where it is above 1: a sharded step
    sums in another order, so a value in the hundreds may differ in its last bit (2**-15 from 256 up: on an
    AMD EPYC host, the `tactics` form's)."""
    # In numpy: each eager jnp op on a leaf of its own shape is an XLA compile of its own.
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.maximum(1.0, np.abs(np.asarray(b)))))
               for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
'''

SCRIPT = PRELUDE + r'''
plan = plan_jax(step, (params, batch), mesh=auto_mesh((4, 2), ("batch", "model")), hardware="A100-80GB",
                solver="none", inputs=["1.*"], workdir=sys.argv[1])
got, want = plan.function(params, batch), jax.jit(step)(params, batch)
print(json.dumps({
    "diff": diff(got, want),
    "in": [str(s.spec) for s in jax.tree.leaves(plan.in_shardings)],
    "out": [str(s.spec) for s in jax.tree.leaves(plan.out_shardings)],
    "xla": xla_collectives(plan.function.as_text()),
    "summary": plan.summary(),
}))
'''


def test_plan_jax_runs_the_plan_under_xla(tmp_path):
    report = json.loads(run_on_8_devices(["-c", SCRIPT, str(tmp_path)]).splitlines()[-1])
    assert report["diff"] < 1e-5  # the sharded step computes what jax.jit computes
    # Arguments are named by pytree path: 1.x and 1.y are the batch, sharded on its rows.
    assert report["in"] == ["P(None, None)", "P(None, None)", "P('batch', None)", "P('batch', None)"]
    assert report["out"] == ["P()", "P(None, None)", "P(None, None)"]
    # Batch parallelism: one all-reduce per gradient and one for the loss, as planned.
    assert report["xla"]["all_reduce"]["tensors"] == 3 and set(report["xla"]) == {"all_reduce"}
    assert "collectives all_reduce 3" in report["summary"]
    spec = (tmp_path / "step.yaml").read_text()
    assert yaml.safe_load(spec)["model"]["param_names"] == ["0.w1", "0.w2", "1.x", "1.y"]
    assert (tmp_path / "step.annotated.mlir").exists()


FORMS = PRELUDE + r'''
def step_of_one(args):  # one dict argument holding a `batch`
    return step(args["params"], args["batch"])

mesh = auto_mesh((4, 2), ("batch", "model"))
forms = {
    "readme": lambda w: plan_jax(step, (params, batch), mesh=mesh, hardware="A100-80GB", solver="cpsat",
                                 inputs=["1.*"], time_limit_s=10, workdir=w),
    "defaults": lambda w: plan_jax(step, (params, batch), mesh=mesh, time_limit_s=10, workdir=w),
    "hardware": lambda w: plan_jax(step, (params, batch), mesh=mesh, solver="mcts", seed=1, time_limit_s=10,
                                   hardware={"preset": "A100-80GB", "links": {"model": "nvlink"}}, memory="64MiB",
                                   workdir=w),
    "tactics": lambda w: plan_jax(step, (params, batch), mesh=mesh, solver="none", workdir=w,
                                  tactics=[{"manual": {"axis": "model", "values": {"0.w1": 1}}}]),
    "named": lambda w: plan_jax(step_of_one, ({"params": params, "batch": batch},), mesh=mesh, solver="none",
                                workdir=w),
}
out = {}
for name, form in forms.items():
    args = ({"params": params, "batch": batch},) if name == "named" else (params, batch)
    plan = form(f"{sys.argv[1]}/{name}")
    got, want = plan.function(*args), jax.jit(step_of_one if name == "named" else step)(*args)
    out[name] = {"diff": diff(got, want),
                 "in": [str(s.spec) for s in jax.tree.leaves(plan.in_shardings)],
                 "spec": open(f"{sys.argv[1]}/{name}/step.yaml").read()}
try:
    batch_inputs(({"w": jnp.ones((32, 8))}, batch))
except ValueError as err:
    out["ambiguous"] = str(err)
print(json.dumps(out))
'''


def test_every_documented_form_of_plan_jax_runs_its_plan(tmp_path):
    """The README's call, the defaults (the batch found by its leading
    dimension), a hardware mapping with a memory override and the MCTS, a
    schedule's tactics, and a batch named `batch` inside one argument."""
    report = json.loads(run_on_8_devices(["-c", FORMS, str(tmp_path)]).splitlines()[-1])
    for name in ("readme", "defaults", "hardware", "tactics", "named"):
        assert report[name]["diff"] < 1e-5, name
    assert 'inputs:\n  - 1.*' in report["defaults"]["spec"] and "preset: H100-SXM" not in report["defaults"]["spec"]
    assert "hardware: H100-SXM" in report["defaults"]["spec"]
    assert "memory: 64MiB" in report["hardware"]["spec"] and "nvlink" in report["hardware"]["spec"]
    assert report["tactics"]["in"][0] == "P(None, 'model')"  # w1's columns, as the tactic says
    assert "- 0.batch.*" in report["named"]["spec"] and report["named"]["in"][:2] == ["P('batch', None)"] * 2
    assert "cannot tell which argument is the batch" in report["ambiguous"]
    assert "arguments 0, 1 all" in report["ambiguous"] and "inputs=" in report["ambiguous"]


def test_the_flax_example_trains_with_the_plan():
    """examples/plan_jax_flax.py (needs flax and optax: tools/dev_env.sh)."""
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    lines = run_on_8_devices([str(ROOT / "examples" / "plan_jax_flax.py")]).splitlines()
    # 1 MiB per device: the plan shards, and fits
    assert "collectives all_reduce" in lines[0] and any("fits" in line for line in lines)
    assert lines[-1].startswith("max |loss difference| over 5 steps:") and float(lines[-1].split()[-1]) < 1e-5


# Grouped-query causal attention through jax.nn.dot_product_attention (its XLA
# form: the scores, mask and softmax as ops, f32 probabilities times bf16
# values), a training step of its projections, planned on a context axis.
LONG = r'''
import json, sys
import numpy as np, jax, jax.numpy as jnp
from solver.frontend.jax_bridge import auto_mesh, plan_jax
from solver.planning.scheme import axis_roles

D, H, KV, HD = 64, 8, 2, 16

def loss(params, x):
    q, k, v = (jnp.einsum("bsd,dnh->bsnh", x, params[n]) for n in ("wq", "wk", "wv"))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return jnp.mean(jnp.einsum("bsnh,nhd->bsd", o, params["wo"]).astype(jnp.float32) ** 2)

def step(params, x):
    value, grads = jax.value_and_grad(loss)(params, x)
    return value, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

def args(seq, make):
    shapes = {"wq": (D, H, HD), "wk": (D, KV, HD), "wv": (D, KV, HD), "wo": (H, HD, D)}
    return {n: make(s) for n, s in shapes.items()}, make((1, seq, D))

rng = np.random.default_rng(0)
small = args(64, lambda s: jnp.asarray(rng.normal(size=s) * 0.3, jnp.bfloat16))
mesh = auto_mesh((8,), ("context",))
plan = plan_jax(step, small, mesh=mesh, hardware="H100-SXM", solver="cpsat", inputs=["1"], workdir=sys.argv[1])
got, want = plan.function(*small), jax.jit(step)(*small)
diff = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
           for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
long = args(16384, lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16))
at_16k = plan_jax(step, long, mesh=mesh, hardware="H100-SXM", solver="cpsat", inputs=["1"],
                  workdir=sys.argv[1] + "/16k").planned
print(json.dumps({"diff": diff, "scheme": axis_roles(at_16k.model, at_16k.nda, at_16k.sharding),
                  "fits": at_16k.assessment.cost.fits}))
'''


def test_jax_attention_at_16k_tokens_imports_and_plans_context_parallel(tmp_path):
    """At 64 tokens the plan runs under XLA equal to jax (to bf16 rounding); at
    16,384 tokens CP-SAT's plan fits and splits the queries over the context
    axis (the report's scheme), the keys and values gathered."""
    report = json.loads(run_on_8_devices(["-c", LONG, str(tmp_path)]).splitlines()[-1])
    assert report["diff"] < 0.05
    assert report["fits"]
    assert "context parallel (K/V all-gathered)" in report["scheme"]["context"]
