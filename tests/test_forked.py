"""solver.search.forked: work shared with forked processes (kept open by
`Helpers`, one batch by `forked_map`), the results in order, a helper's
failure raised here."""

from __future__ import annotations

import os

import pytest

from solver.search.forked import Helpers, forked_map, forks

needs_fork = pytest.mark.skipif(not forks(2, 2), reason="the platform does not fork")


def _where(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@needs_fork
def test_helpers_return_every_result_in_order_and_share_the_work():
    with Helpers(_where, 3) as helpers:
        first = helpers.map(list(range(10)))
        again = helpers.map(list(range(7)))  # the same helpers, kept between batches
        kept = list(helpers._helpers)
    assert [r for r, _ in first] == [x * x for x in range(10)]
    assert [r for r, _ in again] == [x * x for x in range(7)]
    pids = {pid for _, pid in first}
    assert len(pids) == 3 and os.getpid() in pids
    assert {pid for _, pid in again} == pids  # not forked again
    assert all(not process.is_alive() for process, _ in kept)  # closed with the block


def test_one_process_or_one_item_runs_here():
    with Helpers(_where, 1) as helpers:
        assert helpers.map([1, 2, 3]) == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]
        assert not helpers._helpers
    with Helpers(_where, 4) as helpers:
        assert helpers.map([5]) == [(25, os.getpid())]
        assert not helpers._helpers


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x


@needs_fork
def test_a_helpers_failure_is_raised_here_with_its_traceback():
    with Helpers(_fails_on_three, 2) as helpers, pytest.raises(RuntimeError, match="three is not allowed"):
        helpers.map([0, 1, 2, 3])  # 3 goes to the helper (odd positions)


def _dies_on_three(x: int) -> int:
    if x == 3:
        os._exit(9)  # as the kernel's OOM killer would end it
    return x


@needs_fork
def test_a_helper_that_dies_is_named_and_the_others_closed():
    with Helpers(_dies_on_three, 2) as helpers:
        assert helpers.map([0, 1]) == [0, 1]
        with pytest.raises(RuntimeError, match="exit code 9"):
            helpers.map([0, 1, 2, 3])
        assert not helpers._helpers


@needs_fork
def test_a_failure_here_leaves_no_answer_for_the_next_batch():
    with Helpers(_fails_on_three, 2) as helpers:
        with pytest.raises(ValueError, match="three"):
            helpers.map([1, 0, 3, 2])  # 3 fails here (even positions), 0 and 2 were the helper's
        assert helpers.map([4, 5, 6, 7]) == [4, 5, 6, 7]  # not the helper's answer to the batch before


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
