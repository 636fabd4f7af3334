"""Write the long-context fixture: a flax.linen transformer's training step
(tools/export_real_fixtures.py's 3-layer nn.scan model: flax's
MultiHeadDotProductAttention with a causal mask, optax.adamw) on one
sequence of 16,384 tokens, traced with abstract shapes (nothing is
allocated or run), as tests/fixtures/long_context/scan_train_16k.mlir with
its spec (8 H100s on one `context` axis). tests/test_long_context.py
imports and plans it: no jax needed there.

    .venv-dev/bin/python tools/export_long_context.py   # tools/dev_env.sh makes .venv-dev
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from export_real_fixtures import (  # noqa: E402
    OPTIMIZER,
    PINNED,
    VERSIONS,
    ScannedLM,
    lm_loss,
    train_step,
    write_abstract_spec,
)

SEQ = 16384
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "long_context" / "scan_train_16k.mlir"


def main() -> None:
    if VERSIONS != PINNED:
        raise SystemExit(f"pinned versions {PINNED}, installed {VERSIONS}: run tools/dev_env.sh")
    model = ScannedLM()
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])

    def loss_fn(params, batch):
        return lm_loss(model.apply({"params": params}, batch["input_ids"]), batch["input_ids"])

    args = {"params": params, "opt": jax.eval_shape(OPTIMIZER.init, params),
            "batch": {"input_ids": jax.ShapeDtypeStruct((1, SEQ), jnp.int32)}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(jax.jit(train_step(loss_fn)).lower(args).as_text())
    versions = ", ".join(f"{k} {v}" for k, v in VERSIONS.items())
    write_abstract_spec(OUT, args, f"from flax.linen nn.scan ({versions})",
                        f"3-layer flax.linen transformer (nn.scan) training step on one sequence of {SEQ:,} tokens",
                        "devices: 8\nmesh: {context: 8}\nhardware: H100-SXM\n")
    spec = OUT.with_suffix(".yaml")
    spec.write_text(spec.read_text().replace("tools/export_real_fixtures.py", "tools/export_long_context.py", 1))
    print(f"wrote {OUT} and its spec")


if __name__ == "__main__":
    main()
