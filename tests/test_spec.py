"""YAML specs: the bundled specs load and build; every malformed spec is one
line naming the file and the field (or file:line:col for YAML syntax)."""

import math

import pytest
from conftest import ROOT

from costmodel.hardware import PRESET_NAMES, PRESETS, Hardware
from ir.core import Mesh
from solver.planning.spec import SpecError, load_spec, parse_spec

BUNDLED = sorted((ROOT / "specs").glob("*.yaml"))
MODEL = "model: {builder: mlp}\n"
MESH = "mesh: {batch: 4}\n"
HARDWARE = "hardware: A100-80GB\n"


def write(tmp_path, text: str, name: str = "x.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load_error(tmp_path, text: str) -> tuple[str, str]:
    """(the file's path, the SpecError message) of loading `text`; the message
    must be one line starting with the path."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path)
    return path, message


def build_error(tmp_path, text: str) -> tuple[str, str]:
    """Like load_error, for a spec that loads but fails to build."""
    path = write(tmp_path, text)
    spec = load_spec(path)
    with pytest.raises(SpecError) as info:
        spec.build()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path)
    return path, message


# ------------------------------------------------------------ bundled specs


# The paper settings of the model suite (the table of bundled specs in docs/specs.md).
PAPER_SPECS = {
    "mlp", "simplified_attention", "transformer", "gemma_2b", "chinchilla_32l",
    "gemma_2b_tpuv3", "gemma_2b_a100", "gemma_7b_tpuv3", "gemma_7b_a100",
    "chinchilla_32l_tpuv3", "chinchilla_32l_a100", "transformer_decode", "gns", "unet",
    "deep_mlp_8192x16", "deep_mlp_16384x64", "deep_mlp_32768x96", "llama2_70b", "transformer_pipeline",
    "megatron_gpt_18b",
}


def test_the_bundled_specs_are_there():
    assert {p.stem for p in BUNDLED} == PAPER_SPECS


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_bundled_spec_loads_and_builds(path):
    spec = load_spec(str(path))
    assert spec.name == path.stem
    assert spec.description
    assert spec.hardware_name in PRESET_NAMES
    hardware = spec.hardware_obj()
    assert isinstance(hardware, Hardware) and list(hardware.links) == list(spec.mesh)
    assert spec.devices == math.prod(spec.mesh.values())
    assert spec.expectations(), "every bundled spec is checked by `shardplan check specs/`"
    model = spec.build()
    if spec.model.builder == "transformer_decode":  # inference: logits first, the KV cache as state
        assert model.function.results[0].type.rank == 2 and model.state
    else:
        assert model.function.results[0].type.shape == ()
        # Adam's moments are state; SGD keeps none.
        assert bool(model.state) == (spec.model.step == "train" and spec.model.optimizer == "adam")


def test_mlp_spec_is_an_adam_training_step_on_a_2d_mesh():
    spec = load_spec(str(ROOT / "specs" / "mlp.yaml"))
    assert spec.mesh_obj() == Mesh.of(batch=4, model=2)
    model = spec.build()
    params = {p.name: p.type.shape for p in model.function.params}
    assert params["x"] == (256, 32)
    assert params["w1"] == (32, 128)
    assert params["opt.m.w1"] == (32, 128)
    assert "opt.step" in model.state


def test_mesh_keeps_the_spec_order():
    spec = parse_spec(MODEL + "mesh: {model: 2, batch: 4}\n" + HARDWARE)
    assert list(spec.mesh) == ["model", "batch"]
    assert spec.mesh_obj().names == ("model", "batch")


def test_name_defaults_to_the_file_stem_and_can_be_given(tmp_path):
    assert load_spec(write(tmp_path, MODEL + MESH + HARDWARE, "my-run.yaml")).name == "my-run"
    assert parse_spec("name: mlp-2x4\n" + MODEL + MESH + HARDWARE).name == "mlp-2x4"


def test_forward_step_and_sgd():
    forward = parse_spec("model: {builder: mlp, step: forward}\n" + MESH + HARDWARE).build()
    assert forward.state == ()
    assert forward.function.name == "mlp"
    sgd = parse_spec("model: {builder: mlp, optimizer: sgd}\n" + MESH + HARDWARE).build()
    assert sgd.state == ()
    assert "w1.new" in {r.name for r in sgd.function.results}


def test_a_specs_rematerialized_programs_are_made_from_its_one_training_step(monkeypatch):
    # The planner builds the program as written and, where memory binds, with every other and every
    # layer recomputed: the training step is traced and differentiated once for all three.
    import solver.planning.spec as spec_module
    from ir.text import print_function

    text = "model: {builder: transformer, args: {layers: 4}}\n" + MESH + HARDWARE
    steps = []
    real = spec_module.training_step
    monkeypatch.setattr(spec_module, "training_step", lambda *a, **kw: steps.append(1) or real(*a, **kw))
    spec = parse_spec(text)
    built = [spec.build(remat) for remat in ((), ("layers.*[02]",), ("layers.*",))]
    assert len(steps) == 1 and spec.build() is built[0]
    for remat, model in zip(((), ("layers.*[02]",), ("layers.*",)), built):  # as a spec of its own builds it
        assert print_function(model.function) == print_function(parse_spec(text).build(remat).function)
    assert len({len(m.function.ops) for m in built}) == 3


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        load_spec(str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------ errors: keys


def test_unknown_top_level_key(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH + HARDWARE + "schedul: []\n")
    assert (": schedul: unknown key; valid keys: name, description, model, mesh, devices, hardware, schedule, "
            "schedules") in message


def test_misspelt_key_is_reported_rather_than_the_missing_one(tmp_path):
    _, message = load_error(tmp_path, "modle: {builder: mlp}\n" + MESH + HARDWARE)
    assert ": modle: unknown key" in message
    assert message.endswith("(and 1 more)")


def test_unknown_model_key(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlp, arg: {batch: 2}}\n" + MESH + HARDWARE)
    assert (": model.arg: unknown key; valid keys: builder, preset, args, stablehlo, param_names, inputs, state, "
            "step, optimizer") in message


def test_missing_required_key(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH)
    assert message.endswith(": hardware: Field required")


def test_duplicate_key_is_an_error(tmp_path):
    path, message = load_error(tmp_path, MODEL + "mesh: {batch: 4, batch: 2}\n" + HARDWARE)
    assert message == f"{path}:2:18: duplicate key 'batch'"


# ------------------------------------------------------------ errors: model


def test_both_builder_and_preset(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlp, preset: gemma_2b}\n" + MESH + HARDWARE)
    assert ": model: give one of builder, preset or stablehlo, not builder and preset" in message


def test_neither_builder_nor_preset(tmp_path):
    _, message = load_error(tmp_path, "model: {step: train}\n" + MESH + HARDWARE)
    assert ": model: missing builder, preset or stablehlo" in message
    assert "mlp" in message and "gemma_2b" in message


def test_unknown_builder(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlpp}\n" + MESH + HARDWARE)
    assert ": model.builder: unknown model builder 'mlpp'; valid builders: mlp, deep_mlp," in message


def test_unknown_preset(tmp_path):
    _, message = load_error(tmp_path, "model: {preset: gemma_3b}\n" + MESH + HARDWARE)
    assert ": model.preset: unknown model preset 'gemma_3b'; valid presets: gemma_2b," in message


def test_bad_argument_name(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlp, args: {hiden: 64}}\n" + MESH + HARDWARE)
    assert ": model.args: mlp: unknown argument(s) hiden; valid arguments: batch, d_in, hidden" in message


def test_args_with_a_preset(tmp_path):
    _, message = load_error(tmp_path, "model: {preset: gemma_2b, args: {batch: 2}}\n" + MESH + HARDWARE)
    assert ": model: args apply only to a builder" in message


def test_optimizer_with_a_forward_step(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlp, step: forward, optimizer: sgd}\n" + MESH + HARDWARE)
    assert ": model: optimizer applies only to step: train" in message


def test_unknown_step(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlp, step: eval}\n" + MESH + HARDWARE)
    assert ": model.step: Input should be 'train' or 'forward'" in message


@pytest.mark.parametrize("builder, args, problem", [
    ("mlp", "{batch: many}", "mlp: batch must be a positive integer, got 'many'"),
    ("deep_mlp", "{layers: 0}", "deep_mlp: layers must be a positive integer, got 0"),
    ("transformer", "{causal: maybe}", "transformer: causal must be true or false, got 'maybe'"),
])
def test_bad_argument_value_is_a_load_error(tmp_path, builder, args, problem):
    _, message = load_error(tmp_path, f"model: {{builder: {builder}, args: {args}}}\n" + MESH + HARDWARE)
    assert f": model.args: {problem}" in message


def test_integer_model_cannot_train(tmp_path):
    _, message = build_error(tmp_path, "model: {builder: mlp, args: {dtype: i32}}\n" + MESH + HARDWARE)
    assert ": model.step: cannot differentiate" in message


# ------------------------------------------------------------ errors: mesh, hardware


@pytest.mark.parametrize("size, expected", [
    ("0", "Input should be greater than 0"),
    ("-2", "Input should be greater than 0"),
    ("2.5", "Input should be a valid integer"),
    ("'2'", "Input should be a valid integer"),
    ("true", "Input should be a valid integer"),
])
def test_mesh_size_must_be_a_positive_int(tmp_path, size, expected):
    _, message = load_error(tmp_path, MODEL + f"mesh: {{batch: 4, model: {size}}}\n" + HARDWARE)
    assert message.endswith(f": mesh.model: {expected}")


def test_mesh_axis_of_size_one_is_an_error(tmp_path):
    _, message = load_error(tmp_path, MODEL + "mesh: {batch: 4, model: 1}\n" + HARDWARE)
    assert message.endswith(": mesh: axis model has size 1: it shards nothing; remove it from the mesh")


@pytest.mark.parametrize("devices, expected", [
    (32, "mesh: axis model=3 does not divide the 32 devices"),
    (24, "mesh: batch=4 x model=3 is 12 devices, but devices: 24"),
])
def test_mesh_must_fill_the_devices(tmp_path, devices, expected):
    _, message = load_error(tmp_path, MODEL + "mesh: {batch: 4, model: 3}\n" + f"devices: {devices}\n" + HARDWARE)
    assert message.endswith(": " + expected)


def test_devices_matching_the_mesh(tmp_path):
    spec = load_spec(write(tmp_path, MODEL + "mesh: {batch: 4, model: 3}\ndevices: 12\n" + HARDWARE))
    assert spec.devices == 12


def test_empty_mesh(tmp_path):
    _, message = load_error(tmp_path, MODEL + "mesh: {}\n" + HARDWARE)
    assert ": mesh: a mesh needs at least one axis" in message


def test_mesh_axis_must_be_an_identifier(tmp_path):
    _, message = load_error(tmp_path, MODEL + "mesh: {data-parallel: 4}\n" + HARDWARE)
    assert ": mesh: mesh axis name 'data-parallel' is not an identifier" in message


def test_unknown_hardware_lists_the_presets(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH + "hardware: H300\n")
    assert f": hardware: unknown hardware preset 'H300'; valid presets: {', '.join(PRESET_NAMES)}" in message


# ------------------------------------------------------------ hardware: the three forms

MESH2 = "mesh: {batch: 4, model: 2}\n"
INLINE_DEVICE = "  device: {name: my-chip, peak_flops: {f32: 50TFLOP/s, bf16: 400TFLOP/s}, " \
                "memory: 64GiB, memory_bandwidth: 2TB/s}\n"
INLINE_LINKS = "  links: {batch: {bandwidth: 25GB/s, latency: 10us}, model: {bandwidth: 300GB/s, latency: 1us}}\n"


def test_hardware_preset_name_puts_every_axis_on_the_default_link():
    spec = parse_spec(MODEL + MESH2 + "hardware: H100-SXM\n")
    assert spec.hardware == spec.hardware_name == "H100-SXM"
    hw = spec.hardware_obj()
    assert hw.name == "H100-SXM" and hw.device == PRESETS["H100-SXM"].device
    assert {axis: link.kind for axis, link in hw.links.items()} == {"batch": "nvlink", "model": "nvlink"}


def test_hardware_preset_with_links_per_axis():
    spec = parse_spec(MODEL + "mesh: {pod: 2, batch: 4, model: 2}\nhardware:\n  preset: H100-SXM\n"
                      "  links: {batch: infiniband, pod: {bandwidth: 5GB/s, latency: 20us}}\n")
    assert spec.hardware_name == "H100-SXM"
    hw = spec.hardware_obj()
    assert list(hw.links) == ["pod", "batch", "model"]  # mesh order, not the order of links:
    assert hw.links["batch"] == PRESETS["H100-SXM"].links["infiniband"]
    assert hw.links["model"] == PRESETS["H100-SXM"].links["nvlink"]  # not listed: the default link
    assert (hw.links["pod"].kind, hw.links["pod"].bandwidth, hw.links["pod"].latency) == ("custom", 5e9, 20e-6)
    assert hw.link(["pod", "model"]).bandwidth == 5e9


def test_hardware_inline_device_and_links():
    spec = parse_spec(MODEL + MESH2 + "hardware:\n" + INLINE_DEVICE + INLINE_LINKS)
    assert spec.hardware_name == "my-chip"
    hw = spec.hardware_obj()
    assert hw.name == "my-chip" and hw.capacity_bytes == 64 * 2**30
    assert hw.device.peak("bf16") == 400e12 and hw.device.memory_bandwidth == 2e12
    assert hw.links["batch"].bandwidth == 25e9 and hw.links["batch"].latency == 10e-6
    assert hw.links["model"].bandwidth == 300e9 and hw.links["model"].latency == 1e-6
    assert hw.link(["batch", "model"]).bandwidth == 25e9


def test_hardware_inline_device_with_a_preset_is_not_mixed():
    """An inline device's links are all inline: link classes belong to presets."""
    _, message = load_error_text(MODEL + MESH2 + "hardware:\n" + INLINE_DEVICE
                                 + "  links: {batch: infiniband, model: {bandwidth: 1GB/s, latency: 1us}}\n")
    assert ": hardware.links.batch: link class 'infiniband' needs a preset; with an inline device give the figures" \
        in message


def load_error_text(text: str) -> tuple[None, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "x.yaml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("x.yaml: ")
    return None, message


@pytest.mark.parametrize("hardware, expected", [
    ("{preset: H300}", f"hardware.preset: unknown hardware preset 'H300'; valid presets: {', '.join(PRESET_NAMES)}"),
    ("{preset: H100-SXM, links: {batch: nvlnk}}",
     "hardware.links.batch: unknown link class 'nvlnk' for H100-SXM; valid link classes: nvlink, pcie, infiniband, "
     "ethernet"),
    ("{preset: TPUv4, links: {batch: nvlink}}",
     "hardware.links.batch: unknown link class 'nvlink' for TPUv4; valid link classes: ici, dcn"),
    ("{preset: H100-SXM, links: {pipe: nvlink}}", "hardware.links.pipe: not a mesh axis; mesh axes: batch, model"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: 0GB/s, latency: 5us}}}",
     "hardware.links.batch.bandwidth: must be positive, got '0GB/s'"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: -3GB/s, latency: 5us}}}",
     "hardware.links.batch.bandwidth: must be positive"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: 25GB, latency: 5us}}}",
     "hardware.links.batch.bandwidth: '25GB' is a size (B), not a bandwidth (B/s); e.g. '600GB/s'"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: 25, latency: 5us}}}",
     "hardware.links.batch.bandwidth: missing unit, e.g. '600GB/s'"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: 25GB/s, latency: 5}}}",
     "hardware.links.batch.latency: missing unit, e.g. '5us'"),
    ("{preset: H100-SXM, links: {batch: {bandwidth: 25GB/s}}}", "hardware.links.batch.latency: Field required"),
    ("{preset: H100-SXM, links: {batch: {bandwith: 25GB/s, latency: 5us}}}",
     "hardware.links.batch.bandwith: unknown key; valid keys: kind, bandwidth, latency, bandwidth_fraction "
     "(and 1 more)"),
    ("{name: H100-SXM}", "hardware.name: unknown key; valid keys: preset, device, links"),
    ("{links: {}}", "hardware: missing preset or device: a preset (A100-40GB,"),
    ("{links: {batch: nvlink}}", "hardware.links.batch: link class 'nvlink' needs a valid preset, e.g. preset: H100"),
    ("3", "hardware: expected a hardware preset name (A100-40GB,"),
    ("[H100-SXM]", f"hardware: expected a hardware preset name ({', '.join(PRESET_NAMES)}) or a mapping with "
                   "preset or device, not list"),
])
def test_hardware_errors_name_the_field(hardware, expected):
    _, message = load_error_text(MODEL + MESH2 + f"hardware: {hardware}\n")
    assert f"x.yaml: {expected}" in message


@pytest.mark.parametrize("device, expected", [
    ("{name: c, peak_flops: {f32: 5TFLOP/s}, memory: 64, memory_bandwidth: 2TB/s}",
     "hardware.device.memory: missing unit, e.g. '40GiB'"),
    ("{name: c, peak_flops: {f32: 5TFLOP/s}, memory: 64GB/s, memory_bandwidth: 2TB/s}",
     "hardware.device.memory: '64GB/s' is a bandwidth (B/s), not a size (B)"),
    ("{name: c, peak_flops: {f32: 5TFLOP/s}, memory: 64GiB, memory_bandwidth: 2TB}",
     "hardware.device.memory_bandwidth: '2TB' is a size (B), not a bandwidth (B/s)"),
    ("{name: c, peak_flops: {f32: 5TB/s}, memory: 64GiB, memory_bandwidth: 2TB/s}",
     "hardware.device.peak_flops.f32: '5TB/s' is a bandwidth (B/s), not a compute rate (FLOP/s)"),
    ("{name: c, peak_flops: {bf16: 5TFLOP/s}, memory: 64GiB, memory_bandwidth: 2TB/s}",
     "hardware.device.peak_flops: needs an f32 figure"),
    ("{name: c, peak_flops: {f32: 5TFLOP/s, bfloat16: 9TFLOP/s}, memory: 64GiB, memory_bandwidth: 2TB/s}",
     "hardware.device.peak_flops: unknown dtype name 'bfloat16'"),
    ("{name: c, peak_flops: {f32: 5TFLOP/s}, memory: 64GiB, memory_bandwidth: 2TB/s, hbm: 3GiB}",
     "hardware.device.hbm: unknown key; valid keys: name, peak_flops, memory, memory_bandwidth, source"),
    ("{name: c, memory: 64GiB, memory_bandwidth: 2TB/s}", "hardware.device.peak_flops: Field required"),
])
def test_inline_device_errors_name_the_field(device, expected):
    _, message = load_error_text(MODEL + MESH2 + f"hardware:\n  device: {device}\n" + INLINE_LINKS)
    assert f"x.yaml: {expected}" in message


def test_inline_device_needs_a_link_for_every_mesh_axis():
    _, message = load_error_text(MODEL + MESH2 + "hardware:\n" + INLINE_DEVICE
                                 + "  links: {batch: {bandwidth: 25GB/s, latency: 10us}}\n")
    assert message == ("x.yaml: hardware.links: no link for mesh axis model; an inline device needs one per mesh "
                       "axis, e.g. {model: {bandwidth: 25GB/s, latency: 5us}}")


def test_inline_device_links_must_be_mesh_axes():
    _, message = load_error_text(MODEL + MESH2 + "hardware:\n" + INLINE_DEVICE + INLINE_LINKS[:-2]
                                 + ", seq: {bandwidth: 1GB/s, latency: 1us}}\n")
    assert "x.yaml: hardware.links.seq: not a mesh axis; mesh axes: batch, model" in message


def test_preset_and_device_together(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH2 + "hardware:\n  preset: H200\n" + INLINE_DEVICE + INLINE_LINKS)
    assert message.endswith(": hardware: give either preset or device, not both")


def test_unknown_key_inside_a_schedule_entry(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH + HARDWARE + "schedule:\n  - manual: {axis: batch, valus: {x: 0}}\n")
    assert ": schedule.0.manual.valus: unknown key; valid keys: axis, values" in message
    _, message = load_error(tmp_path, MODEL + MESH + HARDWARE + "schedule:\n  - manul: {axis: batch}\n")
    assert (": schedule.0.manul: unknown key; valid keys: manual, replicate, resolve, remat, ring_attention, auto"
            in message)


# ------------------------------------------------------------ errors: file


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path, message = load_error(tmp_path, MODEL + "mesh: {batch: 4\n" + HARDWARE)
    assert message.startswith(f"{path}:3:9: ")


def test_control_character_has_line_and_column(tmp_path):
    path, message = load_error(tmp_path, MODEL + MESH + "hardware: A100\x01\n")
    assert message == f"{path}:3:15: unacceptable character #x0001: special characters are not allowed"


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n"])
def test_empty_file(tmp_path, text):
    _, message = load_error(tmp_path, text)
    assert ": empty spec" in message


def test_top_level_list(tmp_path):
    _, message = load_error(tmp_path, "- model\n- mesh\n")
    assert ": a spec must be a mapping with model, mesh and hardware, not a list" in message


def test_not_utf8(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"hardware: \xff\n")
    with pytest.raises(SpecError, match=r"x\.yaml: not UTF-8 text"):
        load_spec(str(path))


def test_several_errors_are_counted(tmp_path):
    _, message = load_error(tmp_path, "model: {builder: mlpp}\nmesh: {batch: 0}\nhardware: H300\n")
    assert ": model.builder: unknown model builder 'mlpp'" in message
    assert message.endswith("(and 2 more)")


# ------------------------------------------------------------ named schedules and expectations

BP = "      - {manual: {axis: batch, values: {x: 0}}}\n"
MP = "      - {manual: {axis: model, values: {w1: 1}}}\n"


def test_named_schedules_extend_earlier_ones(tmp_path):
    spec = load_spec(write(tmp_path, MODEL + MESH2 + HARDWARE + "schedules:\n  BP:\n    tactics:\n" + BP
                           + "    expect: {all_reduce: 3, fits: true}\n"
                           + "  BP+MP:\n    extends: BP\n    tactics:\n" + MP + "    expect: {all_reduce: 4}\n"))
    assert [t.axis for t in spec.tactics("BP+MP")] == ["batch", "model"]
    assert [t.axis for t in spec.tactics("BP")] == ["batch"]
    # No `schedule:`: the default is the first named schedule.
    assert spec.schedule_name() == "BP" and spec.tactics() == spec.tactics("BP")
    expect = spec.expectations()
    assert list(expect) == ["BP", "BP+MP"]
    assert expect["BP"].counts() == dict(all_reduce=3, all_gather=0, reduce_scatter=0, all_to_all=0, all_slice=0,
                                         collective_permute=0)
    assert expect["BP"].fits is True and expect["BP+MP"].fits is None


def test_default_schedule_is_the_unnamed_one(tmp_path):
    spec = load_spec(write(tmp_path, MODEL + MESH2 + HARDWARE + "schedule:\n" + MP.replace("    ", "", 1)
                           + "schedules:\n  BP:\n    tactics:\n" + BP))
    assert spec.schedule_name() is None and [t.axis for t in spec.tactics()] == ["model"]
    assert spec.expectations() == {}


def test_unknown_schedule_name_lists_the_named_ones(tmp_path):
    spec = load_spec(write(tmp_path, MODEL + MESH2 + HARDWARE + "schedules:\n  BP:\n    tactics:\n" + BP))
    with pytest.raises(SpecError, match=r"x.yaml: no schedule named 'ZeRO'; named schedules: BP$"):
        spec.tactics("ZeRO")


def test_extends_must_name_an_earlier_schedule(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH2 + HARDWARE + "schedules:\n  A:\n    extends: B\n    tactics:\n"
                            + BP + "  B:\n    tactics:\n" + MP)
    assert message.endswith(": schedules.A.extends: 'B' is not a schedule listed before it; it is the first schedule")


def test_named_schedule_with_an_unknown_axis(tmp_path):
    _, message = load_error(tmp_path, MODEL + MESH + HARDWARE + "schedules:\n  MP:\n    tactics:\n" + MP)
    assert message.endswith(": schedules.MP.tactics.0: unknown mesh axis 'model'; mesh axes: batch")


@pytest.mark.parametrize("expect, expected", [
    ("{all_reduces: 3}", "schedules.BP.expect.all_reduces: unknown key; valid keys: all_reduce, all_gather, "
                         "reduce_scatter, all_to_all, all_slice, collective_permute, fits"),
    ("{all_reduce: -1}", "schedules.BP.expect.all_reduce: a count is at least 0, got -1"),
    ("{all_reduce: 2.5}", "schedules.BP.expect.all_reduce: expected a count or a formula of L, P, K, V, not 2.5"),
    ("{all_reduce: 'L + x'}", "schedules.BP.expect.all_reduce: 'L + x': unknown name 'x'; formulas use L (the "
                              "program's layers), P (the pipeline stages), K (the microbatches), V (the stages per "
                              "pipeline device)"),
    ("{all_reduce: 'L +'}", "schedules.BP.expect.all_reduce: 'L +' is not a formula of L, P, K, V"),
    ("{all_reduce: 'L ** 2'}", "schedules.BP.expect.all_reduce: 'L ** 2': only integers, L, P, K, V, + - * // and "
                               "parentheses"),
    ("{fits: maybe}", "schedules.BP.expect.fits: Input should be a valid boolean"),
])
def test_expectation_errors_name_the_field(tmp_path, expect, expected):
    _, message = load_error(tmp_path, MODEL + MESH + HARDWARE + f"schedules:\n  BP:\n    tactics:\n{BP}"
                            f"    expect: {expect}\n")
    assert expected in message


def test_an_inference_program_cannot_train(tmp_path):
    _, message = build_error(tmp_path, "model: {builder: transformer_decode}\n" + MESH + HARDWARE)
    assert message.endswith(": model.step: train needs a scalar loss, but the program's first result %next_logits "
                            "is tensor<2x32xf32> (an inference program: use step: forward)")
