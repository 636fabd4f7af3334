"""Expert schedules as points of the search space: for every named schedule
(without an auto tactic) of every bundled spec, the point nearest its plan
(`SearchSpace.point_of`, how a schedule becomes CP-SAT's hint) has a plan
that costs at most what the schedule costs. "Optimal" then means optimal over
a space that holds what experts write, and the CP-SAT hint is the expert's
plan, not a worse neighbour.

No schedule is outside the space (issue 27): ZeRO-2 (parameters whole,
optimizer state sharded) is a point at the OPTIMIZER level, and the pinned
ZeRO-3 schedules whose spread is narrower than a whole color (an MLP with
its hidden dimension on two axes; Llama's GQA `wo`, gathered once before
its reshape) are points at the STORAGE level (`solver.search.zero`)."""

import pytest
from conftest import ROOT

from costmodel.table import CostTable
from ir.models.presets import PRESETS
from solver.planning.floor import manual_schedules
from solver.planning.planner import prepare
from solver.planning.spec import load_spec
from solver.planning.tactics import Pin, apply_schedule
from solver.search.space import SearchSpace
from solver.search.zero import OPTIMIZER, STORAGE

# The mixtures of experts by the smaller of the two (the same layer kinds and schedules; the 32-layer
# Mixtral-shaped table takes 5 s to build).
SPECS = sorted((ROOT / "specs").glob("*.yaml")) + [ROOT / "specs" / "moe" / "deepseek_v3_moe.yaml"]


def nearest_points(spec):
    """Per manual named schedule: (space, cost table, its plan's sharding, its nearest point, that point's sharding)."""
    mesh, hardware = spec.sharding_mesh(), spec.hardware_obj()
    programs, out = {}, {}
    for name in manual_schedules(spec):
        remat = spec.remat(name)
        if remat not in programs:
            prepared = prepare(spec, remat)
            pins = [Pin(prepared.model.pinned)] if prepared.model.pinned else []
            table = CostTable(prepared.model.function, prepared.nda, mesh, hardware)
            space = SearchSpace(prepared.nda, apply_schedule(prepared.nda, mesh, pins), mesh.names,
                                data_inputs=prepared.model.inputs, optimizer_state=prepared.model.state)
            programs[remat] = (prepared, pins, table, space)
        prepared, pins, table, space = programs[remat]
        plan = apply_schedule(prepared.nda, mesh, pins + spec.tactics(name), origins=prepared.model.origins)
        sharding = plan.materialize(prepared.nda)
        point = space.point_of(sharding, dict(plan.resolutions))
        out[name] = (space, table, sharding, point, space.plan(point).materialize(prepared.nda))
    return out


def nearest_point_costs(spec):
    """Per manual named schedule: (its step time, its nearest point's step time, same factor sharding)."""
    return {name: (table.evaluate(sharding).step_time_s, table.evaluate(nearest).step_time_s, nearest == sharding)
            for name, (_, table, sharding, _, nearest) in nearest_points(spec).items()}


# Schedules that draw a layout boundary inside a color (`replicate` of one named value's dimension: expert
# parallelism's all_to_all, docs/specs.md#expert-parallelism). A point of the space decides whole colors, so no
# point has their sharding (the nearest is another layout, cheaper or dearer); when the space learns boundaries
# this list empties.
OUTSIDE = {("deepseek_v3_moe", name) for name in ("EP", "EP+R", "EP+Z3+R")}


# Layers beyond these add nothing here (repeated layers are decided alike) but time: llama2_70b's 80 take 12 s.
MOST_LAYERS = 8


def shortened(spec):
    """The spec with at most MOST_LAYERS layers (the same layer kinds and schedules; a preset
    becomes the transformer builder's arguments)."""
    builder, args = spec.model.builder, spec.model.args
    if spec.model.preset is not None:
        builder, args = "transformer", PRESETS[spec.model.preset]
    if args.get("layers", 0) <= MOST_LAYERS:
        return spec
    model = spec.model.model_copy(update={"preset": None, "builder": builder,
                                          "args": {**args, "layers": MOST_LAYERS}})
    return spec.model_copy(update={"model": model})


@pytest.mark.parametrize("path", SPECS, ids=[s.stem for s in SPECS])
def test_every_named_schedule_is_reached_by_a_point_of_the_space(path):
    spec = shortened(load_spec(path))
    for name, (expert, nearest, same) in nearest_point_costs(spec).items():
        if (path.stem, name) in OUTSIDE:
            assert not same, f"{name}: the space now reaches its sharding: take it off OUTSIDE"
            continue
        assert nearest <= expert * (1 + 1e-9), f"{name}: nearest point {nearest:.6g} s, schedule {expert:.6g} s"


def test_megatron_on_a_deep_mlp_is_a_point_of_the_space_exactly():
    """Alternating column and row sharding repeats every two layers; the space
    finds that period from the program (a color naming two dimensions of one
    parameter group) and holds HP, DP+HP as they are written."""
    costs = nearest_point_costs(load_spec(ROOT / "specs" / "deep_mlp_8192x16.yaml"))
    assert costs["HP"][2] and costs["DP+HP"][2]


def def_axes(space, sharding, name):
    """The mesh axes anywhere in a parameter's sharding."""
    value = space.nda.function.param(name)
    return {a for dims in sharding.def_dims(space.nda, value) for a in dims}


def test_zero2_is_a_point_at_the_optimizer_level_exactly():
    """ZeRO-2 (the optimizer state sharded along the batch axis, the
    parameters and their updates kept whole) is reached at the OPTIMIZER
    level: its nearest point keeps every parameter whole along the batch axis,
    shards every moment along it, and costs what the schedule costs."""
    spec = load_spec(ROOT / "specs" / "transformer.yaml")
    space, table, sharding, point, nearest = nearest_points(spec)["BP+MP+Z2"]
    assert point.partial and {(a, level) for _, a, level in point.partial} == {("batch", OPTIMIZER)}
    model_params = [n for names in space.nda.param_groups for n in names]
    for name in model_params:
        assert "batch" not in def_axes(space, nearest, name)
        for moment in (f"opt.m.{name}", f"opt.v.{name}"):
            assert "batch" in def_axes(space, nearest, moment)
    assert table.evaluate(nearest).step_time_s == pytest.approx(table.evaluate(sharding).step_time_s, rel=1e-12)


def test_pinned_zero3_on_a_model_sharded_dimension_is_a_point_at_the_storage_level_exactly():
    """The MLP's ZeRO-3 puts w2's hidden dimension on (model, batch): the batch
    axis minor, where the reduce_scatter of its gradient puts it. The point
    holds it at the STORAGE level (the parameters, moments and update, not the
    forward's hidden activations) with the axes in that order, and costs what
    the schedule costs (in mesh order, (batch, model), it cost 2.04x)."""
    spec = load_spec(ROOT / "specs" / "mlp.yaml")
    space, table, sharding, point, nearest = nearest_points(spec)["BP+MP+Z3"]
    assert any(a == "batch" and level == STORAGE for _, a, level in point.partial)
    w2 = space.nda.function.param("w2")
    assert nearest.def_dims(space.nda, w2)[0] == sharding.def_dims(space.nda, w2)[0] == ("model", "batch")
    assert table.evaluate(nearest).step_time_s == pytest.approx(table.evaluate(sharding).step_time_s, rel=1e-12)
