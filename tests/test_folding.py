"""Folding repeated layers: the search's size follows the distinct work, not
the program's length, and folding loses no plan.

The space decides every repeated layer alike (`solver.search.space`: color
groups, internal colors grouped by their place in the period), so CP-SAT's
terms of identical layers are one term with a multiplicity
(`solver.search.cpsat_terms`). Two properties are checked here: the model
(decision variables, keys, terms, combinations) is the same at 2 and 8
layers for every layer kind the builders make, and the optimum of the folded
space is the optimum of the unfolded one, where every layer is decided on
its own (brute force, both backends, with and without ZeRO levels and
rematerialization)."""

from __future__ import annotations

import dataclasses

import pytest
from test_cpsat import brute_force, slow_hardware
from test_table import hardware_for

from costmodel.table import CostTable
from ir.autodiff import training_step
from ir.core import Mesh
from ir.models import build
from ir.nda import analyze
from ir.remat import rematerialize
from solver.plan import Plan
from solver.search.cpsat import CpSatOptions
from solver.search.cpsat import solve as cpsat_solve
from solver.search.cpsat_terms import TermModel
from solver.search.mcts import MctsOptions
from solver.search.mcts import solve as mcts_solve
from solver.search.space import SearchSpace

# Every layer kind the builders repeat, small. The length argument is the builder's own.
LAYER_KINDS = {
    "mha": ("transformer", "layers", dict(heads=4, head_dim=4)),
    "mqa": ("transformer", "layers", dict(heads=4, kv_heads=1, head_dim=4)),
    "gqa": ("transformer", "layers", dict(heads=4, kv_heads=2, head_dim=4)),
    "gqa-gated-fused-layernorm-tied": ("transformer", "layers", dict(
        heads=4, kv_heads=2, head_dim=4, gated_mlp=True, fused_qkv=True, norm="layer", tied_embeddings=True)),
    "decode-gqa": ("transformer_decode", "layers", dict(heads=4, kv_heads=2, head_dim=4)),
    "unet-blocks": ("unet", "blocks", dict()),
    "deep-mlp": ("deep_mlp", "layers", dict()),
    "gns": ("gns", "steps", dict()),
}
# Parameters are grouped by their uses and four ops along their first uses (`ir.nda`), which
# reaches two layers of a deep MLP (a matmul and a relu each) or two message-passing steps:
# their first and last two layers are a boundary of their own, and the repeated run between
# them (of two-layer units, for the deep MLP) settles at 8 layers and at 4 steps.
LENGTHS = {"deep-mlp": (8, 16), "gns": (4, 8)}
# Layer kinds with a little per-layer work that does not fold (test_moe_layers_fold_but_for_the_load_balance_sum).
SUMMED_KINDS = {"moe": ("moe_transformer", "layers", dict(heads=4, kv_heads=2, head_dim=4))}


def _model(kind: str, length: int):
    name, arg, kwargs = {**LAYER_KINDS, **SUMMED_KINDS}[kind]
    model = build(name, **{**kwargs, arg: length})
    return model if name == "transformer_decode" else training_step(model)


def _size(kind: str, length: int, mesh: Mesh) -> tuple:
    model = _model(kind, length)
    nda = analyze(model.function, model.groupable)
    table = CostTable(model.function, nda, mesh, hardware_for(mesh))
    space = SearchSpace(nda, Plan(mesh), mesh.names, data_inputs=model.inputs, optimizer_state=model.state)
    terms = TermModel(space, table)
    return (len(space.variables), len(space.partial_variables), len(space.free_classes), len(terms.keys),
            len(terms.terms), sum(len(t.combos) for t in terms.terms.values()))


@pytest.mark.parametrize("kind", sorted(LAYER_KINDS))
def test_the_model_is_the_same_at_2_and_8_layers(kind):
    """GQA's query heads per key/value head are a factor a reshape splits off
    inside each layer (a color no parameter names), and a decode step's caches
    are state, not weights: both are decided once for every layer, so every
    kind folds. (3-axis meshes: bench/scale.py.)"""
    mesh = Mesh.of(data=2, model=2)
    short, long = LENGTHS.get(kind, (2, 8))
    assert _size(kind, short, mesh) == _size(kind, long, mesh)


def test_moe_layers_fold_but_for_the_load_balance_sum():
    """A mixture of experts adds each layer's load-balancing loss to a running
    scalar sum, a chain through every layer whose partial-sum states differ
    per layer, so those few scalar terms repeat per layer; everything else,
    the router, the dispatch and the experts included, folds. Before scalars
    were kept out of fused kernels (`costmodel.fusion`), the sum fused every
    layer's reductions into one kernel and the combinations tripled per layer."""
    mesh = Mesh.of(data=2, model=2)
    sizes = [_size("moe", layers, mesh) for layers in (2, 3, 4)]
    assert sizes[0][:4] == sizes[1][:4] == sizes[2][:4]  # decisions and keys
    terms, combos = [s[4] for s in sizes], [s[5] for s in sizes]
    assert terms[2] - terms[1] == terms[1] - terms[0] <= 4
    assert combos[2] - combos[1] == combos[1] - combos[0] < combos[0] / 200


def _spaces(model, mesh, zero: bool):
    nda = analyze(model.function, model.groupable)
    table = CostTable(model.function, nda, mesh, slow_hardware(mesh))
    state = model.state if zero else ()
    folded, unfolded = (SearchSpace(nda, Plan(mesh), mesh.names, fold_layers=fold, data_inputs=model.inputs,
                                    optimizer_state=state) for fold in (True, False))
    return table, folded, unfolded


def _deep_mlp(remat: bool):
    """Seven layers: past the two-layer boundary at each end, layers 1-4 fold
    into one two-layer unit (by parity)."""
    forward = build("deep_mlp", layers=7, d_model=64, batch=512)
    step = training_step(forward)
    if remat:  # every layer's forward recomputed in its backward
        step = dataclasses.replace(step, function=rematerialize(step.function, len(forward.function.ops),
                                                                list(range(7))))
    return step


@pytest.mark.parametrize("remat", [False, True], ids=["stored", "remat"])
def test_the_folded_optimum_is_the_unfolded_optimum(remat):
    """Brute force over every point of the unfolded space (each layer decided
    on its own) finds no plan faster than the folded space's optimum, which
    CP-SAT proves and the MCTS reaches."""
    mesh = Mesh.of(x=4)
    table, folded, unfolded = _spaces(_deep_mlp(remat), mesh, zero=False)
    assert len(folded.variables) < len(unfolded.variables)
    best = brute_force(unfolded, table)
    assert brute_force(folded, table) == pytest.approx(best, rel=1e-12)
    exact = cpsat_solve(folded, table, CpSatOptions(time_limit_s=30))
    assert exact.report.status == "optimal"
    assert exact.cost.step_time_s == pytest.approx(best, rel=1e-12)
    searched = mcts_solve(folded, table, MctsOptions(iterations=200, seed=0))
    assert searched.cost.step_time_s == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("remat", [False, True], ids=["stored", "remat"])
def test_with_zero_levels_the_folded_optimum_is_the_unfolded_optimum(remat):
    """With the ZeRO levels (three or four options per decision) the unfolded
    space is too large to enumerate in a test: CP-SAT proves both optima, and
    they are equal; the MCTS on the folded space reaches it."""
    mesh = Mesh.of(x=4)
    table, folded, unfolded = _spaces(_deep_mlp(remat), mesh, zero=True)
    assert len(folded.partial_variables) < len(unfolded.partial_variables)
    results = [cpsat_solve(space, table, CpSatOptions(time_limit_s=60)) for space in (folded, unfolded)]
    assert [r.report.status for r in results] == ["optimal", "optimal"]
    best = results[1].cost.step_time_s
    assert results[0].cost.step_time_s == pytest.approx(best, rel=1e-9)
    searched = mcts_solve(folded, table, MctsOptions(iterations=200, seed=0))
    assert searched.cost.step_time_s == pytest.approx(best, rel=1e-9)


def test_the_folded_optimum_of_a_gqa_transformer_is_the_unfolded_one():
    """Two GQA layers: CP-SAT proves the optimum of the folded space and of
    the unfolded one (every color its own decision), and they are equal."""
    model = training_step(build("transformer", layers=2, heads=4, kv_heads=2, head_dim=8, d_model=32,
                                mlp_hidden=64, seq=16, batch=8))
    mesh = Mesh.of(batch=2, model=2)
    table, folded, unfolded = _spaces(model, mesh, zero=False)
    assert len(folded.variables) < len(unfolded.variables)
    results = [cpsat_solve(space, table, CpSatOptions(time_limit_s=60)) for space in (folded, unfolded)]
    assert [r.report.status for r in results] == ["optimal", "optimal"]
    assert results[0].cost.step_time_s == pytest.approx(results[1].cost.step_time_s, rel=1e-9)
