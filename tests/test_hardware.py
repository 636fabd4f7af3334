"""Hardware descriptions: unit parsing, the spec-sheet presets, link choice
per mesh axis."""

import math

import pytest
from pydantic import ValidationError

from costmodel.hardware import (
    PRESET_NAMES,
    PRESETS,
    Device,
    Hardware,
    Link,
    parse_quantity,
    preset_hardware,
)

GiB = 2**30

# ------------------------------------------------------------ units


@pytest.mark.parametrize("text, unit, expected", [
    ("40GiB", "B", 40 * GiB),
    ("40 GiB", "B", 40 * GiB),
    ("80GB", "B", 80e9),
    ("512MiB", "B", 512 * 2**20),
    ("1.5KiB", "B", 1536),
    ("2TiB", "B", 2 * 2**40),
    ("3kB", "B", 3000),
    ("100B", "B", 100),
    ("1.5TB/s", "B/s", 1.5e12),
    ("600GB/s", "B/s", 600e9),
    ("600 GB/s", "B/s", 600e9),
    ("819GBps", "B/s", 819e9),
    ("1GiB/s", "B/s", GiB),
    ("400Gb/s", "B/s", 50e9),  # network rates in bits
    ("1600Gbps", "B/s", 200e9),
    ("100Gbit/s", "B/s", 12.5e9),
    ("312TFLOP/s", "FLOP/s", 312e12),
    ("312 TFLOPS", "FLOP/s", 312e12),
    ("197TFLOPs", "FLOP/s", 197e12),
    ("1.1PFLOP/s", "FLOP/s", 1.1e15),
    ("500 GFLOP/s", "FLOP/s", 500e9),
    ("5us", "s", 5e-6),
    ("5µs", "s", 5e-6),  # U+00B5 MICRO SIGN
    ("5μs", "s", 5e-6),  # U+03BC GREEK SMALL LETTER MU
    ("2ms", "s", 2e-3),
    ("1.5e-6 s", "s", 1.5e-6),
    ("10ns", "s", 1e-8),
    ("0.25 s", "s", 0.25),
    ("  7 GB  ", "B", 7e9),
])
def test_parse_quantity_accepts(text, unit, expected):
    assert parse_quantity(text, unit) == pytest.approx(expected, rel=1e-15)


def test_binary_and_decimal_prefixes_differ():
    assert parse_quantity("1GiB", "B") == 1024**3
    assert parse_quantity("1GB", "B") == 1000**3


@pytest.mark.parametrize("value, unit, problem", [
    (40, "B", "missing unit, e.g. '40GiB'"),  # a YAML int
    (2.5, "B/s", "missing unit, e.g. '600GB/s'"),  # a YAML float
    ("40", "B", "missing unit, e.g. '40GiB'"),
    ("312", "FLOP/s", "missing unit, e.g. '312TFLOP/s'"),
    ("5", "s", "missing unit, e.g. '5us'"),
    ("600GB", "B/s", "'600GB' is a size (B), not a bandwidth (B/s); e.g. '600GB/s'"),
    ("600GB/s", "B", "'600GB/s' is a bandwidth (B/s), not a size (B)"),
    ("5us", "B/s", "'5us' is a time (s), not a bandwidth (B/s)"),
    ("312TFLOPS", "B/s", "is a compute rate (FLOP/s), not a bandwidth"),
    ("40Gb", "B", "unknown unit 'Gb'"),  # bits are for rates only
    ("1.5GiFLOP/s", "FLOP/s", "unknown unit 'GiFLOP/s'"),
    ("40XB", "B", "unknown unit 'XB' in '40XB'; a size is written like '40GiB'"),
    ("5 minutes", "s", "unknown unit 'minutes'"),
    ("0GB/s", "B/s", "must be positive, got '0GB/s'"),
    ("0 s", "s", "must be positive"),
    ("-5us", "s", "must be positive, got '-5us'"),
    ("-1GiB", "B", "must be positive"),
    ("nan GB", "B", "must be a finite number, got 'nan GB'"),
    ("inf TFLOP/s", "FLOP/s", "must be a finite number"),
    ("1e400GB", "B", "must be a finite number"),
    ("abc", "B", "cannot read 'abc' as a size; expected a number with a unit, e.g. '40GiB'"),
    ("GB", "B", "cannot read 'GB'"),
    ("", "s", "cannot read '' as a time"),
    ("1,5GB", "B", "unknown unit ',5GB'"),
    (True, "B", "expected a size with a unit, e.g. '40GiB'; got True"),
    (None, "s", "expected a time with a unit"),
    ([40, "GB"], "B", "expected a size with a unit"),
])
def test_parse_quantity_rejects(value, unit, problem):
    with pytest.raises(ValueError) as info:
        parse_quantity(value, unit)
    assert problem in str(info.value)


def test_parse_quantity_rejects_an_unknown_base_unit():
    with pytest.raises(ValueError, match="unknown base unit 'GB'"):
        parse_quantity("1GB", "GB")


# ------------------------------------------------------------ models


def device(**changes) -> dict:
    fields = {"name": "chip", "peak_flops": {"f32": "50TFLOP/s", "bf16": "400TFLOP/s"},
              "memory": "64GiB", "memory_bandwidth": "2TB/s"}
    return {**fields, **changes}


def test_device_parses_its_figures():
    d = Device.model_validate(device())
    assert d.memory == 64 * GiB and d.memory_bandwidth == 2e12
    assert d.peak("bf16") == 400e12 and d.peak("f32") == 50e12


def test_dtypes_not_listed_use_the_f32_figure():
    d = Device.model_validate(device())
    assert d.peak("i32") == d.peak("bool") == d.peak("f16") == 50e12


@pytest.mark.parametrize("changes, where, problem", [
    ({"memory": 64}, ("memory",), "missing unit, e.g. '40GiB'"),
    ({"memory_bandwidth": "2TB"}, ("memory_bandwidth",), "is a size (B), not a bandwidth"),
    ({"peak_flops": {"f32": "50TFLOP/s", "bf16": 400}}, ("peak_flops", "bf16"), "missing unit"),
    ({"peak_flops": {"bf16": "400TFLOP/s"}}, ("peak_flops",), "needs an f32 figure"),
    ({"peak_flops": {"f32": "1TFLOP/s", "fp16": "2TFLOP/s"}}, ("peak_flops",), "unknown dtype name 'fp16'"),
    ({"memory": "0GiB"}, ("memory",), "must be positive"),
    ({"name": ""}, ("name",), "at least 1 character"),
])
def test_device_errors_name_the_field(changes, where, problem):
    with pytest.raises(ValidationError) as info:
        Device.model_validate(device(**changes))
    error = info.value.errors()[0]
    assert error["loc"] == where and problem in error["msg"]


def test_models_are_frozen_and_strict():
    link = Link(bandwidth="25GB/s", latency="5us")
    assert link.kind == "custom"
    with pytest.raises(ValidationError):
        link.bandwidth = 1.0
    with pytest.raises(ValidationError, match="Extra inputs"):
        Link(bandwidth="25GB/s", latency="5us", hops=2)


# ------------------------------------------------------------ presets


def test_preset_names_are_the_presets():
    assert PRESET_NAMES == ("A100-40GB", "A100-80GB", "H100-SXM", "H200", "V100-32GB", "P100",
                            "TPUv3", "TPUv4", "TPUv5e")
    assert PRESET_NAMES == tuple(PRESETS)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_is_sane(name):
    preset = PRESETS[name]
    d = preset.device
    assert d.name == name and d.source
    assert {"f32", "bf16"} <= set(d.peak_flops)
    assert all(math.isfinite(v) and v > 0 for v in d.peak_flops.values())
    assert d.peak("bf16") > d.peak("f32")  # tensor cores / MXU
    assert d.peak("i32") == d.peak("f32")
    assert 8 * GiB <= d.memory <= 256 * GiB
    assert 500e9 <= d.memory_bandwidth <= 10e12
    assert preset.default_link in preset.links
    for kind, link in preset.links.items():
        assert link.kind == kind
        assert 1e9 <= link.bandwidth <= 1e12 and 0 < link.latency <= 1e-4
    # The default link is the fastest one: the one inside a node or slice.
    assert preset.links[preset.default_link].bandwidth == max(link.bandwidth for link in preset.links.values())
    # Nodes: GPUs are joined by a slower link between nodes; a TPU slice is one ICI domain.
    if preset.node_devices is not None:
        assert preset.node_link in preset.links and preset.node_devices in (8, 16)
        assert preset.links[preset.node_link].bandwidth < preset.links[preset.default_link].bandwidth
    else:
        assert preset.default_link == "ici" and preset.node_link is None


def test_a_preset_node_link_must_be_one_of_its_links():
    from costmodel.hardware import Preset

    with pytest.raises(ValueError, match="node link 'dcn' is not one of"):
        Preset(device=PRESETS["A100-80GB"].device, links=PRESETS["A100-80GB"].links, default_link="nvlink",
               node_devices=8, node_link="dcn")


def test_gpu_and_tpu_link_classes():
    for name in ("A100-40GB", "A100-80GB", "H100-SXM", "H200", "V100-32GB", "P100"):
        assert set(PRESETS[name].links) == {"nvlink", "pcie", "infiniband", "ethernet"}
        assert PRESETS[name].default_link == "nvlink"
    for name in ("TPUv3", "TPUv4", "TPUv5e"):
        assert set(PRESETS[name].links) == {"ici", "dcn"}
        assert PRESETS[name].default_link == "ici"


def test_a100_80gb_figures():
    p = PRESETS["A100-80GB"]
    assert p.device.memory == 80 * GiB
    assert p.device.memory_bandwidth == 2039e9
    assert p.device.peak("bf16") == p.device.peak("f16") == 312e12
    assert p.device.peak("f32") == 19.5e12
    assert p.links["nvlink"].bandwidth == 300e9  # 600GB/s both directions
    assert p.links["pcie"].bandwidth == 32e9  # Gen4 x16
    assert p.links["infiniband"].bandwidth == 25e9  # HDR 200Gb/s
    assert p.links["ethernet"].bandwidth == 12.5e9
    assert PRESETS["A100-40GB"].device.memory == 40 * GiB
    assert PRESETS["A100-40GB"].device.memory_bandwidth == 1555e9


def test_h100_and_h200_figures():
    h100, h200 = PRESETS["H100-SXM"], PRESETS["H200"]
    assert h100.device.peak("bf16") == 989e12 and h100.device.peak("f32") == 67e12
    assert h100.device.memory == 80 * GiB and h100.device.memory_bandwidth == 3.35e12
    assert h100.links["nvlink"].bandwidth == 450e9 and h100.links["infiniband"].bandwidth == 50e9
    assert h200.device.peak_flops == h100.device.peak_flops
    assert h200.device.memory == 141 * GiB and h200.device.memory_bandwidth == 4.8e12


def test_tpu_v4_figures():
    d = PRESETS["TPUv4"].device
    assert d.peak("bf16") == 275e12
    assert d.peak("f32") == 275e12 / 4  # not on the sheet: bf16 / 4
    assert d.memory == 32 * GiB and d.memory_bandwidth == 1200e9


def test_volta_and_pascal_have_no_bf16_hardware():
    for name in ("V100-32GB", "P100"):
        assert PRESETS[name].device.peak("bf16") == PRESETS[name].device.peak("f16")
    assert PRESETS["V100-32GB"].device.peak("f16") == 125e12
    assert PRESETS["P100"].device.peak("f32") == 10.6e12


def test_tpu_v5e_ici_is_two_of_its_four_links():
    # 1600Gbps per chip over 4 links = 50GB/s per link; an axis's ring uses 2.
    assert PRESETS["TPUv5e"].links["ici"].bandwidth == 2 * parse_quantity("1600Gbps", "B/s") / 4


# ------------------------------------------------------------ hardware and links


def test_preset_hardware_puts_every_axis_on_the_default_link():
    hw = preset_hardware("H100-SXM", ["batch", "model"])
    assert isinstance(hw, Hardware) and hw.name == "H100-SXM"
    assert list(hw.links) == ["batch", "model"]
    assert all(link == PRESETS["H100-SXM"].links["nvlink"] for link in hw.links.values())
    assert hw.capacity_bytes == 80 * GiB
    assert hw.device is PRESETS["H100-SXM"].device


def test_preset_hardware_with_link_overrides():
    hw = preset_hardware("A100-80GB", ["batch", "model"], {"batch": "infiniband"})
    assert hw.links["batch"].kind == "infiniband" and hw.links["batch"].bandwidth == 25e9
    assert hw.links["model"].kind == "nvlink"


@pytest.mark.parametrize("name, axes, links, problem", [
    ("H300", ["batch"], None, "unknown hardware preset 'H300'; valid presets: A100-40GB, A100-80GB,"),
    ("H100-SXM", ["batch"], {"batch": "ici"},
     "unknown link class 'ici' for H100-SXM; valid link classes: nvlink, pcie, infiniband, ethernet"),
    ("TPUv4", ["batch"], {"model": "dcn"}, "link for unknown mesh axis 'model'; mesh axes: batch"),
])
def test_preset_hardware_errors(name, axes, links, problem):
    with pytest.raises(ValueError) as info:
        preset_hardware(name, axes, links)
    assert problem in str(info.value)


def test_link_of_several_axes_is_the_slowest():
    hw = preset_hardware("H100-SXM", ["pod", "batch", "model"], {"pod": "ethernet", "batch": "infiniband"})
    link = hw.link(["model", "batch"])
    # achievable bandwidths: nvlink 450 GB/s x 0.8 = 360, infiniband 50 GB/s x 0.9 = 45
    assert link.bandwidth == pytest.approx(45e9) and link.latency == 5e-6 and link.bandwidth_fraction == 1
    assert link.kind == "nvlink+infiniband"
    worst = hw.link(("batch", "pod", "model"))
    assert worst.bandwidth == pytest.approx(12.5e9 * 0.8) and worst.latency == 10e-6  # ethernet
    assert worst.kind == "infiniband+ethernet+nvlink"


def test_link_takes_min_bandwidth_and_max_latency_separately():
    fast_far = Link(kind="custom", bandwidth="100GB/s", latency="20us")
    slow_near = Link(kind="custom", bandwidth="10GB/s", latency="1us")
    hw = Hardware(name="x", device=Device.model_validate(device()), links={"a": fast_far, "b": slow_near})
    link = hw.link(["a", "b"])
    assert (link.bandwidth, link.latency, link.kind) == (10e9, 20e-6, "custom")


def test_link_of_one_axis():
    hw = preset_hardware("TPUv5e", ["data", "model"], {"data": "dcn"})
    assert hw.link(["data"]) == hw.link("data") == PRESETS["TPUv5e"].links["dcn"]
    assert hw.link(["model", "model"]) is hw.links["model"]


def test_link_errors():
    hw = preset_hardware("TPUv4", ["batch", "model"])
    with pytest.raises(ValueError, match="unknown mesh axis 'seq'; mesh axes: batch, model"):
        hw.link(["batch", "seq"])
    with pytest.raises(ValueError, match="at least one mesh axis"):
        hw.link([])
