"""The plan report as text: what `shardplan plan` prints from the report's
JSON form (`plan_json.plan_report`), section by section."""

from __future__ import annotations

from typing import Any

from solver.planning.scheme import format_roles


def format_simulated(sim: dict[str, Any]) -> list[str]:
    """The overlap line of the human-readable plan report."""
    return [f"  with overlap     {format_seconds(sim['makespan_s'])}, efficiency {sim['efficiency']:.1%} "
            f"(two-stream simulation: {format_seconds(sim['exposed_communication_s'])} of communication exposed, "
            f"peak memory {format_bytes(sim['peak_memory_bytes'])}; --trace FILE shows it)"]


def format_pipeline(report: dict[str, Any]) -> list[str]:
    """The pipeline section of the human-readable plan report."""
    if report["stages"] == 1:
        (st,) = report["per_stage"]
        if report["microbatches"] == 1:  # `microbatches: auto` found the whole batch fits at once
            return [f"gradient accumulation: none (1 microbatch: the whole batch at once); forward "
                    f"{format_seconds(st['forward_s'])}, backward {format_seconds(st['backward_s'])}; peak "
                    f"{format_bytes(st['peak_memory_bytes'])} ({format_bytes(st['stash_bytes'])} of activations)"]
        return [f"gradient accumulation: {report['microbatches']} microbatches one after another, the gradients "
                f"summed, one update; forward {format_seconds(st['forward_s'])}, backward "
                f"{format_seconds(st['backward_s'])} a microbatch; peak {format_bytes(st['peak_memory_bytes'])} "
                f"({format_bytes(st['stash_bytes'])} of one microbatch's activations)"]
    per_k = sum(1 for t in report["transfers"] if t["per_microbatch"])
    chunks = report["chunks"]
    devices = f" ({chunks} per device on {report['stages'] // chunks} devices)" if chunks > 1 else ""
    lines = [f"pipeline: {report['stages']} stages{devices} x {report['microbatches']} microbatches, "
             f"{report['schedule']}; bubble {report['bubble_fraction']:.1%} of the step idle, "
             f"{per_k} transfers per microbatch ({format_seconds(report['transfer_s'])} a step)"]
    for st in report["per_stage"]:
        layers = st["layers"]
        span = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}" if layers else "-"
        times = (f"forward {format_seconds(st['forward_s'])}, backward {format_seconds(st['backward_s'])} "
                 "a microbatch")
        if chunks > 1:
            lines.append(f"  stage {st['stage']} (device {st['device']}): {span:<14} {times}")
        else:
            lines.append(f"  stage {st['stage']}: {span:<14} {times}; peak {format_bytes(st['peak_memory_bytes'])} "
                         f"({st['in_flight']} x {format_bytes(st['stash_bytes'])} of activations in flight)")
    if chunks > 1:
        for d in range(report["stages"] // chunks):
            st = report["per_stage"][d]
            stages = ", ".join(str(s["stage"]) for s in report["per_stage"] if s["device"] == d)
            lines.append(f"  device {d}: stages {stages}; peak {format_bytes(st['peak_memory_bytes'])} "
                         f"({st['in_flight']} stage microbatches in flight, {format_bytes(st['held_bytes'])} of "
                         "activations at most)")
    return lines


def format_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns" if s else "0 s"


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def format_cost(cost: dict[str, Any]) -> list[str]:
    """The cost table of the human-readable plan report."""
    comm = ", ".join(f"{k} {format_seconds(t)}" for k, t in cost["communication_by_kind_s"].items() if t) or "none"
    fits = "fits" if cost["fits"] else "DOES NOT FIT"
    return [
        f"cost per device on {cost['hardware']}:",
        f"  step time        {format_seconds(cost['step_time_s'])}"
        f" (unpartitioned on one device: {format_seconds(cost['unpartitioned_step_time_s'])})",
        f"  compute          {format_seconds(cost['compute_s'])}",
        f"  communication    {format_seconds(cost['communication_s'])}: {comm}",
        f"  peak memory      {format_bytes(cost['peak_memory_bytes'])} of "
        f"{format_bytes(cost['capacity_bytes'])}: {fits}",
        f"  ideal step time  {format_seconds(cost['ideal_step_time_s'])}, efficiency {cost['efficiency']:.1%}",
        f"  relative cost    {cost['relative_cost']:.4g} (TOAST: step time relative to unpartitioned,"
        " plus the memory penalty)",
    ]


def format_search(r: dict[str, Any]) -> str:
    """One line about one auto tactic's search."""
    head = f"search ({r['solver']} on {', '.join(r['axes'])}): {r['message']}"
    if r["solver"] == "mcts":
        return (f"{head}; {r['actions']} actions ({r['pruned']} pruned), {r['states']} states "
                f"({r['merged']} reached by another action order); {r['solve_s']:.2f} s")
    return (f"{head}; model {r['variables']} variables, {r['constraints']} constraints; "
            f"built in {r['build_s']:.2f} s, solved in {r['solve_s']:.2f} s")


def format_floor(floor: dict[str, Any], step_time_s: float) -> str:
    """One line about the expert floor (`solver.planning.floor`)."""
    priced = floor["schedules"]
    fit = sum(1 for e in priced if e["fits"])
    if floor["best"] is None:
        return f"expert floor: none of the {len(priced)} named schedules without a search fits"
    head = (f"expert floor: schedule {floor['best']} {format_seconds(floor['best_step_time_s'])} "
            f"(the fastest of {fit} named schedules that fit, of {len(priced)})")
    if floor["kept"]:
        return f"{head}: no searched plan was faster, so the plan is that schedule's"
    gain = 1 - step_time_s / floor["best_step_time_s"]
    return f"{head}: the searched plan is {gain:.1%} faster" if gain > 0 else f"{head}: the search found it too"


def format_named(floor: dict[str, Any], shown: int = 8) -> str:
    """The named schedules the floor priced, each with its step time and
    peak memory: what the plan above was compared with."""
    parts = []
    for e in floor["schedules"][:shown]:
        if e["error"]:
            parts.append(f"{e['schedule']} (no plan: {e['error']})")
            continue
        fit = "" if e["fits"] else ", does not fit"
        memory = format_bytes(e["peak_memory_bytes"])
        parts.append(f"{e['schedule']} {format_seconds(e['step_time_s'])} at {memory}{fit}")
    more = len(floor["schedules"]) - shown
    return "  priced: " + "; ".join(parts) + (f"; and {more} more (--json lists them)" if more > 0 else "")


def _grouped(decisions: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(axis, text) per line. Decisions on one axis of the same parameter
    dimension in repeated layers (the same `pattern`, with a `*`) print once,
    where the first of them stands: `layers.*.mlp.w_up[1]: 4 colors (#7,
    #11, #15, #19)`, or for pins `%layers.*.attn.wq[1] (18 dimensions, one
    per layer)`. The JSON lists every decision in order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    lines: list[tuple[str, Any]] = []
    for d in decisions:
        pattern = d.get("pattern") or ""
        if "*" not in pattern:
            lines.append((d["axis"], d.get("what", f"color #{d['color']}")))
            continue
        key = (d["axis"], pattern)
        if key not in groups:
            groups[key] = []
            lines.append((d["axis"], key))
        groups[key].append(d)
    out = []
    for axis, what in lines:
        if isinstance(what, str):
            out.append((axis, what))
            continue
        members = groups[what]
        if len(members) == 1:
            out.append((axis, members[0].get("what", "")))
        elif "only" in members[0]:
            out.append((axis, f"{what[1]} ({len(members)} dimensions, one per layer)"))
        else:
            colors = ", ".join(f"#{m['color']}" for m in members)
            out.append((axis, f"{what[1]}: {len(members)} colors ({colors})"))
    return out


def _format_local(local: dict[str, Any]) -> str:
    fusions = local["kernels"] - (local["ops"] - local["fused_ops"])
    return (f"local program: {local['ops']:,} ops in {local['kernels']:,} kernels "
            f"({local['fused_ops']:,} ops fused into {fusions:,} fusions)")


def format_plan(report: dict[str, Any], shown: int = 20) -> str:
    """The human-readable plan report."""
    counts = ", ".join(f"{n} {k}" for k, n in report["collectives"].items() if n) or "no collectives"
    mesh = " x ".join(f"{n}={s}" for n, s in report["mesh"].items())
    schedule = f"schedule {report['schedule']}, " if report["schedule"] else ""
    lines = [f"{report['source']}: plan ({schedule}solver {report['solver']}) on mesh {mesh}",
             f"collectives: {counts}", f"scheme: {format_roles(report['scheme'])}",
             _format_local(report["local_program"])]
    lines += [f"note: {n}" for n in report.get("notes", ())]
    if report["remat"]:
        lines.append(f"rematerialized: {', '.join(report['remat'])} (each layer's forward recomputed in its backward)")
    if report["remat_search"]:
        tried = ", ".join(f"{', '.join(t['remat']) or 'none'} "
                          + (f"{t['step_time_s']:.4g} s" if t["step_time_s"] is not None else "no plan fits")
                          for t in report["remat_search"])
        lines.append(f"remat searched (memory binds): {tried}")
    lines.append("")
    for r in report["search"]:
        lines.append(format_search(r))
    if report["expert_floor"]:
        lines.append(format_floor(report["expert_floor"], report["cost"]["step_time_s"]))
        lines.append(format_named(report["expert_floor"]))
    if report["search"] and report["pipeline"] and report["pipeline"]["stages"] == 1:
        lines.append("  (searched on the whole batch's step; the cost below is the accumulated step's)")
    elif report["search"] and report["pipeline"]:
        lines.append(f"  (searched on the whole step over one stage's devices, with {report['pipeline']['stages']}x "
                     "their memory; the cost below is the pipelined step's)")
    if report["search"]:
        lines.append("")
    lines += format_cost(report["cost"])
    lines += format_simulated(report["simulated"]) if report["simulated"] else format_pipeline(report["pipeline"])
    lines += ["", "decisions:"]
    decisions = _grouped(report["plan"]["decisions"])
    lines += [f"  {axis:>8}: {what}" for axis, what in decisions[:shown]] or ["  none"]
    if len(decisions) > shown:
        lines.append(f"  ... and {len(decisions) - shown} more (--json lists them all)")
    if report["plan"]["resolutions"]:
        lines.append("resolutions: " + ", ".join(f"class {k} -> {b}" for k, b in report["plan"]["resolutions"].items()))
    sharded = [p for p in report["params"] if any(p["sharding"])]
    lines += ["", f"parameters sharded: {len(sharded)} of {len(report['params'])}"]
    for p in sharded[:shown]:
        dims = ", ".join("+".join(a) if a else "-" for a in p["sharding"])
        lines.append(f"  %{p['name']}: {p['type']} [{dims}] -> {p['local_type']}")
    if len(sharded) > shown:
        lines.append(f"  ... and {len(sharded) - shown} more (--json lists them all)")
    return "\n".join(lines) + "\n"
