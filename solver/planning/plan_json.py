"""The `shardplan plan --json` object of a plan (schema in docs/json.md):
what the planner decided and what it costs, as plain data; `plan_text`
prints it."""

from __future__ import annotations

from typing import Any

from costmodel.evaluate import COMMUNICATION, Assessment
from costmodel.simulate import Timeline
from ir.sharding import local_type
from solver.planning.pipelining import pipeline_json
from solver.planning.planner import Planned, planned_counts, simulate_planned
from solver.planning.scheme import axis_roles, ring_axes


def plan_report(planned: Planned, solver: str, timeline: Timeline | None = None) -> dict[str, Any]:
    """The `shardplan plan --json` object (schema in docs/json.md); `timeline`:
    the simulated schedule if already made."""
    fn, mesh = planned.model.function, planned.sharding.mesh
    if planned.pipeline is None:
        timeline = timeline or simulate_planned(planned)

    def tensor(name: str, ty, dims) -> dict[str, Any]:
        return {"name": name, "type": str(ty), "sharding": [list(a) for a in dims],
                "local_type": str(local_type(ty, dims, mesh))}

    return {
        "spec": planned.spec.name,
        "source": planned.spec.source,
        "solver": solver,
        "schedule": planned.schedule,
        "notes": list(planned.model.notes),
        "remat": list(planned.remat),
        "remat_search": [{"remat": list(choice), "step_time_s": seconds} for choice, seconds in planned.remat_tried],
        "mesh_search": [],  # `shardplan plan` fills it for a mesh search (solver.planning.meshes)
        "mesh": dict(planned.spec.mesh_obj().axes),
        "plan": planned.plan.to_json(planned.nda),
        "collectives": planned_counts(planned),
        "scheme": axis_roles(planned.model, planned.nda, planned.sharding,
                             ring_axes(planned.lowered.function) if planned.lowered is not None else frozenset()),
        "cost": cost_report(planned.assessment, planned.spec.hardware_name),
        "simulated": None if planned.pipeline is not None else {
            "makespan_s": timeline.makespan_s, "exposed_communication_s": timeline.exposed_communication_s,
            "peak_memory_bytes": timeline.peak_memory_bytes, "prefetch_kernels": timeline.prefetch,
            "efficiency": planned.assessment.ideal_step_time_s / timeline.makespan_s if timeline.makespan_s else 1.0},
        "pipeline": pipeline_json(planned.pipeline, planned.pipeline_cost) if planned.pipeline is not None else None,
        "local_program": {"ops": len(planned.lowered.function.ops) if planned.pipeline is None else
                          sum(len(t.function.ops) for t in planned.pipeline.tasks),
                          "kernels": planned.assessment.cost.kernels, "fused_ops": planned.assessment.cost.fused_ops},
        "params": [tensor(p.name, p.type, d) for p, d in zip(fn.params, planned.lowered.param_dims)],
        "results": [tensor(r.name, r.type, d) for r, d in zip(fn.results, planned.lowered.result_dims)],
        "search": [r.to_json() for r in planned.search],
        "expert_floor": None if planned.floor is None else {
            **planned.floor.to_json(), "kept": planned.floor_kept, "searched_step_time_s": planned.searched_step_s},
        "time_s": dict(planned.seconds),
    }


def cost_report(assessment: Assessment, hardware: str) -> dict[str, Any]:
    """The `cost` object of `shardplan plan --json` (schema in docs/json.md)."""
    cost = assessment.cost
    return {
        "hardware": hardware,
        "step_time_s": cost.step_time_s,
        "compute_s": cost.compute_s,
        "communication_s": cost.communication_s,
        "communication_by_kind_s": {k: cost.seconds_by_kind.get(k, 0.0) for k in COMMUNICATION},
        "peak_memory_bytes": cost.peak_memory_bytes,
        "capacity_bytes": cost.capacity_bytes,
        "fits": cost.fits,
        "flops_per_device": cost.flops,
        "ideal_step_time_s": assessment.ideal_step_time_s,
        "efficiency": assessment.efficiency,
        "unpartitioned_step_time_s": assessment.baseline.step_time_s,
        "unpartitioned_peak_memory_bytes": assessment.baseline.peak_memory_bytes,
        "relative_cost": assessment.relative_cost,
    }
