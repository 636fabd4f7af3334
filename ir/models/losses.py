"""Losses shared by the model builders, written with existing Builder ops."""

from __future__ import annotations

import math

from ir.builder import Builder
from ir.core import Value


def mean_squared_error(b: Builder, y: Value, target: Value, name: str = "loss") -> Value:
    """mean((y - target)**2) over all elements: a scalar."""
    diff = b.sub(y, target)
    return b.mean(b.mul(diff, diff), range(y.type.rank), name=name)


def softmax_cross_entropy(b: Builder, logits: Value, targets: Value, name: str = "loss") -> Value:
    """Mean over positions of -log softmax(logits)[target]: a scalar.

    `logits` is [..., classes] and `targets` (i32) the leading dims. The one-hot
    is compare(iota, targets) rather than a gather of log-probabilities, so every
    op keeps the class dimension whole or elementwise, which sharding can follow.
    """
    shape = logits.type.shape
    log_probs = b.log_softmax(logits)
    classes = b.iota(shape, dimension=len(shape) - 1)
    labels = b.broadcast_in_dim(targets, shape, range(targets.type.rank))
    one_hot = b.convert(b.compare(classes, labels, "eq"), logits.type.dtype)
    total = b.sum(b.mul(one_hot, log_probs), range(len(shape)))
    return b.mul(total, -1.0 / math.prod(targets.type.shape), name=name)
