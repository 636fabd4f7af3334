"""Reverse-mode differentiation over the IR, and training steps.

`grad(fn, wrt)` appends to a forward program (first result: a scalar loss)
the backward pass, built from each op kind's VJP rule in the registry:
cotangents flow from the loss back through the ops in reverse order, and a
value used by several ops sums their contributions (fan-out). Only ops on a
path from a differentiated parameter to the loss are differentiated, and a
rule is asked only for the operands that lead back to those parameters, so
the backward program holds no dead work (a batch input gets no gradient).
Integer and bool values carry no gradient.

`training_step(forward, params, optimizer)` builds one Function: forward,
loss, backward and the optimizer update (SGD or Adam), returning the loss,
the new parameters and the new optimizer state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ir import ops
from ir.builder import Builder
from ir.core import FLOAT_DTYPES, Function, IRError, Op, Value
from ir.models.base import Model


def _reaching(fn: Function, sources: set[Value]) -> set[Value]:
    """Float values computed (transitively) from `sources`."""
    reached = set(sources)
    for op in fn.ops:
        if any(o in reached for o in op.operands):
            reached.update(r for r in op.results if r.type.dtype in FLOAT_DTYPES)
    return reached


def _needed_by(fn: Function, target: Value) -> set[Value]:
    """Values the target depends on."""
    needed = {target}
    for op in reversed(fn.ops):
        if any(r in needed for r in op.results):
            needed.update(op.operands)
    return needed


def backward(b: Builder, fn: Function, loss: Value, wrt: Sequence[Value],
             origins: dict[str, str] | None = None) -> dict[Value, Value]:
    """Emit into `b` (which holds `fn`'s ops) the gradient of `loss` with
    respect to each value in `wrt`; returns value -> gradient value.

    `origins`, when given, receives for every value the backward defines the
    name of the forward value it comes from: the result of the op whose VJP
    emitted it (a fan-out sum: of the op whose contribution it adds), the
    loss for its seed, the parameter for a gradient that is all zeros.
    Pipelining places backward ops on the stage of their forward op by it."""
    if loss.type.shape != () or loss.type.dtype not in FLOAT_DTYPES:
        raise IRError(f"can only differentiate a float scalar loss, %{loss.name} is {loss.type}")
    active = _reaching(fn, set(wrt)) & _needed_by(fn, loss)

    def record(start: int, origin: Value) -> None:
        if origins is not None:
            origins.update((r.name, origin.name) for op in b.body[start:] for r in op.results)

    start = len(b.body)
    cotangent: dict[Value, Value] = {loss: b.full([], 1.0, loss.type.dtype)}
    record(start, loss)
    for op in reversed(fn.ops):
        g = cotangent.get(op.result) if len(op.results) == 1 else None
        wanted = tuple(o in active for o in op.operands)
        if g is None or not any(wanted):
            continue
        start = len(b.body)
        for operand, contribution in zip(op.operands, _vjp(b, op, g, wanted)):
            if contribution is None or operand not in active:
                continue
            previous = cotangent.get(operand)
            cotangent[operand] = contribution if previous is None else b.add(previous, contribution)
        record(start, op.results[0])
    grads = {}
    for w in wrt:
        start = len(b.body)
        grads[w] = cotangent.get(w) or b.zeros(w.type.shape, w.type.dtype)
        record(start, w)
    return grads


def _vjp(b: Builder, op: Op, g: Value, wanted: tuple[bool, ...]) -> tuple[Value | None, ...]:
    rule = ops.get(op.kind).vjp
    if rule is None:
        raise NotImplementedError(
            f"no VJP for {op.kind} ({op.describe()}): differentiate the global program, then partition it"
        )
    return rule(b, op, g, wanted)


def _check_wrt(fn: Function, names: Sequence[str]) -> list[Value]:
    by_name = {p.name: p for p in fn.params}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise IRError(f"@{fn.name} has no parameter {unknown[0]!r}; parameters: {sorted(by_name)}")
    values = [by_name[n] for n in names]
    for v in values:
        if v.type.dtype not in FLOAT_DTYPES:
            raise IRError(f"cannot differentiate with respect to %{v.name}: {v.type} is not a float tensor")
    return values


def grad(fn: Function, wrt: Sequence[str]) -> Function:
    """A function with `fn`'s parameters returning (loss, d loss / d wrt[0], ...).

    The loss is `fn`'s first result, a float scalar.
    """
    wrt_values = _check_wrt(fn, wrt)
    b = Builder(f"{fn.name}.grad", fn.mesh)
    b.adopt(fn)
    grads = backward(b, fn, fn.results[0], wrt_values)
    return b.build([fn.results[0], *(grads[w] for w in wrt_values)])


# ------------------------------------------------------------- optimizers


@dataclass(frozen=True, slots=True)
class SGD:
    """p <- p - lr * g"""

    lr: float = 0.01

    def state(self, param: Value) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Adam:
    """Adam with bias correction (Kingma and Ba). The state is `opt.m.<p>`,
    `opt.v.<p>` per parameter and `opt.step`, the number of steps taken."""

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def state(self, param: Value) -> tuple[str, ...]:
        return (f"opt.m.{param.name}", f"opt.v.{param.name}")


Optimizer = SGD | Adam


def training_step(forward: Function | Model, params: Sequence[str] | None = None,
                  optimizer: Optimizer = Adam()) -> Model:
    """One training step: forward, loss, backward, optimizer update.

    `forward`'s first result is the scalar loss; `params` (default: the
    model's trainable parameters) are updated. The step's results are the
    loss, the new parameters (`<p>.new`), then the new optimizer state
    (`opt.m.<p>.new`, `opt.v.<p>.new`, `opt.step.new` for Adam).
    """
    if isinstance(forward, Model):
        model, fn = forward, forward.function
        params = list(params if params is not None else model.params)
    else:
        if params is None:
            raise IRError("training_step of a bare Function needs the names of the parameters to train")
        model, fn = None, forward
    wrt = _check_wrt(fn, params)
    b = Builder(f"{fn.name}.train_step", fn.mesh)
    b.adopt(fn)
    state = {w: [b.param(n, w.type.shape, w.type.dtype) for n in optimizer.state(w)] for w in wrt}
    step = b.param("opt.step", [], "f32") if isinstance(optimizer, Adam) else None
    origins: dict[str, str] = {}
    grads = backward(b, fn, fn.results[0], wrt, origins)
    new_params, new_state = [], []
    if step is not None:
        start = len(b.body)
        corrections = _adam_corrections(b, optimizer, step, sorted({w.type.dtype for w in wrt}))
        origins.update((r.name, step.name) for op in b.body[start:] for r in op.results)
    for w in wrt:
        start = len(b.body)
        if isinstance(optimizer, Adam):
            updated, m, v = _adam_update(b, optimizer, w, grads[w], *state[w], corrections[w.type.dtype])
            new_state += [m, v]
        else:
            updated = b.sub(w, b.mul(grads[w], optimizer.lr), name=f"{w.name}.new")
        new_params.append(updated)
        origins.update((r.name, w.name) for op in b.body[start:] for r in op.results)
    if step is not None:
        start = len(b.body)
        new_state.append(b.add(step, 1.0, name="opt.step.new"))
        origins.update((r.name, step.name) for op in b.body[start:] for r in op.results)
    result = b.build([fn.results[0], *new_params, *new_state])
    inputs = model.inputs if model else tuple(p.name for p in fn.params if p.name not in params)
    untrained = tuple(n for n in (model.params if model else ()) if n not in params)
    state_names = tuple(v.name for w in wrt for v in state[w]) + (("opt.step",) if step is not None else ())
    return Model(result, tuple(params), tuple(inputs) + untrained, state_names,
                 origins=tuple(sorted(origins.items())), forward_ops=len(fn.ops))


def _adam_corrections(b: Builder, opt: Adam, step: Value, dtypes: Sequence[str]) -> dict[str, tuple[Value, Value]]:
    """The bias corrections 1 - b1^t and 1 - b2^t, t = step + 1, in each of
    `dtypes`: computed once a step and read by every parameter's update, as
    optax's `scale_by_adam` does (made per parameter, they were a quarter of
    an 80-layer step's ops, every one analysed, tabulated and replayed)."""
    t = b.add(step, 1.0)
    # b^t = exp(t ln b): the step count is a program input, so this stays in the IR.
    correction1 = b.sub(1.0, b.exp(b.mul(t, math.log(opt.b1))))
    correction2 = b.sub(1.0, b.exp(b.mul(t, math.log(opt.b2))))
    return {d: (b.convert(correction1, d), b.convert(correction2, d)) for d in dtypes}


def _adam_update(b: Builder, opt: Adam, w: Value, g: Value, m: Value, v: Value,
                 corrections: tuple[Value, Value]) -> tuple:
    """m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2;
    w' = w - lr * (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps), the
    corrections (1 - b1^t, 1 - b2^t) in w's dtype."""
    correction1, correction2 = corrections
    m_new = b.add(b.mul(m, opt.b1), b.mul(g, 1.0 - opt.b1), name=f"opt.m.{w.name}.new")
    v_new = b.add(b.mul(v, opt.b2), b.mul(b.mul(g, g), 1.0 - opt.b2), name=f"opt.v.{w.name}.new")
    m_hat = b.div(m_new, b.broadcast_to(correction1, w.type.shape))
    v_hat = b.div(v_new, b.broadcast_to(correction2, w.type.shape))
    step_size = b.div(m_hat, b.add(b.sqrt(v_hat), opt.eps))
    return b.sub(w, b.mul(step_size, opt.lr), name=f"{w.name}.new"), m_new, v_new
