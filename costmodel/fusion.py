"""Fusion: which ops of a program run as one kernel, and what that kernel costs.

XLA fuses chains of cheap ops into one loop over memory, so a chain of
elementwise ops (Adam's update, a softmax, a norm) costs one pass over HBM,
not one pass per op. The model here:

  - *fusible* ops: every elementwise kind, `reduce`, and the layout kinds
    that move or make data without reading a table (broadcast_in_dim,
    reshape, transpose, slice, pad, concatenate, iota, full). Contractions,
    convolutions, gathers and scatters, windows, constants and collectives
    are kernels of their own;
  - a producer joins its consumer's kernel when both are fusible, the
    producer has one result, every use of it is in that one consumer, and
    it is not a result of the program (a value read by two ops, or by a
    collective, must be written to HBM anyway), and it is not a scalar.
    Kernels are the connected components of these edges, so a kernel may
    have several outputs. Scalars are left out because fusing them saves
    nothing (a scalar is 4 bytes of traffic either way) and would tie far
    apart ops into one kernel: a sum of per-layer losses (a router's load
    balance) or Adam's step-count corrections would join every layer's
    reductions into one kernel whose price depends on every layer's
    sharding, so repeated layers could not be priced once (CP-SAT's folded
    terms, `solver.search.cpsat_terms`);
  - a kernel of one op costs what the op costs alone (its registered
    roofline); a kernel of several costs
        max(sum of flops / peak flop/s of each op's dtype,
            bytes at its boundary / HBM bandwidth),
    the boundary being every operand slot read from outside the kernel
    plus every result used outside it or returned.

`fuse` is a pure function of the program's structure; run on a device-local
program, a collective between two ops is an op of another kernel and cuts the
chain there, which is how the tabulated model (`costmodel.table`) sees it
too: the global program's kernels, cut at the uses where the plan puts a
collective. `fused_time_s` is the one place the kernel formula lives.

Memory is not changed by fusion here: a fused intermediate is still counted
live from its op to its use (an over-estimate; see docs/costmodel.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from costmodel.hardware import Hardware
from ir import ops
from ir.core import Attrs, Function, Recent, TensorType

FUSIBLE_FAMILIES = frozenset({"elementwise", "reduction"})
FUSIBLE_LAYOUT = frozenset({"broadcast_in_dim", "reshape", "transpose", "slice", "pad", "concatenate", "iota", "full"})
FUSION = "fusion"  # the kind under which a kernel of several ops is reported


def fusible(kind: str) -> bool:
    return kind in FUSIBLE_LAYOUT or ops.get(kind).family in FUSIBLE_FAMILIES


@dataclass(frozen=True, slots=True)
class Fusion:
    """A program's kernels: op indices, each kernel's in program order,
    kernels ordered by their first op; every op in exactly one."""

    kernels: tuple[tuple[int, ...], ...]
    kernel_of: tuple[int, ...]  # op index -> kernel index


def components(count: int, links: Iterable[tuple[int, int]]) -> list[list[int]]:
    """The connected components of `count` nodes joined by `links`, each in
    increasing order, ordered by their first node (union-find). In Python:
    its hot caller cuts a kernel of a few ops (`FusedKernels`), where
    numpy's cost per call would dominate; `ir.nda.components` labels the
    10^5 names of a whole program in numpy."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        parent[root(a)] = root(b)
    members: dict[int, list[int]] = {}
    for i in range(count):
        members.setdefault(root(i), []).append(i)
    return sorted(members.values(), key=lambda m: m[0])


# The last programs' kernels: a program's cost on one device and its cost table read the same (llama2_70b
# recomputed: 0.18 s).
_FUSIONS = Recent(2)


def fuse(fn: Function) -> Fusion:
    """The kernels of `fn` (see the module docstring), made once for the last few programs."""
    return _FUSIONS.get((fn,), None, lambda: _fuse(fn))


def adopt(fn: Function, fusion: Fusion) -> None:
    """Keep `fusion`, made in another process from the same program (a
    forked child: `solver.planning.planner.prepare`), as `fuse(fn)`."""
    _FUSIONS.put((fn,), None, fusion)


def _fuse(fn: Function) -> Fusion:
    producer: dict = {r: i for i, op in enumerate(fn.ops) for r in op.results}
    using: dict = {}
    for i, op in enumerate(fn.ops):
        for v in op.operands:
            using.setdefault(v, set()).add(i)
    returned = set(fn.results)
    can = [fusible(op.kind) and len(op.results) == 1 for op in fn.ops]
    links = [(p, i) for i, op in enumerate(fn.ops) if can[i] for v in op.operands
             if (p := producer.get(v)) is not None and can[p] and using[v] == {i} and v not in returned
             and v.type.shape]  # not a scalar (the module docstring)
    kernels = tuple(tuple(m) for m in components(len(fn.ops), links))
    kernel_of = [0] * len(fn.ops)
    for k, m in enumerate(kernels):
        for i in m:
            kernel_of[i] = k
    return Fusion(kernels, tuple(kernel_of))


def unfused(fn: Function) -> Fusion:
    """Every op a kernel of its own."""
    return Fusion(tuple((i,) for i in range(len(fn.ops))), tuple(range(len(fn.ops))))


@dataclass(frozen=True, slots=True)
class FusedOp:
    """One op of a kernel, on the types it runs on: which operand slots come
    from outside the kernel, and whether its result leaves it."""

    kind: str
    attrs: Attrs
    operands: tuple[TensorType, ...]
    result: TensorType
    external: tuple[bool, ...]  # per operand slot: read from outside the kernel
    exported: bool  # the result is used outside the kernel or returned


def fused_time_s(members: Sequence[FusedOp], hardware: Hardware) -> tuple[float, int]:
    """Time and flops of a kernel of several ops (the module docstring's formula)."""
    device = hardware.device
    compute = 0.0
    flops = 0
    nbytes = 0
    for m in members:
        cost = ops.get(m.kind).cost(m.operands, (m.result,), m.attrs)
        dtype = m.operands[0].dtype if m.operands else m.result.dtype
        compute += cost.flops / device.compute_rate(dtype)
        flops += cost.flops
        nbytes += sum(t.num_bytes for t, outside in zip(m.operands, m.external) if outside)
        nbytes += m.result.num_bytes if m.exported else 0
    return max(compute, nbytes / device.memory_rate), flops


def kernel_members(fn: Function, fusion: Fusion) -> list[list[FusedOp]]:
    """The kernels of several ops of `fn`, as FusedOps, in kernel order
    (kernels of one op are priced as the op alone and not listed)."""
    kernel_of = fusion.kernel_of
    made_in: dict = {}  # value -> the kernel defining it
    for i, op in enumerate(fn.ops):
        for r in op.results:
            made_in[r] = kernel_of[i]
    read_outside = set(fn.results)  # values a kernel other than their own reads, or returned
    for i, op in enumerate(fn.ops):
        read_outside.update(v for v in op.operands if made_in.get(v) != kernel_of[i])
    out = []
    for k, kernel in enumerate(fusion.kernels):
        if len(kernel) == 1:
            continue
        members = []
        for i in kernel:
            op = fn.ops[i]
            (result,) = op.results
            external = tuple(made_in.get(v) != k for v in op.operands)
            members.append(FusedOp(op.kind, op.attrs, tuple(v.type for v in op.operands), result.type,
                                   external, result in read_outside))
        out.append(members)
    return out
