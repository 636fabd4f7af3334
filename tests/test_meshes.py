"""Mesh-shape search (`mesh: auto`): the candidate meshes, their links from
the preset's topology, and the best mesh, checked against brute force over
every plan of every mesh on a small program."""

from __future__ import annotations

import json

import pytest
import yaml
from test_cpsat import brute_force

from costmodel.hardware import topology_links
from costmodel.table import CostTable
from ir.core import Mesh
from solver.plan import Plan
from solver.planning.meshes import candidate_meshes, concrete_data, ordered_factorizations, plan_meshes
from solver.planning.planner import prepare
from solver.planning.spec import SpecError, validate_spec
from solver.search.space import SearchSpace


def test_ordered_factorizations():
    assert ordered_factorizations(12, 2) == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert ordered_factorizations(7, 1) == [(7,)]
    assert len(ordered_factorizations(8, 3)) == 10  # 2^3 split into 3 ordered parts: C(5, 2)
    assert ordered_factorizations(1, 0) == [()] and ordered_factorizations(2, 0) == []


def test_candidate_meshes():
    auto = candidate_meshes({"devices": 8, "mesh": "auto"}, "s.yaml")
    assert auto == [(("model", 8),), (("batch", 2), ("model", 4)), (("batch", 4), ("model", 2)), (("batch", 8),)]
    fixed = candidate_meshes({"devices": 16, "mesh": {"data": "auto", "seq": 2, "model": "auto"}}, "s.yaml")
    assert all(dict(m)["seq"] == 2 for m in fixed) and len(fixed) == 4  # 8 split over data x model
    assert (("seq", 2), ("model", 8)) in fixed  # data of size 1 is left out
    with pytest.raises(SpecError, match="s.yaml: devices: a mesh search needs the device count"):
        candidate_meshes({"mesh": "auto"}, "s.yaml")
    with pytest.raises(SpecError, match=r"do not divide devices: 8"):
        candidate_meshes({"devices": 8, "mesh": {"batch": "auto", "model": 3}}, "s.yaml")
    with pytest.raises(SpecError, match=r"mesh.model: a size of at least 2, or auto; got 'three'"):
        candidate_meshes({"devices": 8, "mesh": {"batch": "auto", "model": "three"}}, "s.yaml")


def test_listed_mesh_candidates():
    listed = {"devices": 16, "mesh_candidates": [{"batch": 8, "model": 2}, {"model": 16}]}
    assert candidate_meshes(listed, "s.yaml") == [(("batch", 8), ("model", 2)), (("model", 16),)]
    with pytest.raises(SpecError, match=r"mesh_candidates.1: 8 devices, but devices: 16"):
        candidate_meshes({"devices": 16, "mesh_candidates": [{"batch": 16}, {"batch": 8}]}, "s.yaml")
    with pytest.raises(SpecError, match=r"mesh_candidates.1: 8 devices, but mesh_candidates.0 has 16"):
        candidate_meshes({"mesh_candidates": [{"batch": 16}, {"batch": 8}]}, "s.yaml")
    with pytest.raises(SpecError, match=r"mesh_candidates.0.batch: a size of at least 2; got 1"):
        candidate_meshes({"mesh_candidates": [{"batch": 1}]}, "s.yaml")
    with pytest.raises(SpecError, match=r"give either mesh or mesh_candidates, not both"):
        candidate_meshes({"mesh": "auto", "mesh_candidates": [{"batch": 2}]}, "s.yaml")
    with pytest.raises(SpecError, match=r"mesh_candidates: a list of meshes"):
        candidate_meshes({"mesh_candidates": {"batch": 2}}, "s.yaml")


def test_a_listed_mesh_search_plans_the_listed_meshes(tmp_path):
    path = tmp_path / "listed.yaml"
    path.write_text(SMALL.replace("mesh: MESH", "mesh_candidates: [{model: 4}, {batch: 2, model: 2}]"))
    search = plan_meshes(path, "cpsat")
    assert [t.mesh for t in search.tried] == [(("model", 4),), (("batch", 2), ("model", 2))]
    assert search.devices == 4
    assert search.best.assessment.cost.step_time_s == min(t.step_time_s for t in search.tried)


def test_topology_links_follow_the_nodes():
    # A100 nodes of 8 on NVLink, InfiniBand between: the minor axis is laid out fastest.
    assert topology_links("A100-80GB", [("batch", 4), ("model", 8)]) == {"batch": "infiniband", "model": "nvlink"}
    assert topology_links("A100-80GB", [("batch", 2), ("model", 4)]) == {"batch": "nvlink", "model": "nvlink"}
    assert topology_links("A100-80GB", [("model", 16)]) == {"model": "infiniband"}
    assert topology_links("V100-32GB", [("model", 16)]) == {"model": "nvlink"}  # a DGX-2: 16 on NVSwitch
    assert topology_links("TPUv4", [("data", 64), ("model", 64)]) == {"data": "ici", "model": "ici"}


def test_concrete_data_fills_links_and_drops_schedules():
    data = {"devices": 32, "mesh": "auto", "hardware": {"preset": "A100-80GB", "links": {"batch": "ethernet",
            "seq": "pcie"}}, "schedules": {"DP": {"tactics": []}}}
    out = concrete_data(data, (("batch", 4), ("model", 8)))
    assert out["mesh"] == {"batch": 4, "model": 8} and "schedules" not in out
    assert out["hardware"]["links"] == {"batch": "ethernet", "model": "nvlink"}  # the spec's link wins
    assert data["hardware"]["links"] == {"batch": "ethernet", "seq": "pcie"}  # the spec's data is untouched
    assert concrete_data({"hardware": "H100-SXM"}, (("model", 16),))["hardware"] == {
        "preset": "H100-SXM", "links": {"model": "infiniband"}}


SMALL = """
model: {builder: mlp, args: {batch: 64, d_in: 64, hidden: 128, d_out: 64}, step: train}
devices: 4
mesh: MESH
hardware:
  device: {name: slow, peak_flops: {f32: 1GFLOP/s}, memory: 80GB, memory_bandwidth: 100GB/s}
  links:
    batch: {kind: nvlink, bandwidth: 100MB/s, latency: 1ns}
    model: {kind: infiniband, bandwidth: 30MB/s, latency: 1ns}
"""


def test_the_best_mesh_is_the_brute_force_best(tmp_path):
    """`mesh: auto` and the axes named with `auto` sizes are the same search."""
    data = yaml.safe_load(SMALL.replace("MESH", "auto"))
    # Brute force: every plan of every candidate mesh (those the search skipped as equivalent too).
    best = {}
    for candidate in candidate_meshes(data, "x.yaml"):
        spec = validate_spec(concrete_data(data, candidate), "x.yaml")
        prepared = prepare(spec)
        mesh_obj = spec.mesh_obj()
        table = CostTable(prepared.model.function, prepared.nda, mesh_obj, spec.hardware_obj())
        space = SearchSpace(prepared.nda, Plan(mesh_obj), mesh_obj.names, data_inputs=prepared.model.inputs,
                            optimizer_state=prepared.model.state)  # the planner's space
        best[candidate] = brute_force(space, table)
    for mesh in ("auto", "{batch: auto, model: auto}"):
        path = tmp_path / "auto.yaml"
        path.write_text(SMALL.replace("MESH", mesh))
        search = plan_meshes(path, "cpsat")
        for t in search.tried:
            assert t.step_time_s == pytest.approx(best[t.mesh], rel=1e-12)  # CP-SAT is exact on each mesh
        # batch=4 and model=4 differ in their link, so all three meshes are planned.
        assert [t.mesh for t in search.tried] == list(best)
        assert search.best.assessment.cost.step_time_s == pytest.approx(min(best.values()), rel=1e-12)
        assert tuple(search.best.spec.mesh.items()) == min(best, key=best.get)


def test_equivalent_meshes_are_planned_once(tmp_path):
    """On one link class, batch=4 and model=4 are the same problem to a search over every axis."""
    path = tmp_path / "auto.yaml"
    one_link = SMALL.replace("infiniband, bandwidth: 30MB/s", "nvlink, bandwidth: 100MB/s")
    path.write_text(one_link.replace("MESH", "auto"))
    search = plan_meshes(path, "mcts")
    assert [t.mesh for t in search.tried] == [(("model", 4),), (("batch", 2), ("model", 2))]


def test_cli_plan_with_a_mesh_search(capsys, tmp_path):
    from conftest import shardplan

    path = tmp_path / "auto.yaml"
    path.write_text(SMALL.replace("MESH", "auto"))
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--json")
    assert code == 0, err
    report = json.loads(out)
    rows = report["mesh_search"]
    assert len(rows) == 3 and sum(r["best"] for r in rows) == 1
    (best,) = [r for r in rows if r["best"]]
    assert best["mesh"] == report["mesh"] and best["step_time_s"] == report["cost"]["step_time_s"]
    assert best["step_time_s"] == min(r["step_time_s"] for r in rows if r["fits"])
    assert rows[0]["links"] == {"model": "infiniband"}
    code, out, _ = shardplan(capsys, "plan", str(path), "--solver", "cpsat")
    assert out.startswith("mesh search: 3 meshes of 4 devices") and "<- best" in out
    assert f"plan (solver cpsat) on mesh {' x '.join(f'{a}={n}' for a, n in best['mesh'].items())}" in out
    code, _, err = shardplan(capsys, "plan", str(path))
    assert code == 1 and "mesh: auto plans each mesh with a search backend: add --solver cpsat" in err
    code, _, err = shardplan(capsys, "lower", str(path))
    assert code == 1 and "a mesh search (auto sizes) is run by `shardplan plan`" in err
    code, _, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat", "--schedule", "DP")
    assert code == 1 and "a mesh search (mesh: auto) plans each mesh with the search backend" in err
    code, out, _ = shardplan(capsys, "plan", "specs/mlp.yaml", "--json")
    assert json.loads(out)["mesh_search"] == []  # a fixed mesh


def test_the_next_mesh_is_hinted_with_the_fastest_plan_so_far(tmp_path):
    from types import SimpleNamespace

    from solver.planning.meshes import _seed

    path = tmp_path / "auto.yaml"
    path.write_text(SMALL.replace("MESH", "auto"))
    tried = list(plan_meshes(path, "cpsat").tried)
    fastest = min(tried, key=lambda t: t.step_time_s).planned.plan
    shared = {(): SimpleNamespace(nda=tried[0].planned.nda)}
    seed, remat = _seed(tried, shared, Mesh.of(model=4))
    assert seed.mesh == Mesh.of(model=4) and remat == ()
    assert seed.decisions == tuple(d for d in fastest.decisions if d.axis == "model")
    other = {(): SimpleNamespace(nda=None)}
    assert _seed(tried, other, Mesh.of(model=4)) == (None, None)  # another program's plans: none
    assert _seed([], shared, Mesh.of(model=4)) == (None, None)


def test_a_mesh_the_step_cannot_run_on_is_reported_and_the_others_planned(tmp_path, capsys):
    """Four pipeline stages of a two-layer model cannot be cut: that mesh is
    a row without a plan saying why, not the end of the search."""
    from conftest import shardplan

    path = tmp_path / "stages.yaml"
    path.write_text("model: {builder: deep_mlp, args: {layers: 2, d_model: 32, batch: 16}, step: train,\n"
                    "        optimizer: sgd}\n"
                    "devices: 4\nmesh: {pipeline: auto, batch: auto}\nmicrobatches: 2\nhardware: A100-80GB\n")
    search = plan_meshes(path, "cpsat")
    rows = {t.mesh: t for t in search.tried}
    assert set(rows) == {(("batch", 4),), (("pipeline", 2), ("batch", 2)), (("pipeline", 4),)}
    assert rows[(("pipeline", 4),)].planned is None
    assert rows[(("pipeline", 4),)].message == "pipeline: 4 pipeline stages need at least 4 layers; " \
        "@deep_mlp.train_step has 2 (values named layers.<l>.out)"
    assert all(t.planned is not None for m, t in rows.items() if m != (("pipeline", 4),))
    code, out, err = shardplan(capsys, "plan", str(path), "--solver", "cpsat")
    assert code == 0, err
    assert "pipeline=4" in out and "no plan" in out and "(pipeline: 4 pipeline stages need at least 4 layers)" in out
