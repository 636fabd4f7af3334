"""The cost table folded by orbits (`costmodel.table_fold`): a search's plan
priced from one member of each orbit of ops, kernels and uses costs exactly
what it costs priced whole, and the fold does fold."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_space import random_points
from test_table import SMALL, hardware_for

from costmodel.table import CostTable
from ir.autodiff import training_step
from ir.core import Mesh
from ir.models import build
from ir.nda import analyze
from solver.planning.tactics import Manual, apply_schedule
from solver.search.keys import IClassKeys
from solver.search.space import Point, SearchSpace

PROGRAMS = {  # transformers of four layers: three of them fold onto one; a deep MLP's run of two-layer units
    # between its boundary layers (`test_folding.LENGTHS`)
    "transformer": lambda: training_step(build("transformer", **{**SMALL, "layers": 4})),
    "transformer-gqa-gated": lambda: training_step(build(
        "transformer", **{**SMALL, "layers": 4, "heads": 4, "head_dim": 2}, kv_heads=2, gated_mlp=True)),
    "deep_mlp": lambda: training_step(build("deep_mlp", layers=8)),
}
MESHES = {"2x2": Mesh.of(batch=2, model=2), "2x2x2": Mesh.of(batch=2, fsdp=2, model=2)}


def _searched(program: str, mesh: Mesh):
    model = PROGRAMS[program]()
    nda = analyze(model.function, model.params)
    base = apply_schedule(nda, mesh, [Manual("batch", ((model.inputs[0], 0),))])
    space = SearchSpace(nda, base, [a for a in mesh.names if a != "batch"], data_inputs=model.inputs,
                        optimizer_state=model.state)
    return space, CostTable(model.function, nda, mesh, hardware_for(mesh))


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_plan_priced_by_orbit_costs_what_it_costs_whole(program, mesh_name):
    space, table = _searched(program, MESHES[mesh_name])
    fold = table.fold(IClassKeys(space).representatives())
    # The fold folds: fewer uses and kernels are looked at than the program has (and no more ops).
    assert len(fold.edges) < len(table.edge_vid)
    assert len(fold.kernels.size) < len(table.kernels.kernels)
    assert sum(len(members) for _, members, _, _ in fold.op_groups) <= sum(len(m) for _, m, _ in table.op_groups)
    # ... the uses of values that may hold a partial sum too (grouped by what the walk reads of them), and
    # the walk over partial sums walks fewer ops.
    may_be_partial = np.isin(table.edge_vid, table.num_params + table.flow_levels.ops)
    assert 0 < np.isin(fold.edges, np.flatnonzero(may_be_partial)).sum() < may_be_partial.sum()
    assert 0 < len(fold.flow_levels.ops) < len(table.flow_levels.ops)
    rng = random.Random(3)
    points = list(random_points(space, rng, 25)) + [Point(frozenset(space.variables), ())]
    cut = 0
    for point in points:
        codes = space.codes(point)
        assert fold.holds(np.append(codes, 0)), point  # a point's codes are constant on each key
        whole, folded = table.timed(codes), table.timed(codes, fold)
        assert folded.without_peak == whole.without_peak, point  # the same figures, to the bit
        assert folded.cost() == whole.cost(), point
        assert folded.run.end_chains == whole.run.end_chains, point
        for name in ("chain_edges", "chain_index", "chain_steps", "reducing", "reduced_vids", "reduced_at",
                     "is_reducing", "mask", "flowing"):
            assert np.array_equal(getattr(folded.run, name), getattr(whole.run, name)), (point, name)
        partial = whole.run.mask != 0  # a combiner is read where a sum is pending
        assert np.array_equal(folded.run.combiner_id[partial], whole.run.combiner_id[partial]), point
        cut += bool(whole.cost().collective_counts)
    assert cut > len(points) // 2  # most plans have collectives, so uses and kernels are cut


def test_codes_not_constant_on_the_orbits_are_priced_whole():
    space, table = _searched("transformer", MESHES["2x2x2"])
    keys = IClassKeys(space)
    fold = table.fold(keys.representatives())
    codes = space.codes(Point(frozenset(space.variables), ()))
    # One member of a key of several, given another code than the key's first member.
    kid = next(k for k, members in enumerate(keys.key_members) if len(members) > 1 and members[-1] < len(codes))
    changed = codes.copy()
    changed[keys.key_members[kid][-1]] = (codes[keys.key_members[kid][-1]] + 1) % len(table.axis_tuples)
    assert not fold.holds(np.append(changed, 0))
    assert table.timed(changed, fold).cost() == table.timed(changed).cost()


@pytest.mark.parametrize("program", ["transformer", "transformer-gqa-gated"])
def test_kernels_cut_alike_are_priced_once_and_add_up_as_one_by_one(monkeypatch, program):
    """The kernels a plan's collectives cut are grouped by case (orbit and
    links broken) and their pieces' times added as running sums per kind
    (`FusedKernels._evaluate_cut`): the same figures, to the bit, as the
    loop over the kernels one by one, folded or not."""
    from costmodel import table_kernels

    space, table = _searched(program, MESHES["2x2x2"])
    fold = table.fold(IClassKeys(space).representatives())
    points = list(random_points(space, random.Random(5), 20))
    grouped, counted = [], []
    monkeypatch.setattr(table_kernels, "_FEW_CUT", 0)  # every plan's cut kernels grouped
    for point in points:
        codes = space.codes(point)
        grouped.append((table.timed(codes).without_peak, table.timed(codes, fold).without_peak))
        counted.append(len(table.timed(codes).run.chain_edges))
    monkeypatch.setattr(table_kernels, "_FEW_CUT", 10**9)  # ... and looped over
    looped = [(table.timed(space.codes(p)).without_peak, table.timed(space.codes(p), fold).without_peak)
              for p in points]
    assert grouped == looped
    assert all(whole == folded for whole, folded in grouped)
    assert sum(c > 0 for c in counted) > len(points) // 2  # most plans cut kernels


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_a_kernels_row_key_is_its_signature_and_codes(mesh_name):
    # The uncut kernels' terms are memoized by their rows packed (`FusedKernels.row_keys`): one integer, or a
    # tuple of one per chunk where a kernel reads more I-classes than a chunk holds (on 3 axes, most do).
    space, table = _searched("transformer-gqa-gated", MESHES[mesh_name])
    kernels = table.kernels
    packing = kernels.packing
    assert (packing.chunks > 1).any() and (packing.chunks == 1).any()
    positions = np.arange(len(packing.kernels))
    for point in random_points(space, random.Random(5), 6):
        codes = np.append(table.codes(space.plan(point).materialize(space.nda)), 0)
        _, first_chunk, packed = kernels._rows(codes, packing)
        keys = kernels.row_keys(packing, positions, first_chunk, packed)
        rows = [(int(kernels.signatures[k]), *codes[kernels.iclass_list[k]].tolist()) for k in packing.kernels]
        by_key, by_row = {}, {}
        for n, (key, row) in enumerate(zip(keys, rows)):
            by_key.setdefault(key, []).append(n)
            by_row.setdefault(row, []).append(n)
        assert sorted(by_key.values()) == sorted(by_row.values())
