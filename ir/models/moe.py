"""A decoder-only transformer whose MLPs are mixtures of experts (Mixtral,
DeepSeek-V3, Qwen3-MoE), as GShard writes them.

Per layer, after the attention block (`ir.models.transformer`'s, GQA
included), the MLP is replaced by (names start with `layers.{l}.moe.`):

  router [d_model, experts]: each token's probabilities over the experts,
    softmax; its `top_k` experts (`sort`/`argsort` from the largest), their
    probabilities renormalized to sum to one;
  dispatch: each sequence is a group (GShard's): a token takes a slot of
    its expert's `capacity` = ceil(capacity_factor * seq * top_k / experts)
    in order, every token's first choice before any second choice (a
    running sum over the group's choices); a token past the capacity is
    dropped for that expert. One-hot `dispatch` [batch, seq, experts,
    capacity] and `combine` (the same, weighted by the gates);
  experts: SwiGLU MLPs with stacked weights w_gate, w_up [experts, d_model,
    expert_hidden] and w_down [experts, expert_hidden, d_model], run on
    expert_in [batch, experts, capacity, d_model] = dispatch^T x;
  output: combine . expert_out, plus `shared_experts` dense SwiGLU experts
    every token goes through (`layers.{l}.shared.*`, DeepSeek's);
  load balance: experts * sum_e f_e P_e, f_e the share of the choices that
    went to expert e, P_e its mean probability (Switch/GShard), summed over
    layers and added to the loss with weight `balance_weight`.

Every step is a registry op with its own factor rule, so the sharding
search sees the experts dimension as any other: an axis on the stacked
experts' weights is expert parallelism, and where the tokens' batch is
sharded on that axis too, the lowering moves expert_in from the batch to
the experts with an all_to_all (and back before the combine).

Function @moe_transformer(batch.tokens, batch.targets, embed.table,
layers.{l}.*, final_norm.*, unembed) -> (loss,).
"""

from __future__ import annotations

import math

from ir.builder import Builder
from ir.core import Value
from ir.models.attention import causal_mask
from ir.models.base import Model
from ir.models.losses import softmax_cross_entropy
from ir.models.transformer import (
    BATCH_INPUTS,
    _attention_residual,
    _check_norm,
    _kv_heads,
    _Layout,
    _logits,
    _norm,
    _project_qkv,
)


def moe_transformer(layers: int = 2, d_model: int = 16, heads: int = 2, head_dim: int = 8, experts: int = 4,
                    top_k: int = 2, expert_hidden: int = 16, shared_experts: int = 0, capacity_factor: float = 1.25,
                    balance_weight: float = 0.01, vocab: int = 32, seq: int = 8, batch: int = 2, dtype: str = "f32",
                    kv_heads: int | None = None, norm: str = "rms", tied_embeddings: bool = False) -> Model:
    """Mean next-token cross-entropy plus the routers' load-balancing loss
    of a pre-norm decoder with mixture-of-experts MLPs (module docstring)."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} with experts={experts}: each token picks 1 to {experts} experts")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor!r}")
    layout = _Layout(d_model, heads, _kv_heads(heads, kv_heads), head_dim, expert_hidden, _check_norm(norm),
                     True, False, dtype)
    capacity = min(seq * top_k, math.ceil(capacity_factor * seq * top_k / experts))
    b = Builder("moe_transformer")
    tokens = b.param(BATCH_INPUTS[0], [batch, seq], "i32")
    targets = b.param(BATCH_INPUTS[1], [batch, seq], "i32")
    table = layout.param(b, "embed.table", [vocab, d_model])
    h = b.gather(table, tokens, name="embed")
    mask = causal_mask(b, seq)
    balance = None
    for layer in range(layers):
        prefix = f"layers.{layer}."
        x = _norm(b, layout, h, f"{prefix}attn_norm")
        q, k, v = _project_qkv(b, layout, x, f"{prefix}attn.")
        h = _attention_residual(b, layout, h, q, k, v, mask, prefix)
        x = _norm(b, layout, h, f"{prefix}mlp_norm")
        out, layer_balance = _moe(b, layout, x, experts, top_k, capacity, f"{prefix}moe.")
        for e in range(shared_experts):
            out = b.add(out, _swiglu(b, layout, x, f"{prefix}shared.{e}."))
        h = b.add(h, out, name=f"{prefix}out")
        balance = layer_balance if balance is None else b.add(balance, layer_balance)
    logits = _logits(b, layout, h, table, tied_embeddings)
    loss = b.add(softmax_cross_entropy(b, logits, targets, name="cross_entropy"), b.mul(balance, balance_weight),
                 name="loss")
    fn = b.build([loss])
    return Model(fn, tuple(p.name for p in fn.params if p.name not in BATCH_INPUTS), BATCH_INPUTS)


def _moe(b: Builder, layout: _Layout, x: Value, experts: int, top_k: int, capacity: int,
         prefix: str) -> tuple[Value, Value]:
    """The mixture of experts on x [batch, seq, d_model]: its output and its load-balancing loss."""
    batch, seq, d = x.type.shape
    router = layout.param(b, f"{prefix}router", [d, experts])
    probs = b.softmax(b.einsum("bsd,de->bse", x, router, name=f"{prefix}logits"), axis=2, name=f"{prefix}probs")
    gates = b.slice(b.op("sort", [probs], dim=2, order="descending"), [0, 0, 0], [batch, seq, top_k])
    chosen = b.slice(b.op("argsort", [probs], dim=2, order="descending"), [0, 0, 0], [batch, seq, top_k],
                     name=f"{prefix}chosen")
    gates = b.div(gates, b.broadcast_in_dim(b.sum(gates, 2), gates.type.shape, [0, 1]), name=f"{prefix}gates")
    # One-hot choices [batch, seq, top_k, experts] and each choice's slot in its expert: first choices first.
    shape = [batch, seq, top_k, experts]
    picked = b.compare(b.iota(shape, dimension=3), b.broadcast_in_dim(chosen, shape, [0, 1, 2]), "eq",
                       name=f"{prefix}picked")
    counts = b.reshape(b.transpose(b.convert(picked, "i32"), [0, 2, 1, 3]), [batch, top_k * seq, experts])
    running = b.op("cumsum", [counts], dim=1)
    slot = b.transpose(b.reshape(running, [batch, top_k, seq, experts]), [0, 2, 1, 3], name=f"{prefix}slot")
    kept = b.op("and", [picked, b.compare(slot, capacity, "le")], name=f"{prefix}kept")  # slot counts from 1
    slots = [batch, seq, top_k, experts, capacity]
    at = b.compare(b.iota(slots, dimension=4), b.broadcast_in_dim(b.sub(slot, 1), slots, [0, 1, 2, 3]), "eq")
    placed = b.convert(b.op("and", [at, b.broadcast_in_dim(kept, slots, [0, 1, 2, 3])]), layout.dtype)
    dispatch = b.sum(placed, 2, name=f"{prefix}dispatch")  # [batch, seq, experts, capacity]
    weighted = b.mul(placed, b.broadcast_in_dim(gates, slots, [0, 1, 2]))
    combine = b.sum(weighted, 2, name=f"{prefix}combine")
    expert_in = b.einsum("bsec,bsd->becd", dispatch, x, name=f"{prefix}expert_in")
    w_gate, w_up = (layout.param(b, f"{prefix}{n}", [experts, d, layout.mlp_hidden]) for n in ("w_gate", "w_up"))
    w_down = layout.param(b, f"{prefix}w_down", [experts, layout.mlp_hidden, d])
    gate = b.einsum("becd,edh->bech", expert_in, w_gate)
    hidden = b.mul(b.mul(gate, b.logistic(gate)), b.einsum("becd,edh->bech", expert_in, w_up),
                   name=f"{prefix}hidden")
    expert_out = b.einsum("bech,ehd->becd", hidden, w_down, name=f"{prefix}expert_out")
    # The experts' outputs as the combine reads them: a value of its own, so that a schedule can keep its
    # experts dimension whole (`replicate`), and the lowering brings it back to the tokens' layout there.
    returned = b.reshape(expert_out, expert_out.type.shape, name=f"{prefix}returned")
    out = b.einsum("bsec,becd->bsd", combine, returned, name=f"{prefix}combined")
    # Load balance: experts * sum_e (share of the choices routed to e) * (mean probability of e).
    share = b.mul(b.sum(b.convert(picked, layout.dtype), [0, 1, 2]), 1.0 / (batch * seq * top_k))
    mean_prob = b.mean(probs, [0, 1])
    balance = b.mul(b.sum(b.mul(share, mean_prob), [0]), float(experts), name=f"{prefix}balance")
    return out, balance


def _swiglu(b: Builder, layout: _Layout, x: Value, prefix: str) -> Value:
    """A dense SwiGLU expert: (silu(x @ w_gate) * (x @ w_up)) @ w_down."""
    d, hidden = layout.d_model, layout.mlp_hidden
    gate = b.matmul(x, layout.param(b, f"{prefix}w_gate", [d, hidden]))
    up = b.matmul(x, layout.param(b, f"{prefix}w_up", [d, hidden]))
    act = b.mul(b.mul(gate, b.logistic(gate)), up, name=f"{prefix}hidden")
    return b.matmul(act, layout.param(b, f"{prefix}w_down", [hidden, d]), name=f"{prefix}out")
