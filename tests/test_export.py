"""`shardplan export`: a plan's shardings as JAX PartitionSpecs, as JSON and
as a Python snippet that JAX (when installed) accepts with the same layout."""

import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from conftest import ROOT, needs, shardplan

from ir.core import Mesh
from ir.interpret import shard
from solver.frontend import cli
from solver.frontend.export import export_json, export_python, partition_spec
from solver.planning.spec import load_spec

MLP = ROOT / "specs" / "mlp.yaml"


def export(capsys, *argv):
    code, out, err = shardplan(capsys, "export", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


def check_export_of(report: dict, spec) -> None:
    """What `shardplan export --format json` hands jax.jit for the plan of
    `shardplan plan --json`'s `report` (export's own: `export_json` of that
    report) on the bundled spec `spec`: the program's flat parameters and
    results in order, each a PartitionSpec JAX accepts over the mesh.
    tests/test_plan_cli.py's every-bundled-spec test calls it on each plan
    that is one SPMD program, so that each spec is planned once for both."""
    exported = export_json(report)
    loaded = load_spec(spec)
    fn = loaded.build().function
    assert exported["mesh"] == {"axes": list(loaded.mesh), "shape": list(loaded.mesh.values())}
    sizes = dict(loaded.mesh)
    for values, shardings in ((fn.params, exported["in_shardings"]), (fn.results, exported["out_shardings"])):
        # The program's flat order, one entry per dimension.
        assert [s["name"] for s in shardings] == [v.name for v in values]
        for value, s in zip(values, shardings):
            assert s["type"] == str(value.type) and len(s["partition_spec"]) == len(value.type.shape)
            used = [a for entry in s["partition_spec"] for a in _axes(entry)]
            # JAX refuses an axis twice in one spec, and a list is only for several axes.
            assert set(used) <= set(sizes) and len(used) == len(set(used)), s
            assert not any(isinstance(entry, list) and len(entry) < 2 for entry in s["partition_spec"]), s
            for size, entry in zip(value.type.shape, s["partition_spec"]):
                assert size % math.prod(sizes[a] for a in _axes(entry)) == 0, s


def test_the_cli_exports_the_plan_json_of_plan(capsys):
    code, out, _ = shardplan(capsys, "plan", MLP, "--json")
    assert code == 0
    exported, err = export(capsys, MLP)
    assert err == "" and exported == export_json(json.loads(out))


def test_an_accumulating_plan_exports_one_microbatchs_shardings_with_a_note(capsys, tmp_path):
    path = tmp_path / "accumulating.yaml"
    path.write_text(MLP.read_text().replace("hardware: A100-80GB", "hardware: A100-80GB\nmicrobatches: 2"))
    exported, err = export(capsys, path)
    assert err.startswith("shardplan: note: the plan accumulates gradients over 2 microbatches: jit one "
                          "microbatch's step") and err.count("\n") == 1
    # The shardings are the plan's (the step's batch dimension split over the batch axis), for each microbatch.
    (x,) = [s for s in exported["in_shardings"] if s["name"] == "x"]
    assert x["partition_spec"] == ["batch", None]


def _axes(entry) -> list[str]:
    """The mesh axes of one partition_spec entry."""
    return [] if entry is None else [entry] if isinstance(entry, str) else entry


def test_mlp_default_schedule_is_batch_parallel_plus_megatron(capsys):
    _, out, _ = shardplan(capsys, "plan", MLP, "--json")
    planned = {p["name"]: p["sharding"] for p in json.loads(out)["params"]}
    # BP shards x's batch dim on batch; Megatron shards w1's hidden (output) dim on model.
    assert planned["x"] == [["batch"], []] and planned["w1"] == [[], ["model"]]
    exported, err = export(capsys, MLP)
    assert err == ""
    specs = {s["name"]: s["partition_spec"] for s in exported["in_shardings"]}
    assert specs["x"] == ["batch", None] and specs["w1"] == [None, "model"]
    assert specs["w2"] == ["model", None]  # w2 contracts the hidden dim, so its rows follow w1's columns
    assert specs["opt.step"] == []  # a scalar
    assert {"spec": "mlp", "source": str(MLP), "schedule": None, "solver": "none"}.items() <= exported.items()


def test_two_axes_on_one_dim_become_a_list_major_to_minor(capsys):
    _, out, _ = shardplan(capsys, "plan", MLP, "--schedule", "BP+MP+Z3", "--json")
    planned = {p["name"]: p["sharding"] for p in json.loads(out)["params"]}
    exported, _ = export(capsys, MLP, "--schedule", "BP+MP+Z3")
    specs = {s["name"]: s["partition_spec"] for s in exported["in_shardings"]}
    # ZeRO-3 adds batch to the first dim batch divides: w2's rows already carry model, batch goes minor.
    assert planned["w2"] == [["model", "batch"], []]
    assert specs["w2"] == [["model", "batch"], None]
    assert specs["w1"] == ["batch", "model"]
    assert exported["schedule"] == "BP+MP+Z3"


def test_partition_spec_entries():
    assert partition_spec([[], ["batch"], ["model", "batch"]]) == [None, "batch", ["model", "batch"]]
    assert partition_spec([]) == []


def plan_report(params, results, mesh=None):
    def tensor(name, ty, sharding):
        return {"name": name, "type": ty, "sharding": sharding}

    return {"spec": "s", "source": "s.yaml", "schedule": None, "solver": "none", "mesh": mesh or {"batch": 8},
            "params": [tensor(*p) for p in params], "results": [tensor(*r) for r in results]}


def test_python_form_of_edge_cases(monkeypatch):
    # One axis (a 1-tuple mesh), one argument (still a tuple), a replicated matrix, no results.
    text = export_python(plan_report([("x", "tensor<8x4xf32>", [[], []])], []))
    assert 'mesh = jax.make_mesh((8,), ("batch",))' in text
    assert "in_shardings = (\n    NamedSharding(mesh, P()),  # x: tensor<8x4xf32>\n)\n" in text
    assert "out_shardings = ()\n" in text
    # Run it against a stand-in for jax that records what the snippet builds.
    jax, sharding = types.ModuleType("jax"), types.ModuleType("jax.sharding")
    jax.make_mesh = lambda shape, names: dict(zip(names, shape))
    sharding.NamedSharding = lambda mesh, spec: (mesh, spec)
    sharding.PartitionSpec = lambda *entries: entries
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax.sharding", sharding)
    namespace = {}
    exec(compile(text, "<export>", "exec"), namespace)
    assert namespace["in_shardings"] == (({"batch": 8}, ()),) and namespace["out_shardings"] == ()


def test_python_snippet_and_output_file(capsys, tmp_path):
    target = tmp_path / "shardings.py"
    code, out, err = shardplan(capsys, "export", MLP, "--schedule", "BP+MP+Z3", "-o", target)
    assert code == 0 and out == "" and err == ""
    text = target.read_text()
    compile(text, str(target), "exec")
    lines = text.splitlines()
    assert "import jax" in lines and "from jax.sharding import NamedSharding, PartitionSpec as P" in lines
    assert 'mesh = jax.make_mesh((4, 2), ("batch", "model"))' in lines
    assert '    NamedSharding(mesh, P("batch", None)),  # x: tensor<256x32xf32>' in lines
    assert '    NamedSharding(mesh, P(("model", "batch"), None)),  # w2: tensor<128x32xf32>' in lines
    assert "    NamedSharding(mesh, P()),  # loss: tensor<f32>" in lines
    assert "tree_unflatten(jax.tree_util.tree_structure(args), in_shardings)" in text
    # Without -o the same text is printed.
    code, out, _ = shardplan(capsys, "export", MLP, "--schedule", "BP+MP+Z3")
    assert code == 0 and out == text


PROBE = """
import json, sys
namespace = {}
exec(open(sys.argv[1]).read(), namespace)
mesh, shapes = namespace["mesh"], json.loads(sys.argv[2])
blocks = {}
for which in ("in_shardings", "out_shardings"):
    blocks[which] = [
        # Per device in mesh order (row-major, shardplan's device ids): its block's [start, stop) per dim.
        [[[i.start or 0, size if i.stop is None else i.stop] for i, size in zip(s.devices_indices_map(tuple(shape))[d],
                                                                                shape)]
         for d in mesh.devices.flat]
        for s, shape in zip(namespace[which], shapes[which])
    ]
# jax.jit takes them as they are (identity functions of the arguments' and of the results' shapes).
import jax
for which in ("in_shardings", "out_shardings"):
    shardings, values = namespace[which], [jax.ShapeDtypeStruct(tuple(s), "float32") for s in shapes[which]]
    jax.jit(lambda *a: a, in_shardings=shardings, out_shardings=shardings).lower(*values)
print(json.dumps({"axes": list(mesh.axis_names), "shape": list(mesh.devices.shape), "blocks": blocks}))
"""


def test_jax_accepts_the_snippet_with_shardplans_layout(capsys, tmp_path):
    needs("jax")
    target = tmp_path / "shardings.py"
    assert shardplan(capsys, "export", MLP, "--schedule", "BP+MP+Z3", "-o", target)[0] == 0
    exported, _ = export(capsys, MLP, "--schedule", "BP+MP+Z3")
    shapes = {w: [_shape(s["type"]) for s in exported[w]] for w in ("in_shardings", "out_shardings")}
    _, out, _ = shardplan(capsys, "plan", MLP, "--schedule", "BP+MP+Z3", "--json")
    report = json.loads(out)
    planned = {"in_shardings": report["params"], "out_shardings": report["results"]}
    # A fresh interpreter: XLA reads the device count when jax first initializes.
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", PROBE, str(target), json.dumps(shapes)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["axes"] == ["batch", "model"] and got["shape"] == [4, 2]
    mesh = Mesh.of(batch=4, model=2)
    for which in ("in_shardings", "out_shardings"):
        assert len(got["blocks"][which]) == len(exported[which])
        for p, shape, per_device in zip(planned[which], shapes[which], got["blocks"][which]):
            # Each device holds the same block in JAX as in shardplan's SPMD executor under the plan.
            array = np.arange(int(np.prod(shape))).reshape(shape)
            want = shard(array, [tuple(axes) for axes in p["sharding"]], mesh)
            for device, bounds in enumerate(per_device):
                block = array[tuple(slice(start, stop) for start, stop in bounds)]
                assert np.array_equal(block, want[device]), (p["name"], device)


def _shape(type_text: str) -> list[int]:
    inside = type_text.removeprefix("tensor<").removesuffix(">")
    return [int(d) for d in inside.split("x")[:-1]]


def test_plan_over_capacity_exports_with_a_warning(capsys, tmp_path):
    text = MLP.read_text().replace("hardware: A100-80GB", "hardware:\n  device: {name: tiny, peak_flops: "
                                   "{f32: 50TFLOP/s}, memory: 1kB, memory_bandwidth: 2TB/s}\n  links: {batch: "
                                   "{bandwidth: 25GB/s, latency: 10us}, model: {bandwidth: 25GB/s, latency: 10us}}")
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    exported, err = export(capsys, path)
    assert len(exported["in_shardings"]) == 9
    assert err.startswith("shardplan: warning: the plan does not fit in memory: peak ") and err.count("\n") == 1


def test_unknown_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", str(MLP), "--format", "yaml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_bad_spec_is_one_line(capsys, tmp_path):
    code, _, err = shardplan(capsys, "export", tmp_path / "missing.yaml")
    assert code == cli.EXIT_INPUT_ERROR and err.count("\n") == 1 and "missing.yaml" in err


def test_a_pipelined_spec_is_not_exported(capsys):
    # jax.jit takes one SPMD program; a pipeline is one program per stage.
    code, _, err = shardplan(capsys, "export", ROOT / "specs" / "transformer_pipeline.yaml", "--format", "json")
    assert code == 1 and "a pipelined plan is one program per stage (MPMD)" in err and "shardplan lower" in err
