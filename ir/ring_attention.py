"""Ring attention: context parallelism that passes key/value blocks around
the context axis instead of gathering them.

A rewrite of a device-local program (after `ir.lower`), as remat is of a
global one. Where context parallelism splits the queries over an axis of n
devices, the lowering gathers K and V whole at each attention kernel
(`all_gather` along the sequence) and reduce-scatters their gradient. Here
each such kernel becomes n steps over the key/value blocks instead: device
i starts with its own block, and at each step every device passes its
block to the next (`collective_permute`, cyclic) while it attends to the
one it holds. The forward's blocks (`attention` with `stats`: the output
and each row's log-sum-exp, in f32) are merged by their statistics, the
online softmax:

    lse = log(exp(lse_a) + exp(lse_b)),  o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse)

The backward's blocks read the merged output and statistics (FlashAttention
2's backward with the row statistics saved): each block's share of dq adds
up on the device, and each block's dk and dv, summed over every device's
queries, travel with the block and go home with one more permute.

What it changes, against the all-gather it replaces: the same bytes over
the same links (n - 1 blocks in, a gathered copy's worth) and the same
flops, but each transfer is a collective_permute the simulator overlaps
with the previous block's compute, and a device holds two blocks, not the
whole sequence's K and V. Kernels whose gathers or gradient fit no ring
(keys gathered over several axes, a gradient reduced over other axes too)
are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from ir.builder import Builder
from ir.core import Function, IRError, Op, Value, without_dead_ops


def ring_attention(fn: Function, axis: str, made_for: dict[str, str] | None = None) -> Function:
    """`fn` (device-local) with its context-parallel attention kernels over
    `axis` run as rings (module docstring). `made_for`, where given,
    receives for each value the rings add the result of the kernel it was
    made for (a pipeline places it with that kernel's stage and phase)."""
    if axis not in fn.mesh.names:
        raise IRError(f"ring attention: the mesh has no axis {axis!r}; its axes: {', '.join(fn.mesh.names)}")
    n = fn.mesh.size(axis)
    rings = _Rings(fn, axis)
    if n == 1 or not rings.forward:
        return fn
    b = _builder(fn)
    env: dict[Value, Value] = {}
    stats: dict[Value, Value] = {}  # a forward kernel's result -> its ring's merged output and statistics
    for op in fn.ops:
        operands = [env.get(v, v) for v in op.operands]
        group = rings.backward.pop(rings.key(op), None) if op.kind.startswith("attention_d") else None
        start = len(b.body)
        if op.result in rings.forward:
            stats[op.result] = _forward(b, op, operands, _mapped(rings.gathered, env), axis, n)
            env[op.result] = _output(b, stats[op.result], op.result.type.dtype)
        elif group is not None:
            sums = _backward(b, group, operands, stats[op.operands[5]], _mapped(rings.gathered, env), axis, n)
            for kernel, total in zip(group, sums):
                for r in rings.scattered.get(kernel, [kernel]):
                    env[r.result] = total
        elif op not in rings.replaced:
            b.body.append(op if operands == list(op.operands) else Op(op.kind, tuple(operands), op.results, op.attrs))
            continue
        if made_for is not None:
            made_for.update((r.name, op.result.name) for added in b.body[start:] for r in added.results)
    return without_dead_ops(b.build([env.get(r, r) for r in fn.results]))


def _mapped(gathered, env: dict[Value, Value]):
    """`gathered`, answering with the block as the rewrite has it so far."""
    def block(v: Value, dim: int) -> Value | None:
        found = gathered(v, dim)
        return None if found is None else env.get(found, found)
    return block


def _builder(fn: Function) -> Builder:
    """A builder with `fn`'s parameters whose new values take names none of `fn`'s have."""
    b = Builder(fn.name, fn.mesh)
    for p in fn.params:
        b.add_param(p)
    for op in fn.ops:
        for r in op.results:
            b.take_name(r.name)
    return b


class _Rings:
    """Which kernels of `fn` run as rings over `axis`: the forward kernels
    whose K and V are gathered over it alone (`forward`, their results), and
    per forward kernel and cotangent the backward kernels that read the
    same blocks (`backward`, keyed by `key`): dq, and dkv where its every
    reader is a reduce_scatter over the axis along the keys (`scattered`)."""

    def __init__(self, fn: Function, axis: str) -> None:
        self.axis = axis
        self.made = {r: op for op in fn.ops for r in op.results}
        readers: dict[Value, list[Op]] = {}
        for op in fn.ops:
            for v in op.operands:
                readers.setdefault(v, []).append(op)
        self.forward = {op.result for op in fn.ops if op.kind == "attention" and self.ringable(op)}
        self.scattered: dict[Op, list[Op]] = {}
        self.backward: dict[tuple, list[Op]] = {}
        for op in fn.ops:
            if op.kind not in ("attention_dq", "attention_dkv") or not self.ringable(op) \
                    or op.operands[5] not in self.forward:
                continue
            if op.kind == "attention_dkv":
                scatters = readers.get(op.result, [])
                if not scatters or any(r.kind != "reduce_scatter" or r.attrs["axes"] != (axis,)
                                       or r.attrs["dim"] != 2 for r in scatters):
                    continue
                self.scattered[op] = scatters
            self.backward.setdefault(self.key(op), []).append(op)
        self.replaced = {r for rs in self.scattered.values() for r in rs} | \
            {k for ks in self.backward.values() for k in ks}

    def gathered(self, v: Value, dim: int) -> Value | None:
        """The local block `v` was all-gathered from along `dim` over the axis alone."""
        op = self.made.get(v)
        if op is not None and op.kind == "all_gather" and op.attrs["axes"] == (self.axis,) and op.attrs["dim"] == dim:
            return op.operands[0]
        return None

    def ringable(self, op: Op) -> bool:
        return (not op.attrs["stats"] and self.gathered(op.operands[1], 1) is not None
                and self.gathered(op.operands[2], 1) is not None)

    def key(self, op: Op) -> tuple:
        """What a backward kernel's ring reads: the same for dq and dkv of one kernel and cotangent."""
        q, k, v, q_pos, k_pos, *rest = op.operands
        return (q, self.gathered(k, 1), self.gathered(v, 1), self.source(q_pos), self.gathered(k_pos, 0) or k_pos,
                *rest)

    def source(self, v: Value) -> Value | tuple:
        """A value sliced by the lowering for one reader (the queries' positions): what it slices, and how."""
        op = self.made.get(v)
        return (op.operands[0], op.attrs) if op is not None and op.kind == "all_slice" else v


def _blocks(b: Builder, op: Op, operands: Sequence[Value], gathered, axis: str) -> tuple[Value, Value, Value]:
    """This device's own key, value and key-position block (step 0 of the ring)."""
    k, v = gathered(op.operands[1], 1), gathered(op.operands[2], 1)
    positions = gathered(op.operands[4], 0)
    if positions is None:
        positions = b.op("all_slice", [operands[4]], axes=[axis], dim=0)
    return k, v, positions


def _passed(b: Builder, blocks: tuple[Value, ...], axis: str) -> tuple[Value, ...]:
    """Each block from the previous device of the ring."""
    return tuple(b.op("collective_permute", [x], axes=[axis], shift=1, cyclic=True) for x in blocks)


def _step_attrs(op: Op, n: int, step: int) -> dict:
    """A ring step's kernel attributes: with `stats`, and `balance` where its
    causal work is the same on every device (`ir.opset.attention`, "Cost"):
    the first step (each device's own block: the diagonal), or every step
    where the sequence's mirrored chunk pairs split evenly over the ring."""
    balance = op.attrs["balance"]
    even = step == 0 or (balance and balance % n == 0)
    return {"scale": op.attrs["scale"], "causal": op.attrs["causal"], "stats": True,
            "balance": (balance or 1) if even else 0}


def _forward(b: Builder, op: Op, operands: Sequence[Value], gathered, axis: str, n: int) -> Value:
    q, _, _, q_pos, _ = operands
    blocks = _blocks(b, op, operands, gathered, axis)
    merged = b.op("attention", [q, blocks[0], blocks[1], q_pos, blocks[2]], **_step_attrs(op, n, 0))
    for step in range(1, n):
        blocks = _passed(b, blocks, axis)
        block = b.op("attention", [q, blocks[0], blocks[1], q_pos, blocks[2]], **_step_attrs(op, n, step))
        merged = _merge(b, merged, block)
    return merged


def _split(b: Builder, x: Value) -> tuple[Value, Value]:
    """(o, lse): the output channels and the statistics channel, [..., h] and [..., 1]."""
    shape = list(x.type.shape)
    h = shape[-1] - 1
    return (b.slice(x, [0] * len(shape), shape[:-1] + [h]), b.slice(x, [0] * (len(shape) - 1) + [h], shape))


def _merge(b: Builder, x: Value, y: Value) -> Value:
    """The online softmax's merge of two blocks' (o, lse) (module docstring);
    a row that sees no key in either keeps o = 0, lse = -inf."""
    (o_x, l_x), (o_y, l_y) = _split(b, x), _split(b, y)
    top = b.maximum(l_x, l_y)
    top = b.select(b.unary("is_finite", top), top, 0.0)  # both -inf: no shift
    w_x, w_y = b.exp(b.sub(l_x, top)), b.exp(b.sub(l_y, top))
    total = b.add(w_x, w_y)
    safe = b.select(b.compare(total, 0.0, "gt"), total, 1.0)
    wide = list(o_x.type.shape)
    stretch = list(range(len(wide)))

    def spread(w: Value) -> Value:
        return b.broadcast_in_dim(w, wide, stretch)

    o = b.div(b.add(b.mul(o_x, spread(w_x)), b.mul(o_y, spread(w_y))), spread(safe))
    return b.concatenate([o, b.add(top, b.log(total))], len(wide) - 1)


def _output(b: Builder, merged: Value, dtype: str) -> Value:
    o, _ = _split(b, merged)
    return o if dtype == "f32" else b.convert(o, dtype)


def _backward(b: Builder, kernels: Sequence[Op], operands: Sequence[Value], merged: Value, gathered, axis: str,
              n: int) -> list[Value]:
    """Per kernel, its ring's result: dq (each block's share adds up here) or
    the stacked dk, dv of this device's own block (each block's sum rides
    with it around the ring, and one more step brings it home). The kernels
    share each step's blocks, as one backward loop does."""
    q, _, _, q_pos, _, _, do = operands
    first = kernels[0]
    blocks = _blocks(b, first, operands, gathered, axis)
    totals: list[Value | None] = [None] * len(kernels)
    for step in range(n):
        if step:
            blocks = _passed(b, blocks, axis)
        for j, kernel in enumerate(kernels):
            part = b.op(kernel.kind, [q, blocks[0], blocks[1], q_pos, blocks[2], merged, do],
                        **_step_attrs(first, n, step))
            if totals[j] is None:
                totals[j] = part
                continue
            if kernel.kind == "attention_dkv":
                (totals[j],) = _passed(b, (totals[j],), axis)
            totals[j] = b.add(totals[j], part)
    for j, kernel in enumerate(kernels):
        if kernel.kind == "attention_dkv":
            (totals[j],) = _passed(b, (totals[j],), axis)
    return totals
