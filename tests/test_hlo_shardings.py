# ruff: noqa: E501 - the HLO lines are as XLA prints them
"""Whether XLA kept the plan's shardings (`solver.frontend.hlo_shardings`), on
lines cut from the modules XLA dumped around Shardy's pass (`shardy-xla`)
when it compiled the flax MoE fixture's EP plan and the 0.5B Llama's CP-SAT
plan (tools/xla_plan_check.py); no jax needed."""

import pytest

from solver.frontend.hlo_shardings import (
    check_shardings,
    device_tiles,
    mesh_tiles,
    parse_sdy_dims,
    split_tuple_sharding,
)

MESH = (("batch", 4), ("model", 2))

# The annotated module: two constrained values of @main's body, on lines 5 and 7.
ANNOTATED = """module @jit_step attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["batch"=4, "model"=2]>
  func.func public @main(%arg0: tensor<8x16xi32>, %arg1: tensor<4x32x64xf32>) -> (tensor<8x16xf32>, tensor<4x32x64xf32>) {
    %sp.9 = stablehlo.convert %arg0 : (tensor<8x16xi32>) -> tensor<8x16xf32>
    %9 = sdy.sharding_constraint %sp.9 <@mesh, [{"batch"}, {}]> : tensor<8x16xf32>
    %sp.10 = stablehlo.negate %arg1 : tensor<4x32x64xf32>
    %10 = sdy.sharding_constraint %sp.10 <@mesh, [{"model"}, {}, {}]> : tensor<4x32x64xf32>
    return %9, %10 : tensor<8x16xf32>, tensor<4x32x64xf32>
  }
}
"""

# XLA's module before Shardy's pass: each constraint a custom-call naming its line.
BEFORE = """HloModule jit_step, entry_computation_layout={(s32[8,16]{1,0}, f32[4,32,64]{2,1,0})->(f32[8,16]{1,0}, f32[4,32,64]{2,1,0})}

ENTRY %main.42 (Arg_0.1: s32[8,16], Arg_24.0: f32[4,32,64]) -> (f32[8,16], f32[4,32,64]) {
  %Arg_0.109 = s32[8,16]{1,0} parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  %Arg_24.1 = f32[4,32,64]{2,1,0} parameter(1), sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  %convert.39 = f32[8,16]{1,0} convert(%Arg_0.109)
  %custom-call.584 = f32[8,16]{1,0} custom-call(%convert.39), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"batch\\"}, {}]>]>"}, metadata={source_file="-" source_line=5 source_end_line=5 source_column=10 source_end_column=10}
  %negate.12 = f32[4,32,64]{2,1,0} negate(%Arg_24.1)
  %custom-call.585 = f32[4,32,64]{2,1,0} custom-call(%negate.12), custom_call_target="Sharding", sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"model\\"}, {}, {}]>]>"}, metadata={source_file="-" source_line=7 source_end_line=7 source_column=10 source_end_column=10}
  ROOT %tuple.1 = (f32[8,16]{1,0}, f32[4,32,64]{2,1,0}) tuple(%custom-call.584, %custom-call.585)
}
"""

# ... and after it: the constraints are copies naming the custom-calls, every op carries its sharding.
AFTER = """HloModule jit_step, entry_computation_layout={(s32[8,16]{1,0}, f32[4,32,64]{2,1,0})->(f32[8,16]{1,0}, f32[4,32,64]{2,1,0})}

ENTRY %main.42 (Arg_0.1: s32[8,16], Arg_24.0: f32[4,32,64]) -> (f32[8,16], f32[4,32,64]) {
  %Arg_0.1 = s32[8,16]{1,0} parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}, metadata={op_name="Arg_0.109"}
  %Arg_24.0 = f32[4,32,64]{2,1,0} parameter(1), sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}, metadata={op_name="Arg_24.1"}
  %convert.5 = f32[8,16]{1,0} convert(%Arg_0.1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}, metadata={op_name="convert.39"}
  %custom-call.555 = f32[8,16]{1,0} copy(%convert.5), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}, metadata={op_name="custom-call.584"}
  %negate.3 = f32[4,32,64]{2,1,0} negate(%Arg_24.0), sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}, metadata={op_name="negate.12"}
  %custom-call.556 = f32[4,32,64]{2,1,0} copy(%negate.3), sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}, metadata={op_name="custom-call.585"}
  ROOT %tuple.6 = (f32[8,16]{1,0}, f32[4,32,64]{2,1,0}) tuple(%custom-call.555, %custom-call.556), sharding={{devices=[4,1,2]<=[8] last_tile_dim_replicate}, {devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}}
}
"""
PARAMS = [[["batch"], []], [["model"], [], []]]


@pytest.mark.parametrize("hlo, dims", [
    ("{replicated}", [[], []]),
    ("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", [["batch"], []]),
    # model is the mesh's minor axis: its tiles take every other device (XLA's transposed iota)
    ("{devices=[1,1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}", [[], [], ["model"]]),
    ("{devices=[2,4]<=[4,2]T(1,0)}", [["model"], ["batch"]]),
    ("{devices=[4,2]<=[8]}", [["batch"], ["model"]]),
    ("{devices=[8,1]<=[8]}", [["batch", "model"], []]),
    ("{devices=[8,1]<=[4,2]T(1,0)}", [["model", "batch"], []]),
    ("{devices=[8,1]0,2,4,6,1,3,5,7}", [["model", "batch"], []]),  # the same, as a device list
])
def test_hlo_and_plan_shardings_decode_to_the_same_tiles(hlo, dims):
    assert device_tiles(hlo, len(dims), 8) == mesh_tiles(dims, MESH)


def test_different_shardings_decode_to_different_tiles():
    assert device_tiles("{devices=[2,4]<=[4,2]T(1,0)}", 2, 8) != mesh_tiles([["batch"], ["model"]], MESH)
    assert device_tiles("{devices=[8,1]<=[8]}", 2, 8) != mesh_tiles([["model", "batch"], []], MESH)
    assert device_tiles("{maximal device=0}", 2, 8) is None


def test_tuple_shardings_split_past_xlas_index_comments():
    assert split_tuple_sharding("{{replicated}, {devices=[2,1]<=[2]}, /*index=2*/{replicated}}") == [
        "{replicated}", "{devices=[2,1]<=[2]}", "{replicated}"]
    assert split_tuple_sharding("{devices=[2,1]<=[2]}") == ["{devices=[2,1]<=[2]}"]
    assert parse_sdy_dims('[{"batch"}, {}, {"model", "batch"}]') == (("batch",), (), ("model", "batch"))


def test_kept_shardings_agree():
    got = check_shardings(ANNOTATED, BEFORE, AFTER, MESH, PARAMS, PARAMS)
    assert (got.arguments, got.results, got.values, got.differences) == ((2, 2), (2, 2), (2, 2), ())


def test_an_op_computed_in_another_sharding_is_a_difference():
    # XLA computes the negate replicated and the copy moves it to the planned layout.
    after = AFTER.replace("negate(%Arg_24.0), sharding={devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}",
                          "negate(%Arg_24.0), sharding={replicated}")
    got = check_shardings(ANNOTATED, BEFORE, after, MESH, PARAMS, PARAMS)
    assert got.values == (1, 2)
    (diff,) = got.differences
    assert diff.value == "%10 (line 7)" and diff.planned == '[{"model"}, {}, {}]'
    assert diff.xla == "negate computed in {replicated}"


def test_arguments_and_results_are_compared_with_the_plan():
    # The plan splits the second argument over batch: XLA's over model is not it.
    planned = [[["batch"], []], [["batch"], [], []]]
    got = check_shardings(ANNOTATED, BEFORE, AFTER, MESH, planned, planned)
    assert got.arguments == (1, 2) and got.results == (1, 2)
    assert [d.value for d in got.differences][:2] == ["argument 1", "result 1"]
