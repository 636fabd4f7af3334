"""Independent, deterministic work in forked processes: the mesh screen's
meshes (`solver.planning.mesh_screen`), CP-SAT's re-ranked plans
(`solver.search.cpsat`), the MCTS's candidates (`Helpers`), a small result
the planner needs later while it goes on (`Beside`). A forked child
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
    open (a `with` block): `map(items)` hands every process the batch, and
    each (this one too) takes the next item no process has taken, until none
    is left; the results come back in the items' order. A search hands its
    small batches over again and again: keeping the helpers costs one fork
    each, not one a batch, and this process works too rather than waits.
    Items are taken as processes come free, not dealt out in turn: the
    items of a batch differ in cost (a timing, a peak replay, a whole
    price), and a helper also idles while this process works between
    batches; dealt k-th of every n, one process waited for the other 0.7-1.2
    s of the 5-8 s of batches on unet, llama2_70b and mixtral_8x7b. A helper
    forks at the first batch worth sharing and sees this process's memory as
    it was then, so `work` must give the same result wherever it runs; what
    it changes (a cache) stays where it ran. Where the platform does not
    fork, or with one process, all of it runs here."""

    def __init__(self, work: Callable[[Any], T], processes: int) -> None:
        self.work, self.processes = work, processes
        self._helpers: list[tuple[Any, Any]] = []  # (process, connection)
        self._next: Any = None  # the next item no process has taken, shared with the helpers

    def map(self, items: Sequence[Any]) -> list[T]:
        if not forks(self.processes, len(items)):
            return [self.work(item) for item in items]
        if not self._helpers:
            self._start()
        self._next.value = 0  # the helpers wait for the batch: nothing else reads it now
        items = list(items)
        for process, conn in self._helpers:
            try:
                conn.send(items)
            except OSError:
                self._lost(process)
        out: list[Any] = [None] * len(items)
        try:
            for k, result in _take(self._next, items, self.work):
                out[k] = result
        except BaseException:
            self.close()  # the helpers' answers to this batch are never read: no later batch may read them
            raise
        for process, conn in self._helpers:
            try:
                ok, results = conn.recv()
            except (EOFError, OSError):
                self._lost(process)
            if not ok:
                self.close()
                raise _raised(*results)
            for k, result in results:
                out[k] = result
        return out

    def _lost(self, process: Any) -> NoReturn:
        process.join(timeout=1)
        code = process.exitcode
        self.close()
        raise RuntimeError(f"a helper process ended without answering (exit code {code}; killed for memory?); "
                           "run with one process (--jobs 1)") from None

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        self._next = context.Value("q", 0)
        for _ in range(self.processes - 1):
            mine, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, self.work, self._next), daemon=True)
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


class Beside(Generic[T]):
    """`work()` in a forked process while this one goes on; `result()` waits
    for it (once; in a `with` block, which ends the child where it was
    never asked). For work whose result is small and which only reads what
    this process holds when it forks: the program's cost on one device
    while this process analyzes the program (`planner.prepare`), the named
    schedules' plans while it makes the program's cost table
    (`floor.expert_floor`). What `work` changes (a cache) stays in the
    child. Where there is one process, the platform does not fork, or this
    process is itself a helper (a daemon may not fork), `result()` runs it
    here."""

    def __init__(self, work: Callable[[], T], processes: int) -> None:
        self._work = work
        self._process: Any = None
        if processes > 1 and "fork" in multiprocessing.get_all_start_methods() \
                and not multiprocessing.current_process().daemon:
            context = multiprocessing.get_context("fork")
            self._conn, theirs = context.Pipe(duplex=False)
            self._process = context.Process(target=_beside, args=(theirs, work), daemon=True)
            self._process.start()
            theirs.close()

    def result(self) -> T:
        if self._process is None:
            return self._work()
        process, self._process = self._process, None
        try:
            ok, out = self._conn.recv()
        except (EOFError, OSError):
            process.join(timeout=1)
            raise RuntimeError(f"a process working beside this one ended without answering (exit code "
                               f"{process.exitcode}; killed for memory?); run with one process (--jobs 1)"
                               ) from None
        finally:
            self._conn.close()
        process.join()
        if not ok:
            raise _raised(*out)
        return out

    def __enter__(self) -> Beside[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        """A result never asked for (this process raised first): the child is ended, not left to wait."""
        if self._process is not None:
            self._process.terminate()
            self._process.join()
            self._conn.close()
            self._process = None


def _beside(conn: Any, work: Callable[[], Any]) -> None:
    """`Beside`'s child: the result (or the error) out, once."""
    try:
        conn.send((True, work()))
    except Exception as err:  # noqa: BLE001 -- the parent raises it, with the child's traceback
        _send_failure(conn, err)


def _take(next_item: Any, items: Sequence[Any], work: Callable[[Any], Any]) -> list[tuple[int, Any]]:
    """(k, work(items[k])) for each item this process takes: the next one no
    process has taken (`next_item`, shared), until none is left."""
    done = []
    while True:
        with next_item.get_lock():
            k = next_item.value
            next_item.value = k + 1
        if k >= len(items):
            return done
        done.append((k, work(items[k])))


def _serve(conn: Any, work: Callable[[Any], Any], next_item: Any) -> None:
    """A helper's loop: a batch in, the results of the items it took (or the error) out, until None."""
    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        if items is None:
            return
        try:
            conn.send((True, _take(next_item, items, work)))
        except Exception as err:  # noqa: BLE001 -- the parent raises it, with the helper's traceback
            _send_failure(conn, err)


def _send_failure(conn: Any, err: Exception) -> None:
    """What a child raised, and its traceback, out to the parent (`_raised`);
    called where it was caught."""
    text = traceback.format_exc()
    try:
        conn.send((False, (err, text)))
    except Exception:  # noqa: BLE001 -- it does not pickle: its traceback alone
        conn.send((False, (None, text)))


def _raised(error: BaseException | None, text: str) -> BaseException:
    """What a helper raised, to raise here: the same exception (so an item
    fails alike wherever it was taken), its traceback in the helper noted;
    one that does not pickle as a RuntimeError with that traceback."""
    if error is None:
        return RuntimeError(f"a helper process failed:\n{text}")
    error.add_note(f"raised in a helper process:\n{text}")
    return error


__all__ = ["Beside", "Helpers", "forked_map", "forks"]
