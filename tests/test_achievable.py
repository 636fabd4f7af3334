"""Achievable fractions of the hardware figures (issue 25, item 5): presets
carry them, the cost model prices with them, the ideal step time does not,
and a spec overrides each."""

import pytest
from test_costmodel import MATMUL

from costmodel.evaluate import collective_s, evaluate, ideal_step_time_s
from costmodel.hardware import PRESETS, preset_hardware
from ir.core import Mesh, tensor
from ir.text import parse
from solver.planning.spec import SpecError, parse_spec


def test_every_preset_names_its_source_and_fractions():
    for name, preset in PRESETS.items():
        assert preset.device.source, name
        assert 0 < preset.device.matmul_fraction < 1 and 0 < preset.device.memory_bandwidth_fraction < 1, name
        assert all(0 < link.bandwidth_fraction < 1 for link in preset.links.values()), name


def test_compute_and_links_are_priced_at_the_achievable_fraction_and_the_ideal_at_peak():
    hw = preset_hardware("A100-80GB", ["x"])
    small = evaluate(parse(MATMUL.replace("DT", "bf16")), hw)
    # 64x128 @ 128x256 in bf16 is memory-bound: 114,688 B at 0.9 x 2,039 GB/s.
    assert small.step_time_s == pytest.approx(114688 / (0.9 * 2039e9), rel=1e-12)
    fn = parse(MATMUL.replace("64x128", "4096x4096").replace("128x256", "4096x4096")
               .replace("64x256", "4096x4096").replace("DT", "bf16"))
    # 2 x 4096^3 flops at 0.8 x 312 TFLOP/s (its 96 MiB at HBM speed take a tenth of that).
    flops = 2 * 4096**3
    assert evaluate(fn, hw).step_time_s == pytest.approx(flops / (0.8 * 312e12), rel=1e-12)
    assert ideal_step_time_s(fn, 1, hw) == pytest.approx(flops / 312e12, rel=1e-12)
    t = tensor([1 << 20], "f32")
    # all_reduce of 4 MiB over 8 devices on NVLink: 300 GB/s x 0.8, 1 us per hop.
    assert collective_s("all_reduce", ["x"], t, t, Mesh.of(x=8), hw) == pytest.approx(
        2 * 7 / 8 * 4 * 2**20 / (0.8 * 300e9) + 2 * 7 * 1e-6, rel=1e-12)


SPEC = """
model: {builder: mlp}
devices: 8
mesh: {batch: 4, model: 2}
hardware:
  preset: A100-80GB
  links: {batch: infiniband}
  achievable: ACHIEVABLE
"""


def test_a_spec_overrides_each_fraction():
    hw = parse_spec(SPEC.replace("ACHIEVABLE", "{matmul: 0.5, memory_bandwidth: 0.6, links: {batch: 0.7}}")
                    ).hardware_obj()
    assert (hw.device.matmul_fraction, hw.device.memory_bandwidth_fraction) == (0.5, 0.6)
    assert hw.links["batch"].bandwidth_fraction == 0.7 and hw.links["batch"].kind == "infiniband"
    assert hw.links["model"].bandwidth_fraction == 0.8  # the preset's nvlink figure, untouched
    assert hw.link(["batch", "model"]).bandwidth == pytest.approx(min(0.7 * 25e9, 0.8 * 300e9))


@pytest.mark.parametrize("achievable, message", [
    ("{matmul: 1.5}", "achievable.matmul: Input should be less than or equal to 1"),
    ("{memory_bandwidth: 0}", "achievable.memory_bandwidth: Input should be greater than 0"),
    ("{links: {nope: 0.5}}", "achievable.links.nope: not a mesh axis"),
    ("{speed: 1}", "achievable.speed: unknown key"),
])
def test_bad_fractions_are_named(achievable, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(SPEC.replace("ACHIEVABLE", achievable))


def test_a_spec_overrides_a_presets_memory():
    text = SPEC.replace("  achievable: ACHIEVABLE\n", "  memory: 3MiB\n")
    hw = parse_spec(text).hardware_obj()
    assert hw.device.memory == 3 * 2**20 and hw.device.matmul_fraction == PRESETS["A100-80GB"].device.matmul_fraction
    assert hw.links["batch"].kind == "infiniband"
    with pytest.raises(SpecError, match=r"hardware: memory overrides a preset's; an inline device gives its own"):
        parse_spec(text.replace("preset: A100-80GB", "device: {name: x, peak_flops: {f32: 1TFLOP/s}, memory: 1GiB, "
                                "memory_bandwidth: 1TB/s}").replace("{batch: infiniband}", "{batch: {bandwidth: "
                                "1GB/s, latency: 1us}, model: {bandwidth: 1GB/s, latency: 1us}}"))
    with pytest.raises(SpecError, match="hardware.memory: missing unit"):
        parse_spec(text.replace("3MiB", "3"))
