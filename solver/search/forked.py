"""Independent, deterministic work in forked processes: the mesh screen's
meshes (`solver.planning.mesh_screen`), CP-SAT's re-ranked plans
(`solver.search.cpsat`), the MCTS's candidates (`Helpers`). A forked child
shares the parent's memory as it is (programs, cost tables, closures)
without pickling it; only each result comes back."""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, NoReturn, TypeVar

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
    what it changes (a cache) stays in the child. A child that dies (the
    kernel's OOM killer) raises here: a `multiprocessing.Pool` would wait
    for its answer forever."""
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
        with ProcessPoolExecutor(min(processes, count), mp_context=multiprocessing.get_context("fork")) as pool:
            out = []
            for k, result in enumerate(pool.map(_run, range(count))):
                out.append(result)
                if done is not None:
                    done(k)
            return out
    except BrokenProcessPool:
        raise RuntimeError("a process working beside this one ended without answering (killed for memory?); run "
                           "with one process (--jobs 1)") from None
    finally:
        _WORK = None


def _run(index: int) -> Any:
    assert _WORK is not None
    return _WORK(index)


class Helpers(Generic[T]):
    """`work` shared with `processes - 1` forked helpers kept while this is
    open (a `with` block): `map(items)` hands the k-th of every `processes`
    items to helper k (this process works the 0-th) and returns the results
    in order. A search hands its small batches over again and again: keeping
    the helpers costs one fork each, not one a batch, and this process works
    too rather than waits. A helper forks at the first batch worth sharing
    and sees this process's memory as it was then, so `work` must give the
    same result wherever it runs; what it changes (a cache) stays where it
    ran. Where the platform does not fork, or with one process, all of it
    runs here."""

    def __init__(self, work: Callable[[Any], T], processes: int) -> None:
        self.work, self.processes = work, processes
        self._helpers: list[tuple[Any, Any]] = []  # (process, connection)

    def map(self, items: Sequence[Any]) -> list[T]:
        if not forks(self.processes, len(items)):
            return [self.work(item) for item in items]
        if not self._helpers:
            self._start()
        n = len(self._helpers) + 1
        for k, (process, conn) in enumerate(self._helpers, start=1):
            try:
                conn.send(items[k::n])
            except OSError:
                self._lost(process)
        out: list[Any] = [None] * len(items)
        try:
            out[0::n] = [self.work(item) for item in items[0::n]]
        except BaseException:
            self.close()  # the helpers' answers to this batch are never read: no later batch may read them
            raise
        for k, (process, conn) in enumerate(self._helpers, start=1):
            try:
                ok, results = conn.recv()
            except (EOFError, OSError):
                self._lost(process)
            if not ok:
                self.close()
                raise RuntimeError(f"a helper process failed:\n{results}")
            out[k::n] = results
        return out

    def _lost(self, process: Any) -> NoReturn:
        process.join(timeout=1)
        code = process.exitcode
        self.close()
        raise RuntimeError(f"a helper process ended without answering (exit code {code}; killed for memory?); "
                           "run with one process (--jobs 1)") from None

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        for _ in range(self.processes - 1):
            mine, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, self.work), daemon=True)
            process.start()
            theirs.close()
            self._helpers.append((process, mine))

    def close(self) -> None:
        for process, conn in self._helpers:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        self._helpers = []

    def __enter__(self) -> Helpers[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(conn: Any, work: Callable[[Any], Any]) -> None:
    """A helper's loop: a batch in, its results (or the error) out, until None."""
    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        if items is None:
            return
        try:
            conn.send((True, [work(item) for item in items]))
        except Exception:  # noqa: BLE001 -- the parent raises it, with the helper's traceback
            conn.send((False, traceback.format_exc()))


__all__ = ["Helpers", "forked_map", "forks"]
