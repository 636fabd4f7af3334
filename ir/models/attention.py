"""Attention models with a mean-squared-error loss, and the attention core the
transformer reuses.

  simplified_attention  the TOAST paper's attention with a mock averaging
                        softmax: x [seq, d_model]; wq, wk, wv [d_model, d_head]
  attention             softmax attention: x [batch, seq, d_model]; single-head
                        (wq, wk, wv [d_model, head_dim], wo [head_dim, d_model])
                        or multi-head (wq, wk, wv [d_model, heads, head_dim],
                        wo [heads, head_dim, d_model]), optionally causal

`attend` (scaled dot-product attention plus output projection) and
`causal_mask` are shared with `ir.models.transformer`.
"""

from __future__ import annotations

import math

from ir.builder import Builder
from ir.core import Value
from ir.models.base import Model
from ir.models.losses import mean_squared_error

BATCH_INPUTS = ("x", "target")

# (scores, context) einsums for each (q rank, k rank). Letters: b batch, s query
# position, t key position, n head, h head dim. Each output is in dot_general's
# natural order (batch dims, lhs free dims, rhs free dims), so no transposes.
_ATTENTION_SPECS = {
    (3, 3): ("bsh,bth->bst", "bst,bth->bsh"),  # single head
    (4, 4): ("bsnh,btnh->bnst", "bnst,btnh->bnsh"),  # multi-head
    (4, 3): ("bsnh,bth->bsnt", "bsnt,bth->bsnh"),  # multi-query: one k/v head shared by all query heads
}
# Grouped-query: q reshaped to [b, s, g, r, h] (g key/value heads of r query heads each).
_GROUPED_SPECS = ("bsgrh,btgh->bgsrt", "bgsrt,btgh->bgsrh")


def simplified_attention(seq: int = 8, d_model: int = 16, d_head: int = 16, dtype: str = "f32") -> Model:
    """The TOAST paper's simplified attention, whose sharding analysis finds 5 conflicts.

    q, k, v = x @ wq, x @ wk, x @ wv; qt = q^T; a = k @ qt [seq (keys), seq
    (queries)]; s = a / mean(a, 0) broadcast along dim 0 (the mock softmax);
    z = s @ v; loss = mean((z - target)**2). The ops are exactly these, in this
    order; the analysis depends on it.

    The mock softmax normalizes over keys (dim 0 of a) so that sharding a on
    its dim 1 (queries) keeps the normalization local. Under sequence sharding
    the paper's Figure 5b program all_gathers k before a = matmul(k, qt) and
    produces z with a reduce_scatter.

    Function @simplified_attention(x [seq, d_model], target [seq, d_head],
    wq, wk, wv [d_model, d_head]) -> (loss,).
    """
    b = Builder("simplified_attention")
    x = b.param("x", [seq, d_model], dtype)
    target = b.param("target", [seq, d_head], dtype)
    wq, wk, wv = (b.param(name, [d_model, d_head], dtype) for name in ("wq", "wk", "wv"))
    q = b.matmul(x, wq, name="q")
    k = b.matmul(x, wk, name="k")
    v = b.matmul(x, wv, name="v")
    qt = b.transpose(q, [1, 0], name="qt")
    a = b.matmul(k, qt, name="a")
    m = b.mean(a, 0, name="m")
    mb = b.broadcast_in_dim(m, [seq, seq], [1], name="mb")
    s = b.div(a, mb, name="s")
    z = b.matmul(s, v, name="z")
    loss = mean_squared_error(b, z, target)
    return Model(b.build([loss]), ("wq", "wk", "wv"), BATCH_INPUTS)


def attention(batch: int = 2, seq: int = 8, d_model: int = 16, heads: int = 1, head_dim: int = 8,
              causal: bool = False, dtype: str = "f32") -> Model:
    """Softmax attention with output projection and an MSE loss.

    y = attend(x @ wq, x @ wk, x @ wv, wo); loss = mean((y - target)**2).
    heads == 1 is single-head attention with 2-D weights; heads > 1 gives every
    weight a heads dim (see the module docstring for shapes).

    Function @attention(x [batch, seq, d_model], target [batch, seq, d_model],
    wq, wk, wv, wo) -> (loss,).
    """
    if heads < 1:
        raise ValueError(f"attention needs at least one head, got {heads}")
    b = Builder("attention")
    x = b.param("x", [batch, seq, d_model], dtype)
    target = b.param("target", [batch, seq, d_model], dtype)
    head_shape = [head_dim] if heads == 1 else [heads, head_dim]
    projections = [b.param(name, [d_model, *head_shape], dtype) for name in ("wq", "wk", "wv")]
    wo = b.param("wo", [*head_shape, d_model], dtype)
    spec = "bsd,dh->bsh" if heads == 1 else "bsd,dnh->bsnh"
    q, k, v = (b.einsum(spec, x, w, name=name) for w, name in zip(projections, "qkv"))
    y = attend(b, q, k, v, wo, causal_mask(b, seq) if causal else None)
    loss = mean_squared_error(b, y, target)
    return Model(b.build([loss]), ("wq", "wk", "wv", "wo"), BATCH_INPUTS)


def causal_mask(b: Builder, seq: int) -> Value:
    """[seq (query), seq (key)] bool: true where the key position <= the query position."""
    query = b.iota([seq, seq], dimension=0, name="query_position")
    key = b.iota([seq, seq], dimension=1, name="key_position")
    return b.compare(query, key, "ge", name="causal_mask")


def attend(b: Builder, q: Value, k: Value, v: Value, wo: Value, mask: Value | None = None,
           prefix: str = "") -> Value:
    """softmax(q k^T / sqrt(head_dim)) v, projected by `wo`: [batch, seq, d_model].

    q is [batch, seq, head_dim] (single head) or [batch, seq, heads, head_dim];
    k and v are [batch, seq, heads, head_dim] like q, [batch, seq, kv_heads,
    head_dim] with kv_heads dividing heads (grouped-query: query head n uses
    key/value head n // (heads / kv_heads)), or [batch, seq, head_dim] (one
    head, shared by all query heads when q has several); wo is
    [head_dim, d_model] or [heads, head_dim, d_model]. The softmax is over key
    positions; `mask` [seq (query), seq (key)] keeps scores where true and sets
    the rest to -inf. `prefix` starts the names of the values emitted.
    """
    grouped = q.type.rank == k.type.rank == 4 and q.type.shape[2] != k.type.shape[2]
    specs = _GROUPED_SPECS if grouped else _ATTENTION_SPECS.get((q.type.rank, k.type.rank))
    if specs is None or (grouped and q.type.shape[2] % k.type.shape[2]):
        raise ValueError(f"attend: unsupported q, k types {q.type}, {k.type}")
    scores_spec, context_spec = specs
    # Scaling q rather than the scores: the same result with seq/head_dim
    # times fewer multiplies.
    q = b.mul(q, 1.0 / math.sqrt(q.type.shape[-1]), name=f"{prefix}q_scaled")
    if grouped:  # query heads n = (kv head g, member r): g major, as a reshape splits it
        batch, seq, heads, head_dim = q.type.shape
        groups = k.type.shape[2]
        q = b.reshape(q, [batch, seq, groups, heads // groups, head_dim], name=f"{prefix}q_grouped")
        wo = b.reshape(wo, [groups, heads // groups, *wo.type.shape[1:]], name=f"{prefix}wo_grouped")
    scores = b.einsum(scores_spec, q, k, name=f"{prefix}scores")
    scores_dims = scores_spec.split("->")[1]
    if mask is not None:
        keep = b.broadcast_in_dim(mask, scores.type.shape, [scores_dims.index("s"), scores_dims.index("t")])
        scores = b.select(keep, scores, float("-inf"), name=f"{prefix}masked_scores")
    probs = b.softmax(scores, axis=scores_dims.index("t"), name=f"{prefix}probs")
    context = b.einsum(context_spec, probs, v, name=f"{prefix}context")
    context_dims = context_spec.split("->")[1]
    head_dims = [context_dims.index(c) for c in "ngrh" if c in context_dims]
    return b.dot_general(context, wo, [head_dims, list(range(len(head_dims)))], name=f"{prefix}out")


def token_positions(b: Builder, seq: int, balance: int = 0) -> Value:
    """[seq] i32: the positions fused attention's causal mask compares: 0, 1,
    ..., or with `balance` = n the sequence laid out in 2n chunks, mirrored
    pairs side by side (`ir.opset.layout.mirrored_order`): what context-parallel trainers
    feed, so each of k contiguous shards (k dividing n) holds chunks of equal
    causal work. One `iota`, whole on every device as the count is."""
    if balance and seq % (2 * balance):
        raise ValueError(f"balance {balance}: the sequence of {seq} does not split into {2 * balance} chunks")
    return b.op("iota", [], "positions", shape=[seq], dtype="i32", dimension=0, mirrored=balance)


def flash_attend(b: Builder, q: Value, k: Value, v: Value, wo: Value, positions: Value, causal: bool = True,
                 prefix: str = "", balance: int = 0) -> Value:
    """`attend`'s result computed by the fused `attention` op (FlashAttention:
    the scores are never a value of the program, `ir/opset/attention.py`).

    q [batch, seq, heads, head_dim]; k and v [batch, seq, kv_heads, head_dim]
    or [batch, seq, head_dim] (one head shared by all); wo [heads, head_dim,
    d_model]. q is viewed as [batch, seq, kv_heads, heads per kv head,
    head_dim] (`q_grouped`) and wo as [kv_heads, heads per kv head, head_dim,
    d_model] (`wo_grouped`), the attention's output is `context`. `balance`:
    the positions' layout (`token_positions`), which the kernels' cost reads.
    """
    if q.type.rank != 4 or k.type.rank not in (3, 4) or k.type != v.type:
        raise ValueError(f"flash_attend: q must be [batch, seq, heads, head_dim] and k, v alike, "
                         f"got {q.type}, {k.type}, {v.type}")
    batch, seq, heads, head_dim = q.type.shape
    if k.type.rank == 3:  # one key/value head: give it its heads dim of 1
        k = b.reshape(k, [*k.type.shape[:2], 1, head_dim], name=f"{prefix}k_heads")
        v = b.reshape(v, [*v.type.shape[:2], 1, head_dim], name=f"{prefix}v_heads")
    groups = k.type.shape[2]
    if heads % groups:
        raise ValueError(f"flash_attend: {groups} key/value heads do not divide {heads} query heads")
    q = b.reshape(q, [batch, seq, groups, heads // groups, head_dim], name=f"{prefix}q_grouped")
    context = b.op("attention", [q, k, v, positions, positions], name=f"{prefix}context",
                   scale=1.0 / math.sqrt(head_dim), causal=causal, balance=balance)
    wo = b.reshape(wo, [groups, heads // groups, *wo.type.shape[1:]], name=f"{prefix}wo_grouped")
    return b.dot_general(context, wo, [[2, 3, 4], [0, 1, 2]], name=f"{prefix}out")

