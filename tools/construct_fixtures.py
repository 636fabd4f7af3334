"""The one-construct StableHLO fixtures (tests/fixtures/stablehlo/): small
programs jax prints for a loop, a checkpoint, a sort, a top_k, a cond or a
switch, with jax's inputs and outputs (`NAME.npz`) where they compute.
Written by `tools/export_real_fixtures.py` (all fixtures, or `--constructs`
for these alone), in the environment of tools/dev_env.sh."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np


def construct_scan(ws, x):
    """lax.scan over stacked weights: a while loop reading a slice per trip."""
    def body(h, w):
        return jnp.tanh(h @ w), h.sum()
    return jax.lax.scan(body, x, ws)


def construct_fori_loop(x):
    """A fori_loop with a static trip count whose counter enters the math."""
    return jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + i, x)


def construct_dynamic_trip_count(x, n):
    """A loop whose trip count is an argument: it cannot be unrolled."""
    return jax.lax.fori_loop(0, n, lambda i, c: c * 2.0, x)


def construct_checkpoint_grad(x):
    """The gradient of a jax.checkpoint'ed function: an optimization_barrier."""
    return jax.grad(lambda x: jax.checkpoint(lambda x: jnp.sin(x) * 2)(x).sum())(x)


def construct_top_k(x):
    """lax.top_k, as a router picks experts: chlo.top_k."""
    return jax.lax.top_k(x, 3)


def construct_top_k_grad(x, w):
    """The gradient through the values top_k picks (a scatter back to their positions)."""
    return jax.grad(lambda x: (jax.lax.top_k(x, 2)[0] * w).sum())(x)


def construct_sort_descending(x):
    """jnp's descending sort and argsort: an ascending sort of the reversed operand (an iota payload)."""
    return jnp.argsort(x, axis=0, descending=True), jnp.sort(x, axis=-1, descending=True)


def construct_sort_payload(keys, values):
    """lax.sort of (keys, values) by the keys: the values follow their keys."""
    return jax.lax.sort((keys, values), dimension=1, num_keys=1)


def construct_cond(p, x):
    """lax.cond on a run-time predicate: stablehlo.case over an index."""
    return jax.lax.cond(p > 0, lambda x: x * 2.0, lambda x: jnp.sin(x) + 1.0, x)


def construct_switch(i, x):
    """lax.switch on a run-time index (clamped into range by jax)."""
    return jax.lax.switch(i, [lambda x: x * 2.0, lambda x: x + 1.0, jnp.tanh], x)


def construct_sort_two_keys(a, b):
    """lax.sort on two keys (the importer refuses it: the registry's sort orders by one)."""
    return jax.lax.sort((a, b), dimension=0, num_keys=2)


def ties(shape, seed: int = 0):
    """Floats from a few values, with a NaN, a -0.0 and a 0.0: ties and jax's total order."""
    x = np.random.default_rng(seed).integers(-3, 3, shape).astype(np.float32)
    x.flat[1], x.flat[2], x.flat[3] = np.nan, -0.0, 0.0
    return x


CONSTRUCTS = {
    "scan": (construct_scan, (jnp.ones((3, 4, 4)), jnp.ones((2, 4)))),
    "fori_loop": (construct_fori_loop, (jnp.ones((2,)),)),
    "dynamic_trip_count": (construct_dynamic_trip_count, (jnp.ones((2,)), 3)),
    "checkpoint_grad": (construct_checkpoint_grad, (jnp.ones((2,)),)),
    "top_k": (construct_top_k, (ties((4, 8)),)),
    "top_k_grad": (construct_top_k_grad, (np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32),
                                          np.random.default_rng(2).normal(size=(4, 2)).astype(np.float32))),
    "sort_descending": (construct_sort_descending, (ties((5, 6), 3),)),
    "sort_payload": (construct_sort_payload, (ties((3, 7), 4), np.arange(21, dtype=np.float32).reshape(3, 7))),
    "sort_two_keys": (construct_sort_two_keys, (ties((6,), 5), ties((6,), 6))),
    "cond": (construct_cond, (np.float32(-1.0), np.linspace(-1, 1, 6, dtype=np.float32))),
    "switch": (construct_switch, (np.int32(5), np.linspace(-1, 1, 6, dtype=np.float32))),
}


def export_constructs(out: pathlib.Path) -> None:
    """Each construct's text and, for those that compute something to compare, jax's inputs and outputs."""
    out.mkdir(parents=True, exist_ok=True)
    for name, (fn, args) in CONSTRUCTS.items():
        (out / f"{name}.mlir").write_text(jax.jit(fn).lower(*args).as_text())
        if name not in ("scan", "fori_loop", "dynamic_trip_count", "checkpoint_grad", "sort_two_keys"):  # (no values)
            outs = jax.tree.leaves(jax.jit(fn)(*args))
            np.savez_compressed(out / f"{name}.npz", **{f"in.{i}": np.asarray(a) for i, a in enumerate(args)},
                                **{f"out.{i}": np.asarray(a) for i, a in enumerate(outs)})
        print(f"{out / name}.mlir")
