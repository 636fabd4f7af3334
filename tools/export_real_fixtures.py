"""Export training and inference steps written with real JAX libraries as
StableHLO fixtures (tests/fixtures/real/), so the importer is tested on what
jax prints for code nobody on this project wrote.

    tools/dev_env.sh                                  # once: .venv-dev with the pinned libraries
    .venv-dev/bin/python tools/export_real_fixtures.py [--only NAME ...] [--out DIR]
    .venv-dev/bin/python tools/export_real_fixtures.py --gemma-2b bench/data/gemma_2b_train.mlir

Library versions are pinned in tools/dev_env.sh (and checked below); the
exported text records them in `versions.json`. No weights are downloaded:
every model is built from a tiny config with random init (seed 0).

For each program NAME: `NAME.mlir` (`jax.jit(step).lower(*args).as_text()`),
`NAME.npz` (the flat inputs `in.<i>` and jax's outputs `out.<i>`, computed on
CPU) and `NAME.yaml`, a shardplan spec (argument names from the pytree paths,
the roles of batch inputs and state, a 4 x 2 mesh and a batch-parallel
schedule with its expected all_reduce count).

Programs (all with optax.adamw, except the decode step):
  gpt2_train          HF transformers FlaxGPT2LMHeadModel, integer-label cross-entropy
  gpt2_dropout_train  the same with dropout on (a PRNG key argument)
  llama_train         FlaxLlamaForCausalLM: RoPE, SwiGLU, grouped-query attention
  gemma_train         FlaxGemmaForCausalLM: multi-query attention, tied embeddings
  cnn_train           flax.linen CNN: convolutions, BatchNorm (batch_stats state), pooling
  mlp_train_flax      flax.linen MLP classifier, optax integer-label loss
  scan_train          flax.linen nn.scan over stacked transformer layers (a while loop)
  gpt2_decode         one GPT-2 decoding step with its key/value cache (no gradient)

and, under tests/fixtures/stablehlo/ (alone: `--constructs`), small programs
of one construct each (scan, fori_loop, a dynamic trip count, a
checkpointed gradient, top_k and its gradient, sorts, cond and switch on a
run-time operand), with jax's inputs and outputs where they compute.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import flax  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import transformers  # noqa: E402

from solver.frontend.jax_bridge import path_name  # noqa: E402

PINNED = {"jax": "0.10.2", "flax": "0.12.8", "optax": "0.2.8", "transformers": "4.57.6"}
VERSIONS = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "transformers": transformers.__version__}

BATCH, SEQ, VOCAB = 8, 16, 64
OPTIMIZER = optax.adamw(1e-3, weight_decay=0.01)


def arg_names(args: dict) -> list[str]:
    return [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]


# ------------------------------------------------------------------ training steps


def train_step(loss_fn, has_state: bool = False):
    """A step over {params, opt, batch(, state)} returning loss, new params,
    new optimizer state (and new model state)."""

    def step(args):
        if has_state:
            (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(args["params"], args["state"],
                                                                            args["batch"])
        else:
            loss, grads = jax.value_and_grad(loss_fn)(args["params"], args["batch"])
        updates, opt = OPTIMIZER.update(grads, args["opt"], args["params"])
        out = {"loss": loss, "params": optax.apply_updates(args["params"], updates), "opt": opt}
        if has_state:
            out["state"] = state
        return out

    return step


def lm_loss(logits, tokens):
    """Next-token cross-entropy with integer labels (the label shift slices)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def tokens(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)


def hf_lm(model_cls, config, dropout: bool = False):
    model = model_cls(config, seed=0, dtype=jnp.float32)
    params = model.params

    def loss_fn(params, batch):
        kwargs = {"dropout_rng": batch["dropout_key"], "train": True} if dropout else {}
        logits = model(batch["input_ids"], params=params, **kwargs).logits
        return lm_loss(logits, batch["input_ids"])

    batch = {"input_ids": tokens()}
    if dropout:
        batch["dropout_key"] = jax.random.key_data(jax.random.key(7))
    args = {"params": params, "opt": OPTIMIZER.init(params), "batch": batch}
    return train_step(loss_fn), args


def gpt2_config(**extra):
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4, **extra)


def gpt2_train():
    return hf_lm(transformers.FlaxGPT2LMHeadModel, gpt2_config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def gpt2_dropout_train():
    return hf_lm(transformers.FlaxGPT2LMHeadModel, gpt2_config(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1),
                 dropout=True)


def llama_train():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    return hf_lm(transformers.FlaxLlamaForCausalLM, config)


def gemma_train():
    config = transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                      max_position_embeddings=SEQ)
    return hf_lm(transformers.FlaxGemmaForCausalLM, config)


class CNN(nn.Module):
    """A CNN with BatchNorm as ResNets write it (a conv before a BatchNorm has
    no bias): conv-BN-relu-max pool twice, an average pool, dense layers."""

    @nn.compact
    def __call__(self, x, train: bool):
        for features in (8, 16):
            x = nn.Conv(features, (3, 3), use_bias=False)(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.relu(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def cnn_train():
    model = CNN()
    rng = np.random.default_rng(2)
    images = rng.normal(size=(BATCH, 16, 16, 3)).astype(np.float32)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    variables = model.init(jax.random.key(0), images, train=False)

    def loss_fn(params, state, batch):
        logits, updates = model.apply({"params": params, **state}, batch["images"], train=True,
                                      mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
        return loss, updates

    params = variables["params"]
    args = {"params": params, "opt": OPTIMIZER.init(params), "batch": {"images": images, "labels": labels},
            "state": {"batch_stats": variables["batch_stats"]}}
    return train_step(loss_fn, has_state=True), args


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64)(x))
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(10)(x)


def mlp_train_flax():
    model = MLP()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCH, 32)).astype(np.float32)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    params = model.init(jax.random.key(0), x)["params"]

    def loss_fn(params, batch):
        logits = model.apply({"params": params}, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    args = {"params": params, "opt": OPTIMIZER.init(params), "batch": {"x": x, "labels": labels}}
    return train_step(loss_fn), args


class Block(nn.Module):
    """A pre-norm transformer block (flax.linen attention and MLP), scan-compatible."""

    @nn.compact
    def __call__(self, x, _):
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        # No projection biases: the key bias has a zero gradient (softmax ignores a per-query shift), and
        # Adam's first step turns its rounding noise into +-lr steps no two float32 runs agree on.
        x = x + nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32, use_bias=False)(h, h, mask=mask)
        h = nn.LayerNorm()(x)
        x = x + nn.Dense(32)(nn.gelu(nn.Dense(64)(h)))
        return x, None


class ScannedLM(nn.Module):
    layers: int = 3

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(VOCAB, 32)
        x = embed(ids)
        stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers)
        x, _ = stack(name="layers")(x, None)
        return embed.attend(nn.LayerNorm()(x))


def scan_train():
    model = ScannedLM()
    ids = tokens(4)
    params = model.init(jax.random.key(0), ids)["params"]

    def loss_fn(params, batch):
        return lm_loss(model.apply({"params": params}, batch["input_ids"]), batch["input_ids"])

    args = {"params": params, "opt": OPTIMIZER.init(params), "batch": {"input_ids": ids}}
    return train_step(loss_fn), args


def gpt2_decode():
    """One token of greedy decoding with HF's key/value cache: the cache is
    state, updated in place with dynamic_update_slice at the position."""
    model = transformers.FlaxGPT2LMHeadModel(gpt2_config(), seed=0, dtype=jnp.float32)
    prompt = tokens(5)[:, :4]
    cache = model.init_cache(BATCH, SEQ)
    mask = jnp.ones((BATCH, SEQ), jnp.int32)  # HF masks the cache beyond its index itself
    out = model(prompt, attention_mask=mask, past_key_values=cache,
                position_ids=jnp.broadcast_to(jnp.arange(4), (BATCH, 4)))
    cache = jax.tree.map(np.asarray, out.past_key_values)

    def step(args):
        ids = args["batch"]["input_ids"]
        position = args["batch"]["position"]
        out = model(ids, attention_mask=mask, params=args["params"], past_key_values=args["state"]["cache"],
                    position_ids=jnp.broadcast_to(position, ids.shape))
        return {"next_token": jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32),
                "state": {"cache": out.past_key_values}}

    next_ids = np.asarray(jnp.argmax(out.logits[:, -1], axis=-1)).astype(np.int32)[:, None]
    args = {"params": model.params, "batch": {"input_ids": next_ids, "position": np.int32(4)},
            "state": {"cache": cache}}
    return step, args


PROGRAMS = {f.__name__: f for f in (gpt2_train, gpt2_dropout_train, llama_train, gemma_train, cnn_train,
                                    mlp_train_flax, scan_train, gpt2_decode)}

# Spec fields per program: which batch input the BP schedule shards, and the
# expected all_reduce count in terms of P (trainable parameter tensors).
BP_INPUT = {"cnn_train": "batch.images", "mlp_train_flax": "batch.x"}

SPEC = """\
# Generated by tools/export_real_fixtures.py from {library} ({versions}).
description: {description}
model:
  stablehlo: {name}.mlir
  param_names: [{names}]
  inputs: ["batch.*"]
  state: [{state}]
devices: 8
mesh: {{batch: 4, model: 2}}
hardware: A100-80GB
schedules:
  BP:
    tactics:
      - manual: {{axis: batch, values: {{{bp_input}: 0}}}}
    expect:
      all_reduce: {bp}   # {bp_formula}{extra}
      fits: true
"""


def bp_expectation(name: str, names: list[str]) -> tuple[int, str]:
    """Batch parallelism's all_reduce count (PartIR's Table 2) and its formula."""
    params = [n for n in names if n.startswith("params.")]
    if name == "gpt2_decode":
        return 0, "inference: each sequence is decoded on its own devices"
    if name == "cnn_train":
        return len(params) + 1 + 3 * 2, (f"P + 1 + 3B, P = {len(params)}, B = 2 BatchNorm layers: each reduces its "
                                         "batch mean and mean of squares, and its statistics' cotangent")
    if name == "scan_train":
        stacked = [n for n in params if n.startswith("params.layers.")]
        count = len(stacked) * ScannedLM.layers + len(params) - len(stacked) + 1
        return count, (f"S L + (P - S) + 1, S = {len(stacked)} stacked of P = {len(params)}, L = "
                       f"{ScannedLM.layers}: the unrolled scan builds a stacked gradient one layer slice at a time")
    return len(params) + 1, f"P + 1, P = {len(params)}: one per parameter gradient and one for the loss"

DESCRIPTIONS = {
    "gpt2_train": ("HF transformers FlaxGPT2LMHeadModel", "GPT-2 (2 layers, d 32, 4 heads) Adam-W training step"),
    "gpt2_dropout_train": ("HF transformers FlaxGPT2LMHeadModel", "GPT-2 training step with dropout"),
    "llama_train": ("HF transformers FlaxLlamaForCausalLM", "Llama (RoPE, SwiGLU, 4 heads / 2 KV heads) training step"),
    "gemma_train": ("HF transformers FlaxGemmaForCausalLM", "Gemma (multi-query attention, tied embeddings) training "
                    "step"),
    "cnn_train": ("flax.linen", "CNN with BatchNorm and pooling, training step"),
    "mlp_train_flax": ("flax.linen", "MLP classifier with the integer-label loss, training step"),
    "scan_train": ("flax.linen nn.scan", "3-layer transformer scanned over stacked layers, training step"),
    "gpt2_decode": ("HF transformers FlaxGPT2LMHeadModel", "GPT-2 decoding step with a key/value cache"),
}


def write_spec(name: str, out: pathlib.Path, names: list[str]) -> None:
    library, description = DESCRIPTIONS[name]
    state = ", ".join(f'"{p}.*"' for p in ("opt", "state") if any(n.startswith(p + ".") for n in names))
    bp, bp_formula = bp_expectation(name, names)
    extra = ("\n      all_slice: 5   # 1 + 2L, L = 2: the random bits of the embedding and residual dropouts come from "
             "counters (an iota, whose counting dims are opaque) made whole on every device, then sliced to the batch "
             "shard: local, no communication") if name == "gpt2_dropout_train" else ""
    text = SPEC.format(library=library, versions=", ".join(f"{k} {v}" for k, v in VERSIONS.items()),
                       bp=bp, bp_formula=bp_formula, extra=extra,
                       description=description + " (exported from jax as StableHLO, 4-way batch x 2-way model)",
                       name=name, names=", ".join(names), state=state,
                       bp_input=BP_INPUT.get(name, "batch.input_ids"))
    (out / f"{name}.yaml").write_text(text)


def export(name: str, out: pathlib.Path) -> None:
    step, args = PROGRAMS[name]()
    args = jax.tree.map(np.asarray, args)
    jitted = jax.jit(step)
    text = jitted.lower(args).as_text()
    (out / f"{name}.mlir").write_text(text)
    flat_in = jax.tree.leaves(args)
    flat_out = jax.tree.leaves(jitted(args))
    arrays = {f"in.{i}": np.asarray(a) for i, a in enumerate(flat_in)}
    arrays |= {f"out.{i}": np.asarray(a) for i, a in enumerate(flat_out)}
    np.savez_compressed(out / f"{name}.npz", **arrays)
    write_spec(name, out, arg_names(args))
    print(f"{out / name}.mlir: {len(text.splitlines())} lines, {len(flat_in)} arguments, {len(flat_out)} results")


def export_gemma_2b(path: pathlib.Path) -> None:
    """The text of a Gemma-2B-shaped training step (18 layers, d 2048, 8 heads
    of 256, MQA, SwiGLU 16384, vocab 256,000, batch 8 x seq 2048), traced
    with abstract shapes (no parameters are allocated), for bench/import.py."""
    config = transformers.GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384,
                                      num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                                      head_dim=256, max_position_embeddings=2048)
    model = transformers.FlaxGemmaForCausalLM(config, _do_init=False, dtype=jnp.bfloat16)
    params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, 8)))
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16), params)

    def loss_fn(params, batch):
        return lm_loss(model(batch["input_ids"], params=params).logits, batch["input_ids"])

    args = {"params": params, "opt": jax.eval_shape(OPTIMIZER.init, params),
            "batch": {"input_ids": jax.ShapeDtypeStruct((8, 2048), jnp.int32)}}
    text = jax.jit(train_step(loss_fn)).lower(args).as_text()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    names = ", ".join(arg_names(args))
    path.with_suffix(".yaml").write_text(
        f"# Written by tools/export_real_fixtures.py --gemma-2b: a Gemma-2B-shaped Adam-W step (HF Flax).\n"
        f"description: Gemma-2B-shaped training step, batch 8 x seq 2048, on 32 H100s (8 x 4)\n"
        f"model:\n  stablehlo: {path.name}\n  param_names: [{names}]\n  inputs: [\"batch.*\"]\n"
        f"  state: [\"opt.*\"]\nmesh: {{batch: 8, model: 4}}\nhardware: H100-SXM\n"
        f"schedule:\n  - manual: {{axis: batch, values: {{batch.input_ids: 0}}}}\n")
    print(f"{path}: {len(text.splitlines())} lines; spec {path.with_suffix('.yaml')}")


# Small programs, one construct each, for the importer's own tests
# (tests/fixtures/stablehlo/NAME.mlir; their inputs are made by the tests).


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real")
    parser.add_argument("--only", nargs="*", choices=sorted(PROGRAMS), help="programs to export (default: all)")
    parser.add_argument("--constructs", action="store_true",
                        help="write only the one-construct programs under tests/fixtures/stablehlo/")
    parser.add_argument("--gemma-2b", type=pathlib.Path, metavar="PATH",
                        help="write a Gemma-2B-shaped training step's text to PATH instead")
    args = parser.parse_args()
    if VERSIONS != PINNED:
        print(f"warning: library versions {VERSIONS} differ from the pinned {PINNED} (tools/dev_env.sh)")
    if args.gemma_2b:
        export_gemma_2b(args.gemma_2b)
        return
    if args.constructs:
        export_constructs(args.out.parent / "stablehlo")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or PROGRAMS:
        export(name, args.out)
    if not args.only:
        export_constructs(args.out.parent / "stablehlo")
    (args.out / "versions.json").write_text(json.dumps(VERSIONS, indent=2) + "\n")


if __name__ == "__main__":
    main()
