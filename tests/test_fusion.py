"""Fusion (costmodel.fusion): which ops run as one kernel, and what a kernel
costs. Figures by hand on the round device of test_costmodel (f32 peak
1 TFLOP/s, HBM 100 GB/s)."""

import pytest
from test_costmodel import HBM, PEAK, hardware

from costmodel.evaluate import evaluate, kernel_times
from costmodel.fusion import FUSION, fuse
from ir.text import parse

CHAIN = """
func @chain(%x: tensor<1024xf32>, %b: tensor<1024xf32>) -> (tensor<1024xf32>) {
  %y = exp(%x) : tensor<1024xf32>
  %z = mul(%y, %y) : tensor<1024xf32>
  %w = add(%z, %x) : tensor<1024xf32>
  %u = add(%w, %b) : tensor<1024xf32>
  return %u
}
"""


def test_a_chain_of_elementwise_ops_is_one_kernel_priced_at_its_boundary():
    fn = parse(CHAIN)
    assert fuse(fn).kernels == ((0, 1, 2, 3),)
    cost = evaluate(fn, hardware())
    # Boundary: exp reads x, add reads x, the last add reads b (3 x 4 KiB), u is returned (4 KiB): 16 KiB.
    # Unfused, every op would read and write its own operands: 8 + 12 + 12 + 12 KiB = 44 KiB.
    flops = 1024 * (1 + 1 + 1 + 1)  # exp counts one flop per element, like every unary op
    assert cost.flops == flops
    assert cost.seconds_by_kind == {FUSION: pytest.approx(max(flops / PEAK, 16384 / HBM), rel=1e-12)}
    assert (cost.kernels, cost.fused_ops) == (1, 4)
    unfused = evaluate(fn, hardware(), fused=False)
    assert unfused.step_time_s == pytest.approx(45056 / HBM, rel=1e-12)  # each op memory-bound on its own
    assert (unfused.kernels, unfused.fused_ops) == (4, 0)


def test_a_value_read_twice_or_returned_is_written_and_ends_its_kernel():
    fn = parse("""
func @f(%x: tensor<1024xf32>) -> (tensor<1024xf32>, tensor<1024xf32>) {
  %y = exp(%x) : tensor<1024xf32>
  %a = neg(%y) : tensor<1024xf32>
  %b = abs(%y) : tensor<1024xf32>
  %c = sqrt(%b) : tensor<1024xf32>
  %d = log(%c) : tensor<1024xf32>
  return %a, %c
}
""")
    # y has two readers, so it is its own kernel; c is returned, so it does not join d.
    assert fuse(fn).kernels == ((0,), (1,), (2, 3), (4,))
    cost = evaluate(fn, hardware())
    # The fused (abs, sqrt): reads y (4 KiB), writes c (4 KiB); 2,048 flops.
    assert cost.seconds_by_kind[FUSION] == pytest.approx(max(2048 / PEAK, 8192 / HBM), rel=1e-12)
    # exp, neg and log alone: each reads 4 KiB and writes 4 KiB.
    assert cost.seconds_by_kind["exp"] == pytest.approx(8192 / HBM, rel=1e-12)
    assert (cost.kernels, cost.fused_ops) == (4, 2)


def test_contractions_stay_kernels_of_their_own():
    fn = parse("""
func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>) {
  %s = neg(%a) : tensor<64x128xf32>
  %c = dot_general(%s, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %d = exp(%c) : tensor<64x256xf32>
  return %d
}
""")
    assert fuse(fn).kernels == ((0,), (1,), (2,))
    assert [kind for kind, _, _ in kernel_times(fn, hardware())] == ["neg", "dot_general", "exp"]


def test_a_collective_inside_a_chain_cuts_its_kernel():
    local = parse("""
func @f(%x: tensor<8x8xf32>) -> (tensor<8x16xf32>) mesh<x=2> {
  %y = exp(%x) : tensor<8x8xf32>
  %g = all_gather(%y) {axes = ["x"], dim = 1} : tensor<8x16xf32>
  %z = neg(%g) : tensor<8x16xf32>
  %u = abs(%z) : tensor<8x16xf32>
  return %u
}
""")
    # y is read by the collective, so it is written; neg and abs still fuse after it.
    assert fuse(local).kernels == ((0,), (1,), (2, 3))
    cost = evaluate(local, hardware(["x"]))
    assert cost.seconds_by_kind[FUSION] == pytest.approx(max(256 / PEAK, 1024 / HBM), rel=1e-12)
    assert (cost.kernels, cost.fused_ops) == (3, 2)
