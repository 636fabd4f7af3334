"""The search space: `SearchSpace.codes`, the fast path every MCTS evaluation
takes, is exactly `materialize` of the point's plan, partial (ZeRO) levels
included."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_table import hardware_for

from costmodel.table import CostTable
from ir.autodiff import training_step
from ir.core import Mesh
from ir.models import build
from ir.nda import analyze
from solver.plan import Plan
from solver.planning.tactics import FIRST_DIVISIBLE, Manual, Replicate, Resolve, apply_schedule
from solver.search.keys import IClassKeys
from solver.search.space import LATE, Point, SearchSpace
from solver.search.zero import OPTIMIZER, STORAGE, WHOLE

MESH = Mesh.of(batch=2, model=2)
SCHEDULES = {  # data input -> tactics before the auto tactic
    "none": lambda data: [],
    "batch": lambda data: [Manual("batch", ((data, 0),))],
    "zero3": lambda data: [Manual("batch", ((data, 0),)), Manual("batch", (("*", FIRST_DIVISIBLE),))],
    "replicate": lambda data: [Replicate("model", ("*w*",))],
}
PROGRAMS = {
    "mlp": (lambda: training_step(build("mlp", batch=8, d_in=8, hidden=16, d_out=8)), "x"),
    "transformer": (lambda: training_step(build("transformer", layers=2)), "batch.tokens"),
    "attention": (lambda: build("simplified_attention", seq=8, d_model=8, d_head=8), "x"),
}


def random_points(space, rng, n):
    for _ in range(n):
        levels = {v: rng.choice((0, *space.options[v])) for v in space.variables if rng.random() < 0.5}
        levels = {v: level for v, level in levels.items() if level}
        if not space.late_order_ok(levels):
            continue
        sharded = frozenset(v for v, level in levels.items() if level == WHOLE)
        partial = frozenset((*v, level) for v, level in levels.items() if level != WHOLE)
        bits = tuple((c, rng.randint(0, 1)) for c in space.free_classes if rng.random() < 0.7)
        yield Point(sharded, bits, partial)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_codes_equal_materialize(program, schedule):
    build_model, data = PROGRAMS[program]
    model = build_model()
    nda = analyze(model.function, model.params)
    tactics = SCHEDULES[schedule](data)
    if schedule == "replicate" and nda.resolution_classes:
        tactics.append(Resolve(((0, 1),)))
    base = apply_schedule(nda, MESH, tactics)
    axes = ("model",) if schedule == "batch" else MESH.names
    space = SearchSpace(nda, base, axes, data_inputs=model.inputs, optimizer_state=model.state)
    table = CostTable(model.function, nda, MESH, hardware_for(MESH))
    rng = random.Random(7)
    points = list(random_points(space, rng, 40)) + [Point(frozenset(space.variables), ())]
    # Materializing only the owners of each key's first I-class (the MCTS's): the same codes.
    folded = space.folded_codes(IClassKeys(space).representatives())
    assert len(folded.size) < len(nda.iclasses)
    for point in points:
        expected = table.codes(space.plan(point).materialize(nda))
        assert np.array_equal(space.codes(point), expected), point
        assert np.array_equal(folded(point), expected), point
        # From a nearby point's passes (a search's successor, or a point with other bits): the same codes.
        for near in (point.without(pair) for pair in sorted(point.levels())):
            assert np.array_equal(space.codes(point, near), expected), (point, near)
            assert np.array_equal(folded(point, near), expected), (point, near)
        assert np.array_equal(space.codes(point, points[0]), expected), point
    assert len({space.codes(p).tobytes() for p in points}) > 5  # the points do differ
    # A training step's space has partial levels (the attention is a forward program: none).
    zero = [p for p in points if any(level < WHOLE for *_, level in p.partial)]
    assert bool(space.partial_variables) == bool(model.state) and bool(zero) == bool(model.state)
    # Every program has a data dimension beside a weight's on the model axis: LATE points were compared.
    if "model" in axes and schedule != "replicate":
        assert any(level == LATE for p in points for *_, level in p.partial)


def test_codes_are_numbered_as_the_cost_table():
    model = training_step(build("mlp", batch=8, d_in=8, hidden=16, d_out=8))
    nda = analyze(model.function, model.params)
    space = SearchSpace(nda, Plan(MESH), MESH.names, data_inputs=model.inputs)
    table = CostTable(model.function, nda, MESH, hardware_for(MESH))
    point = Point(frozenset(space.variables[:2]), ())
    sharding = table.sharding(space.codes(point))
    assert sharding == space.plan(point).materialize(nda)


def test_partial_levels_shard_the_optimizer_side_only():
    """On the MLP's training step along one axis: the OPTIMIZER level of w2's
    output color shards the moments and not w2 (ZeRO-1/2), STORAGE shards w2
    too, and neither shards the forward's output activation; the points are
    distinct plans, each one point of the space."""
    model = training_step(build("mlp", batch=8, d_in=8, hidden=16, d_out=8))
    nda = analyze(model.function, model.params)
    mesh = Mesh.of(x=2)
    space = SearchSpace(nda, Plan(mesh), mesh.names, data_inputs=model.inputs, optimizer_state=model.state)
    fn = model.function
    w2, m = fn.param("w2"), fn.param("opt.m.w2")
    forward = next(i for i, op in enumerate(fn.ops) if op.kind == "dot_general" and w2 in op.operands)
    reads_w2 = nda.use_iclass(forward, list(fn.ops[forward].operands).index(w2), 1)
    group = space.group_of[nda.def_color(w2, 1)]
    assert space.options[(group, "x")] == (OPTIMIZER, STORAGE, WHOLE)
    shardings = {}
    for level in space.options[(group, "x")]:
        point = Point(frozenset({(group, "x")}) if level == WHOLE else frozenset(), (),
                      frozenset() if level == WHOLE else frozenset({(group, "x", level)}))
        plan = space.plan(point)
        shardings[level] = sharding = plan.materialize(nda)
        (decision,) = plan.to_json(nda)["decisions"]  # it names a parameter it shards, not one kept whole
        assert decision["pattern"] == {OPTIMIZER: "opt.m.w2[1]", STORAGE: "w2[1]", WHOLE: "target[1]"}[level]
        assert sharding.def_dims(nda, m)[1] == ("x",)
        assert sharding.def_dims(nda, w2)[1] == (() if level == OPTIMIZER else ("x",))
        assert sharding.axes[reads_w2] == (() if level < WHOLE else ("x",))  # the forward's use of w2
        assert space.point_of(sharding) == point
    assert len(set(shardings.values())) == 3
