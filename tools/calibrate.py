"""Measure the achievable fractions of a hardware preset on the machine at hand
(needs jax; nothing in the tests or the planner needs this script).

    python tools/calibrate.py --preset H100-SXM [--dtype bf16] [--size 8192] [--repeat 20] [--json]

Three short jax benchmarks, each timed as the median of `--repeat` runs after
a warm-up (compilation excluded):

  matmul            an N x N @ N x N matmul in `--dtype`: achieved flop/s over
                    the preset's peak -> `matmul`;
  memory bandwidth  y = x * 2 + 1 over a 1 GiB array (reads and writes it
                    once, one fused loop): bytes moved per second over the
                    preset's HBM bandwidth -> `memory_bandwidth`;
  psum              an all_reduce of 256 MiB over every local device (when
                    there are at least two): the ring's bus bandwidth,
                    2 (n - 1) / n x bytes / time, over the preset's default
                    link -> `links` (name the mesh axes it applies to).

It prints the figures and the `hardware.achievable` block to paste into a
spec (docs/specs.md, "Hardware").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costmodel.hardware import PRESET_NAMES, PRESETS  # noqa: E402

JAX_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}  # IR dtype name -> jax's


def timed(fn, *args, repeat: int) -> float:
    """Median seconds of fn(*args), after one warm-up call that compiles it."""
    fn(*args).block_until_ready()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(preset_name: str, dtype: str, size: int, repeat: int) -> dict:
    import jax
    import jax.numpy as jnp

    preset = PRESETS[preset_name]
    device = preset.device
    out: dict = {"preset": preset_name, "devices": [str(d) for d in jax.local_devices()], "dtype": dtype}
    a = jnp.ones((size, size), JAX_DTYPES[dtype])
    matmul_s = timed(jax.jit(lambda x, y: x @ y), a, a, repeat=repeat)
    flops = 2 * size**3
    out["matmul"] = {"seconds": matmul_s, "flop_per_s": flops / matmul_s,
                     "fraction": flops / matmul_s / device.peak(dtype)}
    x = jnp.ones((1 << 28,), jnp.float32)  # 1 GiB
    stream_s = timed(jax.jit(lambda v: v * 2 + 1), x, repeat=repeat)
    moved = 2 * x.size * 4
    out["memory_bandwidth"] = {"seconds": stream_s, "bytes_per_s": moved / stream_s,
                               "fraction": moved / stream_s / device.memory_bandwidth}
    n = jax.local_device_count()
    if n >= 2:
        per_device = jnp.ones((n, 1 << 26), jnp.float32)  # 256 MiB on each device
        psum = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")
        psum_s = timed(psum, per_device, repeat=repeat)
        bus = 2 * (n - 1) / n * (1 << 26) * 4 / psum_s
        link = preset.links[preset.default_link]
        out["psum"] = {"devices": n, "seconds": psum_s, "bus_bytes_per_s": bus, "link": link.kind,
                       "fraction": bus / link.bandwidth}
    return out


def achievable_block(result: dict) -> str:
    fractions = {"matmul": result["matmul"]["fraction"], "memory_bandwidth": result["memory_bandwidth"]["fraction"]}
    lines = ["hardware:", f"  preset: {result['preset']}", "  achievable:"]
    lines += [f"    {key}: {min(value, 1.0):.2f}" for key, value in fractions.items()]
    if "psum" in result:
        lines.append(f"    links: {{AXIS: {min(result['psum']['fraction'], 1.0):.2f}}}  "
                     f"# every mesh axis on {result['psum']['link']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True, choices=PRESET_NAMES, help="the preset to compare against")
    parser.add_argument("--dtype", default="bf16", help="matmul dtype (IR name: bf16, f16, f32)")
    parser.add_argument("--size", type=int, default=8192, help="matmul side N")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.dtype not in JAX_DTYPES:
        parser.error(f"--dtype: expected one of {', '.join(JAX_DTYPES)}, got {args.dtype!r}")
    result = measure(args.preset, args.dtype, args.size, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.preset} against {', '.join(result['devices'][:2])}{' ...' if len(result['devices']) > 2 else ''}")
    print(f"  matmul {args.size}^3 {args.dtype}: {result['matmul']['flop_per_s'] / 1e12:.1f} TFLOP/s, "
          f"{result['matmul']['fraction']:.0%} of peak")
    print(f"  memory: {result['memory_bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s, "
          f"{result['memory_bandwidth']['fraction']:.0%} of the datasheet")
    if "psum" in result:
        psum = result["psum"]
        print(f"  psum over {psum['devices']} devices: bus {psum['bus_bytes_per_s'] / 1e9:.0f} GB/s, "
              f"{psum['fraction']:.0%} of {psum['link']}")
    print("\n" + achievable_block(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
