"""Hardware descriptions for the cost model: devices, links, presets.

A `Device` holds one accelerator's peak compute per dtype, its HBM capacity
and bandwidth; a `Link` the bandwidth and per-hop latency of one class of
interconnect (NVLink, PCIe, InfiniBand, Ethernet, TPU ICI, data-center
network). A `Preset` is a device from a vendor's public spec sheet with the
link classes it is commonly deployed with; `Hardware` is what the cost model
uses: a device and one link per mesh axis.

Figures are written with units and read by `parse_quantity` ("80GiB",
"3.35TB/s", "989TFLOP/s", "5us"); a bare number is an error, so a spec can
never confuse GB with GiB or bytes with bits silently. Stored values are
plain floats in base units: bytes, bytes/s, flop/s, seconds.

Imports only pydantic and the standard library.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

# ------------------------------------------------------------------ units

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_WHAT = {"B": "a size", "B/s": "a bandwidth", "FLOP/s": "a compute rate", "s": "a time"}
_EXAMPLE = {"B": "40GiB", "B/s": "600GB/s", "FLOP/s": "312TFLOP/s", "s": "5us"}


def _unit_table() -> dict[str, tuple[str, float, float]]:
    """Every accepted unit word -> (its kind, multiplier, divisor) to the base
    unit. Dividing by 1e6 rather than multiplying by 1e-6 keeps "5us" exactly
    5e-06 (1e-6 is not exact in binary floating point)."""
    table: dict[str, tuple[str, float, float]] = {}
    for prefix, factor in {**_DECIMAL, **_BINARY}.items():  # bytes take both kinds of prefix
        table[prefix + "B"] = ("B", factor, 1.0)
        for rate in ("B/s", "Bps"):
            table[prefix + rate] = ("B/s", factor, 1.0)
    for prefix, factor in _DECIMAL.items():
        for bits in ("b/s", "bps", "bit/s"):  # network rates are quoted in bits: 400Gb/s = 50GB/s
            table[prefix + bits] = ("B/s", factor, 8.0)
        for word in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
            table[prefix + word] = ("FLOP/s", factor, 1.0)
    for word, divisor in {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6, "ns": 1e9}.items():
        table[word] = ("s", 1.0, divisor)  # both micro signs: U+00B5 and the Greek mu U+03BC
    return table


UNITS: Mapping[str, tuple[str, float, float]] = _unit_table()
_QUANTITY = re.compile(
    r"\s*(?P<number>[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|nan|inf(?:inity)?))\s*(?P<unit>.*?)\s*",
    re.IGNORECASE,
)


def parse_quantity(text: str | int | float, unit: str) -> float:
    """The value of `text` (a number with a unit, e.g. "80GiB") in the base
    unit `unit`: "B" (bytes), "B/s" (bytes/s), "FLOP/s" or "s" (seconds).

    Decimal prefixes k M G T P are powers of 1000, binary prefixes Ki Mi Gi
    Ti powers of 1024 (bytes only); rates in bits ("400Gb/s", "1600Gbps")
    are converted to bytes. Raises ValueError, saying what is wrong with an
    example, for a bare number, a unit of another kind, an unknown unit, a
    value that is not a positive finite number, or anything else.
    """
    if unit not in _WHAT:
        raise ValueError(f"unknown base unit {unit!r}; expected one of {', '.join(_WHAT)}")
    example = _EXAMPLE[unit]
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected {_WHAT[unit]} with a unit, e.g. {example!r}; got {text!r}")
    if not isinstance(text, str):  # a YAML number: which unit was meant is exactly what we cannot know
        raise ValueError(f"missing unit, e.g. {example!r}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot read {text!r} as {_WHAT[unit]}; expected a number with a unit, e.g. {example!r}")
    number, word = float(match["number"]), match["unit"]
    if not word:
        raise ValueError(f"missing unit, e.g. {example!r}")
    if word not in UNITS:
        raise ValueError(f"unknown unit {word!r} in {text!r}; {_WHAT[unit]} is written like {example!r}")
    kind, multiplier, divisor = UNITS[word]
    if kind != unit:
        raise ValueError(f"{text!r} is {_WHAT[kind]} ({kind}), not {_WHAT[unit]} ({unit}); e.g. {example!r}")
    value = number * multiplier / divisor
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}; e.g. {example!r}")
    if value <= 0:
        raise ValueError(f"must be positive, got {text!r}")
    return value


def _quantity(unit: str) -> Any:
    def parse(value: Any) -> float:
        return parse_quantity(value, unit)

    return Annotated[float, BeforeValidator(parse)]


Fraction = Annotated[float, Field(gt=0, le=1)]
FlopRate = _quantity("FLOP/s")
ByteSize = _quantity("B")
ByteRate = _quantity("B/s")
Seconds = _quantity("s")

# IR dtype names (f32, bf16, f16, f64, i32, i1, bool, ...), not numpy's or torch's (float32, bfloat16, fp16).
_DTYPE_NAME = re.compile(r"(?:f|bf|i|u)\d+|bool")


# ------------------------------------------------------------------ models


class Device(BaseModel):
    """One accelerator: peak compute per dtype, HBM capacity and bandwidth."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    peak_flops: dict[str, FlopRate]
    memory: ByteSize
    memory_bandwidth: ByteRate
    source: str = ""
    # The fractions of the datasheet figures a well-tuned kernel reaches (what an
    # expert plans with): large matmuls' flop/s, and streaming HBM bandwidth.
    matmul_fraction: Fraction = 1.0
    memory_bandwidth_fraction: Fraction = 1.0

    @field_validator("peak_flops")
    @classmethod
    def _dtypes(cls, peaks: dict[str, float]) -> dict[str, float]:
        for dtype in peaks:
            if not _DTYPE_NAME.fullmatch(dtype):
                raise ValueError(f"unknown dtype name {dtype!r}; use IR dtype names such as f32, bf16, f16, f64, i32")
        if "f32" not in peaks:
            raise ValueError("needs an f32 figure (dtypes not listed use it), "
                             "e.g. {f32: 19.5TFLOP/s, bf16: 312TFLOP/s}")
        return peaks

    def peak(self, dtype: str) -> float:
        """Peak flop/s for `dtype`; dtypes not listed (i32, bool, ...) use the f32 figure."""
        return self.peak_flops.get(dtype, self.peak_flops["f32"])

    def compute_rate(self, dtype: str) -> float:
        """The flop/s the cost model prices compute at: peak x matmul_fraction."""
        return self.peak(dtype) * self.matmul_fraction

    @property
    def memory_rate(self) -> float:
        """The HBM bytes/s the cost model prices at: bandwidth x memory_bandwidth_fraction."""
        return self.memory_bandwidth * self.memory_bandwidth_fraction


class Link(BaseModel):
    """One class of interconnect as a ring collective sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(default="custom", min_length=1)  # nvlink, pcie, infiniband, ethernet, ici, dcn, custom
    bandwidth: ByteRate  # bytes/s one device can send in one direction
    latency: Seconds  # per hop
    bandwidth_fraction: Fraction = 1.0  # what a tuned collective library reaches of it

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.bandwidth_fraction


class Preset(BaseModel):
    """A spec-sheet device with the link classes it is deployed with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device
    links: dict[str, Link]  # link class name -> Link
    default_link: str
    # Topology, for meshes the planner lays out itself: a node joins this many devices with the default
    # link and nodes are joined by `node_link` (None: every device on the default link).
    node_devices: int | None = None
    node_link: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Preset:
        if self.default_link not in self.links:
            raise ValueError(f"default link {self.default_link!r} is not one of {', '.join(self.links)}")
        for name, link in self.links.items():
            if link.kind != name:
                raise ValueError(f"link class {name!r} holds a link of kind {link.kind!r}")
        if self.node_link is not None and self.node_link not in self.links:
            raise ValueError(f"node link {self.node_link!r} is not one of {', '.join(self.links)}")
        return self


class Hardware(BaseModel):
    """The resolved hardware the cost model uses: a device and one link per mesh axis."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # the preset name, or the inline device's name
    device: Device
    links: dict[str, Link]  # mesh axis -> link, in mesh order

    @property
    def capacity_bytes(self) -> float:
        """HBM capacity of one device, in bytes."""
        return self.device.memory

    def link(self, axes: Sequence[str]) -> Link:
        """The link a collective over `axes` (one axis name or several) is
        limited by: the smallest bandwidth and the largest latency among
        them; its kind joins the kinds with "+" when they differ."""
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        if not names:
            raise ValueError("a collective needs at least one mesh axis")
        for axis in names:
            if axis not in self.links:
                raise ValueError(f"unknown mesh axis {axis!r}; mesh axes: {', '.join(self.links)}")
        links = [self.links[axis] for axis in names]
        if all(link == links[0] for link in links):
            return links[0]
        kinds = dict.fromkeys(link.kind for link in links)  # first-seen order, no repeats
        # Built from validated figures, so no re-validation (which would want unit strings).
        return Link.model_construct(
            kind="+".join(kinds),
            bandwidth=min(link.effective_bandwidth for link in links),
            latency=max(link.latency for link in links),
            bandwidth_fraction=1.0,
        )


# ------------------------------------------------------------------ presets
#
# Dense (non-sparse) figures from the vendors' public spec sheets; the source
# of each is in its comment and in Device.source. Conventions:
#
# * Memory: HBM capacities are binary. HBM stacks come in powers of two of
#   GiB, and the devices report them so (an "80GB" H100 shows 79.6 GiB in
#   nvidia-smi, an "141GB" H200 about 140 GiB); Google writes GiB outright.
#   Bandwidths are decimal (1 GB/s = 1e9 bytes/s), as every vendor means them.
# * f32 is the IEEE (non-tensor-core, non-TF32) rate; f64 on GPUs is the FP64
#   tensor-core rate where there is one (dense matmuls use it). TPU sheets
#   give bf16 only: f32 matmuls take several bf16 passes on the MXU, so f32
#   is bf16 / 4 here (an estimate, not a Google figure).
# * Link bandwidth is per device per direction, which is what a ring
#   collective moves: NVIDIA quotes NVLink and PCIe as both directions
#   together, so they are halved here. Network links are one NIC per device
#   (as in DGX/HGX systems), converted from Gb/s.
# * Latencies are not on spec sheets: they are typical per-hop values
#   (nvlink 1us, pcie 2us, infiniband 5us, ethernet 10us, ici 1us, dcn 10us).
# * Achievable fractions (`matmul_fraction`, `memory_bandwidth_fraction`,
#   `Link.bandwidth_fraction`) are planning figures, not vendor figures nor
#   measurements here: what a practitioner expects a tuned kernel or
#   collective library to reach. Large bf16 GEMMs in cuBLAS reach about 80% of
#   an A100's or V100's dense tensor peak and about 70% of an H100's (its peak
#   assumes clocks that large GEMMs do not hold); the MXU keeps about 90% on
#   large matmuls; streaming kernels reach about 90% of HBM bandwidth; NCCL's
#   all_reduce bus bandwidth is about 80% of NVLink's and PCIe's and about
#   90% of an InfiniBand NIC's line rate; ICI and DCN collectives about 80%.
#   tools/calibrate.py measures the first and last on a machine at hand; a
#   spec overrides any of them (`hardware: {achievable: ...}`, docs/specs.md).

_NVLINK_LATENCY, _PCIE_LATENCY, _IB_LATENCY, _ETH_LATENCY = "1us", "2us", "5us", "10us"
_ICI_LATENCY, _DCN_LATENCY = "1us", "10us"
# Achievable fractions (see above): per link class, and HBM's for every device.
LINK_FRACTIONS = {"nvlink": 0.8, "pcie": 0.8, "infiniband": 0.9, "ethernet": 0.8, "ici": 0.8, "dcn": 0.8}
_HBM_FRACTION = 0.9


def _link(kind: str, bandwidth: str, latency: str) -> Link:
    return Link(kind=kind, bandwidth=bandwidth, latency=latency, bandwidth_fraction=LINK_FRACTIONS[kind])


def _gpu_links(nvlink: str, pcie: str, infiniband: str) -> dict[str, Link]:
    return {
        "nvlink": _link("nvlink", nvlink, _NVLINK_LATENCY),
        "pcie": _link("pcie", pcie, _PCIE_LATENCY),
        "infiniband": _link("infiniband", infiniband, _IB_LATENCY),
        # 100 Gigabit Ethernet, one port per device.
        "ethernet": _link("ethernet", "100Gb/s", _ETH_LATENCY),
    }


def _tpu_links(ici: str, dcn: str) -> dict[str, Link]:
    return {"ici": _link("ici", ici, _ICI_LATENCY), "dcn": _link("dcn", dcn, _DCN_LATENCY)}


def _device(name: str, source: str, peaks: dict[str, str], memory: str, bandwidth: str, matmul: float) -> Device:
    return Device(name=name, peak_flops=peaks, memory=memory, memory_bandwidth=bandwidth, source=source,
                  matmul_fraction=matmul, memory_bandwidth_fraction=_HBM_FRACTION)


# NVIDIA A100 Tensor Core GPU datasheet (SXM4): FP64 tensor core 19.5, FP32 19.5,
# BF16/FP16 tensor core 312 TFLOPS dense; 40GB HBM2 at 1,555GB/s or 80GB HBM2e
# at 2,039GB/s; NVLink 3 600GB/s (both directions), PCIe Gen4 x16 64GB/s (both
# directions). InfiniBand HDR 200Gb/s per GPU (DGX A100).
_A100_PEAKS = {"f64": "19.5TFLOP/s", "f32": "19.5TFLOP/s", "bf16": "312TFLOP/s", "f16": "312TFLOP/s"}
_A100_LINKS = _gpu_links(nvlink="300GB/s", pcie="32GB/s", infiniband="200Gb/s")
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"

# NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): FP64 tensor core 67, FP32 67,
# BF16/FP16 tensor core 1,979 TFLOPS with sparsity = 989 dense; 80GB HBM3 at
# 3.35TB/s; NVLink 4 900GB/s, PCIe Gen5 x16 128GB/s (both directions).
# InfiniBand NDR 400Gb/s per GPU (DGX H100).
_HOPPER_PEAKS = {"f64": "67TFLOP/s", "f32": "67TFLOP/s", "bf16": "989TFLOP/s", "f16": "989TFLOP/s"}
_HOPPER_LINKS = _gpu_links(nvlink="450GB/s", pcie="64GB/s", infiniband="400Gb/s")

# A DGX / HGX node: 8 GPUs on NVLink, one InfiniBand NIC per GPU between nodes. TPUs keep every chip of
# a slice on ICI (no node_devices).
_DGX = {"node_devices": 8, "node_link": "infiniband"}

PRESETS: dict[str, Preset] = {
    "A100-40GB": Preset(
        device=_device("A100-40GB", _A100_SOURCE, _A100_PEAKS, "40GiB", "1555GB/s", matmul=0.8),
        links=_A100_LINKS, default_link="nvlink", **_DGX,
    ),
    "A100-80GB": Preset(
        device=_device("A100-80GB", _A100_SOURCE, _A100_PEAKS, "80GiB", "2039GB/s", matmul=0.8),
        links=_A100_LINKS, default_link="nvlink", **_DGX,
    ),
    "H100-SXM": Preset(
        device=_device("H100-SXM", "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)",
                       _HOPPER_PEAKS, "80GiB", "3.35TB/s", matmul=0.7),
        links=_HOPPER_LINKS, default_link="nvlink", **_DGX,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): compute as H100 SXM;
    # 141GB HBM3e at 4.8TB/s; NVLink 900GB/s, PCIe Gen5 128GB/s (both directions).
    "H200": Preset(
        device=_device("H200", "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)",
                       _HOPPER_PEAKS, "141GiB", "4.8TB/s", matmul=0.7),
        links=_HOPPER_LINKS, default_link="nvlink", **_DGX,
    ),
    # NVIDIA Tesla V100 GPU datasheet (SXM2): FP64 7.8, FP32 15.7, tensor (FP16)
    # 125 TFLOPS; 32GB HBM2 at 900GB/s; NVLink 2 300GB/s (both directions; all
    # 16 GPUs through NVSwitch in a DGX-2), PCIe Gen3 x16 32GB/s (both
    # directions). Volta has no bf16: a bf16 program runs in fp16 mixed
    # precision there, so bf16 takes the fp16 tensor figure. InfiniBand EDR 100Gb/s.
    "V100-32GB": Preset(
        device=_device("V100-32GB", "NVIDIA Tesla V100 GPU datasheet (SXM2)",
                       {"f64": "7.8TFLOP/s", "f32": "15.7TFLOP/s", "bf16": "125TFLOP/s", "f16": "125TFLOP/s"},
                       "32GiB", "900GB/s", matmul=0.8),
        links=_gpu_links(nvlink="150GB/s", pcie="16GB/s", infiniband="100Gb/s"), default_link="nvlink",
        node_devices=16, node_link="infiniband",
    ),
    # NVIDIA Tesla P100 datasheet (SXM2, NVLink): FP64 5.3, FP32 10.6, FP16 21.2
    # TFLOPS; 16GB CoWoS HBM2 at 732GB/s; NVLink 1 160GB/s (both directions),
    # PCIe Gen3 x16 32GB/s (both directions). No bf16: like V100, bf16 takes the
    # fp16 figure. InfiniBand EDR 100Gb/s.
    "P100": Preset(
        device=_device("P100", "NVIDIA Tesla P100 datasheet (SXM2)",
                       {"f64": "5.3TFLOP/s", "f32": "10.6TFLOP/s", "bf16": "21.2TFLOP/s", "f16": "21.2TFLOP/s"},
                       "16GiB", "732GB/s", matmul=0.8),
        links=_gpu_links(nvlink="80GB/s", pcie="16GB/s", infiniband="100Gb/s"), default_link="nvlink", **_DGX,
    ),
    # TPUs. ICI: a mesh axis lies along one torus dimension, and a ring
    # collective on it sends over the two links of that dimension at once
    # (one per neighbour), so the figure is 2 x the one-way link bandwidth.
    # Per link: the Cloud TPU pages' "all-reduce bandwidth per Pod" / chips /
    # links per chip (v5e: 51.2TB/s / 256 / 4 = 50GB/s, the page's 1600Gbps
    # per chip over 4 links; v4: 1.1PB/s / 4096 / 6 = 45GB/s; v3: 340TB/s /
    # 1024 / 4 = 83GB/s); "How to Scale Your Model" (Google DeepMind, 2025)
    # lists 45 and 50GB/s for v4 and v5e. Without the wraparound link (an axis
    # shorter than the torus) the ring gets half. DCN: "How to Scale Your
    # Model" gives about 25GB/s per host, shared by the host's chips (4 on v3
    # and v4, 8 on v5e; v5e's page: 6.4Tbps per 256-chip Pod = 25Gbps per chip).
    #
    # Google Cloud TPU docs, TPU v3: 123 TFLOPS bf16 per chip, 32 GiB HBM2 at
    # 900GBps, 2D torus, 1024 chips and 340TB/s all-reduce per Pod.
    "TPUv3": Preset(
        device=_device("TPUv3", "Google Cloud TPU documentation: TPU v3 system architecture",
                       {"f32": "30.75TFLOP/s", "bf16": "123TFLOP/s"}, "32GiB", "900GB/s", matmul=0.9),
        links=_tpu_links(ici="166GB/s", dcn="6.25GB/s"), default_link="ici",
    ),
    # Google Cloud TPU docs, TPU v4: 275 TFLOPS bf16 per chip, 32 GiB HBM2 at
    # 1200GBps, 3D torus, 4096 chips and 1.1PB/s all-reduce per Pod.
    "TPUv4": Preset(
        device=_device("TPUv4", "Google Cloud TPU documentation: TPU v4 system architecture",
                       {"f32": "68.75TFLOP/s", "bf16": "275TFLOP/s"}, "32GiB", "1200GB/s", matmul=0.9),
        links=_tpu_links(ici="90GB/s", dcn="6.25GB/s"), default_link="ici",
    ),
    # Google Cloud TPU docs, TPU v5e: 197 TFLOPS bf16 per chip, 16 GB HBM2 at
    # 819GBps (16 GiB: two 8 GiB stacks), ICI 1600Gbps per chip, 2D torus,
    # 256 chips and 51.2TB/s all-reduce per Pod.
    "TPUv5e": Preset(
        device=_device("TPUv5e", "Google Cloud TPU documentation: TPU v5e system architecture",
                       {"f32": "49.25TFLOP/s", "bf16": "197TFLOP/s"}, "16GiB", "819GB/s", matmul=0.9),
        links=_tpu_links(ici="100GB/s", dcn="25Gb/s"), default_link="ici",
    ),
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def preset_hardware(name: str, axes: Sequence[str], links: Mapping[str, str] | None = None) -> Hardware:
    """The preset `name` on a mesh with `axes`: every axis on the preset's
    default link unless `links` maps it to another of the preset's link
    classes (e.g. {"batch": "infiniband"})."""
    if name not in PRESETS:
        raise ValueError(f"unknown hardware preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}")
    preset = PRESETS[name]
    chosen = dict(links or {})
    for axis, link_class in chosen.items():
        if axis not in axes:
            raise ValueError(f"link for unknown mesh axis {axis!r}; mesh axes: {', '.join(axes)}")
        if link_class not in preset.links:
            raise ValueError(
                f"unknown link class {link_class!r} for {name}; valid link classes: {', '.join(preset.links)}"
            )
    return Hardware(
        name=name,
        device=preset.device,
        links={axis: preset.links[chosen.get(axis, preset.default_link)] for axis in axes},
    )


def topology_links(name: str, mesh: Sequence[tuple[str, int]]) -> dict[str, str]:
    """Each axis's link class on the preset `name` when the mesh (axes major
    to minor) is laid out minor axis fastest over devices numbered node by
    node: an axis stays on the default link while its devices lie in one
    node (its size times the sizes of the axes minor to it is at most the
    node's devices) and crosses nodes on the node link otherwise."""
    preset = PRESETS[name]
    links, inner = {}, 1
    for axis, size in reversed(list(mesh)):
        inner *= size
        crosses = preset.node_devices is not None and inner > preset.node_devices
        links[axis] = preset.node_link if crosses and preset.node_link else preset.default_link
    return {axis: links[axis] for axis, _ in mesh}
