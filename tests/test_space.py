"""The search space: `SearchSpace.codes`, the fast path every MCTS evaluation
takes, is exactly `materialize` of the point's plan."""

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
from solver.search.space import Point, SearchSpace

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
        sharded = frozenset(v for v in space.variables if rng.random() < 0.5)
        bits = tuple((c, rng.randint(0, 1)) for c in space.free_classes if rng.random() < 0.7)
        yield Point(sharded, bits)


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
    space = SearchSpace(nda, base, axes, data_inputs=model.inputs)
    table = CostTable(model.function, nda, MESH, hardware_for(MESH))
    rng = random.Random(7)
    points = list(random_points(space, rng, 40)) + [Point(frozenset(space.variables), ())]
    for point in points:
        expected = table.codes(space.plan(point).materialize(nda))
        assert np.array_equal(space.codes(point), expected), point
    assert len({space.codes(p).tobytes() for p in points}) > 5  # the points do differ


def test_codes_are_numbered_as_the_cost_table():
    model = training_step(build("mlp", batch=8, d_in=8, hidden=16, d_out=8))
    nda = analyze(model.function, model.params)
    space = SearchSpace(nda, Plan(MESH), MESH.names, data_inputs=model.inputs)
    table = CostTable(model.function, nda, MESH, hardware_for(MESH))
    point = Point(frozenset(space.variables[:2]), ())
    sharding = table.sharding(space.codes(point))
    assert sharding == space.plan(point).materialize(nda)
