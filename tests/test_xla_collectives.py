"""The exported shardings run under jax/XLA (8 simulated CPU devices) give
the unsharded results, and XLA's collectives match shardplan's counts where
the two partitioners agree; skipped where jax is not installed (the `jax`
extra). Each case runs tools/xla_collectives.py in a process of its own,
because XLA reads its device count before jax is first imported."""

import json
import os
import subprocess
import sys

from conftest import ROOT, needs

needs("jax", module_level=True)

LAYERS = 2  # of the transformer fixture (tools/export_fixtures.py)


def xla_run(name: str, *schedules: str) -> list[dict]:
    """tools/xla_collectives.py's report of each schedule of the fixture, in one process."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "xla_collectives.py"),
                           str(ROOT / "tests" / "fixtures" / f"{name}.yaml"),
                           *[arg for schedule in schedules for arg in ("--schedule", schedule)]],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout)
    assert [r["schedule"] for r in reports] == list(schedules)
    return reports


def check_batch_parallel(report: dict) -> None:
    assert report["max_abs_diff"] < 1e-5  # the sharded step computes the unsharded one
    # One all-reduce per gradient and the loss on both sides (XLA packs them into one tuple op).
    assert set(report["xla"]) == {"all_reduce"} and set(report["shardplan"]) == {"all_reduce"}
    assert report["xla"]["all_reduce"]["tensors"] == report["shardplan"]["all_reduce"]


def test_mlp_all_reduces_are_the_same_batch_parallel_and_megatron():
    bp, megatron = xla_run("mlp_train", "BP", "BP+MP")
    check_batch_parallel(bp)
    assert megatron["max_abs_diff"] < 1e-5
    assert megatron["xla"]["all_reduce"]["tensors"] == megatron["shardplan"]["all_reduce"] == 4


def test_transformer_batch_parallel_all_reduces_are_the_same_and_megatron_reduces_each_projection_cotangent():
    """Batch parallel: the same all-reduces. Megatron: the backward cotangent
    of an attention block's normed input sums the q, k and v projections'
    cotangents, each partial over `model`. shardplan adds the partial sums
    and all-reduces once (a sum of partials is a partial); XLA all-reduces
    each of the three at its dot: 2 more per layer."""
    bp, megatron = xla_run("transformer_train", "BP", "BP+MP")
    check_batch_parallel(bp)
    assert megatron["max_abs_diff"] < 1e-5
    assert set(megatron["xla"]) == {"all_reduce"}
    assert megatron["xla"]["all_reduce"]["tensors"] == megatron["shardplan"]["all_reduce"] + 2 * LAYERS


def test_xla_runs_the_annotated_plans_of_a_real_fixture():
    """The whole plan written back as Shardy annotations (tools/xla_plan_check.py):
    XLA's collectives are shardplan's, kind by kind and byte for byte, for the
    flax MLP's batch-parallel plan and its CP-SAT plan on a memory-tight device."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "xla_plan_check.py"), "--only", "mlp_train_flax",
                           "--json", "--time-limit", "20"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    bp, cpsat = json.loads(done.stdout)
    assert bp["plan"] == "BP" and cpsat["plan"] == "CP-SAT, 75% memory"
    for result in (bp, cpsat):
        assert result["max_abs_diff"] < 1e-5
        assert set(result["xla"]) == set(result["shardplan"]) == {"all_reduce"}
        xla, ours = result["xla"]["all_reduce"], result["shardplan"]["all_reduce"]
        assert (xla["tensors"], xla["bytes"]) == (ours["ops"], ours["bytes"])
    assert bp["shardplan"]["all_reduce"]["ops"] == 7  # P + 1: six parameters and the loss
