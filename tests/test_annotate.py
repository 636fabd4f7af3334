"""The plan written back into the imported module as Shardy annotations
(solver/frontend/annotate.py, `shardplan export --format mlir`): what is annotated,
and that the annotated module still imports to the planned program. XLA
running it is tests/test_xla_collectives.py's part."""

import re

import pytest
from conftest import ROOT, shardplan

from ir.stablehlo import import_module, import_stablehlo
from solver.frontend.annotate import annotate_planned, sdy_dims
from solver.planning.planner import plan_spec
from solver.planning.spec import load_spec

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def megatron_mlp():
    spec = load_spec(FIXTURES / "mlp_train.yaml")
    planned = plan_spec(spec, schedule="BP+MP")
    return spec, planned, annotate_planned(planned)


def test_sdy_dims_lists_axes_major_to_minor():
    assert sdy_dims([["batch"], [], ["model", "batch"]]) == '[{"batch"}, {}, {"model", "batch"}]'
    assert sdy_dims([]) == "[]"


def test_the_module_gets_the_mesh_and_every_argument_its_sharding(megatron_mlp):
    _, planned, text = megatron_mlp
    assert 'mhlo.num_partitions = 8' in text and '  sdy.mesh @mesh = <["batch"=4, "model"=2]>' in text
    header = next(line for line in text.splitlines() if "func.func public @main" in line)
    # w1 is split by model on its columns, x by batch on its rows (the fixture's parameter order).
    assert '%arg0: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}' in header
    assert '%arg3: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>}' in header
    assert header.count("sdy.sharding =") == len(planned.model.function.params) + len(planned.model.function.results)
    assert '{jax.result_info = "result[0]", sdy.sharding = #sdy.sharding<@mesh, []>}' in header


def test_every_value_of_main_is_pinned_to_its_planned_sharding(megatron_mlp):
    _, planned, text = megatron_mlp
    constraints = re.findall(r"^\s*(%\S+) = sdy.sharding_constraint (%sp\.\S+) <@mesh, (.*)> : ", text, re.M)
    assert constraints and all(raw == "%sp." + ssa[1:] for ssa, raw, _ in constraints)
    # The first dot, x @ w1, is batch x model: the hidden activation Megatron leaves sharded.
    first = text.index("%sp.0 = stablehlo.dot_general %arg3, %arg0")
    assert text[first:].splitlines()[1].strip() == (
        '%0 = sdy.sharding_constraint %sp.0 <@mesh, [{"batch"}, {"model"}]> : tensor<8x32xf32>')
    # One constraint per SSA value of @main's body with a rank > 0 result (scalars are left alone).
    imported = import_module((FIXTURES / "mlp_train.mlir").read_text(), "mlp_train.mlir")
    values = {v.name: v for op in imported.function.ops for v in op.results}
    ranked = {ssa for name, ssa in imported.origins.items() if values[name].type.rank > 0}
    assert {ssa for ssa, _, _ in constraints} == ranked


def test_the_annotated_module_imports_to_the_planned_program(megatron_mlp):
    spec, planned, text = megatron_mlp
    assert import_stablehlo(text, "annotated.mlir", spec.model.param_names) == planned.model.function


def test_export_writes_the_annotated_module(capsys, tmp_path):
    out = tmp_path / "step.mlir"
    code, _, _ = shardplan(capsys, "export", FIXTURES / "transformer_train.yaml", "--schedule", "BP",
                           "--format", "mlir", "-o", out)
    assert code == 0 and "sdy.sharding_constraint" in out.read_text()


def test_export_mlir_of_a_builder_spec_is_refused(capsys):
    code, _, err = shardplan(capsys, "export", ROOT / "specs" / "mlp.yaml", "--format", "mlir")
    assert code == 1 and "only a plan of an imported program (model.stablehlo)" in err
