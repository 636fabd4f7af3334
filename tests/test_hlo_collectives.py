# ruff: noqa: E501 - the HLO lines are as XLA prints them
"""XLA's collectives read from compiled HLO text (`solver.frontend.hlo_collectives`),
on a snippet cut from the 0.5B Llama step XLA's CPU pipeline compiled
(tools/xla_plan_check.py's mid-size row): its reduce-scatters appear as an
all-reduce whose tensors are only dynamic-sliced, inside fusions."""

from solver.frontend.hlo_collectives import xla_collectives

# Element 1 of the tuple all-reduce (a weight's gradient) is read only by two Adam fusions that
# take their shard with a dynamic-slice (by partition id); element 0 (the loss) is added to.
HLO = """
HloModule snippet, entry_computation_layout={()->f32[1024,256]{1,0}}

%fused_computation.559 (param_0.1104: f32[1024,256], param_1.1556: f32[256,2048], param_2.1766: s32[8], param_3.2184: u32[]) -> f32[1024,256] {
  %constant.53.clone.68 = f32[] constant(0.1)
  %broadcast.3356 = f32[256,1024]{1,0} broadcast(%constant.53.clone.68), dimensions={}
  %param_1.1556 = f32[256,2048]{1,0} parameter(1)
  %constant.35.clone.110 = s32[] constant(0)
  %param_2.1766 = s32[8]{0} parameter(2)
  %param_3.2184 = u32[] parameter(3)
  %dynamic-slice.1339 = s32[1]{0} dynamic-slice(%param_2.1766, %param_3.2184), dynamic_slice_sizes={1}
  %bitcast.633 = s32[] bitcast(%dynamic-slice.1339)
  %dynamic-slice.1338 = f32[256,1024]{1,0} dynamic-slice(%param_1.1556, %constant.35.clone.110, %bitcast.633), dynamic_slice_sizes={256,1024}
  %multiply.4144 = f32[256,1024]{1,0} multiply(%broadcast.3356, %dynamic-slice.1338)
  %transpose.1697 = f32[1024,256]{0,1} transpose(%multiply.4144), dimensions={1,0}
  %copy.525 = f32[1024,256]{1,0} copy(%transpose.1697)
  %param_0.1104 = f32[1024,256]{1,0} parameter(0)
  ROOT %add.2883 = f32[1024,256]{1,0} add(%copy.525, %param_0.1104)
}

%fused_computation.9 (param_0.1: f32[], param_1.2: f32[]) -> f32[] {
  %param_0.1 = f32[] parameter(0)
  %param_1.2 = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%param_0.1, %param_1.2)
}

%region_1.2 (Arg_0.3: f32[], Arg_1.4: f32[]) -> f32[] {
  %Arg_0.3 = f32[] parameter(0)
  %Arg_1.4 = f32[] parameter(1)
  ROOT %add.5 = f32[] add(%Arg_0.3, %Arg_1.4)
}

ENTRY %main.1 (param.84: f32[1024,256], param.159: f32[1024,256], loss.1: f32[], grad.1: f32[256,2048], other.1: f32[64,32]) -> f32[1024,256] {
  %param.84 = f32[1024,256]{1,0} parameter(0)
  %param.159 = f32[1024,256]{1,0} parameter(1)
  %loss.1 = f32[] parameter(2)
  %grad.1 = f32[256,2048]{1,0} parameter(3)
  %other.1 = f32[64,32]{1,0} parameter(4)
  %constant.969 = s32[8]{0} constant({0, 1024, 0, 1024, 0, 1024, 0, 1024})
  %partition-id = u32[] partition-id()
  %all-reduce.137 = (f32[], f32[256,2048]{1,0}) all-reduce(%loss.1, %grad.1), channel_id=9, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%region_1.2
  %get-tuple-element.6 = f32[] get-tuple-element(%all-reduce.137), index=0
  %get-tuple-element.13 = f32[256,2048]{1,0} get-tuple-element(%all-reduce.137), index=1
  %add_fusion.1 = f32[] fusion(%get-tuple-element.6, %loss.1), kind=kLoop, calls=%fused_computation.9
  %all-reduce.2 = f32[64,32]{1,0} all-reduce(%other.1), channel_id=10, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%region_1.2
  %dynamic-slice.7 = f32[32,32]{1,0} dynamic-slice(%all-reduce.2, %partition-id, %partition-id), dynamic_slice_sizes={32,32}
  %multiply_add_fusion.217 = f32[1024,256]{1,0} fusion(%param.84, %get-tuple-element.13, %constant.969, %partition-id), kind=kLoop, calls=%fused_computation.559
  %multiply_add_fusion.142 = f32[1024,256]{1,0} fusion(%param.159, %get-tuple-element.13, %constant.969, %partition-id), kind=kLoop, calls=%fused_computation.559
  ROOT %add.9 = f32[1024,256]{1,0} add(%multiply_add_fusion.217, %multiply_add_fusion.142)
}
"""


def test_an_all_reduced_tensor_only_sliced_counts_as_a_reduce_scatter():
    got = xla_collectives(HLO)
    # The tuple's gradient (2 MiB) and the 64 x 32 all-reduce read only by a dynamic-slice: reduce-scatters.
    assert got["reduce_scatter"] == {"ops": 1, "tensors": 2, "bytes": 256 * 2048 * 4 + 64 * 32 * 4}
    # The tuple's loss is added to: an all-reduce, counted with its op.
    assert got["all_reduce"] == {"ops": 1, "tensors": 1, "bytes": 4}


def test_a_slice_beside_another_read_keeps_the_all_reduce():
    # The loss element also read by a plain add beside a slice: not only sliced.
    text = HLO.replace("ROOT %add.9 = f32[1024,256]{1,0} add(%multiply_add_fusion.217, %multiply_add_fusion.142)",
                       "%neg.1 = f32[32,32]{1,0} negate(%all-reduce.2)\n"
                       "  ROOT %add.9 = f32[1024,256]{1,0} add(%multiply_add_fusion.217, %multiply_add_fusion.142)")
    got = xla_collectives(text)
    assert got["reduce_scatter"]["tensors"] == 1 and got["all_reduce"]["tensors"] == 2


# XLA's CPU pipeline writes an all-to-all over 2 devices as one operand per peer (the experts' inputs moved
# from the groups to the experts, moe_grouped_train_ep's EP plan): one tensor, its bytes both pieces'.
ALL_TO_ALL = """
HloModule snippet, entry_computation_layout={(f32[1,1,1,2,10,32]{5,4,3,2,1,0}, f32[1,1,1,2,10,32]{5,4,3,2,1,0})->(f32[1,1,1,2,10,32]{5,4,3,2,1,0}, f32[1,1,1,2,10,32]{5,4,3,2,1,0})}

ENTRY %main.1 (a.1: f32[1,1,1,2,10,32], b.1: f32[1,1,1,2,10,32]) -> (f32[1,1,1,2,10,32], f32[1,1,1,2,10,32]) {
  %bitcast_slice_fusion.4 = f32[1,1,1,2,10,32]{5,4,3,2,1,0} parameter(0)
  %bitcast_slice_fusion.3 = f32[1,1,1,2,10,32]{5,4,3,2,1,0} parameter(1)
  ROOT %all-to-all.3 = (f32[1,1,1,2,10,32]{5,4,3,2,1,0}, f32[1,1,1,2,10,32]{5,4,3,2,1,0}) all-to-all(%bitcast_slice_fusion.4, %bitcast_slice_fusion.3), channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2,'axis_3'=1,'axis_4'=1] {'axis_2'}, metadata={op_name="transpose.16"}
}
"""


def test_an_all_to_all_in_pieces_is_one_tensor():
    assert xla_collectives(ALL_TO_ALL) == {"all_to_all": {"ops": 1, "tensors": 1, "bytes": 2 * 2 * 10 * 32 * 4}}
    # With a split dimension, each operand is a tensor of its own.
    split = ALL_TO_ALL.replace("channel_id=2,", "channel_id=2, dimensions={3},")
    assert xla_collectives(split)["all_to_all"]["tensors"] == 2
