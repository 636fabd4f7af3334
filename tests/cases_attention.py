"""Op cases of the fused attention family (attention, attention_dq,
attention_dkv): merged into test_ops.CASES. The references are written
apart from the ops' impls: the scores materialized, the softmax taken row
by row in float64, the gradients by the textbook formulas (dS = P * (dP -
rowsum(P * dP)), not the kernels' rowsum(dO * O)), so a wrong impl and a
wrong reference would have to agree by accident."""

from __future__ import annotations

import numpy as np
from op_cases import F32, I32, Case, t


def counting(offset: int = 0):
    """Positions offset, offset + 1, ...: a sequence's own, or a later block's."""
    return lambda rng, ty: (np.arange(ty.shape[0]) + offset).astype(I32)


def _probs(q, k, q_pos, k_pos, scale, causal):
    q, k = q.astype(np.float64), k.astype(np.float64)
    b, s, g, r, _ = q.shape
    p = np.zeros((b, g, r, s, k.shape[1]))
    for index in np.ndindex(b, g, r, s):
        bi, gi, ri, si = index
        row = np.array([scale * q[bi, si, gi, ri] @ k[bi, ti, gi] for ti in range(k.shape[1])])
        seen = k_pos <= q_pos[si] if causal else np.ones(len(row), dtype=bool)
        if seen.any():
            e = np.exp(row[seen] - row[seen].max())
            p[index][seen] = e / e.sum()
    return p


def ref_attention(scale: float, causal: bool):
    def ref(q, k, v, q_pos, k_pos):
        p = _probs(q, k, q_pos, k_pos, scale, causal)
        return np.einsum("bgrst,btgh->bsgrh", p, v.astype(np.float64)).astype(F32)
    return ref


def _grads(q, k, v, q_pos, k_pos, do, scale, causal, only: slice | None = None):
    """dq, dk, dv; `only`: dq from those keys alone (a ring block's share of it)."""
    p = _probs(q, k, q_pos, k_pos, scale, causal)
    dp = np.einsum("bsgrh,btgh->bgrst", do.astype(np.float64), v.astype(np.float64))
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if only is not None:
        kept = np.zeros(k.shape[1], dtype=bool)
        kept[only] = True
        ds = np.where(kept, ds, 0.0)
    dq = scale * np.einsum("bgrst,btgh->bsgrh", ds, k.astype(np.float64))
    dk = scale * np.einsum("bgrst,bsgrh->btgh", ds, q.astype(np.float64))
    dv = np.einsum("bgrst,bsgrh->btgh", p, do.astype(np.float64))
    return dq, dk, dv


def ref_dq(scale: float, causal: bool):
    def ref(q, k, v, q_pos, k_pos, o, do):
        return _grads(q, k, v, q_pos, k_pos, do, scale, causal)[0].astype(F32)
    return ref


def ref_dkv(scale: float, causal: bool):
    def ref(q, k, v, q_pos, k_pos, o, do):
        _, dk, dv = _grads(q, k, v, q_pos, k_pos, do, scale, causal)
        return np.stack([dk, dv]).astype(F32)
    return ref


def _with_output(scale: float, causal: bool, offset: int = 0):
    """Generators for (q, k, v, q_pos, k_pos, o, do) where o is the forward's
    output of q, k, v (the backward ops read it as the kernels do)."""
    state: dict = {}

    def keep(i):
        def gen(rng, ty):
            if i < 3 or i == 6:
                x = rng.standard_normal(ty.shape).astype(F32)
            elif i == 3:
                x = (np.arange(ty.shape[0])).astype(I32)
            elif i == 4:
                x = (np.arange(ty.shape[0]) + offset).astype(I32)
            else:
                x = ref_attention(scale, causal)(*(state[j] for j in range(5)))
            state[i] = x
            return x
        return gen
    return tuple(keep(i) for i in range(7))


def _lse(q, k, q_pos, k_pos, scale, causal):
    """Each query row's log-sum-exp of its visible scaled scores [B, S, G, R] (-inf: none visible)."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    b, s, g, r, _ = q.shape
    out = np.full((b, s, g, r), -np.inf)
    for bi, si, gi, ri in np.ndindex(b, s, g, r):
        row = np.array([scale * q[bi, si, gi, ri] @ k[bi, ti, gi] for ti in range(k.shape[1])])
        seen = k_pos <= q_pos[si] if causal else np.ones(len(row), dtype=bool)
        if seen.any():
            out[bi, si, gi, ri] = np.log(np.exp(row[seen]).sum())
    return out


def ref_attention_stats(scale: float, causal: bool):
    def ref(q, k, v, q_pos, k_pos):
        o = ref_attention(scale, causal)(q, k, v, q_pos, k_pos).astype(np.float64)
        return np.concatenate([o, _lse(q, k, q_pos, k_pos, scale, causal)[..., None]], axis=-1).astype(F32)
    return ref


def _block_of_keys(scale: float, causal: bool, keys: int, block: slice, offset: int = 0):
    """Generators for a ring block's backward (q, k, v, q_pos, k_pos, o, do):
    k, v and k_pos are `block` of `keys` keys; o is the whole attention's
    output over all of them with each row's log-sum-exp (the statistics the
    ring's forward merged)."""
    state: dict = {}

    def gen(i):
        def make(rng, ty):
            if i == 0:
                state["q"] = rng.standard_normal(ty.shape).astype(F32)
                b, _, g, _, h = ty.shape
                state["k"], state["v"] = (rng.standard_normal((b, keys, g, h)).astype(F32) for _ in range(2))
                return state["q"]
            if i in (1, 2):
                return state["kv"[i - 1]][:, block]
            if i == 3:
                state["q_pos"] = (np.arange(ty.shape[0]) + offset).astype(I32)
                return state["q_pos"]
            if i == 4:
                return np.arange(keys).astype(I32)[block]
            if i == 5:
                full = (state["q"], state["k"], state["v"], state["q_pos"], np.arange(keys).astype(I32))
                return ref_attention_stats(scale, causal)(*full)
            return rng.standard_normal(ty.shape).astype(F32)
        return make
    return tuple(gen(i) for i in range(7)), state


def ref_block_grads(scale: float, causal: bool, state: dict, block: slice, which: str):
    """The block's share of dq, or its keys' dk and dv, from the whole attention's P."""
    def ref(q, k, v, q_pos, k_pos, o, do):
        keys = state["k"].shape[1]
        dq, dk, dv = _grads(q, state["k"], state["v"], q_pos, np.arange(keys).astype(I32), do, scale, causal,
                            only=block)
        return (dq if which == "dq" else np.stack([dk[:, block], dv[:, block]])).astype(F32)
    return ref


_SCALE = 0.5
_GQA = (t(2, 4, 2, 2, 3), t(2, 4, 2, 3), t(2, 4, 2, 3), t(4, dtype="i32"), t(4, dtype="i32"))
_MHA_LONG_KEYS = (t(1, 2, 2, 1, 3), t(1, 6, 2, 3), t(1, 6, 2, 3), t(2, dtype="i32"), t(6, dtype="i32"))

_RING_GENS, _RING_STATE = _block_of_keys(_SCALE, True, keys=6, block=slice(2, 4), offset=2)
_RING = (t(2, 4, 2, 2, 3), t(2, 2, 2, 3), t(2, 2, 2, 3), t(4, dtype="i32"), t(2, dtype="i32"), t(2, 4, 2, 2, 4),
         t(2, 4, 2, 2, 3))

CASES = [
    Case("attention", "gqa-causal", _GQA, {"scale": _SCALE}, ref_attention(_SCALE, True), (None, None, None,
         counting(), counting())),
    Case("attention", "gqa-full", _GQA, {"scale": _SCALE, "causal": False}, ref_attention(_SCALE, False),
         (None, None, None, counting(), counting())),
    # Two queries at positions 0, 1 against keys at 2..7: a later block, every key masked (zeros).
    Case("attention", "masked-block", _MHA_LONG_KEYS, {"scale": _SCALE}, ref_attention(_SCALE, True),
         (None, None, None, counting(), counting(2))),
    # Keys at -4..1 (an earlier block and the diagonal): some rows see some keys.
    Case("attention", "earlier-keys", _MHA_LONG_KEYS, {"scale": _SCALE}, ref_attention(_SCALE, True),
         (None, None, None, counting(), counting(-4))),
    Case("attention_dq", "gqa-causal", _GQA + (_GQA[0], _GQA[0]), {"scale": _SCALE}, ref_dq(_SCALE, True),
         _with_output(_SCALE, True)),
    Case("attention_dq", "earlier-keys", _MHA_LONG_KEYS + (_MHA_LONG_KEYS[0],) * 2, {"scale": _SCALE},
         ref_dq(_SCALE, True), _with_output(_SCALE, True, -4)),
    Case("attention_dkv", "gqa-causal", _GQA + (_GQA[0], _GQA[0]), {"scale": _SCALE}, ref_dkv(_SCALE, True),
         _with_output(_SCALE, True)),
    Case("attention_dkv", "gqa-full", _GQA + (_GQA[0], _GQA[0]), {"scale": _SCALE, "causal": False},
         ref_dkv(_SCALE, False), _with_output(_SCALE, False)),
    # Ring attention's blocks: the output with each row's log-sum-exp; a block's backward from the whole
    # attention's statistics (queries at 2..5 against keys 2, 3 of 0..5).
    Case("attention", "stats", _GQA, {"scale": _SCALE, "stats": True}, ref_attention_stats(_SCALE, True),
         (None, None, None, counting(), counting(1))),
    Case("attention_dq", "ring-block", _RING, {"scale": _SCALE, "stats": True},
         ref_block_grads(_SCALE, True, _RING_STATE, slice(2, 4), "dq"), _RING_GENS),
    Case("attention_dkv", "ring-block", _RING, {"scale": _SCALE, "stats": True},
         ref_block_grads(_SCALE, True, _RING_STATE, slice(2, 4), "dkv"), _RING_GENS),
]

# The head dim everywhere and the key positions are opaque (the module docstring of ir/opset/attention.py);
# in attention_dkv the stacked pair's dim too.
_FORWARD = ([{4}, {1, 3}, {1, 3}, set(), {0}], [{4}])
_BACKWARD = ([{4}, {1, 3}, {1, 3}, set(), {0}, {4}, {4}], [{4}])
_DKV = (_BACKWARD[0], [{0, 2, 4}])
OPAQUE_DIMS = {c.id: {"attention": _FORWARD, "attention_dq": _BACKWARD, "attention_dkv": _DKV}[c.kind]
               for c in CASES}
OPAQUE_DIMS["attention-stats"] = (_FORWARD[0], [{4}])  # the output's channels (head dim and statistics)
