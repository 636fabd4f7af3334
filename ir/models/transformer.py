"""A decoder-only transformer's training loss (forward program).

Function @transformer(batch.tokens [batch, seq] i32, batch.targets [batch, seq]
i32, embed.table [vocab, d_model], layers.{l}.*, final_norm.*, unembed) -> (loss,)

Per layer l (names start with `layers.{l}.`):
  attn_norm.scale [d_model] (+ attn_norm.bias for norm="layer")
  attn.wq [d_model, heads, head_dim]
  attn.wk, attn.wv [d_model, kv_heads, head_dim] (MHA: kv_heads = heads; GQA:
    kv_heads divides heads) or [d_model, head_dim] (MQA: kv_heads = 1)
    or, with fused_qkv, one attn.wqkv [d_model, heads + 2 * kv_heads, head_dim]
  attn.wo [heads, head_dim, d_model]
  mlp_norm.scale (+ mlp_norm.bias)
  mlp.w_gate (gated_mlp only), mlp.w_up [d_model, mlp_hidden], mlp.w_down [mlp_hidden, d_model]
Then final_norm.scale (+ final_norm.bias) and, unless tied_embeddings,
unembed [d_model, vocab]. The builder only traces shapes, so full-size models
(see `ir.models.presets`) build in seconds without allocating tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.builder import Builder
from ir.core import Value
from ir.models.attention import attend, causal_mask, flash_attend, token_positions
from ir.models.base import Model
from ir.models.losses import softmax_cross_entropy

BATCH_INPUTS = ("batch.tokens", "batch.targets")
NORMS = ("rms", "layer")
ATTENTION = ("dense", "flash")


@dataclass(frozen=True, slots=True)
class _Layout:
    """The sizes and choices every layer shares."""

    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp_hidden: int
    norm: str
    gated_mlp: bool
    fused_qkv: bool
    dtype: str
    flash: bool = False

    @property
    def multi_query(self) -> bool:
        """One key/value head shared by every query head (its weights have no heads dim)."""
        return self.kv_heads == 1 and self.heads > 1

    def param(self, b: Builder, name: str, shape: list[int]) -> Value:
        return b.param(name, shape, self.dtype)


def transformer(layers: int = 2, d_model: int = 16, heads: int = 2, head_dim: int = 8, mlp_hidden: int = 32,
                vocab: int = 32, seq: int = 8, batch: int = 2, dtype: str = "f32", kv_heads: int | None = None,
                norm: str = "rms", gated_mlp: bool = False, causal: bool = True, tied_embeddings: bool = False,
                fused_qkv: bool = False, attention: str = "dense", balance: int = 0) -> Model:
    """Mean next-token cross-entropy of a pre-norm decoder-only transformer.

    kv_heads: None or `heads` for multi-head attention, 1 for multi-query
    attention (one key/value head shared by all query heads; with heads == 1
    it is multi-head), or any other divisor of `heads` for grouped-query
    attention (each key/value head shared by heads / kv_heads query heads).
    norm: "rms" (RMSNorm) or "layer" (LayerNorm, with a bias).
    gated_mlp: GeGLU, gelu(x @ w_gate) * (x @ w_up), instead of gelu(x @ w_up).
    tied_embeddings: the logits reuse embed.table.
    attention: "dense" (`attend`: the scores, mask and softmax as ops, the
    1/sqrt(head_dim) scaling applied to q) or "flash" (`flash_attend`: one
    fused op, the scores never in memory, as long-context training runs).
    balance: with fused attention, the sequence laid out in 2 * balance
    chunks, mirrored pairs side by side (`token_positions`): the tokens and
    targets are fed in `ir.opset.layout.mirrored_order`, and a context-parallel split into k
    parts (k dividing balance) gives every device the same causal work.
    """
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; expected one of {', '.join(ATTENTION)}")
    if balance and attention != "flash":
        raise ValueError("balance lays out the positions fused attention reads: it needs attention='flash'")
    layout = _Layout(d_model, heads, _kv_heads(heads, kv_heads), head_dim, mlp_hidden, _check_norm(norm),
                     gated_mlp, fused_qkv, dtype, attention == "flash")
    b = Builder("transformer")
    tokens = b.param(BATCH_INPUTS[0], [batch, seq], "i32")
    targets = b.param(BATCH_INPUTS[1], [batch, seq], "i32")
    table = layout.param(b, "embed.table", [vocab, d_model])
    h = b.gather(table, tokens, name="embed")
    # One mask (or, for fused attention, one positions vector) for all layers: it depends only on positions.
    if layout.flash:
        mask = (token_positions(b, seq, balance), causal, balance)
    else:
        mask = causal_mask(b, seq) if causal else None
    for layer in range(layers):
        h = _block(b, layout, h, mask, f"layers.{layer}.")
    logits = _logits(b, layout, h, table, tied_embeddings)
    fn = b.build([softmax_cross_entropy(b, logits, targets)])
    return Model(fn, tuple(p.name for p in fn.params if p.name not in BATCH_INPUTS), BATCH_INPUTS)


def _kv_heads(heads: int, kv_heads: int | None) -> int:
    """Key/value heads: `heads` (multi-head), 1 (multi-query) or a divisor of `heads` (grouped-query)."""
    if kv_heads is None:
        return heads
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} with heads={heads}: kv_heads must divide heads "
                         f"({heads} for multi-head, 1 for multi-query, another divisor for grouped-query)")
    return kv_heads


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; expected one of {', '.join(NORMS)}")
    return norm


def _block(b: Builder, layout: _Layout, h: Value, mask: Value | tuple[Value, bool, int] | None, prefix: str) -> Value:
    """One pre-norm layer: h + attention(norm(h)), then + mlp(norm(.))."""
    x = _norm(b, layout, h, f"{prefix}attn_norm")
    q, k, v = _project_qkv(b, layout, x, f"{prefix}attn.")
    h = _attention_residual(b, layout, h, q, k, v, mask, prefix)
    return _mlp_residual(b, layout, h, prefix)


def _attention_residual(b: Builder, layout: _Layout, h: Value, q: Value, k: Value, v: Value,
                        mask: Value | tuple[Value, bool, int] | None, prefix: str) -> Value:
    """h + attend(q, k, v) projected by `{prefix}attn.wo` (the decode step
    passes keys and values that include its cache). With fused attention
    `mask` is (positions, causal, balance)."""
    wo = layout.param(b, f"{prefix}attn.wo", [layout.heads, layout.head_dim, layout.d_model])
    if layout.flash:
        positions, causal, balance = mask
        attended = flash_attend(b, q, k, v, wo, positions, causal, f"{prefix}attn.", balance)
    else:
        attended = attend(b, q, k, v, wo, mask, f"{prefix}attn.")
    return b.add(h, attended, name=f"{prefix}attn_residual")


def _mlp_residual(b: Builder, layout: _Layout, h: Value, prefix: str) -> Value:
    """h + mlp(norm(h)): the second half of a layer."""
    x = _norm(b, layout, h, f"{prefix}mlp_norm")
    return b.add(h, _mlp(b, layout, x, f"{prefix}mlp."), name=f"{prefix}out")


def _logits(b: Builder, layout: _Layout, h: Value, table: Value, tied_embeddings: bool) -> Value:
    """final_norm, then the unembedding: by `unembed` [d_model, vocab] or the tied embed.table."""
    h = _norm(b, layout, h, "final_norm")
    if tied_embeddings:
        return b.einsum("bsd,vd->bsv", h, table, name="logits")
    vocab = table.type.shape[0]
    return b.matmul(h, layout.param(b, "unembed", [layout.d_model, vocab]), name="logits")


def _norm(b: Builder, layout: _Layout, x: Value, name: str) -> Value:
    """RMSNorm or LayerNorm over d_model with parameters `{name}.scale` (and `.bias`)."""
    scale = layout.param(b, f"{name}.scale", [layout.d_model])
    if layout.norm == "rms":
        return b.rms_norm(x, scale, name=name)
    bias = layout.param(b, f"{name}.bias", [layout.d_model])
    return b.layer_norm(x, scale, bias, name=name)


def _project_qkv(b: Builder, layout: _Layout, x: Value, prefix: str) -> tuple[Value, Value, Value]:
    """q [batch, seq, heads, head_dim]; k and v like q, or [batch, seq, head_dim] for MQA."""
    if layout.fused_qkv:
        return _project_fused_qkv(b, layout, x, prefix)
    d, heads, head_dim = layout.d_model, layout.heads, layout.head_dim
    wq = layout.param(b, f"{prefix}wq", [d, heads, head_dim])
    kv_shape = [d, head_dim] if layout.multi_query else [d, layout.kv_heads, head_dim]
    wk = layout.param(b, f"{prefix}wk", kv_shape)
    wv = layout.param(b, f"{prefix}wv", kv_shape)
    kv_spec = "bsd,dh->bsh" if layout.multi_query else "bsd,dnh->bsnh"
    return (b.einsum("bsd,dnh->bsnh", x, wq, name=f"{prefix}q"),
            b.einsum(kv_spec, x, wk, name=f"{prefix}k"),
            b.einsum(kv_spec, x, wv, name=f"{prefix}v"))


def _project_fused_qkv(b: Builder, layout: _Layout, x: Value, prefix: str) -> tuple[Value, Value, Value]:
    """One projection by attn.wqkv, sliced along its heads dim into q, k and v."""
    heads, kv_heads = layout.heads, layout.kv_heads
    w = layout.param(b, f"{prefix}wqkv", [layout.d_model, heads + 2 * kv_heads, layout.head_dim])
    qkv = b.einsum("bsd,dnh->bsnh", x, w, name=f"{prefix}qkv")
    # MQA's one key/value head loses its heads dim: attend's shared-head shape.
    squeeze = layout.multi_query
    return (_take_heads(b, qkv, 0, heads, f"{prefix}q"),
            _take_heads(b, qkv, heads, kv_heads, f"{prefix}k", squeeze),
            _take_heads(b, qkv, heads + kv_heads, kv_heads, f"{prefix}v", squeeze))


def _take_heads(b: Builder, qkv: Value, start: int, count: int, name: str, squeeze: bool = False) -> Value:
    """qkv[:, :, start:start + count, :]; `squeeze` reshapes a single head's heads dim away."""
    batch, seq, _, head_dim = qkv.type.shape
    heads = b.slice(qkv, [0, 0, start, 0], [batch, seq, start + count, head_dim], name=None if squeeze else name)
    return b.reshape(heads, [batch, seq, head_dim], name=name) if squeeze else heads


def _mlp(b: Builder, layout: _Layout, x: Value, prefix: str) -> Value:
    """gelu(x @ w_up) @ w_down, or GeGLU: (gelu(x @ w_gate) * (x @ w_up)) @ w_down."""
    d, hidden = layout.d_model, layout.mlp_hidden
    # The projections are named (`up`, `gate`) so that a schedule can place a layout boundary at them
    # (Megatron-SP's: their input cotangents summed before one reduce_scatter).
    if layout.gated_mlp:
        gate = b.gelu(b.matmul(x, layout.param(b, f"{prefix}w_gate", [d, hidden]), name=f"{prefix}gate"))
        up = b.matmul(x, layout.param(b, f"{prefix}w_up", [d, hidden]), name=f"{prefix}up")
        hidden_act = b.mul(gate, up, name=f"{prefix}hidden")
    else:
        up = b.matmul(x, layout.param(b, f"{prefix}w_up", [d, hidden]), name=f"{prefix}up")
        hidden_act = b.gelu(up, name=f"{prefix}hidden")
    return b.matmul(hidden_act, layout.param(b, f"{prefix}w_down", [hidden, d]), name=f"{prefix}out")
