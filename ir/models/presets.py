"""Full-size transformer configurations: keyword arguments of `transformer()`.

  gemma_2b        Gemma 2B: MQA, GeGLU, tied embeddings (published: 2.51e9 parameters)
  gemma_7b        Gemma 7B: MHA, GeGLU, tied embeddings (published: 8.54e9 parameters)
  chinchilla_32l  a 32-layer Chinchilla-style model: MHA, plain GELU MLP, untied
  llama2_70b      Llama 2 70B: GQA (64 query heads, 8 key/value heads), gated MLP,
                  untied, sequences of 4096, a global batch of 1024 (published:
                  6.9e10 parameters; the builder's gate is GELU where Llama's is
                  SiLU, the same shapes and cost)
  llama3_8b       Llama 3 8B at long context: GQA (32 query heads, 8 key/value
                  heads), gated MLP 14,336, vocabulary 128,256, untied, sequences
                  of 131,072, a global batch of 16 (the long-context stage's
                  shape; published: 8.0e9 parameters), laid out in 16
                  mirrored chunk pairs (`balance`: the same causal work on
                  each device of a context-parallel split into up to 16)

The others train on sequences of 2048 tokens, all in bf16. Gemma's (1 + scale) RMSNorm and
sqrt(d_model) embedding scaling are not modelled: they change no shapes.
"""

from __future__ import annotations

from typing import Any

gemma_2b: dict[str, Any] = dict(
    layers=18, d_model=2048, heads=8, kv_heads=1, head_dim=256, gated_mlp=True, mlp_hidden=16384,
    vocab=256128, tied_embeddings=True, norm="rms", seq=2048, batch=16, dtype="bf16",
)

gemma_7b: dict[str, Any] = dict(
    layers=28, d_model=3072, heads=16, head_dim=256, gated_mlp=True, mlp_hidden=24576,
    vocab=256128, tied_embeddings=True, norm="rms", seq=2048, batch=16, dtype="bf16",
)

chinchilla_32l: dict[str, Any] = dict(
    layers=32, d_model=4096, heads=32, head_dim=128, gated_mlp=False, mlp_hidden=16384,
    vocab=32000, tied_embeddings=False, norm="rms", seq=2048, batch=48, dtype="bf16",
)

llama2_70b: dict[str, Any] = dict(
    layers=80, d_model=8192, heads=64, kv_heads=8, head_dim=128, gated_mlp=True, mlp_hidden=28672,
    vocab=32000, tied_embeddings=False, norm="rms", seq=4096, batch=1024, dtype="bf16",
)

llama3_8b: dict[str, Any] = dict(
    layers=32, d_model=4096, heads=32, kv_heads=8, head_dim=128, gated_mlp=True, mlp_hidden=14336,
    vocab=128256, tied_embeddings=False, norm="rms", seq=131072, batch=16, dtype="bf16", attention="flash",
    balance=16,
)

PRESETS: dict[str, dict[str, Any]] = {
    "gemma_2b": gemma_2b,
    "gemma_7b": gemma_7b,
    "chinchilla_32l": chinchilla_32l,
    "llama2_70b": llama2_70b,
    "llama3_8b": llama3_8b,
}
