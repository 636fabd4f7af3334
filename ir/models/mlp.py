"""MLP models with a mean-squared-error loss.

  mlp       the 2-layer MLP of the TOAST and PartIR papers: relu(x @ w1) @ w2
  deep_mlp  the deep MLP of the DistIR paper: `layers` square layers, relu between

Both take a batch `x` and a `target` and return the scalar MSE loss.
"""

from __future__ import annotations

from ir.builder import Builder
from ir.models.base import Model
from ir.models.losses import mean_squared_error

BATCH_INPUTS = ("x", "target")


def mlp(batch: int = 8, d_in: int = 16, hidden: int = 32, d_out: int = 16, dtype: str = "f32") -> Model:
    """loss = mean((relu(x @ w1) @ w2 - target)**2).

    Function @mlp(x [batch, d_in], target [batch, d_out], w1 [d_in, hidden],
    w2 [hidden, d_out]) -> (loss,); trainable: w1, w2.
    """
    b = Builder("mlp")
    x = b.param("x", [batch, d_in], dtype)
    target = b.param("target", [batch, d_out], dtype)
    w1 = b.param("w1", [d_in, hidden], dtype)
    w2 = b.param("w2", [hidden, d_out], dtype)
    h = b.relu(b.matmul(x, w1), name="h")
    y = b.matmul(h, w2, name="y")
    loss = mean_squared_error(b, y, target)
    return Model(b.build([loss]), ("w1", "w2"), BATCH_INPUTS)


def deep_mlp(layers: int = 4, d_model: int = 16, batch: int = 8, dtype: str = "f32") -> Model:
    """`layers` layers of [d_model, d_model] weights `layers.{i}.w`, relu between
    layers (not after the last), MSE loss against `target`.

    Function @deep_mlp(x [batch, d_model], target [batch, d_model],
    layers.0.w, ..., layers.{layers-1}.w) -> (loss,).
    """
    if layers < 1:
        raise ValueError(f"deep_mlp needs at least one layer, got {layers}")
    b = Builder("deep_mlp")
    h = b.param("x", [batch, d_model], dtype)
    target = b.param("target", [batch, d_model], dtype)
    names = tuple(f"layers.{i}.w" for i in range(layers))
    for i, name in enumerate(names):
        last = i == layers - 1
        # `layers.<i>.out` ends a layer: where remat and pipeline stages cut the program.
        h = b.matmul(h, b.param(name, [d_model, d_model], dtype), name=f"layers.{i}.out" if last else f"layers.{i}.y")
        if not last:
            h = b.relu(h, name=f"layers.{i}.out")
    loss = mean_squared_error(b, h, target)
    return Model(b.build([loss]), names, BATCH_INPUTS)
