"""The MCTS's deltas (`solver.search.mcts_pricing`, module docstring "Deltas";
`solver.search.footprints`): two states with the same key give an action
the same change of step time, the key is not trivially coarse, and a search
that takes candidates' step times from deltas returns the plans of one
that times them all, with no delta ever contradicted by a timing."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict

import pytest
from test_cpsat import ZERO_CASES, setup, slow_hardware

from ir.core import Mesh
from ir.lower import LoweringError
from solver.search import mcts
from solver.search.footprints import Footprints
from solver.search.mcts import MctsOptions, solve
from solver.search.mcts_actions import actions, statically_valid, successor
from solver.search.report import SILENT
from solver.search.space import Point

# (program, its arguments, mesh, ZeRO levels in the space)
DELTA_CASES = [
    ("transformer", dict(layers=2), Mesh.of(batch=2, model=2), False),
    *[(name, kwargs, mesh, True) for name, kwargs, mesh in ZERO_CASES],
]
DELTA_IDS = ["transformer-2d", "mlp-zero", "deep-mlp-zero", "mlp-2d-zero"]


def _step_time(table, space, point: Point) -> float | None:
    try:
        return table.timed(space.codes(point)).step_time_s
    except LoweringError:
        return None


@pytest.mark.parametrize("name,kwargs,mesh,zero", DELTA_CASES, ids=DELTA_IDS)
def test_states_with_the_same_key_give_an_action_the_same_delta(name, kwargs, mesh, zero):
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=zero)
    footprints = Footprints(space, table)
    moves, _ = actions(space, 0)
    rng = random.Random(0)
    by_key: dict[tuple, list[float]] = defaultdict(list)
    by_action: dict[object, set[float]] = defaultdict(set)
    recodings: dict[tuple, set[bytes]] = defaultdict(set)  # per key: the I-classes the action recodes, and to what
    for _ in range(60):  # random walks from the root, each state's valid actions measured
        point = Point(frozenset(), ())
        for _ in range(4):
            here = _step_time(table, space, point)
            valid = [a for a in moves if statically_valid(point, a, space)]
            if here is None or not valid:
                break
            codes = space.codes(point)
            for action in rng.sample(valid, min(6, len(valid))):
                after_codes = space.codes(successor(point, action))
                changed = (after_codes != codes).nonzero()[0]
                recodings[footprints.key(point, action)].add(changed.tobytes() + after_codes[changed].tobytes())
                after = _step_time(table, space, successor(point, action))
                if after is not None:
                    delta = after - here
                    by_key[footprints.key(point, action)].append(delta)
                    by_action[action].add(round(delta / max(here, 1e-300), 9))
            point = successor(point, rng.choice(valid))
    shared = [deltas for deltas in by_key.values() if len(deltas) > 1]
    assert len(shared) >= 10, "too few states met again under one key for the test to say anything"
    for deltas in shared:
        scale = max(abs(d) for d in deltas) + 1e-12
        assert max(deltas) - min(deltas) <= 1e-9 * scale + 1e-15, deltas
    # The key is needed: one action changes the step time differently from different states.
    assert any(len(changes) > 1 for changes in by_action.values())
    # And it holds how the action recodes the state (what `_Mcts.children` patches codes by).
    assert sum(len(r) == 1 for r in recodings.values()) >= 10 and all(len(r) == 1 for r in recodings.values())


@pytest.mark.parametrize("name,kwargs,mesh,zero", DELTA_CASES, ids=DELTA_IDS)
@pytest.mark.parametrize("memory", [None, "60KB"], ids=["roomy", "memory-shaped"])
def test_a_search_with_deltas_returns_the_plans_of_one_that_times_every_candidate(name, kwargs, mesh, zero, memory):
    hardware = slow_hardware(mesh) if memory is None else slow_hardware(mesh, memory=memory)
    model, nda, table, space = setup(name, kwargs, mesh, hardware, zero=zero)
    runs = {}
    for deltas in (False, True):
        options = MctsOptions(iterations=300, min_dims=0, deltas=deltas)
        search = mcts._Mcts(space, table, options, SILENT)
        search.run()
        runs[deltas] = search
        assert search.delta_misses == 0
    timed, estimated = runs[False], runs[True]
    # The same cost; its seconds by kind to the last bits: where two layer groups' plans tie, a delta's
    # last bits may pick the other, whose kernels sum in another order (transformer-2d, memory-shaped).
    a, b = estimated.best[0].cost, timed.best[0].cost
    assert dataclasses.replace(a, seconds_by_kind={}) == dataclasses.replace(b, seconds_by_kind={})
    assert a.seconds_by_kind.keys() == b.seconds_by_kind.keys()
    assert a.seconds_by_kind == pytest.approx(b.seconds_by_kind, rel=1e-12)
    assert timed.estimated == 0
    if memory is None:
        assert estimated.estimated > 0
    else:  # states that do not fit: a candidate whose step time is known is replayed for its peak alone
        assert estimated.peaks and timed.peaks
        # and without deltas only after its timing (`Pricing.least`: its bound first ranks it with RT 0)
        assert timed.peaks.keys() <= timed.timed.keys() | timed.prices.keys()
    if estimated.estimated:
        assert len(estimated.timed) + len(estimated.prices) < len(timed.timed) + len(timed.prices)


@pytest.mark.parametrize("name,kwargs,mesh,zero", DELTA_CASES, ids=DELTA_IDS)
def test_children_patched_by_their_key_have_the_codes_made_afresh(name, kwargs, mesh, zero):
    """`_Mcts.children` makes a child's codes from its parent's and the change
    its key's first child made: each equals the codes made from the point."""
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=zero)
    search = mcts._Mcts(space, table, MctsOptions(iterations=300, min_dims=0), SILENT)
    search.run()
    for (point, action), child in search.children_of.items():
        made = search.work(("codes", successor(point, action), None))
        if child is None:  # a no-op: the parent's codes
            made_parent = search.work(("codes", point, None))
            assert (made == made_parent).all()
        else:
            assert (child[1] == made).all()
    assert 0 < len(search.patches) < len(search.children_of)  # keys met again: children patched


def test_the_report_counts_the_candidates_deltas_gave():
    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=2), mesh, slow_hardware(mesh))
    report = solve(space, table, MctsOptions(iterations=300, min_dims=0)).report.to_json()
    assert report["estimated"] > 0
    assert solve(space, table, MctsOptions(iterations=300, min_dims=0, deltas=False)).report.to_json()["estimated"] == 0


@pytest.mark.parametrize("name,kwargs,mesh,zero", DELTA_CASES, ids=DELTA_IDS)
def test_the_peak_alone_is_the_priced_peak(name, kwargs, mesh, zero):
    """`CostTable.peak_bytes` (what a state whose step time a delta gave is
    replayed for) equals the peak of the whole price, folded or not."""
    from solver.search.keys import IClassKeys

    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=zero)
    fold = table.fold(IClassKeys(space).representatives())
    moves, _ = actions(space, 0)
    rng = random.Random(1)
    checked = 0
    for _ in range(20):
        point = Point(frozenset(), ())
        for _ in range(rng.randint(0, 5)):
            valid = [a for a in moves if statically_valid(point, a, space)]
            if not valid:
                break
            point = successor(point, rng.choice(valid))
        codes = space.codes(point)
        try:
            whole = table.timed(codes).cost().peak_memory_bytes
        except LoweringError:
            continue
        assert table.peak_bytes(codes) == whole
        assert table.peak_bytes(codes, fold) == whole
        checked += 1
    assert checked >= 10
