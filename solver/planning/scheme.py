"""What a plan does with each mesh axis, in the names practitioners use.

A plan is a factor sharding: mesh axes per I-class. People compare plans by
scheme: data parallelism, ZeRO, tensor (Megatron) and sequence parallelism,
context parallelism, Ulysses. `axis_roles` reads those off the sharding, so
the report of a searched plan says which scheme the search chose:

  data parallel      a batch input's batch dimension holds the axis;
  context parallel   a fused attention op's queries hold it (its keys are
                     whole there, so K and V are all-gathered: Llama 3's
                     scheme, or passed around as a ring where the lowering
                     ran ring attention); with dense attention, the scores'
                     query side;
  Ulysses            the sequence holds it around attention and the heads
                     inside, with no weight read split along it (all_to_all
                     before and after attention);
  tensor parallel    a trainable weight is read split along it (Megatron's
                     heads and MLP hidden dimension, a vocabulary);
  sequence parallel  with tensor parallelism, the sequence holds the axis
                     between the tensor-parallel regions (Megatron-SP);
  ZeRO-3             a weight is stored split along it and read whole
                     (gathered where it is used: FSDP);
  ZeRO-1/2           the optimizer state is split along it, the weight not.

The roles describe what each axis carries; the step time and memory beside
them in the report say what that costs.
"""

from __future__ import annotations

from ir.core import Function
from ir.models.base import Model
from ir.nda import NDA
from ir.sharding import FactorSharding

DATA, CONTEXT, ULYSSES = "data parallel", "context parallel (K/V all-gathered)", "Ulysses (all_to_all around attention)"
RING = "context parallel (ring of K/V blocks)"
TENSOR, SEQUENCE = "tensor parallel", "sequence parallel"
ZERO3, ZERO12 = "ZeRO-3 (weights gathered where read)", "ZeRO-1/2 (optimizer state split)"


def axis_roles(model: Model, nda: NDA, sharding: FactorSharding, rings: frozenset[str] = frozenset()
               ) -> dict[str, list[str]]:
    """Per mesh axis, the roles it plays (module docstring), in a fixed order;
    an axis that splits nothing has none. `rings`: the axes the lowering ran
    ring attention over (`ring_axes`)."""
    batch, sequence = _batch_axes(model, nda, sharding)
    queries, heads = _attention_axes(nda, sharding)
    read, stored, state = _weight_axes(model, nda, sharding)
    roles: dict[str, list[str]] = {}
    for axis in sharding.mesh.names:
        here = []
        if axis in batch:
            here.append(DATA)
        if axis in queries:
            here.append(RING if axis in rings else CONTEXT)
        elif axis in heads and axis in sequence and axis not in read:
            here.append(ULYSSES)
        if axis in read and axis not in batch:
            here.append(TENSOR)
            if axis in sequence and axis not in queries:
                here.append(SEQUENCE)
        if axis in stored:
            here.append(ZERO3)
        elif axis in state:
            here.append(ZERO12)
        roles[axis] = here
    return roles


def ring_axes(local: Function) -> frozenset[str]:
    """The axes a device-local program passes blocks around as a ring (`ir.ring_attention`)."""
    return frozenset(a for op in local.ops if op.kind == "collective_permute" and op.attrs["cyclic"]
                     for a in op.attrs["axes"])


def _held(dims) -> set[str]:
    return {a for axes in dims for a in axes}


def _batch_axes(model: Model, nda: NDA, sharding: FactorSharding) -> tuple[set[str], set[str]]:
    """(axes on the batch inputs' first dimension, axes on their second: the sequence)."""
    params = {p.name: p for p in nda.function.params}
    batch: set[str] = set()
    sequence: set[str] = set()
    for name in model.inputs:
        dims = sharding.def_dims(nda, params[name])
        batch |= set(dims[0]) if dims else set()
        sequence |= set(dims[1]) if len(dims) > 1 else set()
    return batch, sequence


# An axis plays a weights' role when the weights it plays it for hold at least this share of the
# weights' bytes: an embedding table gathered for its lookup does not make an axis ZeRO-3.
WEIGHT_SHARE = 0.25


def _weight_axes(model: Model, nda: NDA, sharding: FactorSharding) -> tuple[set[str], set[str], set[str]]:
    """(axes the weights are read split along, axes they are stored split
    along but read whole, axes only their optimizer state is split along),
    each where the weights concerned hold `WEIGHT_SHARE` of the bytes. A
    weight's read is its first use (the forward's)."""
    fn = nda.function
    params = {p.name: p for p in fn.params}
    first_use: dict[str, tuple[int, int]] = {}
    for i, op in enumerate(fn.ops):
        for j, v in enumerate(op.operands):
            first_use.setdefault(v.name, (i, j))
    weights = [params[n] for n in model.params if n in params and n in first_use]
    total = sum(p.type.num_bytes for p in weights) or 1
    shares: tuple[dict[str, int], ...] = ({}, {}, {})
    for p in weights:
        stored = _held(sharding.def_dims(nda, p))
        read = _held(sharding.use_dims(nda, *first_use[p.name]))
        state = params.get(f"opt.m.{p.name}")
        only_state = _held(sharding.def_dims(nda, state)) - stored if state is not None else set()
        for share, axes in zip(shares, (read, stored - read, only_state)):
            for a in axes:
                share[a] = share.get(a, 0) + p.type.num_bytes
    read, stored, state = ({a for a, n in share.items() if n >= WEIGHT_SHARE * total} for share in shares)
    return read, stored, state


def _attention_axes(nda: NDA, sharding: FactorSharding) -> tuple[set[str], set[str]]:
    """(axes on the queries, axes on the heads) of the program's attention:
    the fused `attention` ops' query positions and key/value or query heads
    or, without them, the query side of dense attention's scores: a
    contraction whose result has two dimensions of one color (queries and
    keys, both the sequence's), the first of them the queries, as the
    builders and jax's attention lay them out."""
    fn = nda.function
    queries: set[str] = set()
    heads: set[str] = set()
    fused = [i for i, op in enumerate(fn.ops) if op.kind == "attention"]
    for i in fused:
        q = sharding.use_dims(nda, i, 0)  # [batch, seq, kv heads, heads per kv head, head_dim]
        queries |= set(q[1])
        heads |= set(q[2]) | set(q[3])
    if fused:
        return queries, heads
    for op in fn.ops:
        if op.kind == "dot_general":
            r = op.results[0]
            colors = [nda.def_color(r, d) for d in range(r.type.rank)]
            dims = sharding.def_dims(nda, r)
            for d, color in enumerate(colors):
                if colors.count(color) > 1 and colors.index(color) == d:  # the first of the pair: the queries
                    queries |= set(dims[d])
    return queries, heads


def format_roles(roles: dict[str, list[str]]) -> str:
    """One line: `data: data parallel; model: tensor parallel + sequence parallel`."""
    return "; ".join(f"{axis}: {' + '.join(r) if r else 'unused'}" for axis, r in roles.items())
