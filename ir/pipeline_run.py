"""Running a pipelined step (`ir.pipeline.Pipeline`): its schedules, GPipe,
1F1B and Megatron's interleaved 1F1B, as each device's sequence of tasks,
and the executor that runs every stage's tasks on the simulated mesh in a
schedule's order, the transfers through the registered
`collective_permute`'s semantics and the sums over microbatches as they
are made.

A stage is a run of consecutive layers. Under GPipe and 1F1B each device
(a position on the pipeline axis) runs one stage; under the interleaved
schedule it runs `chunks` of them, stages d, d + D, d + 2D, ... of the
D x chunks (Megatron's model chunks, or virtual stages), so a microbatch
passes every device `chunks` times and the fill and drain take a
`chunks`-th as long."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ir.interpret import InterpretError, run_spmd, shard, unshard
from ir.pipeline import Pipeline, PipelineError, Task, Transfer, check_schedule, transfer_function

# --------------------------------------------------------------- schedules


def stage_sequences(stages: int, microbatches: int, schedule: str) -> list[list[tuple[str, int]]]:
    """Each stage's (phase, microbatch) tasks in the order it runs them.

    GPipe: every forward, then every backward. 1F1B (PipeDream-flush):
    stage s runs P - 1 - s forwards ahead (at most K), then alternates one
    forward and one backward, then drains its backwards, so it holds at
    most P - s microbatches' activations at once instead of K."""
    out = []
    for s in range(stages):
        fwd = [("forward", k) for k in range(microbatches)]
        bwd = [("backward", k) for k in range(microbatches)]
        if schedule == "gpipe":
            seq = fwd + bwd
        elif schedule == "1f1b":
            ahead = min(stages - 1 - s, microbatches)
            seq = fwd[:ahead]
            for k in range(microbatches - ahead):
                seq += [fwd[ahead + k], bwd[k]]
            seq += bwd[microbatches - ahead:]
        else:
            check_schedule(schedule, stages, 1)  # unknown, or interleaved: one stage per device is not it
            raise PipelineError(f"the {schedule} schedule runs several stages per device: `device_sequences`")
        out.append(seq + [("post", 0)])
    return out


def device_sequences(stages: int, microbatches: int, schedule: str,
                     chunks: int = 1) -> list[list[tuple[int, str, int]]]:
    """Each device's (stage, phase, microbatch) tasks in the order it runs
    them, its stages' posts last: `stage_sequences` with one stage a device,
    or the interleaved schedule's over `stages` / `chunks` devices."""
    check_schedule(schedule, stages, chunks)
    if schedule == "interleaved":
        return _interleaved(stages // chunks, chunks, microbatches)
    return [[(s, phase, k) for phase, k in seq] for s, seq in enumerate(stage_sequences(stages, microbatches,
                                                                                       schedule))]


def _interleaved(devices: int, chunks: int, microbatches: int) -> list[list[tuple[int, str, int]]]:
    """Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021, section
    2.2.2; `forward_backward_pipelining_with_interleaving`). Device d holds
    chunks c = 0 .. v - 1, stage c x D + d. The K x v forwards go in rounds
    of D microbatches per chunk: forward i runs chunk (i mod D v) // D on
    microbatch (i // D v) x D + i mod D; backward i the same microbatch on
    the chunks in reverse. Device d runs (D - d - 1) x 2 + (v - 1) x D
    forwards ahead (every one when K = D), then alternates a forward and a
    backward, then drains its backwards."""
    if microbatches % devices:
        raise PipelineError(f"the interleaved schedule runs the microbatches in rounds of the {devices} pipeline "
                            f"devices; {microbatches} microbatches is not a multiple of {devices}")
    total = microbatches * chunks
    round_ = devices * chunks

    def task(d: int, i: int, phase: str) -> tuple[int, str, int]:
        chunk = (i % round_) // devices
        chunk = chunk if phase == "forward" else chunks - 1 - chunk
        return chunk * devices + d, phase, (i // round_) * devices + i % devices

    out = []
    for d in range(devices):
        ahead = total if microbatches == devices else min((devices - d - 1) * 2 + (chunks - 1) * devices, total)
        fwd = [task(d, i, "forward") for i in range(total)]
        bwd = [task(d, i, "backward") for i in range(total)]
        seq = fwd[:ahead]
        for j in range(total - ahead):
            seq += [fwd[ahead + j], bwd[j]]
        seq += bwd[total - ahead:]
        out.append(seq + [(c * devices + d, "post", 0) for c in range(chunks)])
    return out


def _ready(stage: int, phase: str, k: int, done: set, stages: int, microbatches: int) -> bool:
    """A forward needs the previous stage's forward of its microbatch, a
    backward the next stage's backward; a post every stage's last backward
    (a sum may come from another stage: a tied embedding's gradient)."""
    if phase == "forward" and stage > 0:
        return (stage - 1, "forward", k) in done
    if phase == "backward" and stage < stages - 1:
        return (stage + 1, "backward", k) in done
    if phase == "post":
        return all((s, "backward", microbatches - 1) in done for s in range(stages))
    return True


def run_order(stages: int, microbatches: int, schedule: str, chunks: int = 1) -> list[tuple[int, str, int]]:
    """One order of every (stage, phase, microbatch) task that keeps each
    device's sequence and the dependencies between stages (in rounds: each
    device runs its next task if it is ready)."""
    seqs = device_sequences(stages, microbatches, schedule, chunks)
    at, done, order = [0] * len(seqs), set(), []
    while any(at[d] < len(seq) for d, seq in enumerate(seqs)):
        progressed = []
        for d, seq in enumerate(seqs):
            if at[d] < len(seq) and _ready(*seq[at[d]], done, stages, microbatches):
                progressed.append(seq[at[d]])
                at[d] += 1
        if not progressed:
            raise PipelineError(f"the {schedule} schedule deadlocks")  # a wrong sequence, never a user error
        done.update(progressed)
        order += progressed
    return order


# ---------------------------------------------------------------- executor


def run_pipeline(pipeline: Pipeline, inputs: Mapping[str, np.ndarray], *, float_dtype=None) -> list[np.ndarray]:
    """Execute the pipelined step on the simulated mesh: every task on its
    stage's devices, in schedule order, transfers through collective_permute,
    sums over the microbatches; returns the step's global results."""
    run = _Execution(pipeline, inputs, float_dtype)
    for stage, phase, k in run_order(pipeline.stages, pipeline.microbatches, pipeline.schedule, pipeline.chunks):
        task = pipeline.task(stage, phase)
        if task is not None:
            run.task(task, k)
    return run.results()


class _Execution:
    """The state of `run_pipeline`: per stage, the values it holds, by name
    and microbatch (None: the same for every microbatch)."""

    def __init__(self, pipeline: Pipeline, inputs: Mapping[str, np.ndarray], float_dtype) -> None:
        local = pipeline.local
        self.float_dtype = float_dtype
        self.pipeline, self.n = pipeline, pipeline.sub_mesh.num_devices
        self.blocks = {p.name: shard(np.asarray(inputs[p.name]), dims, local.function.mesh)
                       for p, dims in zip(local.function.params, local.param_dims)}
        self.env: list[dict[tuple[str, int | None], list[np.ndarray]]] = [{} for _ in range(pipeline.stages)]
        self.totals = dict(pipeline.sums)
        self.summed: dict[str, int] = {}  # a sum -> the microbatches added to it so far
        self.incoming = {(t.value, t.dst): t for t in pipeline.transfers}

    def key(self, name: str, k: int) -> tuple[str, int | None]:
        return name, k if name in self.pipeline.varying else None

    def fetch(self, stage: int, name: str, k: int, reader: str) -> list[np.ndarray]:
        n, key = self.n, self.key(name, k)
        if name in self.blocks:  # a step input: each stage loads its microbatch's blocks
            return self.blocks[name][k * n:(k + 1) * n] if name in self.pipeline.varying else self.blocks[name][:n]
        if self.summed.get(name, self.pipeline.microbatches) < self.pipeline.microbatches:
            raise InterpretError(f"{reader} reads %{name} after {self.summed[name]} of "
                                 f"{self.pipeline.microbatches} microbatches")
        if key not in self.env[stage] and (name, stage) in self.incoming:
            _transfer(self.pipeline, self.incoming[(name, stage)], self.env, key, self.float_dtype)
        if key not in self.env[stage]:
            raise InterpretError(f"{reader} reads %{name} before the {self.pipeline.schedule} schedule has made "
                                 "it there")
        return self.env[stage][key]

    def task(self, task: Task, k: int) -> None:
        stage, env = task.stage, self.env[task.stage]
        reader = f"stage {stage}'s {task.phase}" + (f" of microbatch {k}" if task.per_microbatch else "")
        args = [self.fetch(stage, p.name, k, reader) for p in task.function.params]
        for r, value in zip(task.function.results, run_spmd(task.function, args, float_dtype=self.float_dtype)):
            env[self.key(r.name, k)] = value
            total = self.totals.get(r.name)
            if total is not None:  # gradient accumulation
                previous = env.get((total, None))
                env[(total, None)] = value if previous is None else [a + b for a, b in zip(previous, value)]
                self.summed[total] = self.summed.get(total, 0) + 1

    def results(self) -> list[np.ndarray]:
        """The step's results, assembled over the microbatches and devices."""
        local, out = self.pipeline.local, []
        for r, dims in zip(self.pipeline.results, local.result_dims):
            stage = next(s for s in range(self.pipeline.stages) if self.key(r, 0) in self.env[s] or r in self.blocks)
            per_k = [self.fetch(stage, r, k, "the step's results") for k in range(self.pipeline.microbatches)]
            out.append(unshard([a for arrays in per_k for a in arrays], dims, local.function.mesh))
        return out


def _transfer(pipeline: Pipeline, t: Transfer, env: list[dict], key: tuple[str, int | None], float_dtype) -> None:
    """Move a value from stage t.src to t.dst: run its transfer program (a
    collective_permute over the pipeline axis) on the whole mesh, the other
    devices sending zeros that nobody keeps; between two stages of one
    device (interleaved chunks) the value stays where it is."""
    if key not in env[t.src]:
        raise InterpretError(f"stage {t.dst} reads %{t.value} before stage {t.src} has made it")
    sent = env[t.src][key]
    if pipeline.same_device(t):
        env[t.dst][key] = sent
        return
    n, src, dst = pipeline.sub_mesh.num_devices, pipeline.device(t.src), pipeline.device(t.dst)
    per_device = [sent[d % n] if d // n == src else np.zeros_like(sent[d % n]) for d in range(pipeline.devices * n)]
    (received,) = run_spmd(transfer_function([t], pipeline), [per_device], float_dtype=float_dtype)
    env[t.dst][key] = received[dst * n:(dst + 1) * n]
