"""Independent, deterministic work in forked processes: the mesh screen's
meshes (`solver.planning.mesh_screen`), CP-SAT's re-ranked plans
(`solver.search.cpsat`). A forked child shares the parent's memory as it
is (programs, cost tables, closures) without pickling it; only each
result comes back."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_WORK: Callable[[int], Any] | None = None  # what the children run, set before they fork


def forks(processes: int, count: int) -> bool:
    """Whether `forked_map` runs `count` jobs in other processes."""
    return processes > 1 and count > 1 and "fork" in multiprocessing.get_all_start_methods()


def forked_map(work: Callable[[int], T], count: int, processes: int,
               done: Callable[[int], None] | None = None) -> list[T]:
    """[work(0), ..., work(count - 1)]: in `processes` forked processes where
    there are several and the platform forks, else here; `done(k)` after the
    k-th result. `work` must give the same result wherever it runs, and
    what it changes (a cache) stays in the child."""
    global _WORK
    if not forks(processes, count):
        out = []
        for k in range(count):
            out.append(work(k))
            if done is not None:
                done(k)
        return out
    _WORK = work
    try:
        with multiprocessing.get_context("fork").Pool(min(processes, count)) as pool:
            out = []
            for k, result in enumerate(pool.imap(_run, range(count))):
                out.append(result)
                if done is not None:
                    done(k)
            return out
    finally:
        _WORK = None


def _run(index: int) -> Any:
    assert _WORK is not None
    return _WORK(index)


__all__ = ["forked_map", "forks"]
