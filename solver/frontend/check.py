"""`shardplan check`: assert each spec's named schedules still produce the
collectives (and the memory fit) their `expect:` blocks say, as PartIR's
Table 2 does for its strategies. Meant for CI: one table, one exit status.
A count may be a formula of the layers L, the pipeline stages P and the
microbatches K (`solver.planning.expect`); a pipelined plan's counts are its
step's (`planner.planned_counts`): each stage's collectives, K times for the
per-microbatch tasks, and the transfers between stages as collective_permute.

A spec's program is built and analyzed once; each schedule is then planned,
lowered and costed on it (`planner.prepare`, `planner.plan_spec`).
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

from ir.core import IRError
from ir.remat import layer_segments
from solver.planning.expect import COLLECTIVE_KINDS, Expectation
from solver.planning.plan_text import format_seconds
from solver.planning.planner import Planned, plan_spec, planned_counts, prepare
from solver.planning.spec import load_spec


@dataclass(frozen=True, slots=True)
class Mismatch:
    field: str  # a collective kind, or "fits"
    expected: int | bool
    got: int | bool


@dataclass(frozen=True, slots=True)
class ScheduleCheck:
    """One schedule's expectation against what its plan produced; `error`
    when it could not be planned at all (then the figures are empty)."""

    schedule: str
    expected: Expectation
    counts: dict[str, int]
    fits: bool | None
    step_time_s: float | None
    peak_memory_bytes: int | None
    seconds: float
    error: str | None = None
    names: dict[str, int] = field(default_factory=dict)  # what count formulas read: L, P, K

    @property
    def expected_counts(self) -> dict[str, int]:
        """The expected counts, formulas evaluated (`error` says when one cannot be)."""
        return self.expected.counts(self.names)  # type: ignore[return-value]

    @property
    def mismatches(self) -> list[Mismatch]:
        if self.error is not None:
            return []
        out = [Mismatch(kind, want, self.counts[kind])
               for kind, want in self.expected_counts.items() if self.counts[kind] != want]
        if self.expected.fits is not None and self.fits != self.expected.fits:
            out.append(Mismatch("fits", self.expected.fits, self.fits))
        return out

    @property
    def passed(self) -> bool:
        return self.error is None and not self.mismatches


@dataclass(frozen=True, slots=True)
class SpecCheck:
    """Every expectation of one spec file; `error` when the spec itself is
    unusable (then `schedules` is empty)."""

    source: str
    name: str | None
    schedules: tuple[ScheduleCheck, ...]
    seconds: float
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(s.passed for s in self.schedules)


def spec_files(paths: list[str]) -> list[pathlib.Path]:
    """The spec files named: files as given, directories as their *.yaml
    (sorted). A path that does not exist raises FileNotFoundError."""
    out: list[pathlib.Path] = []
    for text in paths:
        path = pathlib.Path(text)
        if path.is_dir():
            found = sorted(path.glob("*.yaml"))
            if not found:
                raise IRError(f"{text}: no *.yaml spec files in this directory")
            out += found
        elif path.exists():
            out.append(path)
        else:
            raise FileNotFoundError(2, "No such file or directory", text)
    return out


def check_spec(path: pathlib.Path) -> SpecCheck:
    """Plan every schedule of the spec at `path` that has an `expect:` block."""
    start = time.perf_counter()
    try:
        spec = load_spec(path)
        expectations = spec.expectations()
        if not expectations:
            raise IRError(f"{path}: nothing to check: no schedule under `schedules:` has an `expect:` block")
        prepared = prepare(spec)
    except (IRError, OSError) as err:
        return SpecCheck(str(path), None, (), time.perf_counter() - start, _message(err))
    checks = tuple(_check_schedule(spec, prepared, name, expect) for name, expect in expectations.items())
    return SpecCheck(str(path), spec.name, checks, time.perf_counter() - start)


def _check_schedule(spec, prepared, name: str, expect: Expectation) -> ScheduleCheck:
    start = time.perf_counter()
    try:
        planned = plan_spec(spec, schedule=name, prepared=prepared)
    except IRError as err:
        return ScheduleCheck(name, expect, {}, None, None, None, time.perf_counter() - start, str(err))
    cost = planned.assessment.cost
    names = formula_names(planned)
    try:
        expect.counts(names)
    except ValueError as err:
        return ScheduleCheck(name, expect, {}, None, None, None, time.perf_counter() - start,
                             f"{spec.source}: schedules.{name}.expect: {err}")
    return ScheduleCheck(name, expect, planned_counts(planned), cost.fits, cost.step_time_s,
                         cost.peak_memory_bytes, time.perf_counter() - start, names=names)


def formula_names(planned: Planned) -> dict[str, int]:
    """The values count formulas use (`solver.planning.expect`): the pipeline's
    stages, microbatches and stages per device, and the layers when the
    program has any."""
    pipeline = planned.pipeline
    names = {"P": planned.spec.stages, "K": pipeline.microbatches if pipeline else 1,
             "V": pipeline.chunks if pipeline else 1}
    fn = planned.model.function
    forward_ops = planned.model.forward_ops or len(fn.ops)
    layers = layer_segments(fn, forward_ops)
    if layers:
        names["L"] = len(layers)
    return names


def _message(err: Exception) -> str:
    if isinstance(err, OSError):
        return f"{err.filename or ''}: {err.strerror or err}"
    return str(err)


def check(paths: list[str]) -> list[SpecCheck]:
    """Check every spec named by `paths` (files or directories)."""
    return [check_spec(p) for p in spec_files(paths)]


# ---------------------------------------------------------------- reports


def check_report(results: list[SpecCheck], seconds: float) -> dict[str, Any]:
    """The `shardplan check --json` object (schema in docs/json.md)."""
    return {
        "passed": all(r.passed for r in results),
        "time_s": seconds,
        "specs": [_spec_json(r) for r in results],
    }


def _spec_json(r: SpecCheck) -> dict[str, Any]:
    return {
        "source": r.source,
        "spec": r.name,
        "passed": r.passed,
        "error": r.error,
        "time_s": r.seconds,
        "schedules": [{
            "schedule": s.schedule,
            "passed": s.passed,
            "error": s.error,
            "expected": {**(s.expected_counts if s.error is None else s.expected.counts()), "fits": s.expected.fits},
            "got": {**s.counts, "fits": s.fits} if s.error is None else None,
            "mismatches": [{"field": m.field, "expected": m.expected, "got": m.got} for m in s.mismatches],
            "step_time_s": s.step_time_s,
            "peak_memory_bytes": s.peak_memory_bytes,
            "time_s": s.seconds,
        } for s in r.schedules],
    }


def _kinds_shown(results: list[SpecCheck]) -> list[str]:
    """The collective kinds expected or produced anywhere (the table's columns)."""
    used = {k for r in results for s in r.schedules for k in COLLECTIVE_KINDS
            if s.expected.counts()[k] != 0 or s.counts.get(k)}
    return [k for k in COLLECTIVE_KINDS if k in used]


def _cell(s: ScheduleCheck, field: str) -> str:
    """What the plan got; `got (expected N)` where it differs."""
    if s.error is not None:
        return "-"
    if field == "fits":
        got, want = ("yes" if s.fits else "NO"), s.expected.fits
        if want is None or want == s.fits:
            return got
        return f"{got} (expected {'yes' if want else 'no'})"
    got, want, written = s.counts[field], s.expected_counts[field], s.expected.counts()[field]
    formula = f" = {written}" if isinstance(written, str) else ""
    return str(got) if got == want else f"{got} (expected {want}{formula})"


def format_check(results: list[SpecCheck], seconds: float) -> str:
    """The table of every expectation, then each failure spelled out."""
    kinds = _kinds_shown(results)
    header = ["spec", "schedule", *kinds, "fits", "step time", "result"]
    rows: list[list[str]] = []
    failures: list[str] = []
    for r in results:
        name = r.name or r.source
        if r.error is not None:
            rows.append([name, "-", *["-"] * len(kinds), "-", "-", "ERROR"])
            # Spec errors name their file already (SpecError, OSError messages).
            failures.append(r.error if r.error.startswith(r.source) else f"{r.source}: {r.error}")
            continue
        for s in r.schedules:
            step = format_seconds(s.step_time_s) if s.step_time_s is not None else "-"
            result = "ok" if s.passed else ("ERROR" if s.error else "FAIL")
            rows.append([name, s.schedule, *[_cell(s, k) for k in kinds], _cell(s, "fits"), step, result])
            if s.error is not None:
                failures.append(f"{r.source}: schedule {s.schedule}: {s.error}")
            failures += [f"{r.source}: schedule {s.schedule}: {m.field}: expected {_show(m.expected)}, "
                         f"got {_show(m.got)}" for m in s.mismatches]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    checked = sum(len(r.schedules) for r in results)
    passed = sum(s.passed for r in results for s in r.schedules)
    lines += ["", f"{passed} of {checked} schedule(s) in {len(results)} spec(s) as expected; {seconds:.1f} s"]
    if failures:
        lines += ["", "failures:"] + [f"  {f}" for f in failures]
    return "\n".join(lines) + "\n"


def _show(value: int | bool | None) -> str:
    if isinstance(value, bool):
        return "fits" if value else "does not fit"
    return str(value)
