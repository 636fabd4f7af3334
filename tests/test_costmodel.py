"""The cost model (costmodel.evaluate): step time and peak memory per device.

Every expectation is worked out by hand in the test, on a custom device with
round figures (f32 peak 1 TFLOP/s, HBM 100 GB/s, links 100 GB/s + 1 us), so
a reviewer can check the arithmetic against the module docstring's
formulas. Then relations between plans (batch parallelism, Megatron,
ZeRO-3) and the TOAST objective.
"""

import pytest

from costmodel.evaluate import (
    Assessment,
    collective_s,
    evaluate,
    ideal_step_time_s,
    peak_memory_bytes,
    roofline_s,
)
from costmodel.hardware import Device, Hardware, Link
from ir.autodiff import training_step
from ir.builder import Builder
from ir.core import Mesh, tensor
from ir.lower import lower
from ir.models import build
from ir.nda import analyze
from ir.text import parse
from solver.planning.tactics import FIRST_DIVISIBLE, Manual, apply_schedule

PEAK = 1e12  # f32 flop/s
HBM = 100e9  # bytes/s
BW = 100e9  # link bytes/s
LAT = 1e-6  # link latency per hop, s
LINK = Link(bandwidth="100GB/s", latency="1us")


def hardware(axes=(), *, peaks=None, memory="1GiB", hbm="100GB/s", links=None) -> Hardware:
    """The round-figure device, every mesh axis on LINK unless `links` says otherwise."""
    device = Device(name="round", peak_flops=peaks or {"f32": "1TFLOP/s"}, memory=memory, memory_bandwidth=hbm)
    chosen = {axis: LINK for axis in axes} | dict(links or {})
    return Hardware(name="round", device=device, links=chosen)


def lowered_for(model, schedule, mesh):
    nda = analyze(model.function, model.params)
    plan = apply_schedule(nda, mesh, schedule)
    return lower(model.function, nda, plan.materialize(nda))


def ring_all_reduce_s(nbytes, n, bw=BW, lat=LAT):
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


# ------------------------------------------------------------------ roofline

MATMUL = """
func @mm(%a: tensor<64x128xDT>, %b: tensor<128x256xDT>) -> (tensor<64x256xDT>) {
  %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xDT>
  return %c
}
"""
MATMUL_FLOPS = 2 * 64 * 128 * 256  # 4,194,304: one multiply-add per (m, n, k)
MATMUL_BYTES_F32 = 4 * (64 * 128 + 128 * 256 + 64 * 256)  # a + b + c = 4 * 57,344 = 229,376


def test_matmul_compute_bound():
    cost = evaluate(parse(MATMUL.replace("DT", "f32")), hardware())
    compute = MATMUL_FLOPS / PEAK  # 4.194304e-6 s
    memory = MATMUL_BYTES_F32 / HBM  # 2.29376e-6 s: smaller, so compute-bound
    assert compute > memory
    assert cost.flops == MATMUL_FLOPS
    assert cost.step_time_s == pytest.approx(4.194304e-6, rel=1e-12)
    assert cost.compute_s == pytest.approx(4.194304e-6, rel=1e-12)
    assert cost.communication_s == 0
    assert cost.seconds_by_kind == {"dot_general": pytest.approx(4.194304e-6, rel=1e-12)}
    assert roofline_s(MATMUL_FLOPS, MATMUL_BYTES_F32, "f32", hardware()) == pytest.approx(4.194304e-6, rel=1e-12)


def test_matmul_memory_bound_on_a_slow_hbm():
    cost = evaluate(parse(MATMUL.replace("DT", "f32")), hardware(hbm="10GB/s"))
    # compute still 4.194304e-6 s; memory 229,376 B / 1e10 B/s = 2.29376e-5 s: memory-bound
    assert cost.step_time_s == pytest.approx(2.29376e-5, rel=1e-12)
    assert cost.flops == MATMUL_FLOPS


def test_matmul_takes_the_peak_of_its_dtype():
    peaks = {"f32": "1TFLOP/s", "bf16": "10TFLOP/s"}
    cost = evaluate(parse(MATMUL.replace("DT", "bf16")), hardware(peaks=peaks))
    # bf16: compute 4,194,304 / 1e13 = 4.194304e-7 s; bytes 2 * 57,344 = 114,688 -> 1.14688e-6 s: memory-bound
    assert cost.step_time_s == pytest.approx(1.14688e-6, rel=1e-12)
    cost = evaluate(parse(MATMUL.replace("DT", "bf16")), hardware(peaks=peaks, hbm="1TB/s"))
    # HBM 1e12: memory 1.14688e-7 s, compute 4.194304e-7 s at the bf16 (not the f32) peak
    assert cost.step_time_s == pytest.approx(4.194304e-7, rel=1e-12)


def test_global_program_step_time_is_the_sum_of_op_rooflines():
    text = """
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>) {
      %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %d = add(%c, %c) : tensor<64x256xf32>
      return %d
    }
    """
    cost = evaluate(parse(text), hardware())
    # matmul: 4.194304e-6 s (above). add: 16,384 flops -> 1.6384e-8 s;
    # bytes 3 * 65,536 = 196,608 -> 1.96608e-6 s: memory-bound.
    assert cost.flops == MATMUL_FLOPS + 64 * 256
    assert cost.seconds_by_kind["add"] == pytest.approx(1.96608e-6, rel=1e-12)
    assert cost.step_time_s == pytest.approx(4.194304e-6 + 1.96608e-6, rel=1e-12)


# ------------------------------------------------------------------ collectives


def one_collective(mesh: str, op: str, operand: str, result: str) -> str:
    return f"""
    func @c(%a: {operand}) -> ({result}) {mesh} {{
      %b = {op} : {result}
      return %b
    }}
    """


def test_all_reduce_on_a_ring_of_8():
    fn = parse(one_collective("mesh<x=8>", 'all_reduce(%a) {axes = ["x"]}', "tensor<1024xf32>", "tensor<1024xf32>"))
    cost = evaluate(fn, hardware(["x"]))
    # 2 * (7/8) * 4096 B / 1e11 B/s + 2 * 7 * 1e-6 s = 7.168e-8 + 1.4e-5
    expected = 7.168e-8 + 1.4e-5
    assert cost.step_time_s == pytest.approx(expected, rel=1e-12)
    assert cost.communication_s == pytest.approx(expected, rel=1e-12)
    assert cost.compute_s == 0
    assert cost.flops == 0  # the combine is not counted as compute
    assert cost.collective_counts == {"all_reduce": 1, "all_gather": 0, "reduce_scatter": 0, "all_to_all": 0,
                                     "collective_permute": 0}
    assert cost.peak_memory_bytes == 2 * 4096


@pytest.mark.parametrize("op, operand, result, expected", [
    # all_gather: f * result bytes / bw + (n - 1) * lat = 7/8 * 4096 / 1e11 + 7e-6
    ('all_gather(%a) {axes = ["x"], dim = 0}', "tensor<128xf32>", "tensor<1024xf32>", 3.584e-8 + 7e-6),
    # reduce_scatter: f * operand bytes / bw + (n - 1) * lat = 7/8 * 4096 / 1e11 + 7e-6
    ('reduce_scatter(%a) {axes = ["x"], dim = 0}', "tensor<1024xf32>", "tensor<128xf32>", 3.584e-8 + 7e-6),
    # all_to_all: f * bytes / bw + (n - 1) * lat = 7/8 * (8 * 1024 * 4 = 32,768) / 1e11 + 7e-6
    ('all_to_all(%a) {axes = ["x"], src_dim = 0, dst_dim = 1}', "tensor<8x1024xf32>", "tensor<64x128xf32>",
     2.8672e-7 + 7e-6),
])
def test_gather_scatter_and_all_to_all_on_a_ring_of_8(op, operand, result, expected):
    fn = parse(one_collective("mesh<x=8>", op, operand, result))
    cost = evaluate(fn, hardware(["x"]))
    kind = op.split("(")[0]
    assert cost.communication_s == pytest.approx(expected, rel=1e-12)
    assert cost.step_time_s == pytest.approx(expected, rel=1e-12)
    assert cost.compute_s == 0
    assert cost.collective_counts[kind] == 1
    assert sum(cost.collective_counts.values()) == 1


@pytest.mark.parametrize("shift", [1, -1, 3])
def test_collective_permute_is_one_hop_of_the_whole_operand(shift):
    # Every member sends its 4096 B operand to one peer at once: no (n - 1) / n,
    # one latency whatever the shift: 4096 / 1e11 + 1e-6 = 4.096e-8 + 1e-6
    op = f'collective_permute(%a) {{axes = ["x"], shift = {shift}}}'
    fn = parse(one_collective("mesh<x=8>", op, "tensor<1024xf32>", "tensor<1024xf32>"))
    cost = evaluate(fn, hardware(["x"]))
    assert cost.communication_s == pytest.approx(4.096e-8 + 1e-6, rel=1e-12)
    assert cost.step_time_s == cost.communication_s
    assert cost.flops == 0
    assert cost.collective_counts["collective_permute"] == 1
    assert sum(cost.collective_counts.values()) == 1
    # Over y of a 2 x 4 mesh on y's link (50 GB/s, 2 us): 4096 / 5e10 + 2e-6 = 8.192e-8 + 2e-6
    slow = hardware(["x"], links={"y": Link(bandwidth="50GB/s", latency="2us")})
    assert collective_s("collective_permute", ("y",), tensor([1024]), tensor([1024]), Mesh.of(x=2, y=4),
                        slow) == pytest.approx(8.192e-8 + 2e-6, rel=1e-12)


def test_collective_over_one_axis_of_a_2d_mesh_uses_that_axis_group_only():
    # mesh 2 x 4, all_reduce over y: groups of 4 on y's link (50 GB/s, 2 us), not 8 devices
    slow = Link(bandwidth="50GB/s", latency="2us")
    fn = parse(one_collective("mesh<x=2, y=4>", 'all_reduce(%a) {axes = ["y"]}', "tensor<1024xf32>",
                              "tensor<1024xf32>"))
    cost = evaluate(fn, hardware(["x"], links={"y": slow}))
    # 2 * (3/4) * 4096 / 5e10 + 2 * 3 * 2e-6 = 1.2288e-7 + 1.2e-5
    assert cost.communication_s == pytest.approx(1.2288e-7 + 1.2e-5, rel=1e-12)


def test_collective_over_two_axes_uses_the_least_bandwidth_and_the_most_latency():
    # x: 100 GB/s, 1 us; y: 50 GB/s, 0.5 us. The slowest link takes y's bandwidth and x's latency.
    links = {"x": LINK, "y": Link(bandwidth="50GB/s", latency="0.5us")}
    fn = parse(one_collective("mesh<x=2, y=4>", 'all_reduce(%a) {axes = ["x", "y"]}', "tensor<1024xf32>",
                              "tensor<1024xf32>"))
    cost = evaluate(fn, hardware(links=links))
    # n = 8: 2 * (7/8) * 4096 / 5e10 + 2 * 7 * 1e-6 = 1.4336e-7 + 1.4e-5
    assert cost.communication_s == pytest.approx(1.4336e-7 + 1.4e-5, rel=1e-12)
    assert collective_s("all_reduce", ("x", "y"), tensor([1024]), tensor([1024]), fn.mesh,
                        hardware(links=links)) == pytest.approx(1.4336e-7 + 1.4e-5, rel=1e-12)


@pytest.mark.parametrize("op, operand, result", [
    ('all_reduce(%a) {axes = ["one"]}', "tensor<1024xf32>", "tensor<1024xf32>"),
    ('all_gather(%a) {axes = ["one"], dim = 0}', "tensor<1024xf32>", "tensor<1024xf32>"),
    ('reduce_scatter(%a) {axes = ["one"], dim = 0}', "tensor<1024xf32>", "tensor<1024xf32>"),
    ('all_to_all(%a) {axes = ["one"], src_dim = 0, dst_dim = 1}', "tensor<8x1024xf32>", "tensor<8x1024xf32>"),
    ('collective_permute(%a) {axes = ["one"], shift = 1}', "tensor<1024xf32>", "tensor<1024xf32>"),
])
def test_a_group_of_one_device_costs_nothing(op, operand, result):
    fn = parse(one_collective("mesh<one=1, x=8>", op, operand, result))
    cost = evaluate(fn, hardware(["one", "x"]))
    assert cost.step_time_s == 0
    assert cost.collective_counts[op.split("(")[0]] == 1  # still counted: it is in the program


def test_communication_and_compute_are_split_and_summed():
    text = """
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>, tensor<64x32xf32>) mesh<x=8> {
      %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %d = all_reduce(%c) {axes = ["x"]} : tensor<64x256xf32>
      %e = all_slice(%d) {axes = ["x"], dim = 1} : tensor<64x32xf32>
      %f = all_reduce(%e) {axes = ["x"]} : tensor<64x32xf32>
      return %d, %f
    }
    """
    cost = evaluate(parse(text), hardware(["x"]))
    # all_reduce of 65,536 B: 2 * 7/8 * 65,536 / 1e11 + 14e-6 = 1.14688e-6 + 1.4e-5
    # all_reduce of  8,192 B: 2 * 7/8 *  8,192 / 1e11 + 14e-6 = 1.4336e-7 + 1.4e-5
    communication = 1.14688e-6 + 1.4e-5 + 1.4336e-7 + 1.4e-5
    assert cost.communication_s == pytest.approx(communication, rel=1e-12)
    assert cost.seconds_by_kind["all_reduce"] == pytest.approx(communication, rel=1e-12)
    # all_slice moves nothing between devices: a local op, in compute, not a counted collective
    assert cost.seconds_by_kind["all_slice"] > 0
    assert cost.compute_s == pytest.approx(4.194304e-6 + cost.seconds_by_kind["all_slice"], rel=1e-12)
    assert cost.step_time_s == pytest.approx(cost.compute_s + communication, rel=1e-12)
    assert cost.collective_counts == {"all_reduce": 2, "all_gather": 0, "reduce_scatter": 0, "all_to_all": 0,
                                     "collective_permute": 0}


# ------------------------------------------------------------------ peak memory

LIVENESS = {
    # Values die after their last use. Each value is 1 KiB (256 f32); x lives throughout.
    #   op0 a: x a = 2 KiB;  op1 b: x a b = 3 KiB;  op2 c: x b c (a died) = 3 KiB
    #   op3 d: x c d = 3 KiB;  op4 r: x d r = 2 KiB + 4 B.  Peak 3 KiB.
    "dies_after_last_use": ("""
    func @f(%x: tensor<256xf32>) -> (tensor<f32>) {
      %a = exp(%x) : tensor<256xf32>
      %b = exp(%a) : tensor<256xf32>
      %c = exp(%b) : tensor<256xf32>
      %d = exp(%c) : tensor<256xf32>
      %r = reduce(%d) {dims = [0]} : tensor<f32>
      return %r
    }""", 3 * 1024),
    # The same chain returning a too: a lives to the end.
    #   op2 c: x a b c = 4 KiB;  op3 d: x a c d = 4 KiB;  op4 r: x a d r = 3 KiB + 4 B.  Peak 4 KiB.
    "results_live_to_the_end": ("""
    func @f(%x: tensor<256xf32>) -> (tensor<f32>, tensor<256xf32>) {
      %a = exp(%x) : tensor<256xf32>
      %b = exp(%a) : tensor<256xf32>
      %c = exp(%b) : tensor<256xf32>
      %d = exp(%c) : tensor<256xf32>
      %r = reduce(%d) {dims = [0]} : tensor<f32>
      return %r, %a
    }""", 4 * 1024),
    # An unused 4 KiB value lives only at its definition.
    #   op0 u: x u = 1 + 4 = 5 KiB;  op1 a: x a = 2 KiB;  op2 b: x a b = 3 KiB.  Peak 5 KiB
    #   (had u lived on: x u a b = 8 KiB).
    "unused_lives_at_its_definition": ("""
    func @f(%x: tensor<256xf32>) -> (tensor<256xf32>) {
      %u = broadcast_in_dim(%x) {dims = [1], shape = [4, 256]} : tensor<4x256xf32>
      %a = exp(%x) : tensor<256xf32>
      %b = exp(%a) : tensor<256xf32>
      return %b
    }""", 5 * 1024),
    # Parameters live throughout, even after their last use. x 4,096 B, y 64 B.
    #   op0 s: x y s = 4,096 + 64 + 4 = 4,164
    #   op1 a: x y s a = 4,228 (s's last use)
    #   op2 b: x y a b = 4,096 + 3 * 64 = 4,288
    #   op3 c: x y b c = 4,288.  Peak 4,288 (x freed after op0 would give 256).
    "parameters_live_throughout": ("""
    func @f(%x: tensor<1024xf32>, %y: tensor<16xf32>) -> (tensor<16xf32>) {
      %s = reduce(%x) {dims = [0]} : tensor<f32>
      %a = broadcast_in_dim(%s) {dims = [], shape = [16]} : tensor<16xf32>
      %b = add(%a, %y) : tensor<16xf32>
      %c = exp(%b) : tensor<16xf32>
      return %c
    }""", 4096 + 3 * 64),
    # Sizes that rise and fall: x 4 KiB; s 4 B; big and t 16 KiB each.
    #   op0 s: x s = 4,100;  op1 big: x s big = 20,484;  op2 t: x s big t = 36,868
    #   op3 r: x s t r = 20,488 (big died; s is a result);  op4 e: x s r e = 8,200 (t died).  Peak 36,868.
    "rise_and_fall": ("""
    func @f(%x: tensor<1024xf32>) -> (tensor<f32>, tensor<f32>, tensor<1024xf32>) {
      %s = reduce(%x) {dims = [0]} : tensor<f32>
      %big = broadcast_in_dim(%s) {dims = [], shape = [4096]} : tensor<4096xf32>
      %t = tanh(%big) : tensor<4096xf32>
      %r = reduce(%t) {dims = [0]} : tensor<f32>
      %e = exp(%x) : tensor<1024xf32>
      return %r, %s, %e
    }""", 4096 + 4 + 2 * 16384),
    # No ops: just the parameters.
    "no_ops": ("""
    func @f(%x: tensor<1024xf32>, %y: tensor<7xi32>) -> (tensor<1024xf32>) {
      return %x
    }""", 4096 + 28),
}


@pytest.mark.parametrize("case", LIVENESS)
def test_peak_memory_of_straight_line_programs(case):
    text, peak = LIVENESS[case]
    fn = parse(text)
    assert peak_memory_bytes(fn) == peak
    assert evaluate(fn, hardware()).peak_memory_bytes == peak


def test_peak_memory_of_a_device_local_program_counts_local_types():
    # x [8, 1024] f32 local: 32,768 B; all_gather's result [64, 1024] 262,144 B; r [64] 256 B; s 32 B.
    #   op0 g: x g = 294,912;  op1 r: x g r = 295,168.  Peak 295,168.
    text = """
    func @f(%x: tensor<8x1024xf32>) -> (tensor<8xf32>) mesh<x=8> {
      %g = all_gather(%x) {axes = ["x"], dim = 0} : tensor<64x1024xf32>
      %r = reduce(%g) {dims = [1]} : tensor<64xf32>
      %s = slice(%r) {start = [0], limit = [8]} : tensor<8xf32>
      return %s
    }
    """
    # op2 s: x r s = 32,768 + 256 + 32 = 33,056
    assert peak_memory_bytes(parse(text)) == 32768 + 262144 + 256


# ------------------------------------------------------------------ relations between plans

BP_MESH = Mesh.of(batch=4)


def test_batch_parallelism_divides_compute_by_the_number_of_devices():
    # tanh(x @ w): both ops carry the batch dimension. On a compute-bound device
    # (HBM 1 PB/s) every op's time is flops / peak, and each device has a quarter
    # of the flops; w is replicated, so no communication.
    b = Builder("f")
    x = b.param("x", [64, 128])
    w = b.param("w", [128, 256])
    fn = b.build([b.tanh(b.matmul(x, w))])
    nda = analyze(fn)
    plan = apply_schedule(nda, BP_MESH, [Manual("batch", (("x", 0),))])
    local = lower(fn, nda, plan.materialize(nda)).function
    hw = hardware(["batch"], hbm="1PB/s")
    whole, part = evaluate(fn, hw), evaluate(local, hw)
    assert [p.type.shape for p in local.params] == [(16, 128), (128, 256)]
    assert part.communication_s == 0
    # global flops: matmul 4,194,304 + tanh 64 * 256 = 16,384 (one per element) = 4,210,688
    assert whole.flops == 4210688 and part.flops == 4210688 // 4
    assert whole.compute_s == pytest.approx(4.210688e-6, rel=1e-12)
    assert part.compute_s == pytest.approx(whole.compute_s / 4, rel=1e-12)
    # On the 100 GB/s HBM the replicated w is read whole by every device: no 4x speedup.
    #   global: matmul compute-bound 4.194304e-6; tanh 2 * 65,536 B -> 1.31072e-6. Sum 5.505024e-6.
    #   local:  matmul 4 * (16*128 + 128*256 + 16*256) = 155,648 B -> 1.55648e-6 (memory-bound,
    #           compute 1.048576e-6); tanh 2 * 16,384 B -> 3.2768e-7. Sum 1.88416e-6 (not 5.505024e-6 / 4).
    slow = hardware(["batch"])
    assert evaluate(fn, slow).compute_s == pytest.approx(5.505024e-6, rel=1e-12)
    assert evaluate(local, slow).compute_s == pytest.approx(1.88416e-6, rel=1e-12)


def test_batch_parallel_training_step_adds_exactly_the_gradient_all_reduces():
    model = training_step(build("mlp", batch=8, d_in=6, hidden=10, d_out=4))
    lowered = lowered_for(model, [Manual("batch", (("x", 0),))], BP_MESH)
    cost = evaluate(lowered.function, hardware(["batch"]))
    # One all_reduce per gradient (bytes of the parameter) and one for the scalar loss, over 4 devices:
    #   w1 [6, 10]: 240 B;  w2 [10, 4]: 160 B;  loss: 4 B
    #   each 2 * (3/4) * bytes / 1e11 + 2 * 3 * 1e-6
    expected = sum(ring_all_reduce_s(nbytes, 4) for nbytes in (240, 160, 4))
    assert expected == pytest.approx(1.5 * 404 / 1e11 + 3 * 6e-6, rel=1e-12)
    assert cost.collective_counts == {"all_reduce": 3, "all_gather": 0, "reduce_scatter": 0, "all_to_all": 0,
                                     "collective_permute": 0}
    assert cost.communication_s == pytest.approx(expected, rel=1e-12)
    assert cost.step_time_s == pytest.approx(cost.compute_s + expected, rel=1e-12)


def test_megatron_divides_the_sharded_weights_memory_by_n():
    model = training_step(build("mlp", batch=8, d_in=6, hidden=12, d_out=4))
    lowered = lowered_for(model, [Manual("model", (("w1", 1),))], Mesh.of(model=4))
    fn, local = model.function, lowered.function
    whole = {p.name: p.type.num_bytes for p in fn.params}
    part = {p.name: p.type.num_bytes for p in local.params}
    sharded = ["w1", "w2", "opt.m.w1", "opt.v.w1", "opt.m.w2", "opt.v.w2"]  # hidden split 4 ways
    for name in sharded:
        assert part[name] * 4 == whole[name], name
    for name in ("x", "target", "opt.step"):
        assert part[name] == whole[name], name
    # w1 [6, 12] and w2 [12, 4], each with two Adam moments: 3 * (288 + 192) B = 1,440 B -> 360 B per device
    assert sum(whole[n] for n in sharded) == 1440
    assert sum(part[n] for n in sharded) == 360
    # the resident bytes (parameters live throughout) drop by 1,440 - 360 = 1,080
    assert sum(whole.values()) - sum(part.values()) == 1080


def test_zero3_lowers_peak_memory_when_parameters_dominate():
    sizes = dict(layers=1, d_model=32, heads=2, head_dim=8, mlp_hidden=64, vocab=16, seq=2, batch=2)
    model = training_step(build("transformer", **sizes))
    mesh = Mesh.of(batch=2, model=2)
    bp = Manual("batch", (("batch.tokens", 0),))
    mp = Manual("model", (("layers.*.attn.wq", 1), ("layers.*.mlp.w_up", 1)))
    z3 = Manual("batch", (("*", FIRST_DIVISIBLE),))
    hw = hardware(["batch", "model"])
    bp_mp = evaluate(lowered_for(model, [bp, mp], mesh).function, hw)
    zero3 = evaluate(lowered_for(model, [bp, mp, z3], mesh).function, hw)
    params = sum(p.type.num_bytes for p in model.function.params)
    assert params > peak_memory_bytes(model.function) / 3  # parameters and optimizer state dominate
    assert zero3.peak_memory_bytes < bp_mp.peak_memory_bytes
    # the price: gathering the parameters before use and scattering their gradients
    assert zero3.collective_counts["all_gather"] > 0 and zero3.collective_counts["reduce_scatter"] > 0
    assert bp_mp.collective_counts["all_gather"] == 0


# ------------------------------------------------------------------ the objective


def mlp_bp(hw):
    model = training_step(build("mlp", batch=8, d_in=6, hidden=10, d_out=4))
    local = lowered_for(model, [Manual("batch", (("x", 0),))], BP_MESH).function
    return model.function, evaluate(local, hw), evaluate(model.function, hw)


def test_relative_cost_is_relative_runtime_when_the_plan_fits():
    fn, cost, baseline = mlp_bp(hardware(["batch"]))
    assessment = Assessment(cost, baseline, ideal_step_time_s(fn, 4, hardware(["batch"])))
    assert cost.fits and cost.peak_memory_bytes <= 2**30
    assert assessment.memory_overflow == 0
    assert assessment.relative_runtime == pytest.approx(cost.step_time_s / baseline.step_time_s, rel=1e-12)
    assert assessment.relative_cost == pytest.approx(cost.step_time_s / baseline.step_time_s, rel=1e-12)


def test_relative_cost_adds_the_memory_penalty_over_capacity():
    hw = hardware(["batch"], memory="1KiB")  # 1,024 B: nothing fits
    fn, cost, baseline = mlp_bp(hw)
    assert cost.capacity_bytes == 1024 and not cost.fits
    assert cost.peak_memory_bytes > 1024
    for penalty in (10.0, 3.0):
        assessment = Assessment(cost, baseline, ideal_step_time_s(fn, 4, hw), memory_penalty=penalty)
        over = penalty * (cost.peak_memory_bytes - 1024) / baseline.peak_memory_bytes
        runtime = cost.step_time_s / baseline.step_time_s
        assert assessment.memory_overflow == pytest.approx(over, rel=1e-12)
        assert assessment.relative_cost == pytest.approx(runtime + over, rel=1e-12)
    assert Assessment(cost, baseline, 0.0).memory_penalty == 10.0  # TOAST's default


def test_efficiency_is_ideal_over_step_time():
    hw = hardware(["batch"])
    fn, cost, baseline = mlp_bp(hw)
    ideal = ideal_step_time_s(fn, 4, hw)
    assessment = Assessment(cost, baseline, ideal)
    assert assessment.efficiency == pytest.approx(ideal / cost.step_time_s, rel=1e-12)
    assert 0 < assessment.efficiency < 1


def test_ideal_step_time_is_total_flops_over_devices_times_peak():
    fn = parse(MATMUL.replace("DT", "f32"))
    # 4,194,304 flops / (8 devices * 1e12 flop/s) = 5.24288e-7 s
    assert ideal_step_time_s(fn, 8, hardware()) == pytest.approx(5.24288e-7, rel=1e-12)
    # the MLP step: evaluate's flop count of the global program, spread over 4 devices
    model = training_step(build("mlp", batch=8, d_in=6, hidden=10, d_out=4))
    total = evaluate(model.function, hardware()).flops
    assert total > 0
    assert ideal_step_time_s(model.function, 4, hardware()) == pytest.approx(total / (4 * PEAK), rel=1e-12)


def test_ideal_step_time_takes_each_ops_dtype_peak():
    text = """
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %c: tensor<64x128xbf16>, %d: tensor<128x256xbf16>)
        -> (tensor<64x256xf32>, tensor<64x256xbf16>) {
      %e = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %f = dot_general(%c, %d) {contract = [[1], [0]]} : tensor<64x256xbf16>
      return %e, %f
    }
    """
    hw = hardware(peaks={"f32": "1TFLOP/s", "bf16": "4TFLOP/s"})
    # (4,194,304 / 1e12 + 4,194,304 / 4e12) / 2 devices = (4.194304e-6 + 1.048576e-6) / 2
    assert ideal_step_time_s(parse(text), 2, hw) == pytest.approx(2.62144e-6, rel=1e-12)
