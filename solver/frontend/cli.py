"""The `shardplan` command line.

Every subcommand prints a readable report, or JSON with `--json` (schemas in
docs/json.md). Bad input (a missing file, malformed IR, an unknown op, a shape
mismatch) is reported in one line naming the file, line and column, with exit
status 1; usage errors exit with 2. A Python traceback means a bug in
shardplan: `--traceback` shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import Any, NoReturn

import numpy as np

from ir import interpret
from ir.core import IRError
from ir.text import parse_file
from solver.search import CPSAT_TIME_LIMIT_S, MCTS_TIME_LIMIT_S

EXIT_INPUT_ERROR = 1
EXIT_NO_PLAN = 3  # compare: a backend returned no plan (the report says why)
EXIT_CHECK_FAILED = 4  # check: a schedule did not produce what its spec expects
EXIT_INTERNAL_ERROR = 70
_DEFAULT_BUDGETS = (f"{CPSAT_TIME_LIMIT_S:g} s for CP-SAT, {MCTS_TIME_LIMIT_S:g} s for the MCTS; both count work, "
                    "not the clock, so a limit gives the same plan on a loaded machine")
# `run` is a semantics check on small shapes; refuse values that would not fit
# comfortably in this machine's memory rather than die in numpy.
MAX_RUN_BYTES = 1 << 30


def version() -> str:
    try:
        return metadata.version("shardplan")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "unknown"


# ------------------------------------------------------------------- run


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _checksum(arrays: Sequence[np.ndarray]) -> dict[str, float | None]:
    total = sum(float(np.sum(a, dtype=np.float64)) for a in arrays)
    abs_total = sum(float(np.sum(np.abs(a.astype(np.float64)))) for a in arrays)
    return {"sum": _finite(total), "abs_sum": _finite(abs_total)}


def run_program(path: str, seed: int) -> dict[str, Any]:
    """Parse, verify and execute an IR file on seeded random inputs.

    A device-local program (one with a mesh) runs on the simulated mesh with
    independent random inputs per device; its checksums add up all devices.
    """
    fn = parse_file(path)
    largest = max(fn.values(), key=lambda v: v.type.num_bytes, default=None)
    if largest is not None and largest.type.num_bytes > MAX_RUN_BYTES:
        raise IRError(
            f"{path}: too large to execute: %{largest.name} is {largest.type} "
            f"({largest.type.num_bytes / 2**30:.1f} GiB); `run` executes small programs, for checking semantics"
        )
    if fn.mesh:
        per_device = [interpret.random_inputs(fn, seed + d) for d in range(fn.mesh.num_devices)]
        inputs = {p.name: [dev[p.name] for dev in per_device] for p in fn.params}
        outputs = interpret.run_spmd(fn, inputs)
    else:
        outputs = [[y] for y in interpret.run(fn, interpret.random_inputs(fn, seed))]
    return {
        "function": fn.name,
        "mesh": dict(fn.mesh.axes),
        "devices": fn.mesh.num_devices,
        "seed": seed,
        "params": len(fn.params),
        "ops": len(fn.ops),
        "outputs": [
            {"name": v.name, "type": str(v.type), "shape": list(v.type.shape), "dtype": v.type.dtype, **_checksum(ys)}
            for v, ys in zip(fn.results, outputs)
        ],
    }


def _fmt(x: float | None) -> str:
    return "non-finite" if x is None else f"{x:.6g}"


def print_run(report: dict[str, Any]) -> None:
    where = f" on mesh {report['mesh']} ({report['devices']} devices)" if report["mesh"] else ""
    print(f"@{report['function']}: {report['params']} inputs, {report['ops']} ops, seed {report['seed']}{where}")
    width = max((len(o["name"]) for o in report["outputs"]), default=0) + 1
    for o in report["outputs"]:
        print(f"  %{o['name']:<{width}} {o['type']:<24} sum={_fmt(o['sum'])}  abs_sum={_fmt(o['abs_sum'])}")


def cmd_run(args: argparse.Namespace) -> int:
    report = run_program(args.file, args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_run(report)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from solver.frontend.explain import color_dot, explain, format_report
    from solver.planning.spec import load_spec

    report, nda = explain(load_spec(args.spec))
    if args.dot is not None:
        print(color_dot(nda, args.dot), end="")
    elif args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report), end="")
    return 0


def _planned(args: argparse.Namespace):
    from ir.lower import LowerOptions
    from solver.planning.planner import SearchOverrides, plan_spec
    from solver.planning.spec import load_spec

    overrides = SearchOverrides(args.time_limit, args.workers, args.seed, args.iterations, args.rerank,
                                getattr(args, "jobs", 1))
    return plan_spec(load_spec(args.spec), args.solver, LowerOptions(reuse_resharded=args.reuse_resharded), overrides,
                     _progress(args), args.schedule, floor=not getattr(args, "no_floor", False))


def _progress(args: argparse.Namespace):
    from solver.search.report import Progress

    return Progress(sys.stderr, enabled=False if args.quiet else None)


def cmd_plan(args: argparse.Namespace) -> int:
    from costmodel.pipeline import schedule_trace
    from costmodel.simulate import chrome_trace
    from ir.lower import LowerOptions
    from solver.planning import meshes
    from solver.planning.plan_json import plan_report
    from solver.planning.plan_text import format_plan
    from solver.planning.planner import SearchOverrides, simulate_planned
    from solver.planning.spec import SpecError, is_mesh_search, parse_yaml, read_spec_text

    if args.grid:
        return _grid(args)
    search = None
    if is_mesh_search(parse_yaml(read_spec_text(args.spec), args.spec)):
        if args.schedule is not None:
            raise SpecError(f"{args.spec}: --schedule: a mesh search (mesh: auto) plans each mesh with the search "
                            "backend; the named schedules that apply to a mesh are its screen and floor")
        overrides = SearchOverrides(args.time_limit, args.workers, args.seed, args.iterations, args.rerank, args.jobs)
        search = meshes.plan_meshes(args.spec, args.solver, LowerOptions(reuse_resharded=args.reuse_resharded),
                                    overrides, _progress(args),
                                    meshes.SEARCHED if args.search_meshes is None else args.search_meshes)
        planned = search.best
    else:
        planned = _planned(args)
    # A pipelined step's timeline is its schedule of stage tasks (costmodel.pipeline).
    timeline = simulate_planned(planned) if planned.pipeline is None else None
    if args.trace:
        trace = chrome_trace(timeline) if timeline else schedule_trace(planned.pipeline_cost.schedule)
        with open(args.trace, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    report = plan_report(planned, args.solver, timeline)
    if search is not None:
        report["mesh_search"] = meshes.mesh_search_json(search)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        table = meshes.format_mesh_search(report["mesh_search"], search.devices) if search is not None else ""
        print(table + format_plan(report), end="")
    return 0


def _grid(args: argparse.Namespace) -> int:
    from ir.lower import LowerOptions
    from solver.planning.grid import format_grid, grid_json, plan_grid
    from solver.planning.planner import SearchOverrides
    from solver.planning.spec import SpecError

    if args.schedule is not None or args.trace:
        raise SpecError(f"{args.spec}: --grid prices every mesh and microbatch count; it takes no --schedule "
                        "or --trace (plan one configuration for those)")
    start = time.perf_counter()
    overrides = SearchOverrides(args.time_limit, args.workers, args.seed, args.iterations, args.rerank)
    rows = plan_grid(args.spec, args.solver, args.stages, args.microbatches,
                     LowerOptions(reuse_resharded=args.reuse_resharded), overrides, _progress(args))
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(grid_json(rows, args.spec, args.solver, seconds), indent=2))
    else:
        print(format_grid(rows, args.spec, seconds), end="")
    return 0


def cmd_lower(args: argparse.Namespace) -> int:
    from ir.pipeline import pipeline_text
    from ir.text import print_function

    planned = _planned(args)
    text = print_function(planned.lowered.function) if planned.pipeline is None else pipeline_text(planned.pipeline)
    _emit(text, args.output)
    return 0


def _emit(text: str, output: str | None) -> None:
    """Write `text` to the file `output`, or print it when there is none."""
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")


def cmd_export(args: argparse.Namespace) -> int:
    from ir.pipeline import PIPELINE
    from solver.frontend.export import export_json, export_python
    from solver.planning.plan_json import plan_report
    from solver.planning.spec import SpecError

    planned = _planned(args)
    accumulated = planned.pipeline is not None and planned.pipeline.stages == 1
    if accumulated:  # the shardings hold for every microbatch: the plan shards a microbatch's batch
        print(f"shardplan: note: the plan accumulates gradients over {planned.pipeline.microbatches} microbatches: "
              "jit one microbatch's step with these shardings (the batch dimension is the microbatch's) and sum "
              "the gradients in the training loop", file=sys.stderr)
    elif planned.pipeline is not None:
        raise SpecError(f"{args.spec}: export hands jax.jit one SPMD program, and a pipelined plan is one program "
                        f"per stage (MPMD): export the stages' own axes (the mesh without {PIPELINE!r}), or see "
                        "them with shardplan lower")
    report = plan_report(planned, args.solver)
    cost = report["cost"]
    if not cost["fits"]:  # still a plan, but the user should know before handing it to jax.jit
        print(f"shardplan: warning: the plan does not fit in memory: peak {cost['peak_memory_bytes'] / 2**30:.3g} "
              f"GiB per device, capacity {cost['capacity_bytes'] / 2**30:.3g} GiB (see shardplan plan)",
              file=sys.stderr)
    if args.format == "mlir":
        from solver.frontend.annotate import annotate_planned

        try:
            text = annotate_planned(planned)
        except ValueError as exc:
            raise IRError(str(exc)) from exc
    else:
        text = json.dumps(export_json(report), indent=2) + "\n" if args.format == "json" else export_python(report)
    _emit(text, args.output)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from solver.frontend.compare import BACKENDS, compare, format_compare
    from solver.planning.planner import SearchOverrides
    from solver.planning.spec import load_spec

    spec = load_spec(args.spec)
    overrides = SearchOverrides(args.budget, args.workers, args.seed, args.iterations, args.rerank)
    report = compare(spec, overrides, _progress(args), args.schedule, floor=not args.no_floor)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_compare(report, spec.source), end="")
    return EXIT_NO_PLAN if any("error" in report[s] for s in BACKENDS) else 0


def cmd_check(args: argparse.Namespace) -> int:
    from solver.frontend.check import check, check_report, format_check

    start = time.perf_counter()
    results = check(args.specs)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(check_report(results, seconds), indent=2))
    else:
        print(format_check(results, seconds), end="")
    if any(r.error is not None for r in results):
        return EXIT_INPUT_ERROR
    return 0 if all(r.passed for r in results) else EXIT_CHECK_FAILED


def cmd_iopddl_solve(args: argparse.Namespace) -> int:
    from solver.iopddl import SolveOptions, read_problem, solve

    start = time.perf_counter()
    problem = read_problem(args.file)
    read_s = time.perf_counter() - start
    progress = None if args.quiet or not sys.stderr.isatty() else (
        lambda line: print(f"\r{line}", end="", file=sys.stderr, flush=True))
    options = SolveOptions(args.time_limit, args.workers, args.seed, args.max_rounds, wcsp=args.wcsp,
                           wcsp_backtracks=args.wcsp_backtracks)
    result = solve(problem, options, progress)
    if progress is not None:
        print(file=sys.stderr)
    report = {"instance": problem.name, "file": args.file, "nodes": problem.num_nodes, "edges": problem.num_edges,
              "usage_limit": problem.usage_limit, "read_s": read_s, **result.to_json()}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"instance": problem.name, "cost": result.evaluation.cost,
                       "strategies": list(result.strategies)}, f)
            f.write("\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        ev = result.evaluation
        print(f"{args.file}: {problem.name}, {problem.num_nodes} nodes, {problem.num_edges} edges "
              f"(read in {read_s:.1f} s)")
        print(f"{result.message}: cost {ev.cost:,}, peak usage {ev.peak:,} of {problem.usage_limit:,}, "
              f"{result.seconds:.1f} s ({result.rounds} neighbourhoods, {result.improvements} improved"
              + (f"; LP rounding {result.lp_cost:,}" if result.lp_cost is not None else "")
              + (f"; toulbar2 {result.wcsp_cost:,}" if result.wcsp_cost is not None else "") + ")")
        print(" ".join(map(str, result.strategies)))
    return 0 if result.evaluation.feasible else EXIT_INPUT_ERROR


def cmd_iopddl_eval(args: argparse.Namespace) -> int:
    from solver.iopddl import evaluate, read_problem, read_solution

    problem = read_problem(args.file)
    ev = evaluate(problem, read_solution(args.solution))
    if args.json:
        print(json.dumps({"instance": problem.name, **ev.to_json()}, indent=2))
    else:
        state = "feasible" if ev.feasible else "INFEASIBLE"
        where = f"; usage over the limit first at step {ev.first_violation}" if ev.first_violation is not None else ""
        forbidden = f"; {ev.forbidden} forbidden choice(s)" if ev.forbidden else ""
        print(f"{problem.name}: {state}: cost {ev.cost:,}, peak usage {ev.peak:,} of {problem.usage_limit:,}"
              f"{where}{forbidden}")
    return 0 if ev.feasible else EXIT_INPUT_ERROR


def cmd_version(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"shardplan": version(), "python": sys.version.split()[0], "numpy": np.__version__}))
    else:
        print(f"shardplan {version()}")
    return 0


# ------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardplan",
        description="Decide how to shard an ML program over a device mesh, and show the consequences.",
    )
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("version", help="print the shardplan version")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_version)

    p = sub.add_parser(
        "run",
        help="parse, verify and execute an IR program on seeded random inputs",
        description="Parse, verify and execute an IR program (.ir text) on seeded random inputs, "
        "printing each output's type and checksums. Device-local programs (with a mesh) "
        "run on the simulated mesh.",
    )
    p.add_argument("file", help="IR text file, e.g. examples/mlp.ir")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "explain",
        help="Named Dimension Analysis of a spec's program: colors, conflicts, compatibility sets",
        description="Build the spec's program and report its Named Dimension Analysis: colors (dimension "
        "sets sharded together), sharding conflicts, compatibility sets, resolution classes and parameter "
        "groups.",
    )
    p.add_argument("spec", help="YAML spec, e.g. specs/mlp.yaml")
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
    p.add_argument("--dot", type=int, metavar="COLOR", help="print the Graphviz DOT graph of one color instead")
    p.set_defaults(func=cmd_explain)

    for name, func, summary in (
        ("plan", cmd_plan, "run the spec's schedule and report the plan and its collectives"),
        ("lower", cmd_lower, "print the device-local program of the spec's plan, collectives explicit"),
    ):
        p = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        _plan_arguments(p)
        p.add_argument("--reuse-resharded", action="store_true",
                       help="keep resharded values (e.g. all_gathered parameters) for later uses instead of "
                       "resharding at each use")
        if name == "plan":
            p.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
            p.add_argument("--trace", metavar="FILE",
                           help="write the simulated schedule as a Chrome trace (open in ui.perfetto.dev; "
                           "docs/trace.md)")
            p.add_argument("--grid", action="store_true",
                           help="a mesh search's DistIR grid: every data x tensor x pipeline split and microbatch "
                           "count, sorted by step time (docs/specs.md)")
            p.add_argument("--search-meshes", type=int, metavar="N",
                           help="a mesh search with more candidate meshes than N screens each with the plans it "
                           "has (its named schedules, the best searched plan) and searches the N best (default 4)")
            p.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                           help="N processes (default 1; Linux's fork) for a mesh search's screen of its "
                           "candidate meshes and its searches after the first, for scoring the plans a pipelined "
                           "spec re-ranks, and for pricing the MCTS's candidate plans: the same answer (of equally "
                           "fast plans, a mesh search may answer with another)")
            p.add_argument("--stages", type=_int_list, default=(1, 2, 4), metavar="LIST",
                           help="--grid: the pipeline stage counts, e.g. 1,2,4 (default) or 1-8")
            p.add_argument("--microbatches", type=_int_list, default=tuple(range(1, 33)), metavar="LIST",
                           help="--grid: the microbatch counts, e.g. 1-32 (default) or 1,2,4,8")
        else:
            p.add_argument("-o", "--output", metavar="FILE", help="write the program to FILE")
        p.set_defaults(func=func)

    _export_parser(sub)

    summary = "plan the spec with CP-SAT and with MCTS on the same cost model and compare the plans"
    p = sub.add_parser("compare", help=summary, description=summary[0].upper() + summary[1:] + ".")
    p.add_argument("spec", help="YAML spec, e.g. specs/transformer.yaml")
    _schedule_argument(p)
    p.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                   help="time limit of each backend on each auto tactic "
                        f"(default: the spec's, else {_DEFAULT_BUDGETS})")
    _search_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON: {\"cpsat\": ..., \"mcts\": ...} (docs/json.md)")
    p.set_defaults(func=cmd_compare)

    _iopddl_parser(sub)

    summary = "check that each spec's named schedules produce the collective counts and memory fit they expect"
    p = sub.add_parser("check", help=summary, description=summary[0].upper() + summary[1:] + ". Exit 0 when "
                       "all do, 4 when one does not, 1 when a spec cannot be read or planned.")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files or directories of them, e.g. specs/")
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
    p.set_defaults(func=cmd_check)
    return parser


def _iopddl_parser(sub) -> None:
    summary = "the IOPDDL auto-sharding benchmark format: solve an instance or evaluate a solution"
    p = sub.add_parser("iopddl", help=summary, description=summary[0].upper() + summary[1:] + ".")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    s = verbs.add_parser("solve", help="solve an instance (.json or .json.gz) within a time limit",
                         description="Solve an IOPDDL instance: presolve, a least-memory start improved greedily, "
                         "nodes that a neighbour determines absorbed into it, then, when the problem is small, its LP "
                         "relaxation rounded and repaired to fit memory and one CP-SAT model of the whole problem, "
                         "else toulbar2 on the whole problem (memory imposed exactly at the steps that overflow, or "
                         "priced node by node; needs pytoulbar2) and then CP-SAT on neighbourhoods of the "
                         "incumbent, until the time limit. "
                         "Prints the cost, feasibility and time, then the strategy list (one index per node). "
                         "Exit 1 when no feasible solution was found.")
    s.add_argument("file", help="instance, e.g. ../shared/iopddl/asplos-2025-iopddl-B.json.gz")
    s.add_argument("--time-limit", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="wall-clock limit of the solve after reading (default 60)")
    s.add_argument("--workers", type=_positive_int, default=1, help="CP-SAT workers (default 1)")
    s.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    s.add_argument("--max-rounds", type=_positive_int, metavar="N",
                   help="stop after N neighbourhoods (with --workers 1 and --wcsp-backtracks or --wcsp off, "
                   "a reproducible search)")
    s.add_argument("--wcsp", choices=("auto", "off"), default="auto",
                   help="toulbar2 on the whole problem before the neighbourhoods: auto (when pytoulbar2 is "
                   "installed and the problem is too large for one CP-SAT model) or off")
    s.add_argument("--wcsp-backtracks", type=_positive_int, metavar="N",
                   help="bound each toulbar2 solve by N backtracks instead of time (reproducible)")
    s.add_argument("--out", metavar="FILE", help="write {\"instance\", \"cost\", \"strategies\"} to FILE")
    s.add_argument("--quiet", action="store_true", help="no progress line on the terminal")
    s.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
    s.set_defaults(func=cmd_iopddl_solve)
    e = verbs.add_parser("eval", help="evaluate a solution: exact cost, peak usage, feasibility",
                         description="Evaluate a solution of an IOPDDL instance exactly: its cost (unbounded "
                         "integer sum), the peak usage and, if infeasible, the first time step over the limit "
                         "and the forbidden choices. Exit 1 when it is infeasible.")
    e.add_argument("file", help="instance (.json or .json.gz)")
    e.add_argument("solution", help="JSON list of strategy indices, or the object `solve --out` writes")
    e.add_argument("--json", action="store_true", help="print JSON (schema in docs/json.md)")
    e.set_defaults(func=cmd_iopddl_eval)


def _export_parser(sub) -> None:
    summary = "export the spec's plan as JAX shardings: a PartitionSpec per argument and result, and the mesh"
    p = sub.add_parser("export", help=summary, description=summary[0].upper() + summary[1:] + ". The plan is "
                       "the one `shardplan plan` makes with the same options.")
    _plan_arguments(p)
    p.add_argument("--format", choices=("python", "json", "mlir"), default="python",
                   help="python (default): a snippet defining mesh, in_shardings and out_shardings to paste "
                   "before jax.jit(f, in_shardings=..., out_shardings=...); json: the same as data (docs/json.md); "
                   "mlir: for an imported spec (model.stablehlo), its module with the whole plan as Shardy "
                   "annotations (every value of @main constrained), which XLA compiles as planned")
    p.add_argument("-o", "--output", metavar="FILE", help="write the snippet (or JSON) to FILE")
    # Lowering options change collectives, not the shardings of arguments and results.
    p.set_defaults(func=cmd_export, reuse_resharded=False)


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    """The spec and the options that choose its plan, shared by plan, lower and export."""
    p.add_argument("spec", help="YAML spec with a schedule, e.g. specs/mlp.yaml")
    _schedule_argument(p)
    p.add_argument("--solver", choices=("none", "cpsat", "mcts"), default="none",
                   help="none (default): run the schedule as written; cpsat or mcts: run its auto tactics "
                   "with that backend or, if it has none, search every mesh axis (the schedule becomes "
                   "CP-SAT's hint)")
    p.add_argument("--time-limit", type=_positive_float, metavar="SECONDS",
                   help=f"time limit of each auto tactic (default: the spec's, else {_DEFAULT_BUDGETS})")
    _search_arguments(p)


def _schedule_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", metavar="NAME",
                   help="a named schedule of the spec (under schedules:); default: the spec's schedule:, "
                   "else its first named one")


def _search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iterations", type=_positive_int, metavar="N",
                   help="MCTS trajectories (default: the spec's, else 200)")
    p.add_argument("--workers", type=_positive_int, help="CP-SAT workers (default: the spec's, else 1)")
    p.add_argument("--rerank", type=_positive_int, metavar="K",
                   help="CP-SAT: find the K best distinct plans and keep the one with the shortest simulated "
                   "step time (with overlap); default: the spec's, else 1 (the proven optimum as it is)")
    p.add_argument("--seed", type=int, help="search seed (default: the spec's, else 0)")
    p.add_argument("--no-floor", action="store_true",
                   help="do not price the spec's named schedules first: by default a search starts from the "
                   "fastest that fits and keeps it when no searched plan is faster (the expert floor)")
    p.add_argument("--quiet", action="store_true", help="no progress line on the terminal during the search")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    """`1,2,4` or `1-32` (or both: `1,4-8`): positive integers, in order."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first = _positive_int(low.strip())
        last = _positive_int(high.strip()) if high else first
        if last < first:
            raise argparse.ArgumentTypeError(f"empty range {part!r}")
        out += [n for n in range(first, last + 1) if n not in out]
    return tuple(out)


# The cyclic collector's thresholds while a command runs (`_fewer_collections`); the test suite and the
# benchmarks that time stages in-process use them too, so that they time what the command runs.
GC_THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def _fewer_collections(restore: bool = True) -> Iterator[None]:
    """Run the cyclic garbage collector a hundred times less often. A large
    program is millions of small acyclic objects (ops, values, types), freed
    by reference counting as they go; at Python's default thresholds the
    collector rescans them thousands of times while a program is built,
    lowered and priced (a third of the time of pricing Megatron's 1T
    configuration, for no memory back). Not `restore`: the thresholds are
    left raised, for a process about to end (`run`): restored, they start
    a full collection of everything the command built (unet's MCTS plan:
    0.45 s)."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        if restore:
            gc.set_threshold(*before)


def main(argv: Sequence[str] | None = None, *, leaving: bool = False) -> int:
    """The command `argv` asks for (default: the process's arguments); its
    exit status. `leaving`: the process ends right after (`run`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        with _fewer_collections(restore=not leaving):
            return args.func(args)
    except IRError as err:
        print(f"shardplan: error: {err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except NotImplementedError as err:
        print(f"shardplan: not implemented yet: {err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except OSError as err:
        print(f"shardplan: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except Exception as err:  # a bug in shardplan, not in the input
        if args.traceback:
            raise
        print(f"shardplan: internal error: {type(err).__name__}: {err} (rerun with --traceback)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def run() -> NoReturn:
    """The `shardplan` command: `main`, then `leave`."""
    leave(main(leaving=True))


def leave(code: int | None) -> NoReturn:
    """End the process with `code` once its output is flushed, without
    freeing what it built. A plan at scale is millions of small objects (the
    program, its analysis, the prices kept), and freeing them one by one at
    exit takes seconds (GPT 529.6B's mesh search: 2.4 s) for memory the
    operating system takes back at once; clang skips it too
    (`-disable-free`). Nothing is left to an exit hook: files are written
    and closed where they are made, and the processes forked for `--jobs`
    have been waited for."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say there
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    run()
