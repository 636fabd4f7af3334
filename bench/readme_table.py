"""Write a generated table into README.md between its markers, so the
published figures are the ones a benchmark script printed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def write_table(name: str, table: str, path: Path = README) -> None:
    """Replace what lies between `<!-- NAME:begin -->` and `<!-- NAME:end -->`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: the markers {begin} and {end} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}", encoding="utf-8")
    print(f"wrote the {name} into {path}", file=sys.stderr)


def reference_seconds() -> float:
    """Seconds a fixed pure-Python workload takes here (the planner's kind:
    hashing, counting and sorting tuples), the least of three: printed beside
    a table's wall times, it tells the hour's speed, which on a shared
    machine drifts by half from one hour to the next."""
    least = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        counts: dict[tuple, int] = {}
        for i in range(150_000):
            key = (i % 1009, i % 7, str(i % 101))
            counts[key] = counts.get(key, 0) + 1
        sorted(counts.items())
        least = min(least, time.perf_counter() - start)
    return least
