"""The CP-SAT backend on full-size training steps: model size, build and solve
time, status, and the plan's estimated step time and efficiency against the
best manual schedule (BP, BP+MP, BP+MP+Z3) on the same cost model.

Targets (issue 7): a feasible plan within 60 s on the 32-layer model, at
least as fast (estimated) as the best manual schedule; proven optimal (gap
under 1%) on models up to 8 layers within 60 s.

    python bench/cpsat.py [--json] [--time-limit S] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on sys.path and its costmodel.py would shadow the package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

from costmodel.evaluate import ideal_step_time_s  # noqa: E402
from costmodel.hardware import preset_hardware  # noqa: E402
from costmodel.table import CostTable  # noqa: E402
from ir.autodiff import training_step  # noqa: E402
from ir.core import Mesh  # noqa: E402
from ir.models import transformer  # noqa: E402
from ir.models.presets import PRESETS  # noqa: E402
from ir.nda import analyze  # noqa: E402
from solver.planning.tactics import FIRST_DIVISIBLE, Manual, apply_schedule  # noqa: E402
from solver.search.cpsat import CpSatOptions, solve  # noqa: E402
from solver.search.space import SearchSpace  # noqa: E402

MESHES = {"batch8-model4": dict(batch=8, model=4), "data2-seq8-model4": dict(data=2, seq=8, model=4)}
MODELS = {  # name -> (preset, layers, hardware)
    "gemma_2b": ("gemma_2b", None, "TPUv4"),
    "chinchilla_8l": ("chinchilla_32l", 8, "A100-80GB"),
    "chinchilla_32l": ("chinchilla_32l", None, "A100-80GB"),
}


def manual_schedules(mesh: Mesh, gated: bool) -> dict[str, list]:
    """BP (batch, and sequence on a `seq` axis), + Megatron on `model`, + ZeRO-3 on the batch axis."""
    batch_axis = "batch" if "batch" in mesh.names else "data"
    bp = [Manual(batch_axis, (("batch.tokens", 0),))]
    if "seq" in mesh.names:
        bp.append(Manual("seq", (("batch.tokens", 1),)))
    megatron = {"layers.*.attn.wq": 1, "layers.*.mlp.w_up": 1}
    if gated:
        megatron["layers.*.mlp.w_gate"] = 1
    mp = [Manual("model", tuple(megatron.items()))]
    z3 = [Manual(batch_axis, (("*", FIRST_DIVISIBLE),))]
    return {"BP": bp, "BP+MP": bp + mp, "BP+MP+Z3": bp + mp + z3}


def measure(model_name: str, mesh_name: str, time_limit: float) -> dict:
    preset, layers, hw_name = MODELS[model_name]
    config = dict(PRESETS[preset])
    if layers:
        config["layers"] = layers
    step = training_step(transformer(**config))
    fn = step.function
    nda = analyze(fn, step.params)
    mesh = Mesh.of(**MESHES[mesh_name])
    hardware = preset_hardware(hw_name, mesh.names)
    table = CostTable(fn, nda, mesh, hardware)
    ideal = ideal_step_time_s(fn, mesh.num_devices, hardware)
    manual = {}
    for name, tactics in manual_schedules(mesh, config.get("gated_mlp", False)).items():
        cost = table.evaluate(apply_schedule(nda, mesh, tactics).materialize(nda))
        manual[name] = {"step_time_s": cost.step_time_s, "peak_memory_gib": cost.peak_memory_bytes / 2**30,
                        "fits": cost.fits, "efficiency": ideal / cost.step_time_s}
    fitting = {k: v for k, v in manual.items() if v["fits"]}
    best = min(fitting, key=lambda k: fitting[k]["step_time_s"]) if fitting else None
    space = SearchSpace(nda, apply_schedule(nda, mesh, []), mesh.names, data_inputs=step.inputs,
                        optimizer_state=step.state)
    hint = None
    if best:
        best_plan = apply_schedule(nda, mesh, manual_schedules(mesh, config.get("gated_mlp", False))[best])
        hint = space.point_of(best_plan.materialize(nda))
    start = time.perf_counter()
    result = solve(space, table, CpSatOptions(time_limit_s=time_limit), hint)
    wall = time.perf_counter() - start
    report = result.report
    out = {
        "model": model_name, "mesh": mesh_name, "hardware": hw_name, "ops": len(fn.ops),
        "space_variables": report.space, "cp_variables": report.variables, "cp_constraints": report.constraints,
        "terms": report.terms, "folded": report.folded, "build_s": report.build_s, "solve_s": report.solve_s,
        "wall_s": wall, "status": report.status, "gap": report.gap, "rounds": report.rounds,
        "manual": manual, "best_manual": best,
    }
    if result.cost is not None:
        out.update(step_time_s=result.cost.step_time_s, objective_s=report.objective_s,
                   peak_memory_gib=result.cost.peak_memory_bytes / 2**30, efficiency=ideal / result.cost.step_time_s)
        if best:
            out["speedup_vs_best_manual"] = manual[best]["step_time_s"] / result.cost.step_time_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--only", choices=sorted(MODELS), help="one model only")
    args = parser.parse_args()
    rows = [measure(m, mesh, args.time_limit) for m in MODELS if args.only in (None, m) for mesh in MESHES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        manual = ", ".join(f"{k} {v['step_time_s'] * 1e3:.1f} ms{'' if v['fits'] else ' (does not fit)'}"
                           for k, v in r["manual"].items())
        gap = "n/a" if r["gap"] is None else f"{r['gap']:.2%}"
        print(f"{r['model']} on {r['mesh']} ({r['hardware']}, {r['ops']} ops): {r['status']}, gap {gap}; "
              f"model {r['cp_variables']} variables, {r['cp_constraints']} constraints, {r['terms']} terms "
              f"({r['folded']} folded); build {r['build_s']:.1f} s, solve {r['solve_s']:.1f} s")
        if "step_time_s" in r:
            print(f"  plan: {r['step_time_s'] * 1e3:.1f} ms, efficiency {r['efficiency']:.1%}, "
                  f"peak {r['peak_memory_gib']:.1f} GiB; x{r.get('speedup_vs_best_manual', float('nan')):.3f} "
                  f"vs best manual ({r['best_manual']})")
        print(f"  manual: {manual}")


if __name__ == "__main__":
    main()
