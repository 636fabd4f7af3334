"""YAML specs: which model to partition, over which mesh, on which hardware.

A spec is a YAML mapping validated by pydantic; unknown keys are errors, so a
misspelt key fails instead of being ignored:

    name: mlp-2x4               # optional; default: the file's stem
    description: ...            # optional free text
    model:
      builder: mlp              # one of ir.models.BUILDERS, with
      args: {batch: 256}        #   its keyword arguments (optional)
      # or instead: preset: gemma_2b  (one of ir.models.PRESETS)
      # or instead: stablehlo: step.mlir  (jax.jit(f).lower(...).as_text(); a path
      #   relative to the spec), with optional param_names: [...] (one per
      #   argument), inputs: [globs] and state: [globs] (the rest are trainable)
      step: train               # train (default; forward for stablehlo) | forward
      optimizer: adam           # adam (default) | sgd; only with step: train
    mesh: {batch: 4, model: 2}  # axis name -> size (at least 2), major to minor
    devices: 8                  # optional: the cluster's device count; each
                                #   axis must divide it and their product equal it
    hardware: A100-80GB         # one of costmodel.hardware.PRESET_NAMES, or:
    # hardware:                 #   a preset with a link class per mesh axis
    #   preset: H100-SXM        #   (axes not listed: the preset's default link)
    #   links: {batch: infiniband, model: nvlink}
    # hardware:                 #   inline figures (units required)
    #   device: {name: my-chip, peak_flops: {f32: 50TFLOP/s, bf16: 400TFLOP/s},
    #            memory: 64GiB, memory_bandwidth: 2TB/s}
    #   links: {batch: {bandwidth: 25GB/s, latency: 10us}, model: {bandwidth: 300GB/s, latency: 1us}}
    microbatches: 4             # optional: gradient accumulation (or a pipeline's
                                #   microbatches): K, or auto (the planner's choice)
    pipeline: {schedule: interleaved, chunks: 2}   # optional, with a pipeline mesh axis:
                                #   gpipe, 1f1b or interleaved (chunks: stages per device)
    schedule: [...]             # optional: the default schedule (a list of tactics)
    schedules:                  # optional: named schedules, each with what CI expects of it
      BP:
        tactics: [...]
        expect: {all_reduce: 5, fits: true}   # collective counts (kinds not listed: 0)
      BP+MP:
        extends: BP             # BP's tactics first, then these
        tactics: [...]
        expect: {all_reduce: 9, fits: true}

`load_spec(path)` and `parse_spec(text, filename)` return a `Spec` or raise
`SpecError` with one line naming the file and the field
(`specs/x.yaml: model.builder: unknown model builder 'mlpp'; ...`), or the
file, line and column of a YAML syntax error. `Spec.build()` traces the model
(and its training step); its errors name the file and field too.
`Spec.hardware_obj()` resolves the hardware against the mesh axes;
`Spec.tactics(name)` is a schedule's tactics (None: the default schedule,
else the first named one) and `Spec.expectations()` the named schedules
that carry an `expect:` block (what `shardplan check` asserts).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import pathlib
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from costmodel.hardware import PRESET_NAMES, ByteSize, Device, Fraction, Hardware, Link, preset_hardware
from costmodel.hardware import PRESETS as HARDWARE_PRESETS
from ir.autodiff import SGD, Adam, training_step
from ir.core import IRError, Mesh, Recent
from ir.models import BUILDERS, PRESETS, build, build_preset, check_args
from ir.models.base import Model
from ir.pipeline import PIPELINE
from ir.remat import layer_segments, rematerialize, select_layers
from ir.stablehlo import import_module
from solver.planning.expect import Expectation
from solver.planning.spec_tactics import StrictModel as _Strict
from solver.planning.spec_tactics import TacticSpec
from solver.planning.spec_yaml import SpecError, parse_yaml, read_spec_text, validation_message
from solver.planning.tactics import Remat, RingAttention, Tactic

# Stricter than the IR's value names: axis names appear in specs, plans and
# PartitionSpecs, where plain identifiers need no quoting.
AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPTIMIZERS = {"adam": Adam, "sgd": SGD}
# The training steps of the last few specs, before remat (`Spec.build`; a spec is frozen).
_STEPS = Recent(2)


class ModelSpec(_Strict):
    """`model:` a builder with its keyword arguments, or a full-size preset."""

    builder: str | None = None
    preset: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    stablehlo: str | None = None
    param_names: list[str] | None = None
    inputs: list[str] = Field(default_factory=list)
    state: list[str] = Field(default_factory=list)
    step: Literal["train", "forward"] = "train"
    optimizer: Literal["adam", "sgd"] = "adam"

    @model_validator(mode="before")
    @classmethod
    def _imported_programs_run_as_written(cls, data: Any) -> Any:
        """An imported program is usually a whole training step already: its
        default step is forward (run it as written)."""
        if isinstance(data, dict) and "stablehlo" in data and "step" not in data:
            return {**data, "step": "forward"}
        return data

    @field_validator("builder")
    @classmethod
    def _known_builder(cls, name: str | None) -> str | None:
        if name is not None and name not in BUILDERS:
            raise ValueError(f"unknown model builder {name!r}; valid builders: {', '.join(BUILDERS)}")
        return name

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return name

    @field_validator("args")
    @classmethod
    def _known_args(cls, args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Check arguments when the spec is loaded, not when the model is built,
        so a typo or a bad size fails early (the same check `build` makes)."""
        builder = info.data.get("builder")  # absent when the builder itself failed
        if builder is not None:
            check_args(builder, args)
        return args

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        """Exactly one model source; no settings that would be silently ignored."""
        sources = [k for k in ("builder", "preset", "stablehlo") if getattr(self, k) is not None]
        if len(sources) > 1:
            raise ValueError(f"give one of builder, preset or stablehlo, not {' and '.join(sources)}")
        if not sources:
            raise ValueError(
                f"missing builder, preset or stablehlo: a builder ({', '.join(BUILDERS)}), "
                f"a preset ({', '.join(PRESETS)}) or a StableHLO file"
            )
        imported = [k for k in ("param_names", "inputs", "state") if k in self.model_fields_set]
        if self.stablehlo is None and imported:
            raise ValueError(f"{', '.join(imported)} apply only to a stablehlo model")
        if self.stablehlo is not None and self.args:
            raise ValueError("args apply only to a builder; a StableHLO program fixes its sizes")
        if self.preset is not None and self.args:
            raise ValueError(f"args apply only to a builder; preset {self.preset} fixes its sizes")
        if self.step == "forward" and "optimizer" in self.model_fields_set:
            raise ValueError("optimizer applies only to step: train")
        return self


class PipelineSpec(_Strict):
    """`pipeline:` how the `pipeline` mesh axis (its size: the stages) runs:
    the microbatches one step's batch is split into, and the schedule."""

    microbatches: Annotated[int, Field(strict=True, gt=0)] | None = None  # default: 4 per stage
    # default: GPipe, or 1F1B where GPipe does not fit; interleaved: Megatron's interleaved 1F1B
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None
    chunks: Annotated[int, Field(strict=True, gt=1)] | None = None  # interleaved: stages per device (default 2)

    @model_validator(mode="after")
    def _chunks(self) -> PipelineSpec:
        if self.chunks is not None and self.schedule != "interleaved":
            raise ValueError("pipeline.chunks: only the interleaved schedule runs several chunks (stages) per "
                             "device; add schedule: interleaved")
        return self


class ScheduleSpec(_Strict):
    """One entry of `schedules:`: tactics, optionally after another named
    schedule's (`extends`), and what CI expects of the result."""

    description: str | None = None
    extends: str | None = None
    tactics: list[TacticSpec] = Field(default_factory=list)
    expect: Expectation | None = None


def _link_choice(value: Any, info: ValidationInfo) -> Any:
    """A link given by class name ("infiniband") becomes that link of the
    preset; an inline mapping is left for Link to validate."""
    if not isinstance(value, str):
        return value
    preset = info.data.get("preset")  # absent with an inline device, or when the preset name is wrong
    if preset is None and info.data.get("device") is not None:
        raise ValueError(f"link class {value!r} needs a preset; with an inline device give the figures, "
                         "e.g. {bandwidth: 25GB/s, latency: 5us}")
    if preset is None:
        raise ValueError(f"link class {value!r} needs a valid preset, e.g. preset: H100-SXM")
    links = HARDWARE_PRESETS[preset].links
    if value not in links:
        raise ValueError(f"unknown link class {value!r} for {preset}; valid link classes: {', '.join(links)}")
    return links[value]


class AchievableSpec(_Strict):
    """`hardware.achievable:` overrides of the preset's achievable fractions
    (each in (0, 1]): of peak flop/s on matmuls, of HBM bandwidth, and of a
    mesh axis's link bandwidth."""

    matmul: Fraction | None = None
    memory_bandwidth: Fraction | None = None
    links: dict[str, Fraction] = Field(default_factory=dict)  # mesh axis -> fraction

    def apply(self, hardware: Hardware) -> Hardware:
        device = hardware.device.model_copy(update={
            k: v for k, v in (("matmul_fraction", self.matmul), ("memory_bandwidth_fraction", self.memory_bandwidth))
            if v is not None})
        links = {axis: link.model_copy(update={"bandwidth_fraction": self.links[axis]}) if axis in self.links else link
                 for axis, link in hardware.links.items()}
        return Hardware(name=hardware.name, device=device, links=links)


class HardwareSpec(_Strict):
    """`hardware:` as a mapping: a preset with links chosen per mesh axis, or
    an inline device with a link for every mesh axis. Mesh axes are checked
    by Spec, which knows the mesh."""

    preset: str | None = None
    device: Device | None = None
    links: dict[str, Annotated[Link, BeforeValidator(_link_choice)]] = Field(default_factory=dict)
    achievable: AchievableSpec | None = None
    memory: ByteSize | None = None  # a preset's device memory overridden (a smaller share, another SKU)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None:
            _check_hardware_preset(name)
        return name

    @model_validator(mode="after")
    def _one_source(self) -> HardwareSpec:
        if self.preset is not None and self.device is not None:
            raise ValueError("give either preset or device, not both")
        if self.preset is None and self.device is None:
            raise ValueError(f"missing preset or device: a preset ({', '.join(PRESET_NAMES)}) or an inline "
                             "device {name, peak_flops, memory, memory_bandwidth}")
        if self.memory is not None and self.device is not None:
            raise ValueError("memory overrides a preset's; an inline device gives its own device.memory")
        return self

    @property
    def name(self) -> str:
        """The preset name, or the inline device's name."""
        return self.preset if self.preset is not None else self.device.name

    def resolve(self, axes: list[str]) -> Hardware:
        """The hardware on a mesh with `axes` (all of them have a link when
        the spec validated)."""
        if self.preset is not None:
            base = preset_hardware(self.preset, axes)
            device = base.device if self.memory is None else base.device.model_copy(update={"memory": self.memory})
            hardware = Hardware(name=self.preset, device=device, links={**base.links, **self.links})
        else:
            hardware = Hardware(name=self.device.name, device=self.device, links={a: self.links[a] for a in axes})
        return self.achievable.apply(hardware) if self.achievable else hardware


def _check_hardware_preset(name: str) -> None:
    if name not in PRESET_NAMES:
        raise ValueError(f"unknown hardware preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}")


class Spec(_Strict):
    """A validated spec; `build()` traces its program, `mesh_obj()` its mesh."""

    name: str = Field(min_length=1)
    description: str | None = None
    model: ModelSpec
    mesh: dict[str, Annotated[int, Field(strict=True, gt=0)]]
    devices: Annotated[int, Field(strict=True, gt=0)] | None = None
    hardware: str | HardwareSpec
    schedule: list[TacticSpec] = Field(default_factory=list)
    schedules: dict[str, ScheduleSpec] = Field(default_factory=dict)
    pipeline: PipelineSpec | None = None
    # Gradient accumulation (and a pipeline's microbatches): K, or auto (the planner chooses K for its plan).
    microbatches: Annotated[int, Field(strict=True, gt=0)] | Literal["auto"] | None = None
    # The file the spec came from, for the messages of errors found in build().
    _source: str = PrivateAttr("<spec>")

    @field_validator("mesh")
    @classmethod
    def _mesh_axes(cls, mesh: dict[str, int]) -> dict[str, int]:
        if not mesh:
            raise ValueError("a mesh needs at least one axis, e.g. {batch: 4}")
        for name, size in mesh.items():
            if not AXIS_NAME.fullmatch(name):
                raise ValueError(f"mesh axis name {name!r} is not an identifier (letters, digits, '_')")
            if size == 1:
                raise ValueError(f"axis {name} has size 1: it shards nothing; remove it from the mesh")
        return mesh

    @model_validator(mode="after")
    def _mesh_fills_devices(self) -> Spec:
        if self.devices is None:
            return self
        shape = " x ".join(f"{a}={n}" for a, n in self.mesh.items())
        for axis, size in self.mesh.items():
            if self.devices % size:
                raise ValueError(f"mesh: axis {axis}={size} does not divide the {self.devices} devices")
        total = math.prod(self.mesh.values())
        if total != self.devices:
            raise ValueError(f"mesh: {shape} is {total} devices, but devices: {self.devices}")
        return self

    @field_validator("hardware", mode="plain")
    @classmethod
    def _hardware_form(cls, value: Any) -> str | HardwareSpec:
        """Dispatch on the form, so an error names the form's own field
        (a pydantic union would report what is wrong for both forms)."""
        if isinstance(value, str):
            _check_hardware_preset(value)
            return value
        if isinstance(value, (dict, HardwareSpec)):
            return HardwareSpec.model_validate(value)  # its errors are reported under hardware.
        raise ValueError(f"expected a hardware preset name ({', '.join(PRESET_NAMES)}) or a mapping with "
                         f"preset or device, not {type(value).__name__}")

    @model_validator(mode="after")
    def _schedule_axes(self) -> Spec:
        entries = [(f"schedule.{i}", e) for i, e in enumerate(self.schedule)]
        entries += [(f"schedules.{name}.tactics.{i}", e)
                    for name, s in self.schedules.items() for i, e in enumerate(s.tactics)]
        for where, entry in entries:
            for axis in entry.axes():
                if axis == PIPELINE and axis in self.mesh:
                    raise ValueError(f"{where}: the {PIPELINE} axis splits the layers into stages; tactics shard "
                                     f"each stage over the other axes ({', '.join(self.sharding_mesh().names)})")
                if axis not in self.mesh:
                    raise ValueError(f"{where}: unknown mesh axis {axis!r}; mesh axes: {', '.join(self.mesh)}")
        return self

    @model_validator(mode="after")
    def _schedule_names(self) -> Spec:
        """`extends` names a schedule listed before it (so there are no cycles)."""
        earlier: list[str] = []
        for name, schedule in self.schedules.items():
            if schedule.extends is not None and schedule.extends not in earlier:
                known = f"schedules listed before it: {', '.join(earlier)}" if earlier else "it is the first schedule"
                raise ValueError(f"schedules.{name}.extends: {schedule.extends!r} is not a schedule listed "
                                 f"before it; {known}")
            earlier.append(name)
        return self

    @model_validator(mode="after")
    def _hardware_axes(self) -> Spec:
        """Links name mesh axes; an inline device needs one for every axis."""
        hardware = self.hardware
        if isinstance(hardware, str):
            return self
        for axis in hardware.links:
            if axis not in self.mesh:
                raise ValueError(f"hardware.links.{axis}: not a mesh axis; mesh axes: {', '.join(self.mesh)}")
        for axis in hardware.achievable.links if hardware.achievable else ():
            if axis not in self.mesh:
                raise ValueError(f"hardware.achievable.links.{axis}: not a mesh axis; "
                                 f"mesh axes: {', '.join(self.mesh)}")
        missing = [axis for axis in self.mesh if axis not in hardware.links]
        if hardware.device is not None and missing:
            raise ValueError(f"hardware.links: no link for mesh axis {', '.join(missing)}; an inline device needs "
                             f"one per mesh axis, e.g. {{{missing[0]}: {{bandwidth: 25GB/s, latency: 5us}}}}")
        return self

    @model_validator(mode="after")
    def _pipeline_axis(self) -> Spec:
        if self.pipeline is not None and PIPELINE not in self.mesh:
            raise ValueError(f"pipeline: needs a {PIPELINE!r} mesh axis, its size the number of stages, "
                             f"e.g. mesh: {{{PIPELINE}: 4, {', '.join(f'{a}: {n}' for a, n in self.mesh.items())}}}")
        if PIPELINE in self.mesh and self.model.step == "forward":
            raise ValueError(f"mesh.{PIPELINE}: pipeline stages split a training step's forward and backward; "
                             "it needs model.step: train")
        if self.microbatches is not None and self.model.step == "forward":
            raise ValueError("microbatches: gradient accumulation sums a training step's gradients over "
                             "microbatches; it needs model.step: train")
        if self.microbatches is not None and self.pipeline is not None and self.pipeline.microbatches is not None:
            raise ValueError("microbatches: given twice, here and as pipeline.microbatches; keep one")
        if self.chunks > 1 and isinstance(self.mesh.get(PIPELINE), int) and not self.microbatches_auto \
                and self.microbatch_count % self.stages:
            field = "microbatches" if self.microbatches is not None else "pipeline.microbatches"
            raise ValueError(f"{field}: the interleaved schedule runs the microbatches in rounds of the "
                             f"{self.stages} pipeline devices; {self.microbatch_count} is not a multiple of "
                             f"{self.stages}")
        return self

    @property
    def stages(self) -> int:
        """Pipeline stages: the `pipeline` axis's size (1 without one)."""
        return self.mesh.get(PIPELINE, 1)

    @property
    def chunks(self) -> int:
        """Stages per pipeline device: `pipeline.chunks` under the interleaved schedule (default 2), else 1."""
        if self.pipeline is None or self.pipeline.schedule != "interleaved":
            return 1
        return self.pipeline.chunks or 2

    @property
    def microbatch_count(self) -> int:
        """Microbatches per step: `microbatches` (or, with a pipeline axis,
        `pipeline.microbatches`), else 4 per stage, 1 without a pipeline;
        with `microbatches: auto` that default is where the planner's choice
        starts from."""
        chosen = self.pipeline.microbatches if self.pipeline is not None and self.stages > 1 else None
        if isinstance(self.microbatches, int):
            chosen = self.microbatches
        if chosen is not None:
            return chosen
        return 4 * self.stages if self.stages > 1 else 1

    @property
    def microbatches_auto(self) -> bool:
        """`microbatches: auto`: the planner chooses K for its plan (`solver.planning.pipelining`)."""
        return self.microbatches == "auto"

    @property
    def searched_microbatches(self) -> int:
        """The K plans are searched for: the spec's, 1 with `microbatches: auto`
        (K is then chosen for the plan found)."""
        return 1 if self.microbatches_auto else self.microbatch_count

    @property
    def pipelined(self) -> bool:
        """The step runs as stage tasks over microbatches (`ir.pipeline`): a
        pipeline axis, or gradient accumulation (K > 1, or K chosen)."""
        return self.stages > 1 or self.microbatch_count > 1 or self.microbatches_auto

    @property
    def pipeline_schedule(self) -> str | None:
        """`pipeline.schedule`; None: the planner's choice (GPipe, or 1F1B where GPipe does not fit)."""
        return self.pipeline.schedule if self.pipeline is not None else None

    def sharding_mesh(self) -> Mesh:
        """The axes plans shard over: the mesh without its pipeline axis (each stage's devices)."""
        return Mesh.from_pairs((a, n) for a, n in self.mesh.items() if a != PIPELINE)

    @property
    def hardware_name(self) -> str:
        """The hardware preset's name, or the inline device's name."""
        return self.hardware if isinstance(self.hardware, str) else self.hardware.name

    def hardware_obj(self) -> Hardware:
        """The spec's hardware resolved against its mesh: one link per mesh
        axis, in mesh order."""
        if isinstance(self.hardware, str):
            return preset_hardware(self.hardware, list(self.mesh))
        return self.hardware.resolve(list(self.mesh))

    def schedule_name(self, name: str | None = None) -> str | None:
        """The schedule `name` selects: None picks `schedule:` if given, else
        the first named schedule (None when the spec has neither)."""
        if name is not None:
            if name not in self.schedules:
                known = ", ".join(self.schedules) or "none (the spec has no schedules: block)"
                raise SpecError(f"{self._source}: no schedule named {name!r}; named schedules: {known}")
            return name
        if self.schedule or not self.schedules:
            return None
        return next(iter(self.schedules))

    def tactics(self, name: str | None = None) -> list[Tactic]:
        """A schedule as tactics, in order: the named one (with the schedules
        it extends first), or the default (see `schedule_name`)."""
        name = self.schedule_name(name)
        if name is None:
            return [entry.tactic() for entry in self.schedule]
        entry = self.schedules[name]
        before = self.tactics(entry.extends) if entry.extends is not None else []
        return before + [t.tactic() for t in entry.tactics]

    def expectations(self) -> dict[str, Expectation]:
        """The named schedules that carry an `expect:` block, in order."""
        return {name: s.expect for name, s in self.schedules.items() if s.expect is not None}

    @property
    def source(self) -> str:
        """The file this spec was read from (`<spec>` for text without one)."""
        return self._source

    def mesh_obj(self) -> Mesh:
        """The spec's mesh as an IR Mesh, axes in the spec's order (major to minor)."""
        return Mesh.from_pairs(self.mesh.items())

    def build(self, remat: tuple[str, ...] = ()) -> Model:
        """Trace the model; for `step: train`, its training step with the
        optimizer, with the layers matching `remat` rematerialized (`ir.remat`).
        The step before remat is made once for the last few specs (`_STEPS`):
        a planner that tries recomputing layers builds two more programs from
        it (llama2_70b: 0.8 s a step)."""
        if self.model.step == "forward":
            if remat:
                raise SpecError(f"{self._source}: remat recomputes a layer's forward in the backward; "
                                "it needs model.step: train")
            return self._build_forward()
        step, forward_ops = _STEPS.get((self,), None, self._training_step)
        if not remat:
            return step
        try:
            layers = select_layers(layer_segments(step.function, forward_ops), remat)
        except IRError as exc:
            raise SpecError(f"{self._source}: {exc}") from exc
        return dataclasses.replace(step, function=rematerialize(step.function, forward_ops, layers))

    def _training_step(self) -> tuple[Model, int]:
        """The training step of the traced model (not rematerialized) and the forward's op count."""
        model = self._build_forward()
        first = model.function.results[0]
        if first.type.shape != ():
            raise SpecError(f"{self._source}: model.step: train needs a scalar loss, but the program's first result "
                            f"%{first.name} is {first.type} (an inference program: use step: forward)")
        try:
            return training_step(model, optimizer=OPTIMIZERS[self.model.optimizer]()), len(model.function.ops)
        except IRError as exc:  # e.g. integer args.dtype: nothing to differentiate
            raise SpecError(f"{self._source}: model.step: {exc}") from exc

    def ring_axis(self, name: str | None = None) -> str | None:
        """The axis the schedule's `ring_attention` names (None: attention's K/V are gathered)."""
        rings = [t.axis for t in self.tactics(name) if isinstance(t, RingAttention)]
        if len(set(rings)) > 1:
            raise SpecError(f"{self._source}: schedule {name}: ring_attention names several axes {rings}; "
                            "a ring runs over one")
        return rings[0] if rings else None

    def remat(self, name: str | None = None) -> tuple[str, ...]:
        """The layer globs the schedule's remat tactics name, in order."""
        return tuple(dict.fromkeys(v for t in self.tactics(name) if isinstance(t, Remat) for v in t.values))

    def _build_forward(self) -> Model:
        spec = self.model
        if spec.stablehlo is not None:
            return self._import()
        field = "model.preset" if spec.preset is not None else "model.args"
        try:
            if spec.preset is not None:
                return build_preset(spec.preset)
            return build(spec.builder, **spec.args)
        # Builders check argument values by using them: a string where a size
        # belongs fails in the IR (IRError) or in Python arithmetic (TypeError).
        except (ValueError, TypeError, IRError) as exc:
            raise SpecError(f"{self._source}: {field}: {exc}") from exc


    def stablehlo_path(self) -> pathlib.Path:
        """The StableHLO file, relative to the spec's directory."""
        path = pathlib.Path(self.model.stablehlo)
        return path if path.is_absolute() else pathlib.Path(self._source).parent / path

    def _import(self) -> Model:
        """The imported program, its parameters split by `inputs` and `state`."""
        spec, path = self.model, self.stablehlo_path()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"{self._source}: model.stablehlo: cannot read {path}: {exc.strerror or exc}") from exc
        imported = import_module(text, str(path), spec.param_names)
        fn = imported.function
        pinned = imported.pins()
        for value, dim, axis in pinned:
            if axis not in self.mesh:
                raise SpecError(f"{self._source}: model.stablehlo: the program constrains %{value} dimension {dim} to "
                                f"mesh axis {axis!r}, which the spec's mesh ({', '.join(self.mesh)}) lacks")
        names = [p.name for p in fn.params]
        inputs, state = (_globbed(names, patterns, f"{self._source}: model.{key}")
                         for key, patterns in (("inputs", spec.inputs), ("state", spec.state)))
        params = [n for n in names if n not in inputs and n not in state]
        return Model(fn, tuple(params), tuple(n for n in names if n in inputs),
                     tuple(n for n in names if n in state and n not in inputs), pinned, notes=imported.notes)


def _globbed(names: list[str], patterns: list[str], where: str) -> set[str]:
    """The names matching any pattern; a pattern matching none is an error."""
    out: set[str] = set()
    for pattern in patterns:
        found = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
        if not found:
            shown = ", ".join(names[:12]) + (f", ... ({len(names)} parameters)" if len(names) > 12 else "")
            raise SpecError(f"{where}: no parameter matches {pattern!r}; parameters: {shown}")
        out |= found
    return out


def load_spec(path: str | os.PathLike[str]) -> Spec:
    """Read and validate the spec file `path`. A missing or unreadable file
    raises OSError; anything wrong inside it raises SpecError."""
    return parse_spec(read_spec_text(path), os.fspath(path))


def parse_spec(text: str, filename: str = "<spec>") -> Spec:
    """Validate the spec in `text`; `filename` names it in error messages and
    gives the default `name` (its stem)."""
    data = parse_yaml(text, filename)
    if is_mesh_search(data):
        raise SpecError(f"{filename}: mesh: a mesh search (auto sizes) is run by `shardplan plan`, which plans "
                        "every mesh and reports the best; this command needs a concrete mesh")
    return validate_spec(data, filename)


def is_mesh_search(data: Any) -> bool:
    """The spec leaves the mesh to the planner: `mesh: auto`, an axis sized
    `auto`, or a list of `mesh_candidates`."""
    if not isinstance(data, dict):
        return False
    mesh = data.get("mesh")
    return "mesh_candidates" in data or mesh == "auto" or isinstance(mesh, dict) and "auto" in mesh.values()


def validate_spec(data: dict[Any, Any], filename: str) -> Spec:
    """The Spec of parsed YAML `data` (`filename` names it in error messages)."""
    data.setdefault("name", pathlib.PurePath(filename).stem)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_message(filename, exc, Spec)) from exc
    spec._source = filename
    return spec
