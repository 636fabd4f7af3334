"""Run a jax fixture with the shardings `shardplan export` gives it, and count
the collectives XLA inserts (needs jax; the test that uses it skips without).

    python tools/xla_collectives.py tests/fixtures/transformer_train.yaml --schedule BP+MP

Plans the spec's schedule, exports it (`solver.frontend.export.export_json`), jits the
fixture's jax step (tools/export_fixtures.py) on 8 simulated CPU devices with
those in_shardings and out_shardings, and prints one JSON object (a list of
them, one a schedule, where --schedule is given more than once: one process
imports jax once for all):

  max_abs_diff   largest difference between the sharded and unsharded results
  xla            per collective kind: {"ops": N, "tensors": N} in the compiled
                 HLO (XLA combines several all-reduces into one op of a tuple,
                 so tensors is the figure to compare)
  shardplan      the device-local program's collective counts

XLA_FLAGS must give 8 host devices before jax is imported, so run this as a
process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import export_fixtures  # noqa: E402

from solver.frontend.export import export_json  # noqa: E402
from solver.planning.plan_json import plan_report  # noqa: E402
from solver.planning.planner import collective_counts, plan_spec  # noqa: E402
from solver.planning.spec import load_spec  # noqa: E402

XLA_KINDS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
             "all-to-all": "all_to_all", "collective-permute": "collective_permute"}


def xla_collectives(hlo: str) -> dict[str, dict[str, int]]:
    """Collective ops of compiled HLO text and the tensors they move."""
    out = {}
    for xla_name, name in XLA_KINDS.items():
        calls = [m.group(1) for m in re.finditer(rf"\s{xla_name}(?:-start)?\(([^)]*)\)", hlo)]
        if calls:
            out[name] = {"ops": len(calls), "tensors": sum(c.count("%") for c in calls)}
    return out


def named(mesh, entries) -> NamedSharding:
    return NamedSharding(mesh, P(*[tuple(e) if isinstance(e, list) else e for e in entries]))


def compare(spec_path: str, schedules: list[str | None]) -> list[dict]:
    """Per schedule, the report (module docstring); the fixture's inputs and
    its unsharded results are made once for all."""
    spec = load_spec(spec_path)
    program = pathlib.Path(spec.model.stablehlo).stem
    loss_fn, _ = export_fixtures.PROGRAMS[program]
    data = np.load(spec.stablehlo_path().with_suffix(".npz"))
    step = export_fixtures.train_step(loss_fn)
    # Traced abstractly: made eagerly, each jnp op on a leaf of its own shape is an XLA compile.
    treedef = jax.tree.structure(jax.eval_shape(lambda: export_fixtures.example_args(program)))
    args = jax.tree.unflatten(treedef, [jnp.asarray(data[f"in.{i}"]) for i in range(treedef.num_leaves)])
    out_tree = jax.tree.structure(jax.eval_shape(step, *args))
    want = jax.tree.leaves(jax.jit(step)(*args))
    reports = []
    for schedule in schedules:
        planned = plan_spec(spec, schedule=schedule)
        exported = export_json(plan_report(planned, "none"))
        mesh = jax.make_mesh(tuple(exported["mesh"]["shape"]), tuple(exported["mesh"]["axes"]))
        in_shardings = jax.tree.unflatten(treedef, [named(mesh, s["partition_spec"])
                                                    for s in exported["in_shardings"]])
        out_shardings = jax.tree.unflatten(out_tree, [named(mesh, s["partition_spec"])
                                                      for s in exported["out_shardings"]])
        sharded = jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings)
        hlo = sharded.lower(*args).compile().as_text()
        got = jax.tree.leaves(sharded(*args))
        reports.append({
            "spec": spec.name,
            "schedule": planned.schedule,
            # In numpy: each eager jnp op on a leaf of its own shape is an XLA compile (~60 here, 5 s).
            "max_abs_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(got, want)),
            "xla": xla_collectives(hlo),
            "shardplan": {k: v for k, v in collective_counts(planned.lowered).items() if v},
        })
    return reports


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a fixture's spec (tests/fixtures/*.yaml)")
    parser.add_argument("--schedule", action="append",
                        help="the schedule to plan (default: the spec's first); again for more")
    args = parser.parse_args(argv)
    reports = compare(args.spec, args.schedule or [None])
    print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
