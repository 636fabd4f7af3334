"""One decode step of a transformer with a key/value cache (inference).

Function @transformer_decode(batch.tokens [batch, 1] i32,
cache.layers.{l}.k, cache.layers.{l}.v [batch, seq, kv_heads, head_dim],
weights) -> (logits [batch, vocab], then per layer l the new k and v entries
[batch, 1, kv_heads, head_dim])

The weights have transformer()'s names and shapes (`embed.table`,
`layers.{l}.attn.wq`, ..., `final_norm.scale`, `unembed`; see
ir.models.transformer), so a schedule written for the training program
applies to its decode step. Each layer projects the new token's q, k and v,
appends k and v after the cache along the sequence, and lets the one query
attend over all seq + 1 positions: no causal mask, everything cached is in
its past. The entries are returned for the server to append to its cache.
There is no loss, so no training step (`training_step` refuses the logits).
"""

from __future__ import annotations

from ir.builder import Builder
from ir.core import Value
from ir.models.base import Model
from ir.models.transformer import (
    _attention_residual,
    _check_norm,
    _kv_heads,
    _Layout,
    _logits,
    _mlp_residual,
    _norm,
    _project_qkv,
)

INPUTS = ("batch.tokens",)


def cache_names(layers: int) -> tuple[str, ...]:
    """The cache inputs, in parameter order: k then v per layer."""
    return tuple(f"cache.layers.{layer}.{kv}" for layer in range(layers) for kv in "kv")


def transformer_decode(layers: int = 2, d_model: int = 16, heads: int = 2, head_dim: int = 8, mlp_hidden: int = 32,
                       vocab: int = 32, seq: int = 8, batch: int = 2, dtype: str = "f32",
                       kv_heads: int | None = None, norm: str = "rms", gated_mlp: bool = False,
                       tied_embeddings: bool = False, fused_qkv: bool = False) -> Model:
    """The next token's logits given one token per sequence and a cache of
    `seq` positions; options as transformer()'s (kv_heads 1 is multi-query:
    the cache holds one key/value head)."""
    layout = _Layout(d_model, heads, _kv_heads(heads, kv_heads), head_dim, mlp_hidden, _check_norm(norm),
                     gated_mlp, fused_qkv, dtype)
    b = Builder("transformer_decode")
    tokens = b.param(INPUTS[0], [batch, 1], "i32")
    names = cache_names(layers)
    cache = [b.param(name, [batch, seq, layout.kv_heads, head_dim], dtype) for name in names]
    table = layout.param(b, "embed.table", [vocab, d_model])
    h = b.gather(table, tokens, name="embed")
    entries: list[Value] = []
    for layer in range(layers):
        h, k, v = _decode_block(b, layout, h, cache[2 * layer], cache[2 * layer + 1], f"layers.{layer}.")
        entries += [k, v]
    logits = _logits(b, layout, h, table, tied_embeddings)
    next_logits = b.reshape(logits, [batch, vocab], name="next_logits")
    fn = b.build([next_logits, *entries])
    weights = tuple(p.name for p in fn.params if p.name not in INPUTS and p.name not in names)
    return Model(fn, weights, INPUTS, names)


def _decode_block(b: Builder, layout: _Layout, h: Value, cache_k: Value, cache_v: Value,
                  prefix: str) -> tuple[Value, Value, Value]:
    """One layer on the new token: (its output, its k entry, its v entry)."""
    x = _norm(b, layout, h, f"{prefix}attn_norm")
    q, k, v = _project_qkv(b, layout, x, f"{prefix}attn.")
    k_entry, keys = _extend(b, layout, cache_k, k, f"{prefix}attn.k")
    v_entry, values = _extend(b, layout, cache_v, v, f"{prefix}attn.v")
    h = _attention_residual(b, layout, h, q, keys, values, None, prefix)
    return _mlp_residual(b, layout, h, prefix), k_entry, v_entry


def _extend(b: Builder, layout: _Layout, cache: Value, new: Value, name: str) -> tuple[Value, Value]:
    """(the new entry in the cache's layout, cache and entry along the sequence
    in attend's layout). Multi-query projections have no heads dim; the cache
    keeps a heads dim of 1 so that every cache has one layout."""
    batch, seq, kv_heads, head_dim = cache.type.shape
    entry = b.reshape(new, [batch, 1, kv_heads, head_dim], name=f"{name}_entry") if layout.multi_query else new
    # The sequence dim is opaque at the concatenation: a decode step shards
    # the cache on batch or heads, not on positions.
    extended = b.concatenate([cache, entry], 1, name=f"{name}_all")
    if layout.multi_query:
        extended = b.reshape(extended, [batch, seq + 1, head_dim], name=f"{name}_shared")
    return entry, extended
