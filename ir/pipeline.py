"""Pipeline parallelism: a training step cut into P stages of its layers and
run on K microbatches, with a GPipe or a 1F1B schedule.

Microbatches are a sharding. Splitting the batch into K microbatches is
sharding it over a mesh axis `micro` of size K whose coordinates run one
after another on the same devices rather than side by side. So the step is
lowered once, with the batch on `micro` (the major axis) and the plan's own
axes: the result is one microbatch's device-local program, every collective
explicit. Its collectives over `micro` are all_reduce sums (a gradient, the
loss); run in time they become the accumulation over microbatches: the sum
of the K microbatches' values goes on, all_reduced over the remaining axes,
to the optimizer update. Any other collective over `micro` means the step
needs the whole batch at once (batch statistics) and cannot be microbatched.

Stages. The layers (`layers.<l>.out`, found as `ir.remat` finds them) are
split into P stages of consecutive layers, as equal as the count allows. A
forward op outside every layer goes with the latest stage it reads from
(the loss with the last layer) or, when it reads no activation, with its
first reader (the embedding with the first layer). A backward op goes with
the forward op whose VJP emitted it (`Model.origins`), an optimizer update
with its parameter.

Each device-local op then has a stage and a phase:

    forward   once per microbatch
    backward  once per microbatch
    post      once, after the last microbatch (reads the sums: the update)

What is made from parameters and constants alone (a gathered weight, a
fill) is made where it is first read, again for every microbatch, not kept
for the whole step. What is made from constants and the step's scalar
inputs alone (a mask, Adam's bias corrections from `opt.step`) every task
that reads it makes for itself: no stage sends another a correction.

and the ops of one stage and phase are one device-local program, a `Task`,
on the stage's devices (the plan's sub-mesh). A value one stage computes and
another reads is a `Transfer`: a `collective_permute` over the `pipeline`
axis, per microbatch for forward and backward values, once for the others.
`ir.pipeline_run` holds the schedules and the executor that runs the tasks
on the simulated mesh; `costmodel.pipeline` prices them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from ir import ops
from ir.builder import Builder
from ir.core import Function, IRError, Mesh, Op, TensorType, Value
from ir.lower import Lowered, LowerOptions, lower
from ir.models.base import Model
from ir.nda import NDA
from ir.remat import layer_count, layer_segments
from ir.sharding import Decision, FactorSharding, materialize
from ir.text import print_function

MICRO = "micro"
PIPELINE = "pipeline"
PHASES = ("forward", "backward", "post")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


class PipelineError(IRError):
    """A program or plan that cannot be pipelined as asked."""


@dataclass(frozen=True, slots=True)
class Task:
    """The device-local program one stage runs in one phase."""

    stage: int
    phase: str
    function: Function

    @property
    def per_microbatch(self) -> bool:
        return self.phase in ("forward", "backward")


@dataclass(frozen=True, slots=True)
class Transfer:
    """A value stage `src` computes and stage `dst` reads: a collective_permute
    over the pipeline axis with shift dst - src."""

    value: str
    type: TensorType
    src: int
    dst: int
    phase: str  # the sender's phase
    per_microbatch: bool


@dataclass(frozen=True, slots=True)
class Pipeline:
    stages: int
    microbatches: int
    schedule: str
    sub_mesh: Mesh  # every stage's devices: the plan's mesh
    local: Lowered  # one microbatch's step on micro x sub_mesh, before the cut
    tasks: tuple[Task, ...]  # in (stage, phase) order; a stage and phase without ops has none
    transfers: tuple[Transfer, ...]
    sums: tuple[tuple[str, str], ...]  # (per-microbatch value, its sum over the microbatches)
    varying: frozenset[str]  # values that differ between microbatches
    results: tuple[str, ...]  # the step's results: `local`'s, a value summed over `micro` alone by its sum
    stage_layers: tuple[tuple[int, ...], ...] = ()  # the layers of each stage
    chunks: int = 1  # stages per device: the interleaved schedule's model chunks (`ir.pipeline_run`)

    @property
    def devices(self) -> int:
        """The devices along the pipeline axis (its size): a device runs `chunks` stages."""
        return self.stages // self.chunks

    def device(self, stage: int) -> int:
        """The pipeline-axis position that runs `stage`: stages d, d + D, ... run on device d."""
        return stage % self.devices

    def same_device(self, t: Transfer) -> bool:
        """A transfer between two stages of one device: no collective, the value stays."""
        return self.device(t.src) == self.device(t.dst)

    @property
    def mesh(self) -> Mesh:
        """The whole pipelined mesh: the pipeline axis, then the stages' own."""
        return Mesh(((PIPELINE, self.devices),) + self.sub_mesh.axes)

    def task(self, stage: int, phase: str) -> Task | None:
        return next((t for t in self.tasks if t.stage == stage and t.phase == phase), None)

    def collective_counts(self, copies: Mapping[int, int] | None = None) -> dict[str, int]:
        """Collectives per training step on one stage's devices, summed over
        the stages; a per-microbatch task's count K times, and the transfers
        (each where it arrives) as collective_permutes. `copies`: how many
        stages of the step each stage stands for (`ir.pipeline_fold`)."""
        copies = copies or {}
        counts: dict[str, int] = {}
        for task in self.tasks:
            runs = (self.microbatches if task.per_microbatch else 1) * copies.get(task.stage, 1)
            for op in task.function.ops:
                if ops.get(op.kind).is_collective:
                    counts[op.kind] = counts.get(op.kind, 0) + runs
        permutes = sum((self.microbatches if t.per_microbatch else 1) * copies.get(t.dst, 1) for t in self.transfers
                       if not self.same_device(t))
        if permutes:  # beside the tasks' own (ring attention's)
            counts["collective_permute"] = counts.get("collective_permute", 0) + permutes
        return counts


def bubble_fraction(stages: int, microbatches: int, chunks: int = 1) -> float:
    """GPipe's idle share of each device with equal stages and free transfers,
    (P - 1) / (K + P - 1) on P devices; the interleaved schedule's with v
    chunks per device, (P - 1) / (v K + P - 1) (the fill and drain pass
    stages a v-th as long)."""
    devices = stages // chunks
    return (devices - 1) / (chunks * microbatches + devices - 1)


# ------------------------------------------------------------ microbatches


def microbatch_mesh(mesh: Mesh, microbatches: int) -> Mesh:
    """The mesh one microbatch's program is lowered on: `micro`, then `mesh`'s axes."""
    if MICRO in mesh.names or PIPELINE in mesh.names:
        raise PipelineError(f"the stages' mesh may not name {MICRO!r} or {PIPELINE!r}: {list(mesh.names)}")
    return Mesh(((MICRO, microbatches),) + mesh.axes)


def microbatch_decision(nda: NDA, inputs: Sequence[str]) -> Decision:
    """Shard the batch (dimension 0 of the batch inputs, one color) over
    `micro`; the caller puts it before the plan's decisions so `micro` is
    the batch's major axis."""
    params = {p.name: p for p in nda.function.params}
    colors = {nda.def_color(params[n], 0) for n in inputs if n in params and params[n].type.rank}
    if len(colors) != 1:
        raise PipelineError(f"microbatching splits the batch inputs' first dimension; the inputs {list(inputs)} "
                            f"give {len(colors)} batch dimensions, not one")
    return Decision(MICRO, colors.pop())


def microbatch_nda(nda: NDA, inputs: Sequence[str], microbatches: int) -> NDA:
    """`nda` as the plans of one microbatch see it: the batch color's
    I-classes `microbatches` times smaller. Only divisibility reads an
    I-class's size, so a plan materialized on this view splits the batch
    only as far as a microbatch of it splits, and is one `pipeline_step`
    can run with `microbatches` (a search on it never finds a plan its own
    pipeline refuses)."""
    if microbatches == 1:
        return nda
    color = microbatch_decision(nda, inputs).color
    members = set(nda.color_iclasses[color])
    if any(nda.iclasses[k].size % microbatches for k in members):
        first = next(p for p in nda.function.params if p.name in inputs and p.type.rank)
        raise PipelineError(f"the batch of %{first.name} ({first.type.shape[0]}) does not split into "
                            f"{microbatches} microbatches")
    iclasses = tuple(dataclasses.replace(ic, size=ic.size // microbatches) if ic.id in members else ic
                     for ic in nda.iclasses)
    return dataclasses.replace(nda, iclasses=iclasses)


def pipeline_step(model: Model, nda: NDA, mesh: Mesh, decisions: Sequence[Decision], *, stages: int,
                  microbatches: int, schedule: str = "gpipe", resolutions: Mapping[int, int] | None = None,
                  replicated: Sequence[tuple[int, str]] = (), options: LowerOptions | None = None,
                  chunks: int = 1, sharding: FactorSharding | None = None) -> Pipeline:
    """The pipelined step of a training step `model` (its NDA `nda`): each
    stage on `mesh`, sharded by `decisions` (with `resolutions` and
    `replicated`, as `ir.sharding.materialize` takes them), the batch split
    into `microbatches`; `stages` / `chunks` devices along the pipeline
    axis, each running `chunks` stages (the interleaved schedule).
    `sharding`: the microbatch's, where the caller has it already
    (`microbatch_sharding` of the same arguments)."""
    fn = model.function
    if sharding is None:
        sharding = microbatch_sharding(model, nda, mesh, decisions, microbatches, resolutions, replicated)
    stage_of = value_stages(fn, model.forward_ops, dict(model.origins), stages)
    forward = {r.name for op in fn.ops[:model.forward_ops] for r in op.results}
    lowered = lower(fn, nda, sharding, options)
    if lowered.made_for:  # a rewrite's values go with the value each was made for (ring attention's)
        stage_of = {**stage_of, **{name: stage_of[made] for name, made in lowered.made_for.items()}}
        forward |= {name for name, made in lowered.made_for.items() if made in forward}
    pipeline = lower_pipeline(lowered, stage_of, forward, stages, schedule, chunks)
    by_layer = layer_stages(layer_segments(fn, model.forward_ops), stages)
    return dataclasses.replace(pipeline, stage_layers=tuple(
        tuple(layer for layer, s in by_layer.items() if s == stage) for stage in range(stages)))


def microbatch_sharding(model: Model, nda: NDA, mesh: Mesh, decisions: Sequence[Decision], microbatches: int,
                        resolutions: Mapping[int, int] | None = None,
                        replicated: Sequence[tuple[int, str]] = ()) -> FactorSharding:
    """The factor sharding of one microbatch's step on `microbatch_mesh`: the
    batch on `micro`, then the plan's decisions (`pipeline_step`)."""
    fn = model.function
    if not model.forward_ops:
        raise PipelineError(f"@{fn.name} is not a training step built here (model.step: train): pipelining "
                            "splits a forward and its backward into stages")
    if microbatches < 1:
        raise PipelineError(f"the microbatch count must be at least 1, got {microbatches}")
    micro = microbatch_decision(nda, model.inputs)
    sharding = materialize(nda, microbatch_mesh(mesh, microbatches), [micro, *decisions], resolutions, replicated)
    # The stages run the plan as a microbatch's batch takes it (`microbatch_nda`), with `micro` in
    # front of the batch: a batch that does not split K ways would make the rules drop one or the other.
    # Where `micro` took every I-class of the batch, it left each K times smaller, and the decisions
    # after it read what they read on that view (the same divisibility, owners and neighbours): the
    # rest of the sharding is the plan's there, and only otherwise is it materialized to compare.
    same = all(sharding.axes[k][:1] == (MICRO,) for k in nda.color_iclasses[micro.color])
    if not same:
        plan = materialize(microbatch_nda(nda, model.inputs, microbatches), mesh, decisions, resolutions,
                           replicated)
        same = all(tuple(a for a in axes if a != MICRO) == kept for axes, kept in zip(sharding.axes, plan.axes))
    for name in model.inputs:
        p = fn.param(name)
        if p.type.rank and not (same and MICRO in sharding.def_dims(nda, p)[0]):
            raise PipelineError(f"the batch of %{name} ({p.type.shape[0]}) does not split into {microbatches} "
                                "microbatches")
    return sharding


# ------------------------------------------------------------------ stages


def layer_stages(layers: Sequence[int] | Mapping[int, Any], stages: int) -> dict[int, int]:
    """Layer -> stage: consecutive layers, the counts as equal as they can be."""
    order = sorted(layers)
    return {layer: n * stages // len(order) for n, layer in enumerate(order)}


def check_stages(fn: Function, forward_ops: int, stages: int) -> None:
    """A PipelineError unless `fn` has a layer for each of `stages` stages (cheap: the layers' outputs)."""
    layers = layer_count(fn, forward_ops)
    if stages < 1 or layers < stages:
        raise PipelineError(f"{stages} pipeline stages need at least {stages} layers; @{fn.name} has "
                            f"{layers} (values named layers.<l>.out)")


def value_stages(fn: Function, forward_ops: int, origins: Mapping[str, str], stages: int) -> dict[str, int]:
    """The stage of every value `fn`'s ops define, and of every parameter
    (where its first reader is), by the rules of the module docstring."""
    if stages == 1:  # gradient accumulation: every value on the one stage, layers or none
        return {v.name: 0 for v in fn.params} | {r.name: 0 for op in fn.ops for r in op.results}
    check_stages(fn, forward_ops, stages)
    segments = layer_segments(fn, forward_ops)
    layer_stage = layer_stages(segments, stages)
    op_layer = {i: layer for layer, members in segments.items() for i in members}
    stage: dict[str, int] = {}
    free = []
    for i, op in enumerate(fn.ops[:forward_ops]):
        known = [stage[v.name] for v in op.operands if v.name in stage]
        s = layer_stage[op_layer[i]] if i in op_layer else max(known, default=None)
        if s is None:
            free.append(i)
        else:
            stage.update((r.name, s) for r in op.results)
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(fn.ops[:forward_ops]):
        for v in op.operands:
            readers.setdefault(v.name, []).append(i)
    for i in reversed(free):
        op = fn.ops[i]
        read_at = [stage[fn.ops[j].results[0].name] for r in op.results for j in readers.get(r.name, ())]
        stage.update((r.name, min(read_at, default=stages - 1)) for r in op.results)
    for p in fn.params:
        read_at = [stage[fn.ops[j].results[0].name] for j in readers.get(p.name, ())]
        stage[p.name] = min(read_at, default=0)
    for op in fn.ops[forward_ops:]:
        for r in op.results:
            origin = r.name[: -len(".remat")] if r.name.endswith(".remat") else origins.get(r.name)
            if origin not in stage:
                raise PipelineError(f"%{r.name} has no known forward origin: pipelining needs a training step "
                                    "built by shardplan's autodiff (model.step: train)")
            stage[r.name] = stage[origin]
    return stage


# -------------------------------------------------------------------- cut


def lower_pipeline(lowered: Lowered, stage_of: Mapping[str, int], forward_values: set[str], stages: int,
                   schedule: str = "gpipe", chunks: int = 1, sent: Collection[str] = ()) -> Pipeline:
    """Cut one microbatch's device-local step (`lowered`, on `microbatch_mesh`)
    into the stages' tasks and transfers (module docstring). `stage_of`
    gives every global value's stage (`value_stages`), `forward_values` the
    names the forward defines; `chunks`: stages per device; `sent`: values
    their tasks return though no task here reads them (a folded pipeline's:
    what a stage left out reads, `ir.pipeline_fold`)."""
    check_schedule(schedule, stages, chunks)
    mesh = lowered.function.mesh
    if not mesh.names or mesh.names[0] != MICRO:
        raise PipelineError(f"the step must be lowered on a mesh whose first axis is {MICRO!r}")
    sub_mesh = Mesh(mesh.axes[1:])
    body, results, sums, varying = _accumulate(lowered)
    constant = _constants(body, set(results), [p for p in lowered.function.params if not p.type.shape])
    where = _place(body, stage_of, forward_values, varying, {t.name: total for t, total in sums}, constant)
    read_at: dict[Value, set[tuple[int, str]]] = {}  # the tasks that read each value
    for op, w in zip(body, where):
        if w[0] >= 0:
            for v in op.operands:
                read_at.setdefault(v, set()).add(w)
    placed: dict[tuple[int, str], list[int]] = {}  # each task's own ops, in program order
    for i, w in enumerate(where):
        placed.setdefault(w, []).append(i)
    made_by = {r: i for i in constant for r in body[i].results}
    wanted = set(results) | {t for t, _ in sums}  # every task returns what it makes of these
    wanted |= {r for op in body for r in op.results if r.name in sent}
    tasks = []
    for s in range(stages):
        for phase in PHASES:
            members = _with_constants(placed.get((s, phase), []), body, made_by)
            if members:
                tasks.append(Task(s, phase, _function(f"stage{s}.{phase}", members, read_at, (s, phase), wanted,
                                                      sub_mesh)))
    pipeline = Pipeline(stages, mesh.size(MICRO), schedule, sub_mesh, lowered, tuple(tasks), (),
                        tuple((t.name, total) for t, total in sums), frozenset(varying), tuple(r.name for r in results),
                        chunks=chunks)
    return dataclasses.replace(pipeline, transfers=_transfers(pipeline))


def _accumulate(lowered: Lowered) -> tuple[list[Op], list[Value], list[tuple[Value, str]], set[str]]:
    """The ops with each all_reduce over `micro` replaced by the sum over
    microbatches (a value `<t>.sum` the executor provides; before the
    reduce_scatters that led to it, which then run on the sum) all_reduced
    over the other axes, or by that sum alone; the results so renamed; the
    (value, sum) pairs; the names of the per-microbatch values."""
    fn = lowered.function
    micro_count = fn.mesh.size(MICRO)
    varying = {p.name for p, dims in zip(fn.params, lowered.param_dims) if any(MICRO in d for d in dims)}
    readers = Counter(chain.from_iterable(op.operands for op in fn.ops)) + Counter(fn.results)
    renamed: dict[Value, Value] = {}
    body, sums = [], []
    made_at: dict[Value, int] = {}
    moved: set[int] = set()
    for op in fn.ops:
        # The op itself where it reads no sum renamed (the lowered step's ops are shared, not copied).
        renames = renamed and any(v in renamed for v in op.operands)
        operands = tuple(renamed.get(v, v) for v in op.operands) if renames else op.operands
        micro = ops.get(op.kind).is_collective and MICRO in op.attrs["axes"]
        if micro and not (op.kind == "all_reduce" and op.attrs["combiner"] == "sum"):
            raise PipelineError(f"{op.describe()}: the step needs the whole batch here ({op.kind} over the "
                                "microbatches), so it cannot be split into microbatches")
        if not micro:
            made_at[op.results[0]] = len(body)
            body.append(Op(op.kind, operands, op.results, op.attrs) if renames else op)
            if any(v.name in varying for v in operands):
                varying.update(r.name for r in op.results)
            continue
        (t,) = operands
        # The lowering reduce_scatters a gradient over the axes its update splits before the sum over
        # `micro`; both are linear, so the sum goes first and the reduce_scatters run once, after the
        # last microbatch (as Megatron's distributed optimizer does), not once per microbatch. With one
        # microbatch there is nothing to sum: they stay where the lowering put them, right after the
        # gradient is made, or the backward would hold every gradient whole (the whole step does not).
        scatters = []
        while micro_count > 1 and t in made_at and body[made_at[t]].kind == "reduce_scatter" and readers[t] == 1:
            moved.add(made_at[t])
            scatters.append(body[made_at[t]])
            varying.discard(t.name)
            t = body[made_at[t]].operands[0]
        if t.name not in varying:
            raise PipelineError(f"{op.describe()}: sums over the microbatches a value that is the same in each")
        total = Value(f"{t.name}.sum", t.type)
        sums.append((t, total.name))
        for scatter in reversed(scatters):
            body.append(_typed(Op("reduce_scatter", (total,), scatter.results, scatter.attrs), fn.mesh))
            total = scatter.results[0]
        rest = tuple(a for a in op.attrs["axes"] if a != MICRO)
        if rest:
            body.append(_typed(Op("all_reduce", (total,), op.results, op.attrs.replace(axes=rest)), fn.mesh))
        else:
            renamed[op.results[0]] = total
    body = [op for i, op in enumerate(body) if i not in moved]
    return body, [renamed.get(r, r) for r in fn.results], sums, varying


def _typed(op: Op, mesh: Mesh) -> Op:
    """An op `_accumulate` made anew, its declared types checked: the tasks'
    functions check SSA alone (`_function`), every other op of theirs being
    the lowered step's, whose types were inferred where `ir.lower` made
    them, on the same operand types (the sum over microbatches has its
    value's)."""
    expected = ops.infer_results(op.kind, tuple(v.type for v in op.operands), op.attrs, mesh)
    if expected != tuple(r.type for r in op.results):
        raise PipelineError(f"{op.describe()}: its operands give {', '.join(map(str, expected))}")
    return op


def _constants(body: list[Op], results: set[Value], scalars: Sequence[Value] = ()) -> set[int]:
    """The ops computed from constants and the step's scalar inputs alone (a
    causal mask, a fill, Adam's bias corrections from `opt.step`), not
    results of the step: every task that reads one makes its own copy, as
    each stage of a pipeline computes its own corrections from the step
    count every device holds, not a stage-to-stage transfer a step."""
    made: set[Value] = set(scalars)
    out = set()
    for i, op in enumerate(body):
        if all(v in made for v in op.operands) and not ops.get(op.kind).is_collective:
            made.update(op.results)
            if not set(op.results) & results:
                out.add(i)
    return out


def _with_constants(members: list[int], body: list[Op], made_by: Mapping[Value, int]) -> list[Op]:
    """A task's ops with the constant ops they read (transitively; `made_by`:
    the constant op making each value), in order."""
    chosen, todo = set(members), list(members)
    while todo:
        for v in body[todo.pop()].operands:
            i = made_by.get(v)
            if i is not None and i not in chosen:
                chosen.add(i)
                todo.append(i)
    return [body[i] for i in sorted(chosen)]


def _place(body: list[Op], stage_of: Mapping[str, int], forward_values: set[str],
           varying: set[str], sums: dict[str, str], constant: set[int]) -> list[tuple[int, str]]:
    """(stage, phase) of every op. An op of one microbatch goes to its
    global op's stage, forward or backward; one that reads the sums to the
    post of its stage. The others go where they are first read (in the
    step's order): a collective (the lowering emits it right before its
    reader), and what is made from parameters and constants alone (a fill,
    a gathered weight), which is made again for every microbatch that reads
    it rather than kept for the whole step, as the lowering reshards a
    parameter at each use. Read by none, an op goes with its operand, or to
    the post of its stage. A constant op is no task's own: (-1, "constant")."""
    where: list[tuple[int, str] | None] = [None] * len(body)
    for i in constant:
        where[i] = (-1, "constant")
    _own_places(body, where, stage_of, forward_values, varying, sums)
    _reader_places(body, where, constant)
    _unread_places(body, where, stage_of, sums)
    return where  # type: ignore[return-value]


def _own_places(body: list[Op], where: list, stage_of: Mapping[str, int], forward_values: set[str],
                varying: set[str], sums: dict[str, str]) -> None:
    """The ops of one microbatch and those after the sums: their own stage."""
    after_sums: set[str] = set(sums.values())
    for i, op in enumerate(body):
        if where[i] is not None:
            continue
        reads_sums = any(v.name in after_sums for v in op.operands)
        if reads_sums:
            after_sums.update(r.name for r in op.results)
        name = op.results[0].name
        if ops.get(op.kind).is_collective:
            continue
        if name in varying:
            if reads_sums:
                raise PipelineError(f"{op.describe()} reads a sum over every microbatch inside a microbatch")
            where[i] = (stage_of[name], "forward" if name in forward_values else "backward")
        elif reads_sums:
            where[i] = (stage_of[name], "post")


def _reader_places(body: list[Op], where: list, constant: set[int]) -> None:
    """The others where their earliest reader is (phase order, then program order)."""
    readers: dict[str, list[tuple[int, int, tuple[int, str]]]] = {}
    for i in reversed(range(len(body))):
        op = body[i]
        if where[i] is None:
            placed = [r for res in op.results for r in readers.get(res.name, ())]
            if placed:
                where[i] = min(placed)[2]
        if where[i] is not None and i not in constant:
            for v in op.operands:
                readers.setdefault(v.name, []).append((PHASES.index(where[i][1]), i, where[i]))


def _unread_places(body: list[Op], where: list, stage_of: Mapping[str, int], sums: dict[str, str]) -> None:
    """What only the step's results (or the sums) read: a collective with
    its operand, the rest at the post of its stage."""
    made = {r.name: w for op, w in zip(body, where) if w and w[0] >= 0 for r in op.results}

    def made_sums() -> None:  # a sum is complete after its stage's last backward
        made.update((total, (made[value][0], "post")) for value, total in sums.items() if value in made)

    made_sums()
    for i, op in enumerate(body):
        if where[i] is None:
            operand = made.get(op.operands[0].name) if ops.get(op.kind).is_collective else None
            where[i] = operand or (stage_of[op.results[0].name], "post")
            made.update((r.name, where[i]) for r in op.results)
            made_sums()


def _function(name: str, members: list[Op], read_at: Mapping[Value, set[tuple[int, str]]], key: tuple[int, str],
              wanted: set[Value], mesh: Mesh) -> Function:
    """The ops of one task (`key`) as a function: what it reads from outside
    are its parameters; what other tasks read of it (`read_at`: the tasks
    that read each value) and the `wanted` values (the step's results, the
    values summed over microbatches), its results."""
    members = _as_soon_as_possible(members)
    inside = {r for op in members for r in op.results}
    params: dict[Value, None] = {}
    for op in members:
        params.update((v, None) for v in op.operands if v not in inside)
    outs = [r for op in members for r in op.results if r in wanted or any(w != key for w in read_at.get(r, ()))]
    # SSA and order checked; the types were, where the ops were made (`_typed`).
    return ops.verify(Function(name, tuple(params), tuple(members), tuple(outs), mesh), types=False)


def _as_soon_as_possible(members: list[Op]) -> list[Op]:
    """The task's ops, each right after the last op it reads (in program
    order among those), and what is made from constants and scalar inputs
    alone (a fill, a causal mask broadcast to a layer's scores, Adam's bias
    correction broadcast to a parameter's shape) right before its first
    reader, as XLA's scheduler runs it: at its index a layer's mask would be
    made with the first layer's and held until its own layer, every
    layer's at once. The step's order puts every update after the whole
    backward, so a microbatch's gradient would wait there; here it goes on
    into its sum as soon as it is made."""
    made: dict[Value, tuple[int, ...]] = {}
    constant: dict[Value, Op] = {}  # made from constants (and scalar inputs) alone, by value
    inside = {r for op in members for r in op.results}
    scalar_inputs = {v for op in members for v in op.operands if not v.type.shape and v not in inside}
    keyed = []
    for i, op in enumerate(members):
        if all(v in constant or v in scalar_inputs for v in op.operands):
            constant.update((r, op) for r in op.results)
            continue
        key = max((made[v] for v in op.operands if v in made), default=()) + (i,)
        made.update((r, key) for r in op.results)
        keyed.append((key, op))
    out: list[Op] = []
    emitted: set[int] = set()

    def emit(op: Op) -> None:  # its constant operands first, each once
        todo = [(op, False)]
        while todo:
            o, ready = todo.pop()
            if id(o) in emitted:
                continue
            if ready:
                emitted.add(id(o))
                out.append(o)
                continue
            todo.append((o, True))
            todo.extend((constant[v], False) for v in reversed(o.operands) if v in constant)

    for _, op in sorted(keyed, key=lambda kv: kv[0]):
        emit(op)
    for op in members:  # read by none of the task's own ops
        if id(op) not in emitted and all(r in constant for r in op.results):
            emit(op)
    return out


def _transfers(pipeline: Pipeline) -> tuple[Transfer, ...]:
    """Every value a task reads from another stage's task (or another
    stage's sum); the step's inputs are read where they are needed."""
    made: dict[str, tuple[int, str]] = {}
    for task in pipeline.tasks:
        made.update((r.name, (task.stage, task.phase)) for r in task.function.results)
    for value, total in pipeline.sums:
        made[total] = (made[value][0], "post")
    out: dict[tuple[str, int], Transfer] = {}
    for task in pipeline.tasks:
        for p in task.function.params:
            src, phase = made.get(p.name, (task.stage, ""))
            if src != task.stage and (p.name, task.stage) not in out:
                out[(p.name, task.stage)] = Transfer(p.name, p.type, src, task.stage, phase,
                                                     p.name in pipeline.varying)
    return tuple(out.values())


# ------------------------------------------------------------------- text


def check_schedule(schedule: str, stages: int, chunks: int) -> None:
    """A PipelineError unless `schedule` can run `stages` stages, `chunks` per device."""
    if schedule not in SCHEDULES:
        raise PipelineError(f"unknown pipeline schedule {schedule!r}; choose {', '.join(SCHEDULES)}")
    if schedule != "interleaved" and chunks != 1:
        raise PipelineError(f"the {schedule} schedule runs one stage per device, not {chunks}; the interleaved "
                            "schedule runs several")
    if schedule == "interleaved" and (chunks < 2 or stages % chunks or stages // chunks < 2):
        raise PipelineError(f"the interleaved schedule runs at least 2 chunks on each of at least 2 devices; "
                            f"{stages} stages as {chunks} chunks per device do not")


def transfer_function(transfers: Sequence[Transfer], pipeline: Pipeline) -> Function:
    """The transfers between devices as one device-local program on the whole
    pipelined mesh: per transfer, `%<value>.to<stage>` = a collective_permute
    of the value over the pipeline axis by the devices between (each device
    sends what its stage holds; only the receiving device keeps what
    arrives). A transfer between two stages of one device is no collective."""
    b = Builder("transfers", pipeline.mesh)
    params: dict[str, Value] = {}
    outs = []
    for t in transfers:
        if pipeline.same_device(t):
            continue
        if t.value not in params:
            params[t.value] = b.param(t.value, t.type.shape, t.type.dtype)
        outs.append(b.op("collective_permute", [params[t.value]], f"{t.value}.to{t.dst}", axes=(PIPELINE,),
                         shift=pipeline.device(t.dst) - pipeline.device(t.src)))
    return b.build(outs)


def pipeline_text(pipeline: Pipeline) -> str:
    """The pipelined step as text: each stage's tasks as functions on its
    devices, then the transfers between stages as one program of
    collective_permutes over the pipeline axis."""
    mesh = " x ".join(f"{a}={n}" for a, n in pipeline.mesh.axes)
    chunks = f" ({pipeline.chunks} per device: stage s on device s mod {pipeline.devices})" \
        if pipeline.chunks > 1 else ""
    lines = [f"// pipeline: {pipeline.stages} stages{chunks} x {pipeline.microbatches} microbatches, "
             f"{pipeline.schedule}, on mesh {mesh}",
             "// forward and backward run once per microbatch, post once per step; a `.sum` parameter is "
             "the sum of its value over the microbatches"]
    for task in pipeline.tasks:
        layers = pipeline.stage_layers[task.stage] if pipeline.stage_layers else ()
        span = f", layers {layers[0]}-{layers[-1]}" if layers else ""
        lines += ["", f"// stage {task.stage}{span}: {task.phase}", print_function(task.function).rstrip("\n")]
    if pipeline.transfers:
        lines += ["", f"// the transfers between stages over {PIPELINE}:"]
        lines += [f"//   %{t.value}: stage {t.src}'s {t.phase} -> stage {t.dst}, "
                  + ("per microbatch" if t.per_microbatch else "once")
                  + (", on one device" if pipeline.same_device(t) else "") for t in pipeline.transfers]
        if not all(pipeline.same_device(t) for t in pipeline.transfers):
            lines.append(print_function(transfer_function(pipeline.transfers, pipeline)).rstrip("\n"))
    return "\n".join(lines) + "\n"
