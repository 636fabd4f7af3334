"""Model builders: functions returning a `Model` (a forward program whose first
result is the scalar loss, plus which parameters are trainable and which are
batch inputs).

  mlp                   2-layer MLP, MSE loss (TOAST, PartIR)      ir.models.mlp
  deep_mlp              n-layer square MLP, MSE loss (DistIR)      ir.models.mlp
  simplified_attention  attention with a mock softmax (TOAST)      ir.models.attention
  attention             single- or multi-head softmax attention    ir.models.attention
  transformer           decoder-only transformer, cross-entropy    ir.models.transformer
  moe_transformer       the same with mixture-of-experts MLPs      ir.models.moe
  unet                  convolutional U-Net denoiser, MSE loss     ir.models.unet
  transformer_decode    one KV-cached decode step: logits, no loss ir.models.decode
  gns                   graph network simulator, MSE loss (PartIR) ir.models.gns

`build(name, **kwargs)` looks a builder up by name; `build_preset(name)`
builds a full-size transformer from `PRESETS` (ir.models.presets).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ir.models.attention import attention, simplified_attention
from ir.models.base import Model
from ir.models.decode import transformer_decode
from ir.models.gns import gns
from ir.models.mlp import deep_mlp, mlp
from ir.models.moe import moe_transformer
from ir.models.presets import PRESETS
from ir.models.transformer import transformer
from ir.models.unet import unet

BUILDERS: dict[str, Callable[..., Model]] = {
    "mlp": mlp,
    "deep_mlp": deep_mlp,
    "simplified_attention": simplified_attention,
    "attention": attention,
    "transformer": transformer,
    "moe_transformer": moe_transformer,
    "transformer_decode": transformer_decode,
    "gns": gns,
    "unet": unet,
}

__all__ = ["BUILDERS", "PRESETS", "Model", "build", "build_preset", "check_args"]


def build(name: str, **kwargs: Any) -> Model:
    """Build the model `name` with the builder's keyword arguments; a ValueError
    names an unknown builder or argument and lists the valid ones."""
    builder = BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown model builder {name!r}; valid builders: {', '.join(BUILDERS)}")
    check_args(name, kwargs)
    return builder(**kwargs)


def check_args(name: str, kwargs: dict[str, Any]) -> None:
    """Raise a ValueError naming any argument the builder `name` does not take
    (listing the valid ones) or any value of the wrong kind."""
    params = inspect.signature(BUILDERS[name]).parameters
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise ValueError(f"{name}: unknown argument(s) {', '.join(unknown)}; valid arguments: {', '.join(params)}")
    for key, value in kwargs.items():
        _check_arg(name, key, value, params[key].default)


def _check_arg(builder: str, key: str, value: Any, default: Any) -> None:
    """Sizes are positive ints and flags bools, judged by the default's type, so
    a bad spec value is a clear error instead of a failure deep in a builder."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{builder}: {key} must be true or false, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{builder}: {key} must be a positive integer, got {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"{builder}: {key} must be a string, got {value!r}")


def build_preset(name: str) -> Model:
    """Build the full-size transformer configuration `name` from PRESETS."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return transformer(**PRESETS[name])
