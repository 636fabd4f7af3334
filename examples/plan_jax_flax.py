"""Train a flax model for a few steps with the plan shardplan chose.

    tools/dev_env.sh && .venv-dev/bin/python examples/plan_jax_flax.py

A flax.linen MLP classifier with optax's Adam-W, on 8 simulated CPU
devices as a 4 x 2 mesh: `plan_jax` plans the training step (CP-SAT, the
batch found by its leading dimension, the optimizer state marked as
state, 1 MiB per device so that the plan must shard), prints the plan, and the loop runs the compiled, annotated step
beside `jax.jit` of the same step, printing both losses: XLA runs exactly
the plan, and the numbers agree.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from solver.frontend.jax_bridge import auto_mesh, plan_jax  # noqa: E402

STEPS, BATCH, FEATURES, CLASSES = 5, 64, 32, 10


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x))
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(CLASSES)(x)


model = MLP()
optimizer = optax.adamw(1e-3, weight_decay=0.01)


def train_step(params, opt_state, batch):
    def loss_fn(params):
        logits = model.apply({"params": params}, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def batches(seed: int = 0):
    rng = np.random.default_rng(seed)
    while True:
        yield {"x": rng.normal(size=(BATCH, FEATURES)).astype(np.float32),
               "labels": rng.integers(0, CLASSES, BATCH).astype(np.int32)}


def main() -> None:
    data = batches()
    batch = next(data)
    params = model.init(jax.random.key(0), batch["x"])["params"]
    opt_state = optimizer.init(params)
    mesh = auto_mesh((4, 2), ("batch", "model"))
    # On a whole A100 a model this small is fastest replicated; 1 MiB per device makes the plan shard it.
    plan = plan_jax(train_step, (params, opt_state, batch), mesh=mesh, hardware="A100-80GB", memory="1MiB",
                    state=["1.*"], time_limit_s=20)
    print(plan.summary())
    print(f"the plan's files: {plan.workdir}")
    ours, theirs = (params, opt_state), (params, opt_state)
    reference = jax.jit(train_step)
    worst = 0.0
    for step in range(STEPS):
        # The compiled step takes its arguments where the plan puts them.
        args = jax.device_put((*ours, batch), plan.in_shardings)
        *ours, loss = plan.function(*args)
        *theirs, want = reference(*theirs, batch)
        worst = max(worst, abs(float(loss) - float(want)))
        print(f"step {step}: loss {float(loss):.6f} (jax.jit: {float(want):.6f})")
        batch = next(data)
    print(f"max |loss difference| over {STEPS} steps: {worst:.2e}")


if __name__ == "__main__":
    main()
