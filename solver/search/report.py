"""What the search backends (`solver.search.cpsat`, `solver.search.mcts`) share: their
result type, the no-fit explanation, and the live progress line."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from costmodel.evaluate import Cost, live_at_peak
from costmodel.table import CostTable
from ir.core import IRError
from ir.lower import lower
from ir.sharding import FactorSharding
from solver.plan import Plan
from solver.search.space import SearchSpace


@dataclass(frozen=True, slots=True)
class AutoResult:
    """A backend's answer: the plan (None if no plan that fits was found), its
    factor sharding and tabulated cost, and the backend's report (a
    `cpsat.SolveReport` or `mcts.MctsReport`: both have `solver`, `axes`,
    `status`, `objective_s`, `solve_s`, `message` and `to_json()`)."""

    plan: Plan | None
    sharding: FactorSharding | None
    cost: Cost | None
    report: Any


def report_json(report: Any) -> dict[str, Any]:
    """A backend's report (a slotted dataclass) as its `search[]` JSON object."""
    return {f: list(v) if isinstance(v := getattr(report, f), tuple) else v for f in report.__slots__}


class NoPlanFits(IRError):
    """No plan of the space fits the devices' memory (or none was found in time)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report  # the search's, where one ran


def no_fit_message(space: SearchSpace, table: CostTable, smallest: tuple[int, FactorSharding] | None,
                   proven: bool, tries: str) -> str:
    """Why no plan was returned: the capacity, the smallest peak seen and what
    is live at it (lowering that one plan, once). `tries` says how hard the
    backend looked ("in 3 solves")."""
    capacity = table.hardware.capacity_bytes
    if smallest is None:
        if proven:
            return "no plan of the search space can be lowered (CP-SAT proved the model infeasible)"
        return f"no plan found {tries}"
    peak, sharding = smallest
    local = lower(table.fn, space.nda, sharding).function
    _, live = live_at_peak(local)
    params = {p.name for p in local.params}
    resident = sum(b for name, b in live if name in params)
    top = ", ".join(f"%{name} {gib(b)}" for name, b in live[:4])
    why = "no plan fits" if proven else f"no plan that fits was found {tries}"
    return (f"{why}: {gib(capacity)} per device on {table.hardware.name}; the smallest peak found is "
            f"{gib(peak)}, of which parameters and optimizer state {gib(resident)}; largest live values: {top}")


def gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


class Progress:
    """A live single-line status of a long search (rounds, best cost,
    elapsed), rewritten in place on a terminal. Silent when the stream is not
    a terminal (pipes, CI logs, --json captured by a script) or when disabled
    (`--quiet`). Updates are throttled, so backends may call `update` freely."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None, interval_s: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.interval_s = interval_s
        self._shown_at = -float("inf")
        self._width = 0

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._shown_at < self.interval_s:
            return
        self._shown_at = now
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the line (before the report is printed)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


SILENT = Progress(enabled=False)
