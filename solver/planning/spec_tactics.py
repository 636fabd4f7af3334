"""The schedule entries of a spec (`schedules.<name>.tactics`), as YAML
writes them: one model per tactic kind, each turning into its
`solver.planning.tactics` record. The base of every spec model
(`StrictModel`) lives here too, so that `spec.py` reads as the spec's
top level."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from solver.planning.tactics import Auto, Manual, Remat, Replicate, Resolve, RingAttention, Tactic


class StrictModel(BaseModel):
    """Base of the spec models: unknown keys are errors, specs are values."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ManualSpec(StrictModel):
    """`manual:` shard values (name or glob -> dimension) along one axis."""

    axis: str
    values: dict[str, Annotated[int, Field(strict=True, ge=0)] | Literal["first_divisible"]] = Field(min_length=1)


class ReplicateSpec(StrictModel):
    """`replicate:` keep values unsharded along one axis: a list of
    parameters or results (names or globs, every dimension), or a mapping
    of any named values (names or globs) to the one dimension to keep whole."""

    axis: str
    values: list[str] | dict[str, Annotated[int, Field(strict=True, ge=0)]] = Field(min_length=1)


class AutoSpec(StrictModel):
    """`auto:` a search backend on some axes."""

    axes: list[str] = Field(min_length=1)
    solver: Literal["cpsat", "mcts"] = "cpsat"
    time_limit: float | None = Field(default=None, gt=0)  # seconds; None: the solver's default
    workers: int = Field(default=1, ge=1)  # CP-SAT
    seed: int = 0
    iterations: int = Field(default=200, ge=1)  # MCTS trajectories
    rerank: int = Field(default=1, ge=1)  # CP-SAT: the best plans the simulator re-ranks


class RematSpec(StrictModel):
    """`remat:` recompute the forward of these layers (globs over `layers.<l>`) in the backward."""

    values: list[str] = Field(min_length=1)


class RingSpec(StrictModel):
    """`ring_attention:` run context parallelism's attention over this axis as a ring of key/value blocks."""

    axis: str


TACTIC_KINDS = ("manual", "replicate", "resolve", "remat", "ring_attention", "auto")


class TacticSpec(StrictModel):
    """One schedule entry: exactly one of manual, replicate, resolve, remat, ring_attention, auto."""

    manual: ManualSpec | None = None
    replicate: ReplicateSpec | None = None
    resolve: dict[int, Literal[0, 1]] | None = None
    remat: RematSpec | None = None
    ring_attention: RingSpec | None = None
    auto: AutoSpec | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TacticSpec:
        given = [k for k in TACTIC_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a schedule entry is exactly one of {', '.join(TACTIC_KINDS)}; got {given or 'none'}")
        return self

    def axes(self) -> list[str]:
        if self.manual is not None:
            return [self.manual.axis]
        if self.replicate is not None:
            return [self.replicate.axis]
        if self.ring_attention is not None:
            return [self.ring_attention.axis]
        return list(self.auto.axes) if self.auto is not None else []

    def tactic(self) -> Tactic:
        if self.manual is not None:
            return Manual(self.manual.axis, tuple(self.manual.values.items()))
        if self.replicate is not None:
            values = self.replicate.values
            if isinstance(values, dict):
                return Replicate(self.replicate.axis, (), tuple(values.items()))
            return Replicate(self.replicate.axis, tuple(values))
        if self.resolve is not None:
            return Resolve(tuple(sorted(self.resolve.items())))
        if self.remat is not None:
            return Remat(tuple(self.remat.values))
        if self.ring_attention is not None:
            return RingAttention(self.ring_attention.axis)
        a = self.auto
        return Auto(tuple(a.axes), a.solver, a.time_limit, a.workers, a.seed, a.iterations, a.rerank)
