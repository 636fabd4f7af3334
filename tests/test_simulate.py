"""The list schedule of a device-local program (costmodel.simulate) and its Chrome trace.

Hand-built programs on the round-figure device of tests/test_costmodel.py
(f32 peak 1 TFLOP/s, HBM 100 GB/s, every link 100 GB/s + 1 us per hop), so
each start time, makespan and memory level below is worked out by hand from
the formulas in costmodel/evaluate.py. Then properties of every schedule on
random programs and lowered random plans, checked by an independent reading
of the module docstring's rules (`check_schedule`).
"""

import json
import random

import pytest
from program_gen import random_program

from costmodel.evaluate import evaluate, kernel_times, peak_memory_bytes
from costmodel.fusion import fuse
from costmodel.hardware import Device, Hardware, Link
from costmodel.simulate import DEFAULT_PREFETCH, Timeline, chrome_trace, simulate
from ir.autodiff import training_step
from ir.core import Function, Mesh
from ir.lower import lower
from ir.models import build
from ir.nda import analyze
from ir.sharding import Decision, materialize
from ir.text import parse

LINK = Link(bandwidth="100GB/s", latency="1us")
T = 4.194304e-6  # a 64x128 @ 128x256 f32 matmul: 2 * 64 * 128 * 256 flops / 1e12 (compute-bound)
ADD = 1.96608e-6  # an add of 64x256 f32: 3 * 65,536 B / 1e11 (memory-bound)
AG8 = 7 / 8 * 131072 / 1e11 + 7e-6  # all_gather to 128x256 f32 on 8 devices: 1.14688e-6 + 7e-6 = 8.14688e-6


def hardware(axes=()) -> Hardware:
    device = Device(name="round", peak_flops={"f32": "1TFLOP/s"}, memory="1GiB", memory_bandwidth="100GB/s")
    return Hardware(name="round", device=device, links={axis: LINK for axis in axes})


def by_name(timeline: Timeline) -> dict:
    return {task.name: task for task in timeline.tasks}


def level_at(timeline: Timeline, t: float) -> int:
    """Live bytes from time t on (the last curve point at or before t)."""
    return [nbytes for time, nbytes in timeline.memory if time <= t][-1]


# ------------------------------------------------------------------ overlap, by hand

OVERLAP = """
func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %ws: tensor<16x256xf32>) -> (tensor<64x256xf32>) mesh<x=8> {
  %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %w = all_gather(%ws) {axes = ["x"], dim = 0} : tensor<128x256xf32>
  %e = dot_general(%a, %w) {contract = [[1], [0]]} : tensor<64x256xf32>
  %f = add(%c, %e) : tensor<64x256xf32>
  return %f
}
"""


def test_all_gather_of_a_parameter_overlaps_an_independent_matmul():
    fn = parse(OVERLAP)
    timeline = simulate(fn, hardware(["x"]))
    tasks = by_name(timeline)
    # c and the all_gather both start at 0 (w's operand is a parameter); e waits for w (AG8 > T).
    assert tasks["%c"].start_s == 0 and tasks["%w"].start_s == 0
    assert tasks["%w"].stream == "comm:x" and tasks["%c"].stream == "compute"
    assert tasks["%e"].start_s == pytest.approx(AG8, rel=1e-12)
    assert tasks["%f"].start_s == pytest.approx(AG8 + T, rel=1e-12)
    # makespan = max(T, AG8) + T + ADD = 14.307264e-6, not the sum 18.501568e-6
    assert timeline.makespan_s == pytest.approx(AG8 + T + ADD, rel=1e-12)
    assert timeline.serial_s == pytest.approx(2 * T + AG8 + ADD, rel=1e-12)
    assert timeline.serial_s == pytest.approx(evaluate(fn, hardware(["x"])).step_time_s, rel=1e-12)
    # the compute stream idles while the all_gather outlasts c: AG8 - T = 3.952576e-6
    assert timeline.exposed_communication_s == pytest.approx(AG8 - T, rel=1e-9)
    assert timeline.critical_path_s == pytest.approx(AG8 + T + ADD, rel=1e-12)  # w -> e -> f


def test_a_collective_waits_for_the_compute_it_reads():
    fn = parse("""
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>) mesh<x=8> {
      %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %r = all_reduce(%c) {axes = ["x"]} : tensor<64x256xf32>
      return %r
    }""")
    timeline = simulate(fn, hardware(["x"]))
    reduce = 2 * 7 / 8 * 65536 / 1e11 + 14e-6  # 1.14688e-6 + 1.4e-5
    assert by_name(timeline)["%r"].start_s == pytest.approx(T, rel=1e-12)
    assert timeline.makespan_s == pytest.approx(T + reduce, rel=1e-12)  # the sum: nothing to overlap
    assert timeline.serial_s == pytest.approx(timeline.makespan_s, rel=1e-12)
    assert timeline.critical_path_s == pytest.approx(timeline.makespan_s, rel=1e-12)
    assert timeline.exposed_communication_s == pytest.approx(reduce, rel=1e-9)


AR_X = 2 * (1 / 2) * 4096 / 1e11 + 2 * 1e-6  # all_reduce of 4 KiB over x (2 devices): 2.04096e-6
AR_Y = 2 * (3 / 4) * 4096 / 1e11 + 2 * 3e-6  # over y (4 devices): 6.06144e-6
AR_XY = 2 * (7 / 8) * 4096 / 1e11 + 2 * 7e-6  # over x and y (8 devices): 14.07168e-6


@pytest.mark.parametrize("first, second, second_start, makespan", [
    (["x"], ["y"], 0.0, AR_Y),  # disjoint axes: their own links, at once
    (["y"], ["x"], 0.0, AR_Y),
    (["y"], ["y"], AR_Y, 2 * AR_Y),  # one link: one after the other
    (["x", "y"], ["x"], AR_XY, AR_XY + AR_X),  # sharing x is enough to queue
])
def test_collectives_share_a_link_only_on_a_common_axis(first, second, second_start, makespan):
    fn = parse(f"""
    func @f(%p: tensor<1024xf32>, %q: tensor<1024xf32>) -> (tensor<1024xf32>, tensor<1024xf32>) mesh<x=2, y=4> {{
      %r = all_reduce(%p) {{axes = {json.dumps(first)}}} : tensor<1024xf32>
      %s = all_reduce(%q) {{axes = {json.dumps(second)}}} : tensor<1024xf32>
      return %r, %s
    }}""")
    timeline = simulate(fn, hardware(["x", "y"]))
    tasks = by_name(timeline)
    assert tasks["%r"].start_s == 0
    assert tasks["%s"].start_s == pytest.approx(second_start, rel=1e-12)
    assert timeline.makespan_s == pytest.approx(makespan, rel=1e-12)
    assert tasks["%r"].stream == "comm:" + ",".join(first)
    assert timeline.streams == tuple(dict.fromkeys(["compute", "comm:" + ",".join(first), "comm:" + ",".join(second)]))


def test_collectives_start_when_ready_not_in_program_order():
    fn = parse("""
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %q: tensor<1024xf32>)
        -> (tensor<64x256xf32>, tensor<1024xf32>) mesh<x=2, y=4> {
      %c = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %r = all_reduce(%c) {axes = ["x"]} : tensor<64x256xf32>
      %s = all_reduce(%q) {axes = ["y"]} : tensor<1024xf32>
      return %r, %s
    }""")
    timeline = simulate(fn, hardware(["x", "y"]))
    tasks = by_name(timeline)
    # s's operand is ready at 0 and y is free: it runs under the matmul, before r (XLA's latency-hiding
    # scheduler moves an async collective's start to where its operand is ready).
    assert tasks["%s"].start_s == 0
    assert tasks["%r"].start_s == pytest.approx(T, rel=1e-12)
    assert timeline.makespan_s == pytest.approx(max(T + 2 * 0.5 * 65536 / 1e11 + 2 * 1e-6, AR_Y), rel=1e-12)


def test_gradient_reductions_overlap_the_backward_that_follows_them():
    # Two layers' gradients: g2 is ready first and its all_reduce runs under the matmul making g1,
    # although in program order the reductions come last (as an optimizer step puts them).
    fn = parse("""
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>, tensor<64x256xf32>) mesh<x=2> {
      %g2 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %g1 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %r1 = all_reduce(%g1) {axes = ["x"]} : tensor<64x256xf32>
      %r2 = all_reduce(%g2) {axes = ["x"]} : tensor<64x256xf32>
      return %r1, %r2
    }""")
    timeline = simulate(fn, hardware(["x"]))
    tasks = by_name(timeline)
    ar = 2 * 0.5 * 65536 / 1e11 + 2 * 1e-6
    assert tasks["%r2"].start_s == pytest.approx(T, rel=1e-12)
    assert tasks["%r1"].start_s == pytest.approx(max(2 * T, T + ar), rel=1e-12)
    assert timeline.makespan_s == pytest.approx(max(2 * T, T + ar) + ar, rel=1e-12)


PREFETCH = """
func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %ws: tensor<16x256xf32>)
    -> (tensor<64x256xf32>, tensor<64x256xf32>, tensor<64x256xf32>, tensor<64x256xf32>) mesh<x=8> {
  %c1 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %c2 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %c3 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %w = all_gather(%ws) {axes = ["x"], dim = 0} : tensor<128x256xf32>
  %e = dot_general(%a, %w) {contract = [[1], [0]]} : tensor<64x256xf32>
  return %c1, %c2, %c3, %e
}
"""


@pytest.mark.parametrize("prefetch, w_start, makespan", [
    # c1, c2, c3 run at 0, T, 2T; w may start once c_(3 - prefetch) has started
    (0, 2 * T, 2 * T + AG8 + T),  # after c3 starts; e waits for w to end at 2T + AG8 > 3T
    (1, T, 4 * T),  # after c2 starts; w ends at T + AG8 < 3T, so e follows c3 at once
    (2, 0.0, 4 * T),  # after c1 starts, at 0
    (3, 0.0, 4 * T),  # three compute kernels precede w: no bound
    (DEFAULT_PREFETCH, 0.0, 4 * T),
])
def test_prefetch_window_holds_a_collective_back(prefetch, w_start, makespan):
    timeline = simulate(parse(PREFETCH), hardware(["x"]), prefetch)
    tasks = by_name(timeline)
    assert [tasks[f"%c{i}"].start_s for i in (1, 2, 3)] == pytest.approx([0, T, 2 * T], rel=1e-12)
    assert tasks["%w"].start_s == pytest.approx(w_start, rel=1e-12, abs=0)
    assert timeline.makespan_s == pytest.approx(makespan, rel=1e-12)
    assert timeline.prefetch == prefetch


def test_prefetch_must_not_be_negative():
    with pytest.raises(ValueError, match="at least 0"):
        simulate(parse(PREFETCH), hardware(["x"]), -1)


def test_a_fused_kernel_runs_where_its_last_op_is():
    # exp fuses into the add (its one use), which reads the matmul: the fusion
    # must run after the dot although its first op comes before it.
    fn = parse("""
    func @f(%x: tensor<64x256xf32>, %a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>) {
      %e = exp(%x) : tensor<64x256xf32>
      %m = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %s = add(%e, %m) : tensor<64x256xf32>
      return %s
    }""")
    assert fuse(fn).kernels == ((0, 2), (1,))
    timeline = simulate(fn, hardware())
    (_, fused, _), _ = kernel_times(fn, hardware())
    assert [t.name for t in timeline.tasks] == ["%m", "fusion(%e..%s, 2 ops)"]
    dot, fusion = timeline.tasks
    assert (fusion.kind, fusion.ops, fusion.stream) == ("fusion", ("%e", "%s"), "compute")
    assert fusion.start_s == pytest.approx(T, rel=1e-12)
    assert timeline.makespan_s == pytest.approx(T + fused, rel=1e-12)


# ------------------------------------------------------------------ memory, by hand

MEMORY = """
func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %w2: tensor<256x8xf32>, %w3: tensor<8x8xf32>,
        %ws: tensor<64x256xf32>, %x: tensor<8x128xf32>) -> (tensor<64x8xf32>, tensor<8x256xf32>) mesh<x=2> {
  %t = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
  %c = dot_general(%t, %w2) {contract = [[1], [0]]} : tensor<64x8xf32>
  %d = dot_general(%c, %w3) {contract = [[1], [0]]} : tensor<64x8xf32>
  %g = all_gather(%ws) {axes = ["x"], dim = 0} : tensor<128x256xf32>
  %e = dot_general(%x, %g) {contract = [[1], [0]]} : tensor<8x256xf32>
  return %d, %e
}
"""
# Bytes: parameters a 32,768 + b 131,072 + w2 8,192 + w3 256 + ws 65,536 + x 4,096 = 241,920;
# t 65,536 (dead once c ends), c 2,048, d 2,048, g 131,072, e 8,192.
PARAMS = 241920


def test_memory_counts_a_prefetched_all_gather_while_it_waits():
    fn = parse(MEMORY)
    prefetched = simulate(fn, hardware(["x"]))
    g = by_name(prefetched)["%g"]
    assert g.start_s == 0  # three compute kernels before it, well inside the window
    assert g.end_s < by_name(prefetched)["%t"].end_s < by_name(prefetched)["%e"].start_s  # done, then waits
    # from 0: parameters + t + g; g still counts after it ends, while t runs
    assert level_at(prefetched, g.end_s) == PARAMS + 65536 + 131072
    # the peak: c starts while t and g are live: 241,920 + 65,536 + 131,072 + 2,048
    assert prefetched.peak_memory_bytes == 440576
    # prefetch 0: g starts with d, after c has ended and freed t. Peak when e runs: 241,920 + d + g + e,
    # which is the program-order peak of evaluate
    held_back = simulate(fn, hardware(["x"]), prefetch=0)
    assert by_name(held_back)["%g"].start_s == by_name(held_back)["%d"].start_s > 0
    assert held_back.peak_memory_bytes == PARAMS + 2048 + 131072 + 8192 == 383232
    assert peak_memory_bytes(fn) == 383232
    for timeline in (prefetched, held_back):
        assert timeline.memory[0][0] == 0 and timeline.memory[-1] == (timeline.makespan_s, PARAMS + 2048 + 8192)
        assert max(nbytes for _, nbytes in timeline.memory) == timeline.peak_memory_bytes


@pytest.mark.parametrize("text, peak", [
    # One fused kernel of five ops; each value is 1 KiB and lives from its op to its use, as
    # evaluate counts it (tests/test_costmodel.py's "dies_after_last_use"): peak x + 2 values = 3 KiB.
    ("""func @f(%x: tensor<256xf32>) -> (tensor<f32>) {
      %a = exp(%x) : tensor<256xf32>
      %b = exp(%a) : tensor<256xf32>
      %c = exp(%b) : tensor<256xf32>
      %d = exp(%c) : tensor<256xf32>
      %r = reduce(%d) {dims = [0]} : tensor<f32>
      return %r
    }""", 3 * 1024),
    # A reshape takes no time, yet its unused 1 KiB result exists beside x for that instant: 2 KiB.
    ("""func @f(%x: tensor<256xf32>) -> (tensor<f32>) {
      %r = reshape(%x) {shape = [16, 16]} : tensor<16x16xf32>
      %s = reduce(%x) {dims = [0]} : tensor<f32>
      return %s
    }""", 2 * 1024),
])
def test_without_communication_the_peak_is_the_program_order_peak(text, peak):
    fn = parse(text)
    timeline = simulate(fn, hardware())
    assert timeline.peak_memory_bytes == peak_memory_bytes(fn) == peak
    assert max(nbytes for _, nbytes in timeline.memory) == peak


def kernels_contiguous(fn: Function) -> bool:
    return all(k[-1] - k[0] + 1 == len(k) for k in fuse(fn).kernels)


def test_without_communication_random_programs_reach_the_program_order_peak():
    """When no kernel's ops have another kernel's ops between them, the compute
    stream runs the ops in program order, so the peaks must agree exactly."""
    compared = 0
    for seed in range(200):  # about a quarter of them qualify
        fn = random_program(seed, 14)
        if not kernels_contiguous(fn):
            continue
        timeline = simulate(fn, hardware())
        assert timeline.peak_memory_bytes == peak_memory_bytes(fn), seed
        assert timeline.makespan_s == pytest.approx(timeline.serial_s, rel=1e-12), seed  # one stream, no gaps
        compared += 1
    assert compared >= 40


# ------------------------------------------------------------------ every schedule keeps the rules


def check_schedule(fn: Function, timeline: Timeline) -> None:
    """The module docstring's rules, read independently of its code."""
    eps = 1e-15
    task_of = {name: task for task in timeline.tasks for name in task.ops}
    producer = {v: task_of[f"%{op.results[0].name}"] for op in fn.ops for v in op.results}
    assert len(timeline.tasks) == len(fuse(fn).kernels)
    for op in fn.ops:
        task = task_of[f"%{op.results[0].name}"]
        for v in op.operands:
            if v in producer and producer[v] is not task:
                assert task.start_s >= producer[v].end_s - eps, f"{task.name} starts before {v.name} is ready"
    compute = sorted((t for t in timeline.tasks if t.stream == "compute"), key=lambda t: (t.start_s, t.end_s))
    comm = [t for t in timeline.tasks if t.stream != "compute"]
    assert all(b.start_s >= a.end_s - eps for a, b in zip(compute, compute[1:])), "compute stream overlaps"
    for j, b in enumerate(comm):
        for a in comm[:j]:
            if set(a.stream[5:].split(",")) & set(b.stream[5:].split(",")):
                apart = b.start_s >= a.end_s - eps or a.start_s >= b.end_s - eps
                assert apart or 0 in (a.duration_s, b.duration_s), f"{a.name} and {b.name} share a link"
    p = timeline.prefetch
    for i, task in enumerate(timeline.tasks):
        before = [t for t in timeline.tasks[:i] if t.stream == "compute"]
        if task.kind == "all_gather" and len(before) > p:
            assert task.start_s >= before[-1 - p].start_s, f"{task.name} runs ahead of its window"
    # a list schedule: every task starts at 0 or when another task starts or ends
    times = {0.0} | {t.start_s for t in timeline.tasks} | {t.end_s for t in timeline.tasks}
    assert all(t.start_s in times for t in timeline.tasks)
    assert timeline.critical_path_s <= timeline.makespan_s * (1 + 1e-12)
    assert timeline.makespan_s <= timeline.serial_s * (1 + 1e-12)
    assert timeline.makespan_s == max((t.end_s for t in timeline.tasks), default=0.0)
    assert timeline.exposed_communication_s <= sum(t.duration_s for t in comm) * (1 + 1e-9) + eps
    params = sum(v.type.num_bytes for v in fn.params)
    kept = sum(v.type.num_bytes for v in dict.fromkeys(fn.results) if v not in set(fn.params))
    assert timeline.memory[0][0] == 0 and timeline.memory[-1][1] == params + kept
    assert all(b[0] >= a[0] for a, b in zip(timeline.memory, timeline.memory[1:]))
    assert timeline.peak_memory_bytes == max(nbytes for _, nbytes in timeline.memory) >= params


@pytest.mark.parametrize("seed", range(40))
def test_random_device_local_programs_keep_the_rules(seed):
    mesh = Mesh.of(a=2, b=3) if seed % 2 else Mesh.of(a=2, b=2, c=2)
    fn = random_program(seed, 24, mesh)
    hw = hardware(mesh.names)
    for prefetch in (0, 2, DEFAULT_PREFETCH):
        timeline = simulate(fn, hw, prefetch)
        check_schedule(fn, timeline)
        assert timeline.serial_s == pytest.approx(evaluate(fn, hw).step_time_s, rel=1e-12, abs=1e-18)


SMALL = dict(layers=2, d_model=8, heads=2, head_dim=4, mlp_hidden=12, vocab=10, seq=4, batch=4)
MODELS = {
    "mlp-train": lambda: training_step(build("mlp")),
    "transformer-train": lambda: training_step(build("transformer", **SMALL)),
}
MESHES = {"2x2": Mesh.of(batch=2, model=2), "2x2x2": Mesh.of(data=2, model=2, seq=2)}


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("model_name", MODELS)
def test_lowered_random_plans_keep_the_rules(model_name, mesh_name):
    """As tests/test_table.py draws plans: a few (color, axis) decisions and resolution bits."""
    model, mesh = MODELS[model_name](), MESHES[mesh_name]
    nda = analyze(model.function, model.params)
    links = {axis: Link(bandwidth=f"{25 * (i + 1)}GB/s", latency="2us") for i, axis in enumerate(mesh.names)}
    hw = hardware().model_copy(update={"links": links})
    rng = random.Random(f"{model_name}/{mesh_name}")
    hidden = 0.0
    for _ in range(4):
        decisions = [Decision(rng.choice(mesh.names), rng.randrange(nda.num_colors)) for _ in range(rng.randint(1, 6))]
        resolutions = {c: rng.randint(0, 1) for c in range(len(nda.resolution_classes))}
        fn = lower(model.function, nda, materialize(nda, mesh, decisions, resolutions)).function
        timeline = simulate(fn, hw)
        check_schedule(fn, timeline)
        assert timeline.serial_s == pytest.approx(evaluate(fn, hw).step_time_s, rel=1e-12)
        hidden += timeline.serial_s - timeline.makespan_s
    assert hidden > 0  # some communication was overlapped


# ------------------------------------------------------------------ the Chrome trace


def assert_slices_do_not_overlap(complete: list) -> None:
    """Each track's slices, as a viewer reads them (microseconds rounded to
    nanoseconds), follow one another without overlapping."""
    for tid in {e["tid"] for e in complete}:
        ns = sorted((round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in complete if e["tid"] == tid)
        assert all(b[0] >= a[0] + a[1] for a, b in zip(ns, ns[1:])), tid


def test_chrome_trace_has_a_track_per_stream_an_event_per_task_and_a_memory_counter():
    timeline = simulate(parse(MEMORY), hardware(["x"]))
    trace = json.loads(json.dumps(chrome_trace(timeline)))
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == ["comm: x", "compute"]
    track = {name: tid for tid, name in names.items()}
    assert all(e["pid"] == 1 and e["tid"] >= 1 for e in events)  # Perfetto mistreats id 0
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline.tasks)
    for event, task in zip(complete, timeline.tasks):
        assert event["name"] == task.name and event["pid"] == 1
        assert event["tid"] == track["compute" if task.stream == "compute" else "comm: x"]
        assert event["ts"] == pytest.approx(task.start_s * 1e6, abs=5e-4)  # microseconds, to the nanosecond
        assert event["dur"] == pytest.approx((task.end_s - task.start_s) * 1e6, abs=1e-3)
        assert event["args"]["kind"] == task.kind and event["args"]["ops"] == list(task.ops)
    assert complete[3]["name"] == "%g" and complete[3]["dur"] == 1.655  # 1,655.36 ns
    assert_slices_do_not_overlap(complete)
    counters = [e for e in events if e["ph"] == "C"]
    assert [c["name"] for c in counters] == ["memory"] * len(timeline.memory)
    for counter, (time_s, nbytes) in zip(counters, timeline.memory):
        assert counter["ts"] == pytest.approx(time_s * 1e6, abs=5e-4)
        assert counter["args"]["GiB"] == pytest.approx(nbytes / 2**30, rel=1e-12)
    assert max(c["args"]["GiB"] for c in counters) == pytest.approx(440576 / 2**30, rel=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_chrome_trace_of_random_programs_is_json_with_well_formed_tracks(seed):
    mesh = Mesh.of(a=2, b=2, c=2)
    fn = random_program(seed, 24, mesh)
    timeline = simulate(fn, hardware(mesh.names))  # kernels of a few nanoseconds: rounding shows
    events = json.loads(json.dumps(chrome_trace(timeline)))["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in complete] == [t.name for t in timeline.tasks]
    assert_slices_do_not_overlap(complete)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute"} | {"comm: " + t.stream[5:] for t in timeline.tasks if t.stream != "compute"}


def test_a_kernel_feeding_a_collective_runs_where_its_operand_is_made():
    # An optimizer step lists the gradient scaling (neg here) after the whole backward; the compute
    # stream runs s2 right after g2, so r2 overlaps g1's matmul.
    fn = parse("""
    func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>) -> (tensor<64x256xf32>, tensor<64x256xf32>) mesh<x=2> {
      %g2 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %g1 = dot_general(%a, %b) {contract = [[1], [0]]} : tensor<64x256xf32>
      %s2 = neg(%g2) : tensor<64x256xf32>
      %s1 = neg(%g1) : tensor<64x256xf32>
      %r2 = all_reduce(%s2) {axes = ["x"]} : tensor<64x256xf32>
      %r1 = all_reduce(%s1) {axes = ["x"]} : tensor<64x256xf32>
      return %r1, %r2
    }""")
    timeline = simulate(fn, hardware(["x"]))
    tasks = by_name(timeline)
    neg = 2 * 65536 / 1e11  # memory-bound: read and write 64 KiB
    ar = 2 * 0.5 * 65536 / 1e11 + 2 * 1e-6
    assert [tasks[n].start_s for n in ("%g2", "%s2", "%g1", "%s1")] == pytest.approx(
        [0, T, T + neg, 2 * T + neg], rel=1e-12)
    assert tasks["%r2"].start_s == pytest.approx(T + neg, rel=1e-12)  # under g1
    assert timeline.makespan_s == pytest.approx(2 * T + 2 * neg + ar, rel=1e-12)
    check_schedule(fn, timeline)
