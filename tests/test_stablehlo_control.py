"""The importer's structure handling on programs jax printed (written by
tools/export_real_fixtures.py under tests/fixtures/stablehlo/): loops
unrolled on a static trip count, checkpoint barriers, sharding annotations,
dead code, and the ties back to the text (`import_module`)."""

import numpy as np
import pytest
from conftest import ROOT
from spmd_check import assert_lowering_matches

from ir.interpret import run
from ir.stablehlo import StableHLOError, import_module, import_stablehlo, load_stablehlo
from solver.planning.planner import SearchOverrides, plan_spec
from solver.planning.spec import SpecError, load_spec

SMALL = ROOT / "tests" / "fixtures" / "stablehlo"


def test_fori_loop_is_unrolled_and_its_counter_enters_the_math():
    fn = load_stablehlo(SMALL / "fori_loop.mlir")
    x = np.array([1.0, -2.0], np.float32)
    want = x.copy()
    for i in range(3):
        want = want * 2 + i
    np.testing.assert_allclose(run(fn, [x])[0], want)
    # Unrolled: three multiplies, no loop left, the evaluated conditions dropped as dead code.
    assert sum(op.kind == "mul" for op in fn.ops) == 3 and not any(op.kind == "compare" for op in fn.ops)


def test_scan_over_stacked_weights_slices_one_layer_per_trip():
    fn = load_stablehlo(SMALL / "scan.mlir")
    rng = np.random.default_rng(0)
    ws, x = rng.standard_normal((3, 4, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    h, sums = x.astype(np.float64), []
    for w in ws:
        sums.append(h.sum())
        h = np.tanh(h @ w)
    got_h, got_sums = run(fn, [ws, x])
    np.testing.assert_allclose(got_h, h, rtol=1e-5)
    np.testing.assert_allclose(got_sums, sums, rtol=1e-5)
    # The stacked weights are read by static slices at the known counter, one per layer.
    slices = [op for op in fn.ops if op.kind == "slice" and op.operands[0] is fn.params[0]]
    assert sorted(op.attrs["start"][0] for op in slices) == [0, 1, 2]


def test_a_loop_with_a_dynamic_trip_count_is_refused_at_its_line():
    path = SMALL / "dynamic_trip_count.mlir"
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "stablehlo.while" in text)
    with pytest.raises(StableHLOError, match=rf"dynamic_trip_count.mlir:{line}: stablehlo.while: the trip count "
                       "is not static"):
        load_stablehlo(path)


def test_checkpoint_barrier_passes_values_through():
    fn = load_stablehlo(SMALL / "checkpoint_grad.mlir")
    x = np.array([0.3, -1.2], np.float32)
    np.testing.assert_allclose(run(fn, [x])[0], 2 * np.cos(x), rtol=1e-6)


MAIN = """\
module @jit_f {
  func.func public @main(%arg0: tensor<8x4xf32>, %arg1: tensor<4x6xf32>) -> (tensor<8x6xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x6xf32>) -> tensor<8x6xf32>
    %1 = stablehlo.custom_call @Sharding(%0) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<8x6xf32>) -> tensor<8x6xf32>
    %2 = sdy.sharding_constraint %1 <@mesh, [{"batch"}, {}]> : tensor<8x6xf32>
    %3 = call @twice(%2) : (tensor<8x6xf32>) -> tensor<8x6xf32>
    %unused = stablehlo.exponential %0 : tensor<8x6xf32>
    return %3 : tensor<8x6xf32>
  }
  func.func private @twice(%arg0: tensor<8x6xf32>) -> tensor<8x6xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<8x6xf32>
    return %0 : tensor<8x6xf32>
  }
}
"""  # noqa: E501 (jax's lines)


def test_sharding_annotations_pass_through_and_are_recorded():
    module = import_module(MAIN, "main.mlir")
    fn = module.function
    a, b = np.ones((8, 4), np.float32), np.full((4, 6), 0.5, np.float32)
    np.testing.assert_allclose(run(fn, [a, b])[0], 2 * (a @ b))
    dot = module.function.ops[0].result
    assert module.constraints == ((dot.name, "{devices=[2,1]<=[2]}"), (dot.name, '@mesh, [{"batch"}, {}]'))
    # Only the Shardy form names mesh axes: it becomes a pin; the HLO sharding names devices.
    assert module.pins() == ((dot.name, 0, "batch"),)
    # The unused exponential is dead code; the dot and the call's add remain.
    assert [op.kind for op in fn.ops] == ["dot_general", "add"]


def test_origins_name_the_ssa_values_of_main_only():
    module = import_module(MAIN, "main.mlir")
    dot, add = module.function.ops
    # %0, %1 and %2 are all the dot's value (the annotations return their operand); the
    # call's result %3 is the add inlined from @twice, whose own %0 is not @main's.
    assert module.origins == {dot.result.name: "%0", add.result.name: "%3"}


@pytest.mark.parametrize("target", ["cu_threefry2x32", "SPMDFullToShardShape"])
def test_other_custom_calls_are_refused_by_name(target):
    text = MAIN.replace("@Sharding", f"@{target}")
    with pytest.raises(StableHLOError, match=rf"main.mlir:4: stablehlo.custom_call @{target} is not supported"):
        import_stablehlo(text, "main.mlir")


SPEC = """\
model:
  stablehlo: main.mlir
  param_names: [x, w]
  inputs: [x]
mesh: {batch: 2, model: 2}
hardware: A100-80GB
"""


def test_the_programs_own_constraints_are_pinned_in_every_plan(tmp_path):
    (tmp_path / "main.mlir").write_text(MAIN)
    (tmp_path / "step.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "step.yaml")
    # No schedule at all: the program's constraint is one.
    planned = plan_spec(spec)
    dot = planned.model.function.ops[0].result
    assert planned.model.pinned == ((dot.name, 0, "batch"),)
    assert planned.sharding.def_dims(planned.nda, dot) == (("batch",), ())
    # The pin propagates like a manual tactic: x's rows follow the dot's.
    assert planned.lowered.param_dims[0] == (("batch",), ())
    assert_lowering_matches(planned.model, planned.lowered)
    # A search keeps it: CP-SAT starts after the pin and never undoes it.
    searched = plan_spec(spec, solver="cpsat", overrides=SearchOverrides(time_limit_s=10))
    assert searched.sharding.def_dims(searched.nda, searched.model.function.ops[0].result)[0][0] == "batch"


def test_a_constraint_on_an_axis_the_mesh_lacks_is_a_spec_error(tmp_path):
    (tmp_path / "main.mlir").write_text(MAIN)
    (tmp_path / "step.yaml").write_text(SPEC.replace("batch: 2, ", "data: 2, "))
    with pytest.raises(SpecError, match="step.yaml: model.stablehlo: the program constrains %.* dimension 0 to mesh "
                       "axis 'batch', which the spec's mesh \\(data, model\\) lacks"):
        load_spec(tmp_path / "step.yaml").build()
