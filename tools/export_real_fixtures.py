"""Export training and inference steps written with real JAX libraries as
StableHLO fixtures (tests/fixtures/real/), so the importer is tested on what
jax prints for code nobody on this project wrote.

    tools/dev_env.sh                                  # once: .venv-dev with the pinned libraries
    .venv-dev/bin/python tools/export_real_fixtures.py [--only NAME ...] [--out DIR]
    .venv-dev/bin/python tools/export_real_fixtures.py --gemma-2b bench/data/gemma_2b_train.mlir
    .venv-dev/bin/python tools/export_real_fixtures.py --llama-500m bench/data/llama_500m_train.mlir

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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from construct_fixtures import export_constructs  # noqa: E402

PINNED = {"jax": "0.10.2", "flax": "0.12.8", "optax": "0.2.8", "transformers": "4.57.6"}
VERSIONS = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "transformers": transformers.__version__}

BATCH, SEQ, VOCAB = 8, 16, 64
OPTIMIZER = optax.adamw(1e-3, weight_decay=0.01)


def arg_names(args: dict) -> list[str]:
    return [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]


# ------------------------------------------------------------------ training steps


def train_step(loss_fn, has_state: bool = False, optimizer=OPTIMIZER):
    """A step over {params, opt, batch(, state)} returning loss, new params,
    new optimizer state (and new model state)."""

    def step(args):
        if has_state:
            (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(args["params"], args["state"],
                                                                            args["batch"])
        else:
            loss, grads = jax.value_and_grad(loss_fn)(args["params"], args["batch"])
        updates, opt = optimizer.update(grads, args["opt"], args["params"])
        out = {"loss": loss, "params": optax.apply_updates(args["params"], updates), "opt": opt}
        if has_state:
            out["state"] = state
        return out

    step.loss_fn = loss_fn
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


def multisteps_train():
    """The MLP with optax.MultiSteps (gradient accumulation over 2 steps): the
    update is applied every second step, a `lax.cond` on the step counter.
    Exported at its second step, so the branch that applies it runs."""
    optimizer = optax.MultiSteps(OPTIMIZER, every_k_schedule=2)
    step, args = mlp_train_flax()
    step = train_step(step.loss_fn, optimizer=optimizer)
    first = jax.jit(step)({**args, "opt": optimizer.init(args["params"])})
    return step, {**args, "params": first["params"], "opt": first["opt"]}


class Gated(nn.Module):
    """An MLP whose middle is chosen per step by a run-time flag with
    `flax.linen.cond`: two Dense layers, or one."""

    def setup(self):
        self.inp, self.deep1, self.deep2, self.shallow, self.out = (nn.Dense(n) for n in (64, 64, 64, 64, 10))

    def __call__(self, x, deep):
        h = nn.relu(self.inp(x))
        if self.is_initializing():  # both branches' parameters exist before the cond (flax requires it)
            self.shallow(h), self.deep2(self.deep1(h))
        h = nn.cond(deep, lambda m, h: nn.relu(m.deep2(nn.relu(m.deep1(h)))), lambda m, h: nn.relu(m.shallow(h)),
                    self, h)
        return self.out(h)


def cond_train():
    model = Gated()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH, 32)).astype(np.float32)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    params = model.init(jax.random.key(0), x, True)["params"]

    def loss_fn(params, batch):
        logits = model.apply({"params": params}, batch["x"], batch["deep"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    args = {"params": params, "opt": OPTIMIZER.init(params),
            "batch": {"x": x, "labels": labels, "deep": np.bool_(True)}}
    return train_step(loss_fn), args


def route(probs, top: int, capacity: int):
    """GShard's routing of one group's tokens by their probabilities [tokens,
    experts]: each token's `top` experts (`lax.top_k`), a slot of an
    expert's capacity in order (first choices, then second ones, in token
    order; tokens past it are dropped). The one-hot choices [tokens, top,
    experts] and the dispatch and combine tensors [tokens, experts, capacity]."""
    tokens, experts = probs.shape
    weights, chosen = jax.lax.top_k(probs, top)  # [tokens, top]
    weights = weights / weights.sum(-1, keepdims=True)
    mask = jax.nn.one_hot(chosen, experts)  # [tokens, top, experts]
    order = mask.transpose(1, 0, 2).reshape(top * tokens, experts)
    slot = (jnp.cumsum(order, axis=0) - 1).reshape(top, tokens, experts).transpose(1, 0, 2)
    kept = mask * (slot < capacity)
    slots = jax.nn.one_hot(slot, capacity) * kept[..., None]  # [tokens, top, experts, capacity]
    return mask, slots.sum(1), (weights[..., None, None] * slots).sum(1)


class MoE(nn.Module):
    """A mixture-of-experts MLP as GShard writes it: a router's top-2
    experts per token, routed with a capacity (`route`), one-hot dispatch
    and combine tensors, the experts' MLPs as batched einsums, and the
    router's load-balancing loss (returned beside the output)."""

    experts: int = 4
    top: int = 2
    hidden: int = 64
    capacity_factor: float = 1.25

    def weights(self, d: int):
        return (self.param("w_in", nn.initializers.lecun_normal(), (self.experts, d, self.hidden)),
                self.param("w_out", nn.initializers.lecun_normal(), (self.experts, self.hidden, d)))

    @nn.compact
    def __call__(self, x):
        tokens, d = x.shape
        capacity = int(self.capacity_factor * tokens * self.top / self.experts)
        probs = jax.nn.softmax(nn.Dense(self.experts, use_bias=False, name="router")(x))
        mask, dispatch, combine = route(probs, self.top, capacity)
        w_in, w_out = self.weights(d)
        inputs = jnp.einsum("tec,td->ecd", dispatch, x)
        outputs = jnp.einsum("ech,ehd->ecd", nn.gelu(jnp.einsum("ecd,edh->ech", inputs, w_in)), w_out)
        balance = self.experts * jnp.sum(mask[:, 0].mean(0) * probs.mean(0))
        return jnp.einsum("tec,ecd->td", combine, outputs), balance


class GroupedMoE(MoE):
    """The MoE on groups of tokens [groups, tokens, d] (GShard's: each
    sequence routed alone, its own capacity), written as flaxformer writes
    it: the experts' inputs swapped to [experts, groups, capacity, d] for
    the experts' MLPs and their outputs swapped back for the combine."""

    @nn.compact
    def __call__(self, x):
        groups, tokens, d = x.shape
        capacity = int(self.capacity_factor * tokens * self.top / self.experts)
        probs = jax.nn.softmax(nn.Dense(self.experts, use_bias=False, name="router")(x))
        mask, dispatch, combine = jax.vmap(lambda p: route(p, self.top, capacity))(probs)
        w_in, w_out = self.weights(d)
        inputs = jnp.einsum("gtec,gtd->gecd", dispatch, x).swapaxes(0, 1)
        outputs = jnp.einsum("egch,ehd->egcd", nn.gelu(jnp.einsum("egcd,edh->egch", inputs, w_in)), w_out)
        balance = self.experts * jnp.sum(mask[:, :, 0].mean((0, 1)) * probs.mean((0, 1)))
        return jnp.einsum("gtec,gecd->gtd", combine, outputs.swapaxes(0, 1)), balance


class MoELM(nn.Module):
    """Embedding, a pre-norm mixture-of-experts MLP block, tied logits."""

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(VOCAB, 32)
        x = embed(ids)
        b, s, d = x.shape
        moe, balance = MoE(name="moe")(nn.LayerNorm()(x).reshape(b * s, d))
        x = x + moe.reshape(b, s, d)
        return embed.attend(nn.LayerNorm()(x)), balance


class GroupedMoELM(nn.Module):
    """MoELM with the MoE on groups: each sequence a group."""

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(VOCAB, 32)
        x = embed(ids)
        moe, balance = GroupedMoE(name="moe")(nn.LayerNorm()(x))
        return embed.attend(nn.LayerNorm()(x + moe)), balance


def moe_grouped_train():
    return moe_train(GroupedMoELM())


def moe_train(model: nn.Module | None = None):
    model = model or MoELM()
    ids = tokens(6)
    params = model.init(jax.random.key(0), ids)["params"]

    def loss_fn(params, batch):
        logits, balance = model.apply({"params": params}, batch["input_ids"])
        return lm_loss(logits, batch["input_ids"]) + 0.01 * balance

    args = {"params": params, "opt": OPTIMIZER.init(params), "batch": {"input_ids": ids}}
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
                                    mlp_train_flax, scan_train, gpt2_decode, moe_train, multisteps_train,
                                    cond_train, moe_grouped_train)}

# Spec fields per program: which batch input the BP schedule shards, and the
# expected all_reduce count in terms of P (trainable parameter tensors).
BP_INPUT = {"cnn_train": "batch.images", "mlp_train_flax": "batch.x", "multisteps_train": "batch.x",
            "cond_train": "batch.x"}

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
    if name in ("moe_train", "moe_grouped_train"):
        return len(params) + 3, (f"P + 3, P = {len(params)}: one per parameter gradient, one for the loss and two for "
                                 "the load-balancing loss's means over the tokens (of the first choices and of the "
                                 "router's probabilities)")
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
    "moe_train": ("flax.linen", "mixture-of-experts LM (4 experts, top-2 routing with lax.top_k, GShard dispatch "
                  "with capacity, load-balancing loss), training step"),
    "moe_grouped_train": ("flax.linen", "mixture-of-experts LM as moe_train, its tokens routed in GShard's groups ("
                          "each sequence with its own capacity; flaxformer's layout, the experts' inputs swapped to "
                          "experts-major and back), training step"),
    "multisteps_train": ("flax.linen, optax.MultiSteps", "MLP classifier with gradient accumulation over 2 steps "
                         "(the update a lax.cond), at the step that applies it"),
    "cond_train": ("flax.linen nn.cond", "MLP whose middle layers a run-time flag chooses (flax.linen.cond), "
                   "training step"),
}


def write_spec(name: str, out: pathlib.Path, names: list[str]) -> None:
    library, description = DESCRIPTIONS[name]
    state = ", ".join(f'"{p}.*"' for p in ("opt", "state") if any(n.startswith(p + ".") for n in names))
    bp, bp_formula = bp_expectation(name, names)
    extra = ("\n      all_slice: 5   # 1 + 2L, L = 2: the random bits of the embedding and residual dropouts come from "
             "counters (an iota, whose counting dims are opaque) made whole on every device, then sliced to the batch "
             "shard: local, no communication") if name == "gpt2_dropout_train" else ""
    if name == "moe_train":
        extra = ("\n      all_gather: 1   # a token's slot in an expert counts the choices of the tokens before it, "
                 "over the whole batch (a cumulative sum along the sharded tokens): the choices are gathered whole"
                 "\n      all_slice: 1   # ... and the slots sliced back to the batch shard")
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


def abstract_step(model, dtype, batch_shape: tuple[int, int], path: pathlib.Path) -> tuple[dict, str]:
    """A HF Flax causal LM's Adam-W training step traced with abstract shapes
    (no parameters are allocated), its text written to `path`: (args, text)."""
    params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, 8)))
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), params)

    def loss_fn(params, batch):
        return lm_loss(model(batch["input_ids"], params=params).logits, batch["input_ids"])

    args = {"params": params, "opt": jax.eval_shape(OPTIMIZER.init, params),
            "batch": {"input_ids": jax.ShapeDtypeStruct(batch_shape, jnp.int32)}}
    text = jax.jit(train_step(loss_fn)).lower(args).as_text()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return args, text


BP_TACTIC = "manual: {axis: batch, values: {batch.input_ids: 0}}\n"


def write_abstract_spec(path: pathlib.Path, args: dict, comment: str, description: str, rest: str) -> None:
    """The spec beside an abstract step's text: its argument names and roles, then `rest` (mesh, hardware,
    schedule)."""
    path.with_suffix(".yaml").write_text(
        f"# Written by tools/export_real_fixtures.py {comment}.\ndescription: {description}\n"
        f"model:\n  stablehlo: {path.name}\n  param_names: [{', '.join(arg_names(args))}]\n"
        f"  inputs: [\"batch.*\"]\n  state: [\"opt.*\"]\n{rest}")


def export_gemma_2b(path: pathlib.Path) -> None:
    """The text of a Gemma-2B-shaped training step (18 layers, d 2048, 8 heads
    of 256, MQA, SwiGLU 16384, vocab 256,000, batch 8 x seq 2048), traced
    with abstract shapes (no parameters are allocated), for bench/import.py."""
    config = transformers.GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384,
                                      num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                                      head_dim=256, max_position_embeddings=2048)
    model = transformers.FlaxGemmaForCausalLM(config, _do_init=False, dtype=jnp.bfloat16)
    args, text = abstract_step(model, jnp.bfloat16, (8, 2048), path)
    write_abstract_spec(path, args, "--gemma-2b: a Gemma-2B-shaped Adam-W step (HF Flax)",
                        "Gemma-2B-shaped training step, batch 8 x seq 2048, on 32 H100s (8 x 4)",
                        "mesh: {batch: 8, model: 4}\nhardware: H100-SXM\nschedule:\n  - " + BP_TACTIC)
    print(f"{path}: {len(text.splitlines())} lines; spec {path.with_suffix('.yaml')}")


def export_llama_500m(path: pathlib.Path) -> None:
    """The text of a HF Flax Llama of 0.5B parameters (8 layers, d 2048, 16
    heads sharing 8 key/value heads, SwiGLU 5,632, vocab 32,000, f32) and its
    Adam-W step on batch 8 x seq 512, traced with abstract shapes (nothing is
    allocated), for tools/xla_plan_check.py's mid-size row: planned on a 4 x 2
    mesh and compiled by XLA, not run."""
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                                      max_position_embeddings=512)
    model = transformers.FlaxLlamaForCausalLM(config, _do_init=False, dtype=jnp.float32)
    args, text = abstract_step(model, jnp.float32, (8, 512), path)
    count = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(args["params"]))
    write_abstract_spec(path, args, f"--llama-500m: a HF Flax Llama of {count:,} parameters, Adam-W (transformers "
                        f"{transformers.__version__}, jax {jax.__version__})",
                        f"HF Flax Llama, {count / 1e9:.2f}B parameters, 8 layers, training step, batch 8 x seq 512, "
                        "on 8 A100s (4 x 2)",
                        "devices: 8\nmesh: {batch: 4, model: 2}\nhardware: A100-80GB\nschedules:\n  BP:\n"
                        "    tactics:\n      - " + BP_TACTIC)
    print(f"{path}: {len(text.splitlines())} lines, {count:,} parameters; spec {path.with_suffix('.yaml')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real")
    parser.add_argument("--only", nargs="*", choices=sorted(PROGRAMS), help="programs to export (default: all)")
    parser.add_argument("--constructs", action="store_true",
                        help="write only the one-construct programs under tests/fixtures/stablehlo/")
    parser.add_argument("--gemma-2b", type=pathlib.Path, metavar="PATH",
                        help="write a Gemma-2B-shaped training step's text to PATH instead")
    parser.add_argument("--llama-500m", type=pathlib.Path, metavar="PATH",
                        help="write a 0.5B HF Flax Llama's training step (and its spec) to PATH instead")
    args = parser.parse_args()
    if VERSIONS != PINNED:
        print(f"warning: library versions {VERSIONS} differ from the pinned {PINNED} (tools/dev_env.sh)")
    if args.gemma_2b:
        export_gemma_2b(args.gemma_2b)
        return
    if args.llama_500m:
        export_llama_500m(args.llama_500m)
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
