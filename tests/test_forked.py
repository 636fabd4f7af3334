"""solver.search.forked: work shared with forked processes (kept open by
`Helpers`, its items taken as processes come free; one batch by
`forked_map`; one result made beside this process by `Beside`), the
results in order, a helper's failure raised here."""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass

import pytest

from solver.search.forked import Beside, Helpers, forked_map, forks

needs_fork = pytest.mark.skipif(not forks(2, 2), reason="the platform does not fork")


def _where(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


# Items are taken as processes come free, so which process works which item is the machine's
# timing. A test that needs each process to work one item hands over a batch of `_Meet`s, one a
# process: each waits at a barrier for the others, so no process can take a second before every
# process took one.
_PARENT = os.getpid()
_BARRIER: list = []  # the barrier of the test running, made before its helpers fork


@dataclass(frozen=True)
class _Meet:
    x: int


def _meet(processes: int) -> list[_Meet]:
    """A batch of one `_Meet` a process; call it before the helpers fork (they see the barrier then)."""
    _BARRIER[:] = [multiprocessing.get_context("fork").Barrier(processes)]
    return [_Meet(x) for x in range(processes)]


def _where_met(item: _Meet | int) -> tuple[int, int]:
    if isinstance(item, _Meet):
        _BARRIER[0].wait(timeout=60)
        item = item.x
    return _where(item)


@needs_fork
def test_helpers_return_every_result_in_order_and_share_the_work():
    with Helpers(_where_met, 3) as helpers:
        met = helpers.map(_meet(3))  # each of the three processes takes one
        first = helpers.map(list(range(10)))
        again = helpers.map(list(range(7)))  # the same helpers, kept between batches
        kept = list(helpers._helpers)
    assert [r for r, _ in met] == [0, 1, 4]
    assert [r for r, _ in first] == [x * x for x in range(10)]
    assert [r for r, _ in again] == [x * x for x in range(7)]
    pids = {pid for _, pid in met}
    assert len(pids) == 3 and os.getpid() in pids
    assert {pid for _, pid in first + again} <= pids  # not forked again
    assert all(not process.is_alive() for process, _ in kept)  # closed with the block


@needs_fork
def test_a_slow_item_does_not_hold_back_the_rest():
    """Dealt in turn, a process would wait for the slow item's process to come to its next item."""
    with Helpers(_slow_first, 2) as helpers:
        out = helpers.map(_meet(2) + [2, 3, 4, 5])
    slow = next(pid for (x, pid) in out[:2] if x == 0)
    assert [x for x, _ in out] == [0, 1, 2, 3, 4, 5]
    assert all(pid != slow for _, pid in out[2:])  # the other process took every item after the meeting


def _slow_first(item: _Meet | int) -> tuple[int, int]:
    x, pid = _where_met(item)
    if isinstance(item, _Meet) and item.x == 0:
        time.sleep(1.0)  # long enough for the other process to take every item left
    return item.x if isinstance(item, _Meet) else item, pid


def test_one_process_or_one_item_runs_here():
    with Helpers(_where, 1) as helpers:
        assert helpers.map([1, 2, 3]) == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]
        assert not helpers._helpers
    with Helpers(_where, 4) as helpers:
        assert helpers.map([5]) == [(25, os.getpid())]
        assert not helpers._helpers


def _fails_in_a_helper(item: _Meet | int) -> int:
    _where_met(item)
    if os.getpid() != _PARENT:
        raise ValueError("not in a helper")
    return 0


@needs_fork
def test_a_helpers_failure_is_raised_here_as_itself_with_its_traceback():
    with Helpers(_fails_in_a_helper, 2) as helpers, pytest.raises(ValueError, match="not in a helper") as raised:
        helpers.map(_meet(2))  # one of the two is the helper's
    assert any("raised in a helper process" in note and "_fails_in_a_helper" in note
               for note in raised.value.__notes__)


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not pickled")


def _fails_unpicklably_in_a_helper(item: _Meet | int) -> int:
    _where_met(item)
    if os.getpid() != _PARENT:
        raise _Unpicklable("the lock it holds")
    return 0


@needs_fork
def test_a_helpers_failure_that_does_not_pickle_is_raised_with_its_traceback():
    with Helpers(_fails_unpicklably_in_a_helper, 2) as helpers, \
            pytest.raises(RuntimeError, match="a helper process failed:(.|\n)*the lock it holds"):
        helpers.map(_meet(2))


def _dies_in_a_helper(item: _Meet | int) -> int:
    x, _ = _where_met(item)
    if isinstance(item, _Meet) and os.getpid() != _PARENT:
        os._exit(9)  # as the kernel's OOM killer would end it
    return x


@needs_fork
def test_a_helper_that_dies_is_named_and_the_others_closed():
    meeting = _meet(2)  # its barrier made before the helper forks
    with Helpers(_dies_in_a_helper, 2) as helpers:
        assert helpers.map([0, 1]) == [0, 1]
        with pytest.raises(RuntimeError, match="exit code 9"):
            helpers.map(meeting)
        assert not helpers._helpers


def _fails_here_on_meeting(item: _Meet | int) -> int:
    x, _ = _where_met(item)
    if isinstance(item, _Meet) and os.getpid() == _PARENT:
        raise ValueError("failed here")
    return item if isinstance(item, int) else -1


@needs_fork
def test_a_failure_here_leaves_no_answer_for_the_next_batch():
    with Helpers(_fails_here_on_meeting, 2) as helpers:
        with pytest.raises(ValueError, match="failed here"):
            helpers.map(_meet(2))  # the helper answered its item; this process failed on its own
        assert helpers.map([4, 5, 6, 7]) == [4, 5, 6, 7]  # not the helper's answer to the batch before


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x


def _dies_on_three(x: int) -> int:
    if x == 3:
        os._exit(9)  # as the kernel's OOM killer would end it
    return x


@needs_fork
def test_forked_map_returns_every_result_in_order_from_its_processes():
    done = []
    out = forked_map(_where, 6, 2, done.append)
    assert [r for r, _ in out] == [x * x for x in range(6)] and done == list(range(6))
    assert os.getpid() not in {pid for _, pid in out}  # the children's, this process waits
    assert forked_map(_where, 3, 1) == [(x * x, os.getpid()) for x in range(3)]  # one process: here


@needs_fork
def test_forked_map_raises_when_a_child_dies_rather_than_wait_for_it():
    with pytest.raises(RuntimeError, match="killed for memory"):
        forked_map(_dies_on_three, 5, 2)
    with pytest.raises(ValueError, match="three is not allowed"):  # an exception comes back as it was
        forked_map(_fails_on_three, 5, 2)


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _pid_met() -> int:
    _BARRIER[0].wait(timeout=60)
    return os.getpid()


@needs_fork
def test_beside_works_in_a_child_while_this_process_goes_on():
    _meet(2)  # a barrier for this process and the child: neither passes it until both are at it
    with Beside(_pid_met, 2) as beside:
        here = _pid_met()  # before the result is asked for: the child is at work already
        there = beside.result()
    assert here == os.getpid() != there
    assert Beside(os.getpid, 1).result() == os.getpid()  # one process: here, when asked


@needs_fork
def test_beside_raises_the_childs_failure_and_death_here():
    with Beside(lambda: _fails_on_three(3), 2) as beside, pytest.raises(ValueError, match="three is not allowed"):
        beside.result()
    with Beside(lambda: _dies_on_three(3), 2) as beside, pytest.raises(RuntimeError, match="exit code 9"):
        beside.result()


@needs_fork
def test_beside_ends_a_child_never_asked():
    with Beside(lambda: _pid_after(60), 2) as beside:
        child = beside._process
    assert not child.is_alive() and beside._process is None


@needs_fork
def test_a_program_prepared_with_two_jobs_is_costed_beside_its_analysis_alike(monkeypatch):
    """`planner.prepare` with two jobs costs the program on one device in a
    child while it analyzes it: the same analysis and cost as one process."""
    from conftest import ROOT

    from solver.planning import planner
    from solver.planning.spec import load_spec

    spec = load_spec(ROOT / "specs/transformer.yaml")
    one = planner.prepare(spec, ("layers.*",))
    costed_here = []
    evaluate = planner.evaluate
    monkeypatch.setattr(planner, "evaluate", lambda *a: costed_here.append(os.getpid()) or evaluate(*a))
    two = planner.prepare(spec, ("layers.*",), jobs=2)
    assert costed_here == []  # the child's call, recorded in the child
    assert two.baseline == one.baseline and two.nda.iclasses == one.nda.iclasses
    # The child's kernels and one-device seconds, adopted here for the cost table and the search.
    from costmodel import evaluate as costing
    from costmodel import fusion

    fn, hardware = two.model.function, spec.hardware_obj()
    assert fusion._FUSIONS.find((fn,), None) == fusion._fuse(fn)
    assert costing._IDEAL_SECONDS.find((fn, hardware.device), None) == costing._one_device_seconds(fn, hardware)
    assert planner.prepare(spec, ("layers.*",)).baseline == one.baseline and costed_here == [os.getpid()]
