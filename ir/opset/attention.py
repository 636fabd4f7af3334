"""Fused attention: FlashAttention's kernels as three op kinds.

At 32k-128k tokens a sequence's attention scores ([heads, seq, seq] per
sequence, 1 TiB at 128k) cannot exist in memory; every long-context trainer
runs a fused kernel that streams key/value blocks through an online softmax
and never writes the scores. These ops are that kernel, so that the memory
model sees what runs:

  attention(q, k, v, q_pos, k_pos)          -> o
  attention_dq(q, k, v, q_pos, k_pos, o, do)  -> dq
  attention_dkv(q, k, v, q_pos, k_pos, o, do) -> dkv = stack(dk, dv)

with q [B, S, G, R, H] (G key/value heads of R query heads each: multi-head
is R = 1, multi-query G = 1), k and v [B, T, G, H], positions q_pos [S] and
k_pos [T] (i32), o and do like q, dkv [2, B, T, G, H]. `scale` multiplies
the scores; with `causal` a query attends to the keys whose position is at
most its own (the positions are operands, not implied by the index, so a
shard of the queries or a ring of key blocks carries its own). A query row
with no visible key gives zeros.

Factor rules. Batch, key/value heads and query heads are parallel; the query
positions are parallel in the forward and `attention_dq` (each query row is
its own softmax) and a sum in `attention_dkv` (dk and dv add up every
query's contribution); query heads are a sum there too (each key/value head
serves R query heads). The key positions and the head dim are opaque: a
softmax row needs every key and each score the whole head dim, so a split
key sequence is gathered at the op (Llama 3's context parallelism:
all_gather K and V, reduce_scatter their gradients). Ring attention, which
splits the keys and merges blocks by their row statistics, is a different
algorithm, not a sharding of this op.

Cost, as the kernels run: one matmul-sized pass is 2 B G R S T H flops; the
forward makes two (Q K^T, P V), `attention_dq` three (S again, dP = dO V^T,
dQ = dS K) and `attention_dkv` four (S, dP, dV = P^T dO, dK = dS^T Q):
FlashAttention-2's backward as its dq and dk/dv kernels. With `causal` the
kernels skip the key blocks above the diagonal: half the passes' work where
every device's queries see as many keys. In sequence order they do not: a
kernel whose queries are one of k contiguous chunks of the keys' sequence
(context parallelism: keys gathered, T = k S) costs, on the slowest device,
the last chunk's (2k - 1) / 2k of its passes. `balance` = n lays the
sequence out in 2n chunks, mirrored pairs side by side (0, 2n-1, 1, 2n-2,
...; `ir.opset.layout.mirrored_order`), so every split into k dividing n
contiguous parts holds pairs of equal work: the half again. A ring step
(`stats`, one block of keys) costs half where `balance` > 0 (the ring
rewrite sets it where the ring's blocks are balanced, and on its diagonal
step) and its whole passes otherwise: in sequence order some device sees a
whole block at every step but the first. The row statistics the forward saves for the backward
(one f32 per query row and head, 1/H of o) are recomputed by the backward
ops' semantics here and not counted. Bytes: operands read once, results
written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ir.core import Attrs, Mesh, TensorType
from ir.opdef import (
    AttrSpec,
    FactorRule,
    OpCost,
    OpDef,
    Types,
    attr_bool,
    attr_number,
    io_bytes,
    register,
    require,
)


def attr_count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a count (an int, 0 or more), got {v!r}")
    return v


ATTRS = (AttrSpec("scale", attr_number), AttrSpec("causal", attr_bool, True), AttrSpec("stats", attr_bool, False),
         AttrSpec("balance", attr_count, 0))
PASSES = {"attention": 2, "attention_dq": 3, "attention_dkv": 4}  # matmul-sized passes (module docstring)


def _check(kind: str, types: Types, stats: bool = False) -> tuple[TensorType, ...]:
    q, k, v, q_pos, k_pos = types[:5]
    require(q.rank == 5, f"{kind}: q must be [batch, seq, kv_heads, heads per kv head, head_dim], got {q}")
    require(k.rank == 4 and v.rank == 4, f"{kind}: k and v must be [batch, seq, kv_heads, head_dim], got {k}, {v}")
    b, s, g, _, h = q.shape
    require(k.shape == v.shape, f"{kind}: k and v differ: {k}, {v}")
    require(k.shape[0] == b and k.shape[2] == g and k.shape[3] == h,
            f"{kind}: k {k} does not match q {q} in batch, kv_heads or head_dim")
    require(q.dtype == k.dtype == v.dtype and q.dtype in ("f32", "bf16", "f16", "f64"),
            f"{kind}: q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    require(q_pos.shape == (s,) and k_pos.shape == (k.shape[1],) and q_pos.dtype == k_pos.dtype == "i32",
            f"{kind}: positions must be i32 [{s}] and [{k.shape[1]}], got {q_pos}, {k_pos}")
    if len(types) > 5:
        o, do = types[5:]
        want_o = _with_stats(q) if stats else q
        require(o == want_o, f"{kind}: o must be {want_o}, got {o}")
        require(do == q, f"{kind}: do must be like q {q}, got {do}")
    return q, k


def _with_stats(q: TensorType) -> TensorType:
    """o and each query row's log-sum-exp, one more channel, in f32: what a
    block of ring attention returns to be merged."""
    return TensorType((*q.shape[:-1], q.shape[-1] + 1), "f32")


def _infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    q = _check("attention", types)[0]
    return (_with_stats(q) if attrs["stats"] else q,)


def _dq_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    return (_check("attention_dq", types, attrs["stats"])[0],)


def _dkv_infer(types: Types, attrs: Attrs, mesh: Mesh) -> Types:
    _, k = _check("attention_dkv", types, attrs["stats"])
    return (TensorType((2, *k.shape), k.dtype),)


_Q, _KV, _QPOS, _KPOS = ("b", "s", "g", "r", "h"), ("b", "t", "g", "h"), ("s",), ("t",)


_O = ("b", "s", "g", "r", "c")  # o with its statistics: the head dim and one more channel


def _factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    out = _O if attrs["stats"] else _Q
    return FactorRule.build(operand_types, result_types, [_Q, _KV, _KV, _QPOS, _KPOS], [out],
                            opaque=["h", "t", "c"])


def _dq_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    o = _O if attrs["stats"] else _Q
    return FactorRule.build(operand_types, result_types, [_Q, _KV, _KV, _QPOS, _KPOS, o, _Q], [_Q],
                            opaque=["h", "t", "c"])


def _dkv_factors(operand_types: Types, result_types: Types, attrs: Attrs) -> FactorRule:
    o = _O if attrs["stats"] else _Q
    return FactorRule.build(operand_types, result_types, [_Q, _KV, _KV, _QPOS, _KPOS, o, _Q],
                            [("two", *_KV)], combiners={"s": "sum", "r": "sum"}, opaque=["h", "t", "two", "c"])


def causal_share(q: TensorType, k: TensorType, attrs: Attrs) -> tuple[int, int]:
    """The share of its passes a kernel computes on the slowest device, as
    (numerator, denominator) (module docstring, "Cost")."""
    if not attrs["causal"]:
        return 1, 1
    if attrs["stats"]:
        return (1, 2) if attrs["balance"] else (1, 1)
    chunks = max(1, k.shape[1] // q.shape[1])
    if chunks == 1 or (attrs["balance"] and attrs["balance"] % chunks == 0):
        return 1, 2
    return 2 * chunks - 1, 2 * chunks


def _cost(operand_types: Types, result_types: Types, attrs: Attrs, passes: int) -> OpCost:
    q, k = operand_types[0], operand_types[1]
    one_pass = 2 * q.num_elements * k.shape[1]  # 2 B G R S H T
    share, whole = causal_share(q, k, attrs)
    return OpCost(passes * one_pass * share // whole, io_bytes(operand_types, result_types))


def _scores(q, k, q_pos, k_pos, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    """(the scaled scores [B, G, R, S, T] with the masked ones -inf, which are visible)."""
    dtype = np.promote_types(q.dtype, np.float32)
    scores = np.einsum("bsgrh,btgh->bgrst", q.astype(dtype), k.astype(dtype)) * attrs["scale"]
    visible = np.ones(scores.shape[-2:], dtype=bool)
    if attrs["causal"]:
        visible = q_pos[:, None] >= k_pos[None, :]
    return np.where(visible, scores, -np.inf), visible


def _probabilities(q, k, q_pos, k_pos, attrs: Attrs, lse=None) -> np.ndarray:
    """P [B, G, R, S, T]: the softmax over keys of the scaled, masked scores;
    with `lse` [B, G, R, S] (a row's log-sum-exp over more keys than these:
    ring attention's backward), exp(score - lse) for these keys."""
    scores, visible = _scores(q, k, q_pos, k_pos, attrs)
    if lse is not None:
        shift = np.where(np.isfinite(lse), lse, 0.0)[..., None]
        return np.where(visible, np.exp(scores - shift), 0.0)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(visible, np.exp(scores - top), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def _impl(args, attrs: Attrs):
    q, k, v, q_pos, k_pos = args
    p = _probabilities(q, k, q_pos, k_pos, attrs)
    o = np.einsum("bgrst,btgh->bsgrh", p, v.astype(p.dtype))
    if not attrs["stats"]:
        return (o,)
    scores, _ = _scores(q, k, q_pos, k_pos, attrs)
    top = scores.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a row with no visible key: log 0 = -inf
        lse = (np.log(np.exp(scores - safe).sum(axis=-1, keepdims=True)) + safe)[..., 0]  # [B, G, R, S]
    return (np.concatenate([o, np.moveaxis(lse, 3, 1)[..., None]], axis=-1),)


def _score_grads(args, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    """(P, dS): the probabilities and the cotangent of the scaled scores.
    With `stats`, o carries the whole row's log-sum-exp: these keys' share."""
    q, k, v, q_pos, k_pos, o, do = args
    lse = None
    if attrs["stats"]:
        o, lse = o[..., :-1], np.moveaxis(o[..., -1], 1, 3)  # [B, S, G, R] -> [B, G, R, S]
    p = _probabilities(q, k, q_pos, k_pos, attrs, lse)
    do = do.astype(p.dtype)
    dp = np.einsum("bsgrh,btgh->bgrst", do, v.astype(p.dtype))
    row = np.einsum("bsgrh,bsgrh->bgrs", do, o.astype(p.dtype))[..., None]  # rowsum(dO * O) = rowsum(P * dP)
    return p, p * (dp - row)


def _dq_impl(args, attrs: Attrs):
    _, k = args[0], args[1]
    _, ds = _score_grads(args, attrs)
    return (np.einsum("bgrst,btgh->bsgrh", ds, k.astype(ds.dtype)) * attrs["scale"],)


def _dkv_impl(args, attrs: Attrs):
    q, do = args[0], args[6]
    p, ds = _score_grads(args, attrs)
    dk = np.einsum("bgrst,bsgrh->btgh", ds, q.astype(ds.dtype)) * attrs["scale"]
    dv = np.einsum("bgrst,bsgrh->btgh", p, do.astype(p.dtype))
    return (np.stack([dk, dv]),)


def _vjp(b, op, g, wanted):
    """dq from `attention_dq`; dk and dv sliced from one `attention_dkv`."""
    if op.attrs["stats"]:
        raise NotImplementedError("attention with stats is ring attention's block, made after autodiff "
                                  "(ir/ring_attention.py): it has no VJP")
    q, k, v, q_pos, k_pos = op.operands
    attrs = {"scale": op.attrs["scale"], "causal": op.attrs["causal"], "balance": op.attrs["balance"]}
    inputs = [q, k, v, q_pos, k_pos, op.results[0], g]
    out = [None] * 5
    if wanted[0]:
        out[0] = b.op("attention_dq", inputs, **attrs)
    if wanted[1] or wanted[2]:
        dkv = b.op("attention_dkv", inputs, **attrs)
        shape = list(k.type.shape)
        for i in (1, 2):
            if wanted[i]:
                part = b.slice(dkv, [i - 1, 0, 0, 0, 0], [i, *shape])
                out[i] = b.reshape(part, shape)
    return tuple(out)


def _no_vjp(b, op, g, wanted):
    raise NotImplementedError(f"{op.kind} has no VJP: a second derivative of fused attention is not supported")


for _kind, _infer_fn, _factor_fn, _impl_fn, _vjp_fn, _doc in (
    ("attention", _infer, _factors, _impl, _vjp, "fused softmax attention (FlashAttention's forward)"),
    ("attention_dq", _dq_infer, _dq_factors, _dq_impl, _no_vjp, "fused attention's query gradient"),
    ("attention_dkv", _dkv_infer, _dkv_factors, _dkv_impl, _no_vjp,
     "fused attention's key and value gradients, stacked"),
):
    register(OpDef(
        _kind, "attention", 5 if _kind == "attention" else 7, ATTRS, _infer_fn, _factor_fn,
        lambda operands, results, attrs, passes=PASSES[_kind]: _cost(operands, results, attrs, passes),
        impl=_impl_fn, vjp=_vjp_fn, doc=_doc,
    ))
