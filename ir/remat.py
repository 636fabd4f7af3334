"""Rematerialization: recompute a layer's forward in the backward instead of
keeping its activations (what `jax.checkpoint` does to a layer).

A training step (`ir.autodiff.training_step`) is its forward ops, then the
backward and the optimizer update. The backward reads many forward values:
every activation a layer's VJPs need, kept from the forward to the layer's
backward, which for deep models is most of the memory. `rematerialize`
rewrites the step so that the chosen layers keep only their output (the
next layer's input): right before the first backward op that reads one of
a layer's activations, a copy of the forward ops that make those
activations is inserted (values named `<name>.remat`), reading the layer's
input and parameters, and the backward reads the copies. The values are the
same (the ops are deterministic), so the step computes exactly what it did;
the forward's activations now die in the forward, and each layer's copies
live only through its own backward. The price is the forward's flops again.

Layers are found by name, as the model builders write them: layer l's
forward ends at the value `layers.<l>.out` and starts after the previous
layer's; its ops are those of that range that depend on its input or on a
`layers.<l>.` parameter, and the ops of the range those read (a fill, the
mask broadcast to the scores' shape). A mask computed once before the
layers is outside every range, and is kept. A pure function: it returns a new Function.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Sequence

from ir.core import Function, IRError, Op, Recent, Value

_LAYER_OUT = re.compile(r"layers\.(\d+)\.out")
_LAYER_PARAM = re.compile(r"layers\.\d+\.")

REMAT_SUFFIX = ".remat"  # a recomputed value is named after the value it recomputes


def layer_count(fn: Function, forward_ops: int) -> int:
    """How many layers `layer_segments` finds (its layer outputs), without finding their ops
    (kept for the last few programs: a mesh search asks it of each mesh's stages, a thousand times)."""
    return _LAYER_COUNTS.get((fn,), forward_ops, lambda: len(
        {int(m[1]) for op in fn.ops[:forward_ops] for r in op.results if (m := _LAYER_OUT.fullmatch(r.name))}))


_LAYER_COUNTS = Recent(4)


def layer_segments(fn: Function, forward_ops: int) -> dict[int, tuple[int, ...]]:
    """Layer index -> the indices of its forward ops (see the module docstring),
    among the first `forward_ops` ops of `fn`."""
    outputs = {}
    for i, op in enumerate(fn.ops[:forward_ops]):
        for r in op.results:
            match = _LAYER_OUT.fullmatch(r.name)
            if match:
                outputs[int(match[1])] = i
    readers = _readers(fn.ops[:forward_ops])
    params = set(fn.params)
    own: dict[str, set[Value]] = {}  # `layers.<l>.` -> that layer's parameters
    for p in fn.params:
        match = _LAYER_PARAM.match(p.name)
        if match:
            own.setdefault(match[0], set()).add(p)
    segments = {}
    start, source = 0, None
    for layer in sorted(outputs):
        end = outputs[layer]
        mine = own.get(f"layers.{layer}.", set())
        segments[layer] = _layer_ops(fn, range(start, end + 1), mine, params, source, readers)
        start, source = end + 1, fn.ops[end].results[0]
    return segments


def _readers(ops: Sequence[Op]) -> dict[Value, list[int]]:
    """Value -> the indices of the ops in `ops` that read it, in order."""
    readers: dict[Value, list[int]] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            readers.setdefault(v, []).append(i)
    return readers


def _layer_ops(fn: Function, span: range, mine: set[Value], params: set[Value], source: Value | None,
               readers: dict[Value, list[int]]) -> tuple[int, ...]:
    """The ops of `span` that are one layer's (module docstring): those reached
    from its input `source` or its parameters (`mine`, among all `params`),
    and what they read from the span that no later layer reads and that reads
    no other parameter."""
    reached = mine | ({source} if source is not None else set())
    members = []
    for i in span:
        if any(v in reached for v in fn.ops[i].operands):
            members.append(i)
            reached.update(fn.ops[i].results)
    chosen = set(members)
    used = {v for i in members for v in fn.ops[i].operands}
    for i in reversed(span):
        op = fn.ops[i]
        if i in chosen or not used & set(op.results):
            continue
        # Not what reads other parameters (the embedding is the first layer's input), nor what
        # later layers read too (a mask computed in the first layer's span is shared).
        reads_other = any(v in params and v not in mine for v in op.operands)
        if reads_other or any(j > span[-1] for r in op.results for j in readers.get(r, ())):
            continue
        chosen.add(i)
        used.update(op.operands)
    return tuple(sorted(chosen))


def select_layers(segments: Collection[int], patterns: Sequence[str]) -> list[int]:
    """The layers whose name `layers.<l>` matches one of the glob `patterns`
    (`layers.*`, `layers.1?`)."""
    chosen = [layer for layer in sorted(segments) if any(fnmatch.fnmatchcase(f"layers.{layer}", p) for p in patterns)]
    if not chosen:
        raise IRError(f"remat: no layer matches {', '.join(patterns)}; the program's layers are "
                      f"layers.0 .. layers.{max(segments)}" if segments else
                      "remat: the program has no layers (values named layers.<l>.out)")
    return chosen


def rematerialize(fn: Function, forward_ops: int, layers: Sequence[int]) -> Function:
    """`fn` (a training step whose first `forward_ops` ops are its forward)
    with the forward of each of `layers` recomputed in the backward."""
    segments = layer_segments(fn, forward_ops)
    missing = [layer for layer in layers if layer not in segments]
    if missing:
        raise IRError(f"remat: no layer {missing[0]} in {fn.name} (values named layers.<l>.out)")
    ops = list(fn.ops)
    inserts: dict[int, list[Op]] = {}  # backward op index -> recomputation to emit before it
    renamed: dict[int, dict[Value, Value]] = {}  # backward op index -> operand substitutions
    readers = _readers(ops)  # looked up per layer, built once
    for layer in layers:
        _plan_layer(fn, forward_ops, segments[layer], readers, inserts, renamed)
    out: list[Op] = []
    for i, op in enumerate(ops):
        out += inserts.get(i, [])
        subs = renamed.get(i)
        out.append(op if not subs else Op(op.kind, tuple(subs.get(v, v) for v in op.operands), op.results, op.attrs))
    return Function(fn.name, fn.params, tuple(out), fn.results, fn.mesh)


def _plan_layer(fn: Function, forward_ops: int, members: tuple[int, ...], readers: dict[Value, list[int]],
                inserts: dict, renamed: dict) -> None:
    """Where one layer's recomputation goes and which backward reads it
    replaces (`readers`: the ops reading each value, in order)."""
    inside = {r for i in members for r in fn.ops[i].results}
    member_set = set(members)
    read_later = {v for v in inside if any(i < forward_ops and i not in member_set for i in readers.get(v, ()))}
    kept = read_later | ({fn.ops[members[-1]].results[0]} if members else set())
    kept |= inside & set(fn.results)
    # The activations the backward reads, and the first backward op reading one.
    backward_reads = {v: [i for i in readers.get(v, ()) if i >= forward_ops] for v in inside - kept}
    wanted = {v for v, at in backward_reads.items() if at}
    if not wanted:
        return
    first = min(backward_reads[v][0] for v in wanted)
    # Recompute only what the wanted values need, within the layer.
    needed = set(wanted)
    for i in reversed(members):
        op = fn.ops[i]
        if any(r in needed for r in op.results):
            needed.update(v for v in op.operands if v in inside and v not in kept)
    copies: dict[Value, Value] = {}
    emitted = []
    for i in members:
        op = fn.ops[i]
        if not any(r in needed for r in op.results):
            continue
        results = tuple(Value(f"{r.name}{REMAT_SUFFIX}", r.type) for r in op.results)
        copies.update(zip(op.results, results))
        emitted.append(Op(op.kind, tuple(copies.get(v, v) for v in op.operands), results, op.attrs))
    inserts.setdefault(first, []).extend(emitted)
    for v, copy in copies.items():
        for i in readers.get(v, ()):
            if i >= first:
                renamed.setdefault(i, {})[v] = copy
