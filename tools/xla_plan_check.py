"""Does XLA run the plan shardplan chose? For each fixture and plan, compile
the annotated module (the plan written back as Shardy annotations,
`solver.frontend.annotate`) on 8 XLA CPU devices, run it on the fixture's inputs,
and compare XLA's collectives with shardplan's, kind by kind.

    python tools/xla_plan_check.py                   # print the table
    python tools/xla_plan_check.py --write-docs      # and write it into docs/xla_comparison.md
    python tools/xla_plan_check.py --only gpt2_train --json

Needs jax (the `jax` extra), not the libraries the fixtures came from: the
module text and the .npz inputs are committed. Figures per fixture and plan
(`BP`: the spec's batch-parallel schedule, `EP` for moe_train_ep, the same
flax MoE step on a mesh with an expert axis, and for moe_grouped_train_ep,
the MoE routed in GShard's groups, its experts' inputs moved by all_to_all; `CP-SAT`: `--solver cpsat` on
the spec's A100 figures with 75% (else 90%) of the replicated program's
peak memory, see `tight_spec`):
  ops        shardplan's collectives of the kind in the device-local program;
             XLA's tensors moved by ops of the kind (XLA combines several
             all-reduces into one op of a tuple)
  bytes      the operands' bytes on one device, summed over those collectives
  max |diff| between the sharded run and jax's unsharded outputs
A difference is explained in NOTES (below) or printed as unexplained. A table
of every plan's bytes (all kinds together, XLA's over the plan's) follows,
with the shardings XLA kept as planned (`solver.frontend.hlo_shardings`, on
the module XLA dumps after Shardy's propagation for each compilation):
arguments, results and constrained values of @main's body that agree, of
those compared; the ones that do not are listed under it.

Mid-size (MIDSIZE): a 0.5B HF Flax Llama, its CP-SAT plan at a quarter of
its replicated peak memory, compiled by XLA from shapes and not run; its
module is generated (`tools/export_real_fixtures.py --llama-500m`), and the
row is skipped, saying so, where it is missing.

XLA_FLAGS must give 8 host devices before jax is imported, so run this as a
process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from costmodel.hardware import PRESETS  # noqa: E402
from ir.lower import LowerOptions  # noqa: E402
from ir.ops import get  # noqa: E402
from solver.frontend.annotate import annotate_planned  # noqa: E402
from solver.frontend.hlo_shardings import check_shardings, dumped_modules  # noqa: E402
from solver.frontend.jax_bridge import auto_mesh, compile_annotated, xla_collectives  # noqa: E402
from solver.planning.planner import SearchOverrides, plan_spec, prepare  # noqa: E402
from solver.planning.spec import load_spec, parse_spec  # noqa: E402
from solver.search.report import NoPlanFits  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
PROGRAMS = ["real/gpt2_train", "real/gpt2_dropout_train", "real/llama_train", "real/gemma_train",
            "real/cnn_train", "real/mlp_train_flax", "real/scan_train", "real/gpt2_decode", "real/moe_train",
            "real/multisteps_train", "real/cond_train", "real/moe_train_ep", "real/moe_grouped_train",
            "real/moe_grouped_train_ep"]
# The named schedule each program is planned with besides CP-SAT (default BP) and the fixture whose inputs it runs.
NAMED = {"real/moe_train_ep": "EP", "real/moe_grouped_train_ep": "EP"}
INPUTS = {"real/moe_train_ep": "real/moe_train", "real/moe_grouped_train_ep": "real/moe_grouped_train"}
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
DOC = ROOT / "docs" / "xla_comparison.md"
MEMORY_FRACTIONS = (0.75, 0.9)  # of the replicated peak, for the CP-SAT plans (see tight_spec)
# Mid-size programs, compiled from shapes and not run (too large to commit: made by
# `.venv-dev/bin/python tools/export_real_fixtures.py --llama-500m bench/data/llama_500m_train.mlir`).
MIDSIZE = {"llama_500m": ROOT / "bench" / "data" / "llama_500m_train.yaml"}
MIDSIZE_FRACTIONS = (0.25, 0.5, 0.75)  # a 0.5B step's weights and Adam state: a quarter of its replicated peak
JNP_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64, "i32": jnp.int32,
              "i64": jnp.int64, "i1": jnp.bool_, "u32": jnp.uint32, "i8": jnp.int8, "u8": jnp.uint8}
BEGIN, END = "<!-- xla-comparison:begin -->", "<!-- xla-comparison:end -->"

# (program, plan, kind) -> why XLA's figure differs from shardplan's.
TIED = ("the tied embedding's gradient sums the lookup's scatter and the output projection's dot, each partial over "
        "batch: shardplan adds the partial terms and all-reduces once, XLA all-reduces each term (+1 tensor, +8,192 "
        "bytes: the 64 x 32 f32 table)")
CNN = "CP-SAT, 75% memory"
GLU = ("under Megatron-style sharding (heads and the MLP's hidden over model) the cotangent of each block's input "
       "sums its projections' cotangents, each partial over model: shardplan adds them and all-reduces once per "
       "block, XLA all-reduces each term at its dot")
MID, MID_PLAN = "llama_500m", "CP-SAT, 25% memory, reused"
GEP = "moe_grouped_train_ep"
NOTES: dict[tuple[str, str, str], str] = {
    ("gpt2_train", "BP", "all_reduce"): TIED,
    ("gpt2_dropout_train", "BP", "all_reduce"): TIED,
    ("gemma_train", "BP", "all_reduce"): TIED,
    ("scan_train", "BP", "all_reduce"): TIED + "; the 36 per-layer gradient tensors are all-reduced inside the "
    "backward while loop, which XLA keeps (3 trips of 12)",
    ("scan_train", "CP-SAT, 75% memory", "all_reduce"): "XLA keeps the scanned layers as a while loop, whose body's "
    "values the annotations cannot reach (only @main's are constrained): inside it XLA's propagation splits the "
    "attention heads over model too, where the plan splits only the MLP's hidden (and the attention weights' "
    "update), so each of the 3 trips all-reduces the attention's output and its q, k and v cotangents besides the "
    "MLP's two: 6 per trip where the plan has 2 per layer",
    ("llama_train", CNN, "all_reduce"): GLU + ": q, k and v (+2 per layer) and SwiGLU's gate and up (+1 per "
    "layer), 2 layers: +6 tensors of 16,384 bytes",
    ("gemma_train", CNN, "all_reduce"): "the plan shards the tied embedding over its vocabulary: XLA looks each "
    "token's row up where it lies and all-reduces the rows (+1 tensor, 16,384 bytes), where shardplan gathers the "
    "table (4,096 bytes, the all_gather row), and picks each label's logit where it lies and all-reduces it (+1, 480 "
    "bytes), where shardplan gathers the logits (15,360 bytes); and " + GLU + " (GeGLU's gate and up, +1 per "
    "layer, 2 layers). In all 132,512 bytes against the 102,336 planned, gathers included",
    ("gemma_train", CNN, "all_gather"): "none: XLA replaces both planned gathers (the vocabulary-sharded table before "
    "the lookup, the logits before the labels' pick) by local lookups and all-reduces (the all_reduce row)",
    ("moe_train", "BP", "all_reduce"): TIED,
    ("moe_train", "BP", "all_gather"): "XLA gathers the router's probabilities whole (a 128 x 4 f32 result, +512 "
    "bytes) and runs its TopK on every device: its SPMD partitioner does not split a TopK along the tokens, which "
    "the plan keeps local (sort's other dimensions are parallel). The other gather is the planned one: the choices, "
    "for the capacity's cumulative sum over the whole batch",
    ("moe_train_ep", "EP", "all_reduce"): TIED + "; the tokens' cotangent sums two terms each partial over expert "
    "(the dispatch's and the router's: both contract the experts dimension): shardplan adds them and all-reduces "
    "once, XLA all-reduces each (+1 tensor, +4,096 bytes); and XLA all-reduces the softmax cotangent's second sum "
    "as 32 values where shardplan all-reduces it as 32 x 2 (-128 bytes)",
    ("moe_train_ep", "EP", "all_gather"): "as many gathers, other ones: XLA gathers the router's probabilities over "
    "expert once for its TopK, where shardplan gathers them once per reader (the values' sort and the indices' "
    "argsort, -256 bytes), and gathers them over batch too (the 128 x 4 result, +512 bytes): its SPMD partitioner "
    "does not split a TopK along the tokens (moe_train's BP row). The choices' gather over batch, for the capacity's "
    "cumulative sum, is the planned one; no all_to_all on either side (the capacity is the whole batch's, so the "
    "experts' inputs are a contraction over the tokens: all-reduced over batch, not moved)",
    ("moe_grouped_train", "BP", "all_reduce"): TIED,
    ("moe_grouped_train", "BP", "all_gather"): "XLA gathers the router's probabilities whole over batch (the 8 x 16 "
    "x 4 result of a 2 x 16 x 4 shard, 512 bytes) for its TopK, which its SPMD partitioner does not split along the "
    "sequences (moe_train's BP row); the plan routes each device's sequences where they lie. Routed in groups, the "
    "plan gathers nothing else: each sequence counts its own slots (moe_train gathers the choices for that)",
    (GEP, "EP", "all_reduce"): TIED,
    (GEP, "EP", "all_gather"): "XLA gathers the router's probabilities over all 8 devices for its TopK (256 bytes; "
    "moe_train's BP row), and for the tokens' cotangent through the dispatch (dispatch^T . the experts' inputs' "
    "cotangent) it gathers both operands over expert, the dispatch tensor along the groups (2,560 bytes) and the "
    "inputs' cotangent along the experts (5,120 bytes), and computes it whole per pair: nothing left to reduce (the "
    "reduce_scatter row). It does not gather the output's cotangent, which the plan gathers over expert (2,048 "
    "bytes) to compute the experts' outputs' cotangent in the experts' layout (the all_to_all row)",
    (GEP, "EP", "reduce_scatter"): "none: the plan computes the tokens' cotangent through the dispatch in the experts' "
    "layout, partial over expert, and reduce-scatters it to the groups (4,096 bytes); XLA gathers its operands "
    "instead (the all_gather row)",
    (GEP, "EP", "all_to_all"): "as many bytes, other tensors: the forward's two are the plan's (the experts' inputs "
    "swapped from the groups to the experts, their outputs swapped back: 5,120 bytes each, in two pieces, one per "
    "expert rank); in the backward XLA computes the cotangent of the outputs as the combine reads them where the "
    "tokens lie and moves it to the experts (GShard's backward all-to-all, 5,120 bytes), where the plan moves the "
    "combine and dispatch tensors to the experts' layout (2 x 2,560 bytes) and computes the cotangents there",
    (MID, MID_PLAN, "all_reduce"): GLU + ": q, k and v (+2 per layer) and SwiGLU's gate and up (+1 per layer), 8 "
    "layers: +24 tensors of 16.8 MB; and the plan splits the embedding's vocabulary: XLA looks each token's row up "
    "where it lies and all-reduces the rows (+1, 16.8 MB) where shardplan gathers the table (the all_gather row), "
    "and picks each label's logit where it lies and all-reduces it (+1, 8 KB) where shardplan gathers the logits",
    (MID, MID_PLAN, "all_gather"): "XLA gathers the 17 norm scales again for the backward (+17, 4 KB each) and the "
    "token ids over model for its lookup and its scatter (+2, 8 KB each; the all_to_all row); it gathers neither the "
    "vocabulary-split table (32,000 x 1,024 over model and 8,000 x 1,024 over batch, 164 MB) nor the logits (4 x 511 "
    "x 8,000 over batch, 65 MB): the lookup and the labels' pick run where the rows lie (the all_reduce row). The 57 "
    "weight gathers are the plan's, once each (this row is lowered with reuse_resharded; by default shardplan gathers "
    "each ZeRO-3 weight again for the backward: 57 more, 222 MB)",
    (MID, MID_PLAN, "reduce_scatter"): "the gradients' reduce-scatters in XLA's CPU form (an all-reduce whose tensor "
    "is only dynamic-sliced, `solver.frontend.hlo_collectives`): 74 of the plan's 75, the same shapes; the embedding "
    "table's gradient (32,000 x 2,048, 262 MB) is not reduce-scattered: XLA moves the tokens' cotangents to the "
    "table's split instead (the all_to_all row) and scatter-adds them where the rows lie",
    (MID, MID_PLAN, "all_to_all"): "XLA's own choice around the vocabulary-split embedding: one at the lookup and one "
    "at its gradient's scatter, each of 16.8 MB over model in two 8.4 MB pieces (the tokens' rows and cotangents "
    "moved between the table's vocabulary and hidden splits), where shardplan gathers the table (164 MB) and "
    "reduce-scatters its gradient (262 MB). In all, XLA moves 0.978x the planned bytes (the totals below)",
    ("cnn_train", CNN, "reduce_scatter"): "the second convolution's partial output (model-sharded input channels) "
    "is reduce-scattered onto its output channels by shardplan; XLA's CPU pipeline all-reduces it and slices "
    "(the same 32,768 operand bytes; GPU and TPU pipelines form the reduce-scatter)",
    ("cnn_train", CNN, "all_gather"): "shardplan reshards at each use (PartIR's default): the model-sharded "
    "activation read by two ops is gathered twice (2 x 16,384 bytes); XLA gathers it once and reuses it "
    "(`--reuse-resharded` is that choice in shardplan)",
    ("cnn_train", CNN, "all_reduce"): "1 is the reduce-scatter above; the other (8,192 bytes) is XLA's own choice: it "
    "splits the first convolution's kernel gradient over its contracting batch dimension across the batch axis, which "
    "the plan leaves replicated, and all-reduces the partial result; all bytes together 58,368, below the planned "
    "66,560",
    ("cnn_train", CNN, "collective_permute"): "moves the operand of the batch-split kernel gradient above into that "
    "layout (8,192 bytes), XLA's choice inside a value the plan computes whole on every device",
}


def shardplan_collectives(lowered) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for op in lowered.function.ops:
        if get(op.kind).is_collective and op.kind != "all_slice":  # all_slice is local: no communication
            entry = out.setdefault(op.kind, {"ops": 0, "bytes": 0})
            entry["ops"] += 1
            entry["bytes"] += op.operands[0].type.num_bytes
    return out


def tight_spec(path: pathlib.Path, fraction: float):
    """The spec on the same A100 figures with only `fraction` of the replicated
    program's peak memory per device: on these tiny programs a device of 80 GiB
    makes replication optimal (any collective costs more than it saves), so
    the search is given a reason to shard."""
    spec = load_spec(path)
    peak = prepare(spec).baseline.peak_memory_bytes
    device = PRESETS["A100-80GB"].device
    flops = ", ".join(f"{k}: {v / 1e12:g}TFLOP/s" for k, v in device.peak_flops.items())
    inline = (f"hardware:\n  device: {{name: A100-tight, peak_flops: {{{flops}}}, memory: {int(peak * fraction)}B, "
              f"memory_bandwidth: {device.memory_bandwidth / 1e9:g}GB/s}}\n"
              "  links: {" + ", ".join(f"{axis}: {{bandwidth: 300GB/s, latency: 5us}}" for axis in spec.mesh) + "}\n")
    text = re.sub(r"^hardware: .*\n", inline, path.read_text(), flags=re.M)
    return parse_spec(text, str(path))


def tightest_plan(path: pathlib.Path, fractions, overrides: SearchOverrides,
                  options: LowerOptions | None = None) -> tuple | None:
    """CP-SAT's plan under the tightest of `fractions` of the replicated peak
    that it fits (`tight_spec`), and that fraction; None if none fits.
    (Memory-tight search itself is issue 27's.)"""
    for fraction in fractions:
        try:
            return plan_spec(tight_spec(path, fraction), solver="cpsat", overrides=overrides, options=options), fraction
        except NoPlanFits:
            continue
    return None


def check(program: str, plan: str, time_limit_s: float) -> dict:
    path = FIXTURES / f"{program}.yaml"
    overrides = SearchOverrides(time_limit_s=time_limit_s)
    if plan == "BP":
        plan = NAMED.get(program, "BP")
        planned = plan_spec(load_spec(path), schedule=plan)
    else:
        tightest = tightest_plan(path, MEMORY_FRACTIONS, overrides)
        if tightest is None:
            planned, plan = plan_spec(load_spec(path), solver="cpsat", overrides=overrides), "CP-SAT"
        else:
            planned, fraction = tightest
            plan = f"CP-SAT, {fraction:.0%} memory"
    data = np.load(FIXTURES / f"{INPUTS.get(program, program)}.npz")
    args = tuple(jnp.asarray(data[f"in.{i}"]) for i in range(sum(k.startswith("in.") for k in data)))
    outs = [data[f"out.{i}"] for i in range(sum(k.startswith("out.") for k in data))]
    compiled, shardings = compile_checked(planned, args, tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs))
    got = compiled(*args)
    diff = max((float(np.max(np.abs(np.asarray(g, np.float64) - o))) if o.size else 0.0)
               for g, o in zip(got, outs))
    return {"program": program.split("/")[-1], "plan": plan, "max_abs_diff": diff,
            "shardplan": shardplan_collectives(planned.lowered), "xla": xla_collectives(compiled.as_text()),
            "shardings": shardings}


def compile_checked(planned, args, outs) -> tuple[jax.stages.Compiled, dict]:
    """The plan's annotated module compiled by XLA for its mesh, and whether
    XLA kept the plan's shardings (`solver.frontend.hlo_shardings`: the
    module Shardy's propagation hands the SPMD partitioner, dumped by XLA
    for this compilation only)."""
    axes = planned.sharding.mesh.axes
    text = annotate_planned(planned)
    lowered = planned.lowered
    with tempfile.TemporaryDirectory(prefix="xla-plan-check-") as folder:
        options = {"xla_dump_to": folder, "xla_dump_hlo_pass_re": "shardy-xla", "xla_dump_hlo_as_text": True}
        compiled = compile_annotated(text, auto_mesh([s for _, s in axes], [a for a, _ in axes]), args, outs,
                                     lowered.param_dims, lowered.result_dims, compiler_options=options)
        kept = check_shardings(text, *dumped_modules(folder), axes, lowered.param_dims, lowered.result_dims)
    return compiled, {"arguments": kept.arguments, "results": kept.results, "values": kept.values,
                      "differences": [[d.value, d.planned, d.xla] for d in kept.differences]}


def check_midsize(name: str, time_limit_s: float) -> dict:
    """A mid-size program's CP-SAT plan under the tightest memory it fits,
    compiled by XLA from shapes (nothing allocated, nothing run). Lowered
    with `reuse_resharded` (`plan --reuse-resharded`): a weight gathered for
    the forward is kept for the backward, as XLA keeps it; by default
    shardplan gathers it again at each use (PartIR's rule, what the search
    prices), which here is 57 gathers and 222 MB more than XLA moves."""
    path = MIDSIZE[name]
    overrides = SearchOverrides(time_limit_s=time_limit_s)
    tightest = tightest_plan(path, MIDSIZE_FRACTIONS, overrides, LowerOptions(reuse_resharded=True))
    if tightest is None:
        raise SystemExit(f"{path}: no CP-SAT plan fits {MIDSIZE_FRACTIONS[-1]:.0%} of the replicated peak")
    planned, fraction = tightest
    fn = planned.model.function
    args = tuple(jax.ShapeDtypeStruct(p.type.shape, JNP_DTYPES[p.type.dtype]) for p in fn.params)
    outs = tuple(jax.ShapeDtypeStruct(r.type.shape, JNP_DTYPES[r.type.dtype]) for r in fn.results)
    compiled, shardings = compile_checked(planned, args, outs)
    return {"program": name, "plan": f"CP-SAT, {fraction:.0%} memory, reused", "max_abs_diff": None,
            "shardplan": shardplan_collectives(planned.lowered), "xla": xla_collectives(compiled.as_text()),
            "shardings": shardings}


def rows(result: dict) -> list[str]:
    out = []
    for kind in KINDS:
        ours, xla = result["shardplan"].get(kind), result["xla"].get(kind)
        if not ours and not xla:
            continue
        ours = ours or {"ops": 0, "bytes": 0}
        xla = xla or {"tensors": 0, "bytes": 0}
        same = ours["ops"] == xla["tensors"] and xla["bytes"] <= ours["bytes"]
        note = "same" if same else NOTES.get((result["program"], result["plan"], kind), "**unexplained**")
        out.append(f"| {result['program']} | {result['plan']} | {kind} | {ours['ops']} | {xla['tensors']} | "
                   f"{ours['bytes']:,} | {xla['bytes']:,} | {_diff(result)} | {note} |")
    if not out:
        out.append(f"| {result['program']} | {result['plan']} | none | 0 | 0 | 0 | 0 | {_diff(result)} | same |")
    return out


def _diff(result: dict) -> str:
    return "compiled, not run" if result["max_abs_diff"] is None else f"{result['max_abs_diff']:.2g}"


def totals(results: list[dict]) -> str:
    """Every kind together: the bytes XLA moves against the plan's; and the
    shardings XLA kept as planned (agree / compared), then those it did not."""
    out = ["| program | plan | shardplan bytes | XLA bytes | XLA / plan | arguments as planned | results as planned "
           "| values as planned |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ours = sum(v["bytes"] for v in r["shardplan"].values())
        xla = sum(v["bytes"] for v in r["xla"].values())
        ratio = f"{xla / ours:.3f}" if ours else ("-" if not xla else "inf")
        kept = " | ".join(f"{a:,} / {n:,}" for a, n in (r["shardings"][k] for k in ("arguments", "results", "values")))
        out.append(f"| {r['program']} | {r['plan']} | {ours:,} | {xla:,} | {ratio} | {kept} |")
    differ = [f"- {r['program']}, {r['plan']}: {value} planned `{planned}`, XLA `{xla}`"
              for r in results for value, planned, xla in r["shardings"]["differences"]]
    return "\n".join(out + ["", "Shardings XLA did not keep: " + ("none." if not differ else "")] + differ)


def table(results: list[dict]) -> str:
    head = ["| program | plan | kind | shardplan ops | XLA tensors | shardplan bytes | XLA bytes | max abs diff | "
            "note |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    return "\n".join(head + [r for result in results for r in rows(result)]) + "\n\n" + totals(results)


def write_docs(text: str) -> None:
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="program names (default: every real fixture)")
    parser.add_argument("--plans", nargs="*", default=["BP", "CP-SAT"], choices=["BP", "CP-SAT"],
                        help="BP: each program's named schedule (BP, or NAMED's); CP-SAT: the search's plan")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--write-docs", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    programs = [p for p in PROGRAMS if not args.only or p.split("/")[-1] in args.only]
    results = [check(p, plan, args.time_limit) for p in programs for plan in args.plans]
    for name, path in MIDSIZE.items():
        if args.only and name not in args.only or "CP-SAT" not in args.plans:
            continue
        if not path.exists():
            print(f"{name}: skipped, {path.relative_to(ROOT)} is missing (tools/export_real_fixtures.py makes it)",
                  file=sys.stderr)
            continue
        results.append(check_midsize(name, args.time_limit))
    print(json.dumps(results, indent=2) if args.json else table(results))
    if args.write_docs:
        write_docs(table(results))


if __name__ == "__main__":
    main()
