"""The MCTS backend: reproducible, reaches the brute-force optimum of small
spaces, its plans execute correctly, its transposition table merges action
orders, and it is reachable from the planner and the CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from spmd_check import assert_lowering_matches
from test_cpsat import CASES, EXECUTION_CASES, EXECUTION_IDS, ZERO_CASES, brute_force, setup, slow_hardware, write_spec

from costmodel.evaluate import evaluate
from ir.core import Mesh
from ir.lower import lower
from solver.planning.expect import COLLECTIVE_KINDS
from solver.search import mcts, mcts_polish
from solver.search.forked import forks
from solver.search.mcts import MctsOptions, solve
from solver.search.report import SILENT
from solver.search.space import Point


@pytest.mark.parametrize("name,kwargs,mesh,step", CASES[:4], ids=lambda v: str(v) if isinstance(v, Mesh) else None)
def test_reaches_the_brute_force_optimum_and_prices_like_the_cost_model(name, kwargs, mesh, step):
    model, nda, table, space = setup(name, kwargs, mesh, step=step)
    result = solve(space, table, MctsOptions(iterations=400, seed=0))
    assert result.report.status == "feasible"
    assert result.cost.step_time_s == pytest.approx(brute_force(space, table), rel=1e-12)
    lowered = evaluate(lower(model.function, nda, result.sharding).function, table.hardware)
    assert result.report.objective_s == pytest.approx(lowered.step_time_s, rel=1e-9)
    assert result.sharding == result.plan.materialize(nda)


@pytest.mark.parametrize("name,kwargs,mesh", ZERO_CASES[:2], ids=["mlp", "deep-mlp"])
def test_reaches_the_brute_force_optimum_of_a_space_with_zero_levels(name, kwargs, mesh):
    """Actions set partial levels too: the search reaches the optimum of the
    enlarged space, which holds a partial level (tests/test_cpsat.py)."""
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=True)
    result = solve(space, table, MctsOptions(iterations=400, seed=0, min_dims=0))
    assert result.cost.step_time_s == pytest.approx(brute_force(space, table), rel=1e-12)
    assert result.sharding == result.plan.materialize(nda)
    assert space.point_of(result.sharding, dict(result.plan.resolutions)).partial


@pytest.mark.parametrize("name,kwargs,mesh", EXECUTION_CASES, ids=EXECUTION_IDS)
def test_returned_plans_execute_correctly(name, kwargs, mesh):
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh))
    result = solve(space, table, MctsOptions(iterations=300, min_dims=0))
    lowered = lower(model.function, nda, result.sharding)
    assert any(op.kind.startswith("all_") or op.kind == "reduce_scatter" for op in lowered.function.ops)
    assert_lowering_matches(model, lowered)


def test_same_seed_same_plan():
    model, nda, table, space = setup("transformer", dict(layers=2), Mesh.of(batch=2, model=2), slow_hardware(
        Mesh.of(batch=2, model=2)))
    runs = [solve(space, table, MctsOptions(iterations=150, round_iterations=50, seed=5)) for _ in range(2)]
    assert runs[0].plan == runs[1].plan
    first, again = (r.report.to_json() for r in runs)
    for field in ("evaluations", "states", "merged", "iterations", "rounds", "objective_s"):
        assert first[field] == again[field]


def test_transposition_table_merges_permuted_action_orders():
    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=1), mesh, slow_hardware(mesh))
    search = mcts._Mcts(space, table, MctsOptions(min_dims=0), SILENT)
    root_point = Point(frozenset(), ())
    root = search.node(root_point, search.codes(root_point))
    # Two actions on different axes that both change the sharding, from the root and from each other.
    a = next(x for x in search.actions if search.child(root.point, root.codes, x))
    b = next(x for x in search.actions if x.axis != a.axis and x.group != a.group
             and search.child(root.point, root.codes, x)
             and search.child(*search.child(root.point, root.codes, a), x))
    after_a = search.node(*search.child(root.point, root.codes, a))
    after_b = search.node(*search.child(root.point, root.codes, b))
    ab = search.node(*search.child(after_a.point, after_a.codes, b))
    count = len(search.nodes)
    ba = search.node(*search.child(after_b.point, after_b.codes, a))
    assert ab is ba and len(search.nodes) == count  # one state, one node: shared statistics
    # A whole search (long enough: rounds of 50 trajectories at least) reaches states by several orders and says so.
    result = solve(space, table, MctsOptions(iterations=200, min_dims=0, patience=50))
    assert result.report.merged > 0 and result.report.states < result.report.iterations + 1


def test_states_keep_their_codes_narrow_and_price_as_the_table_does():
    """The search keeps every state's codes (and keys its prices by them):
    one per key, one byte each where the mesh has under 256 axis tuples,
    every I-class's code read from them, the same prices as the table's
    int64 codes; the codes the table reads (`held`) hold its fold, and the
    table takes them unchecked with the same figures."""
    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=1), mesh, slow_hardware(mesh))
    search = mcts._Mcts(space, table, MctsOptions(min_dims=0), SILENT)
    root = Point(frozenset(), ())
    point, codes = next(c for a in search.actions if (c := search.child(root, search.codes(root), a)))
    assert codes.dtype == np.uint8 and np.array_equal(search.whole(codes), space.codes(point))
    assert len(codes) < len(nda.iclasses)
    assert search.price(point, codes).cost == table.evaluate(space.codes(point))
    for state in (codes, search.codes(root)):
        held = search.held(state)
        assert held.dtype == np.int64 and np.array_equal(held, np.append(search.whole(state), 0))
        assert search.fold.holds(held)
        assert table.timed(held, search.fold, held=True).cost() == table.evaluate(search.whole(state))
        assert table.peak_bytes(held, search.fold, held=True) == table.evaluate(search.whole(state)).peak_memory_bytes


def test_actions_are_pruned_and_no_op_actions_are_invalid():
    mesh = Mesh.of(x=4)
    model, nda, table, space = setup("mlp", dict(batch=8, d_in=8, hidden=8, d_out=8), mesh, slow_hardware(mesh))
    everything = mcts._Mcts(space, table, MctsOptions(min_dims=0), SILENT)
    assert everything.pruned == 0 and len(everything.actions) >= len(space.variables)
    sizes = sorted(sum(nda.color_names[c] for c in space.groups[g]) for g, _ in space.variables)
    threshold = sizes[len(sizes) // 2]
    some = mcts._Mcts(space, table, MctsOptions(min_dims=threshold), SILENT)
    assert 0 < some.pruned < len(everything.actions)
    assert all(sum(nda.color_names[c] for c in space.groups[a.group]) >= threshold for a in some.actions)
    # With every action pruned, the only plan is the earlier tactics' (here: replicated).
    none = solve(space, table, MctsOptions(min_dims=10**9, iterations=20))
    assert none.report.actions == 0 and not any(none.sharding.axes)
    # An action whose color is already taken on its axis changes nothing: it is not a child.
    point = Point(frozenset(), ())
    codes = everything.codes(point)
    for action in everything.actions:
        after = everything.child(point, codes, action)
        if after is not None:
            again = everything.child(after[0], after[1], action)  # the same (group, axis) twice
            assert again is None or not np.array_equal(again[1], after[1])


def test_no_plan_fits_is_said_plainly():
    mesh = Mesh.of(x=4)
    model, nda, table, space = setup("mlp", dict(batch=512, d_in=32, hidden=32, d_out=32), mesh,
                                     slow_hardware(mesh, memory="100KB"))
    result = solve(space, table, MctsOptions(iterations=100))
    assert result.plan is None and result.report.status == "unknown"
    assert result.report.message.startswith("no plan that fits was found in ")
    assert "the smallest peak found is" in result.report.message


def test_finds_zero3_when_the_replicated_model_does_not_fit():
    mesh = Mesh.of(x=4)
    kwargs = dict(layers=4, d_model=64, batch=512)
    model, nda, table, space = setup("deep_mlp", kwargs, mesh, slow_hardware(mesh, memory="450KB"))
    result = solve(space, table, MctsOptions(iterations=600))
    assert result.cost.fits
    assert result.cost.step_time_s == pytest.approx(brute_force(space, table), rel=1e-12)


def test_options_are_checked():
    with pytest.raises(ValueError, match="iterations must be at least 1"):
        MctsOptions(iterations=0)
    with pytest.raises(ValueError, match="time_limit_s must be positive"):
        MctsOptions(time_limit_s=0)
    with pytest.raises(ValueError, match=r"round_gain must be in \[0, 1\)"):
        MctsOptions(round_gain=1.0)


def test_a_round_that_gains_too_little_ends_the_search():
    """The search goes on after a round only where the round lowered the
    tree's best C(s) by more than `round_gain`: a gain no round reaches
    ends it after the second (the first is judged against nothing)."""
    model, nda, table, space = setup("transformer", dict(layers=2), Mesh.of(batch=2, model=2), slow_hardware(
        Mesh.of(batch=2, model=2)))
    runs = {gain: solve(space, table, MctsOptions(iterations=400, seed=1, round_iterations=3, round_gain=gain)).report
            for gain in (0.0, 0.01, 0.99)}
    assert runs[0.0].rounds > runs[0.01].rounds > runs[0.99].rounds == 2
    assert runs[0.99].stopped_by == "no-improvement"
    assert runs[0.99].iterations < runs[0.0].iterations
    # A plan that fits after one that does not is a gain whatever its C(s); the reverse never is.
    assert mcts._gained((True, 1.0), (False, 5.0), 0.5) and not mcts._gained((False, 1.0), (True, 0.1), 0.5)
    assert mcts._gained((False, 1.0), (False, 0.98), 0.01) and not mcts._gained((False, 1.0), (False, 0.995), 0.01)


def test_a_later_round_ends_after_patience_trajectories_that_gain_too_little(monkeypatch):
    """A trajectory of a round after the first counts as progress only where
    it lowers the tree's best C(s) by more than `round_gain`: with a gain no
    trajectory reaches, the second round is `patience` trajectories long
    (judged by the round's own best, it ran 3 and 11 here), while the first
    round, judged by any gain, is as long as with no such rule."""
    model, nda, table, space = setup("transformer", dict(layers=2), Mesh.of(batch=2, model=2), slow_hardware(
        Mesh.of(batch=2, model=2)))
    rounds: list[int] = []  # per trajectory, the round it ran in (the decisions committed before it)
    trajectory = mcts._Mcts.trajectory

    def counted(self, root):
        rank = trajectory(self, root)
        rounds.append(len(self.committed))
        return rank

    monkeypatch.setattr(mcts._Mcts, "trajectory", counted)
    for patience in (2, 3):
        lengths = {}
        for gain in (0.0, 0.99):
            rounds.clear()
            report = solve(space, table, MctsOptions(iterations=400, seed=1, round_iterations=50, patience=patience,
                                                     round_gain=gain)).report
            lengths[gain] = [rounds.count(r) for r in range(report.rounds)]
        assert len(lengths[0.99]) == 2 and lengths[0.99][1] == patience
        assert lengths[0.99][0] == lengths[0.0][0] > patience


def test_cli_plan_with_mcts_and_auto_tactic(capsys, tmp_path):
    from conftest import shardplan

    spec = write_spec(tmp_path, "hardware: A100-80GB\nschedule:\n  - manual: {axis: batch, values: {x: 0}}\n")
    code, out, err = shardplan(capsys, "plan", str(spec), "--solver", "mcts", "--json", "--iterations", "200")
    assert code == 0, err
    report = json.loads(out)
    (search,) = report["search"]
    assert search["solver"] == "mcts" and search["status"] == "feasible" and search["iterations"] <= 200
    assert search["objective_s"] == pytest.approx(report["cost"]["step_time_s"], rel=1e-9)
    code, out, _ = shardplan(capsys, "plan", str(spec), "--solver", "mcts", "--iterations", "50")
    assert code == 0 and "search (mcts on batch, model): best of " in out
    spec = write_spec(tmp_path, "hardware: A100-80GB\nschedule:\n  - manual: {axis: batch, values: {x: 0}}\n"
                      "  - auto: {axes: [model], solver: mcts, iterations: 100, seed: 2}\n")
    code, out, err = shardplan(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    (search,) = json.loads(out)["search"]
    assert search["solver"] == "mcts" and search["axes"] == ["model"] and search["iterations"] <= 100


class FakeTerminal:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("backend", ["cpsat", "mcts"])
def test_progress_line_on_a_terminal_only(backend):
    from solver.search import cpsat
    from solver.search.report import Progress

    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=1), mesh, slow_hardware(mesh))
    shown = {}
    for tty in (True, False):
        stream = FakeTerminal(tty)
        progress = Progress(stream, interval_s=0.0)
        if backend == "mcts":
            plan = solve(space, table, MctsOptions(iterations=50), progress).plan
        else:
            plan = cpsat.solve(space, table, cpsat.CpSatOptions(time_limit_s=30), progress=progress).plan
        progress.clear()
        shown[tty] = (stream.text, plan)
    text, plan = shown[True]
    assert text.startswith(f"\r{backend}: ") and "best step time" in text and text.endswith("\r")
    assert "\n" not in text  # one line, rewritten in place
    assert shown[False] == ("", plan)  # silent when not a terminal, and the search is the same
    quiet = FakeTerminal(True)
    Progress(quiet, enabled=False).update("x")
    assert quiet.text == ""


def test_cli_compare(capsys, tmp_path):
    from conftest import shardplan

    spec = write_spec(tmp_path, "hardware: A100-80GB\nschedule:\n  - manual: {axis: batch, values: {x: 0}}\n")
    code, out, err = shardplan(capsys, "compare", str(spec), "--json", "--budget", "20", "--iterations", "200")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) == {"cpsat", "mcts"}
    for solver, r in report.items():
        assert r["solver"] == solver and r["search"][0]["solver"] == solver
        assert set(r["collectives"]) == set(COLLECTIVE_KINDS)
    # CP-SAT is exact on this space: the MCTS plan is never faster.
    assert report["cpsat"]["cost"]["step_time_s"] <= report["mcts"]["cost"]["step_time_s"] * (1 + 1e-9)
    code, out, err = shardplan(capsys, "compare", str(spec), "--budget", "20", "--iterations", "200", "--quiet")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].endswith("CP-SAT against MCTS on the same cost model")
    header = lines[2].split()
    assert header == ["CP-SAT", "MCTS"]
    for row in ("estimated step time", "efficiency", "peak memory", "fits", "all_reduce", "search time", "status"):
        assert any(line.startswith(row) for line in lines), row
    assert lines[-1].startswith(("same estimated step time", "CP-SAT's plan is faster", "MCTS's plan is faster"))


def test_cli_compare_when_nothing_fits(capsys, tmp_path):
    from conftest import shardplan

    spec = write_spec(tmp_path, "hardware: {device: {name: tiny, peak_flops: {f32: 1TFLOP/s}, memory: 10KB, "
                      "memory_bandwidth: 1TB/s}, links: {batch: {kind: nvlink, bandwidth: 1GB/s, latency: 1us}, "
                      "model: {kind: nvlink, bandwidth: 1GB/s, latency: 1us}}}\n")
    code, out, _ = shardplan(capsys, "compare", str(spec), "--iterations", "50")
    assert code == 3
    # 10 KB is below the program's live bytes split evenly over the devices: the planner answers for
    # both backends without searching (`min_peak_memory_bytes`), and says why.
    assert "CP-SAT: no plan: schedule.0.auto: no plan fits" in out
    assert "MCTS: no plan: schedule.0.auto: no plan fits: 9.77 KiB per device on tiny, and every plan's peak" in out
    assert out.rstrip().endswith("neither backend found a plan")


def _best_point(space, table):
    """The fastest point of a small space that fits (brute force), and its step time."""
    best = None
    for point in space.points():
        timed = table.timed(space.codes(point))  # the peak replayed only for a plan faster than the best so far
        if (best is None or timed.step_time_s < best[1]) and timed.cost().fits:
            best = (point, timed.step_time_s)
    return best


def test_an_incumbent_seeds_the_best_found():
    name, kwargs, mesh, step = CASES[0]
    model, nda, table, space = setup(name, kwargs, mesh, step=step)
    options = MctsOptions(iterations=1, polish=False)
    one = solve(space, table, options)
    point, best_s = _best_point(space, table)
    assert best_s < one.report.objective_s * (1 - 1e-9)  # one trajectory alone does not find it
    seeded = solve(space, table, options, incumbent=point)
    assert seeded.cost.step_time_s == pytest.approx(best_s, rel=1e-12)
    assert seeded.report.incumbent_s == pytest.approx(best_s, rel=1e-12)
    assert "no searched plan beat the incumbent" in seeded.report.message
    assert seeded.report.to_json()["incumbent_s"] == seeded.report.incumbent_s
    # A worse incumbent is beaten, and the message does not claim otherwise.
    worst = solve(space, table, MctsOptions(iterations=200), incumbent=Point(frozenset(), ()))
    assert worst.report.incumbent_s > worst.cost.step_time_s
    assert "incumbent" not in worst.report.message


def test_without_an_incumbent_the_search_is_unchanged():
    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=2), mesh, slow_hardware(mesh))
    options = MctsOptions(iterations=100, seed=3)
    plain, none = solve(space, table, options), solve(space, table, options, incumbent=None)
    assert plain.plan == none.plan and none.report.incumbent_s is None
    first, again = plain.report.to_json(), none.report.to_json()
    for field in ("evaluations", "states", "merged", "iterations", "rounds", "objective_s", "message"):
        assert first[field] == again[field]


def test_polish_undoes_a_decision_a_descent_cannot():
    """Actions only add shardings, so a descent from a point holding two
    ZeRO levels ends above the optimum; dropping one decision and
    descending again (the polish after the rounds) reaches it."""
    name, kwargs, mesh = ZERO_CASES[0]
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=True)
    best_s = brute_force(space, table)
    search = mcts._Mcts(space, table, MctsOptions(min_dims=0), SILENT)
    start = Point(frozenset(), (), frozenset({(2, "x", 1), (3, "x", 1)}))
    codes = search.codes(start)
    search.best = (search.price(start, codes), start, codes)
    _, descended = search.descend(start, codes)
    assert table.evaluate(search.whole(descended)).step_time_s > best_s * (1 + 1e-9)
    assert search.polish() >= 2
    assert search.best[0].cost.step_time_s == pytest.approx(best_s, rel=1e-12)
    assert search.best[1].levels() != start.levels()


def test_polish_also_starts_from_descents_avoiding_a_committed_decision():
    """A round commits to the root's child on the way to its best, and the
    polish of the best may not leave that basin (the attention step, seed 0:
    the batch, then the heads, above the optimum, which shards the head dim
    alone): the polish then descends from the root avoiding each committed
    decision (here that descent reaches the optimum itself)."""
    name, kwargs, mesh, step = CASES[3]
    model, nda, table, space = setup(name, kwargs, mesh, step=step)
    best_s = brute_force(space, table)

    def searched(committed: bool) -> mcts._Mcts:
        search = mcts._Mcts(space, table, MctsOptions(iterations=400, seed=0, polish=False), SILENT)
        search.run()
        if not committed:
            search.committed = []
        search.polish()
        return search

    assert searched(committed=False).best[0].cost.step_time_s > best_s * (1 + 1e-9)
    search = searched(committed=True)
    assert search.committed and search.best[0].cost.step_time_s == pytest.approx(best_s, rel=1e-12)


def test_polish_is_an_option():
    name, kwargs, mesh = ZERO_CASES[0]
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=True)
    runs = {flag: solve(space, table, MctsOptions(iterations=1, min_dims=0, polish=flag)) for flag in (False, True)}
    assert runs[True].cost.step_time_s <= runs[False].cost.step_time_s
    assert runs[True].report.evaluations > runs[False].report.evaluations


@pytest.mark.parametrize("memory", [None, "60KB"], ids=["roomy", "memory-shaped"])
def test_candidates_ruled_out_by_time_alone_change_nothing_but_the_work(monkeypatch, memory):
    """A descent step replays for memory only its candidates faster than the
    state it is at, in order, until one fits (`Pricing.step`): the search takes
    the same course and returns the same plan as one that prices every
    candidate, where memory shapes the answer too (there, the step's focus
    may keep candidates that do not fit: a superset; here the same course)."""
    mesh = Mesh.of(batch=2, model=2)
    hardware = slow_hardware(mesh) if memory is None else slow_hardware(mesh, memory=memory)
    model, nda, table, space = setup("transformer", dict(layers=2), mesh, hardware)
    options = MctsOptions(iterations=300, min_dims=0, deltas=False)  # every candidate timed or priced
    bounded = solve(space, table, options)
    def price_every_candidate(self, candidates, here, binds, estimates=None):
        ranks = [self.price(p, c).rank for p, c in candidates]
        improving = [r < here for r in ranks]
        return min((k for k in range(len(ranks)) if improving[k]), key=ranks.__getitem__, default=None), \
            improving, binds

    monkeypatch.setattr(mcts._Mcts, "step", price_every_candidate)
    priced = solve(space, table, options)
    assert bounded.plan == priced.plan and bounded.cost == priced.cost
    one, every = bounded.report.to_json(), priced.report.to_json()
    for field in ("iterations", "rounds", "states", "merged", "stopped_by", "memory_shaped"):
        assert one[field] == every[field], field
    assert one["memory_shaped"] == (memory is not None)
    assert one["timed_only"] > 0 and every["timed_only"] == 0
    # Every state the one search met was priced, timed or (memory shaped) bounded alone; where memory
    # shapes it, a step's focus keeps the candidates a bound could not rule out (a superset), so it may
    # meet more states, most of them neither priced nor timed.
    met = one["evaluations"] + one["timed_only"] + one["bounded"]
    assert met == every["evaluations"] if memory is None else met >= every["evaluations"]
    assert one["evaluations"] < every["evaluations"]
    assert (one["bounded"] > 0) == (memory is not None)


@pytest.mark.skipif(not forks(2, 2), reason="the platform does not fork")
@pytest.mark.parametrize("memory", [None, "60KB"], ids=["roomy", "memory-shaped"])
def test_candidates_priced_in_a_helper_process_are_the_same_search(monkeypatch, memory):
    """With two jobs a descent step's candidates are priced half here, half in
    a forked helper (`mcts_pricing.Pricing.step`): the same plan, cost and course
    as one process, the helper's prices taken in the candidates' order."""
    from solver.search import forked

    mesh = Mesh.of(batch=2, model=2)
    hardware = slow_hardware(mesh) if memory is None else slow_hardware(mesh, memory=memory)
    model, nda, table, space = setup("transformer", dict(layers=2), mesh, hardware)
    options = MctsOptions(iterations=300, min_dims=0)
    alone = solve(space, table, options)
    started, start = [], forked.Helpers._start
    monkeypatch.setattr(forked.Helpers, "_start", lambda self: started.append(self.processes) or start(self))
    shared = solve(space, table, dataclasses.replace(options, jobs=2))
    assert started == [2]  # a helper forked once for the whole search
    assert alone.plan == shared.plan and alone.cost == shared.cost
    one, two = alone.report.to_json(), shared.report.to_json()
    for timing in ("solve_s", "build_s"):
        one.pop(timing), two.pop(timing)
    assert one == two


def test_polish_narrows_a_level_no_action_can_set():
    """A ZeRO level the search has no action for (the incumbent set it; its
    actions were pruned) is narrowed by the polish where narrower is faster:
    dropping it alone would leave a descent nothing to take."""
    name, kwargs, mesh = ZERO_CASES[0]
    # Memory for ZeRO-1 of the group's optimizer state, not for none.
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh, memory="132300B"), zero=True)
    search = mcts._Mcts(space, table, MctsOptions(min_dims=10**9), SILENT)
    assert not search.actions
    none, storage, optimizer = (Point(frozenset(), (), frozenset({(2, "x", level)} if level else ()))
                                for level in (0, 2, 1))
    costs = {p: table.evaluate(space.codes(p)) for p in (none, storage, optimizer)}
    assert not costs[none].fits and costs[storage].fits and costs[optimizer].fits
    assert costs[optimizer].step_time_s < costs[storage].step_time_s
    codes = search.codes(storage)
    search.best = (search.price(storage, codes), storage, codes)
    search.polish()
    # Narrowed to ZeRO-1 (where the batch may also have taken the axis LATE, beside it: no slower).
    assert (2, "x", 1) in search.best[1].partial and (2, "x") not in search.best[1].sharded
    assert search.best[0].cost.step_time_s <= costs[optimizer].step_time_s


def test_refit_finds_memory_in_several_decisions_where_one_fits_slowly():
    """Dropping a decision that made the plan fit, and never taking it again,
    a descent takes the one step that fits however slow it is; the polish's
    refit applies the cheapest sets of actions that save the memory together."""
    name, kwargs, mesh = ZERO_CASES[2]
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh), zero=True)
    replicated = table.evaluate(space.codes(Point(frozenset(), ()))).peak_memory_bytes
    memory = f"{int(replicated * 0.6)}B"
    model, nda, table, space = setup(name, kwargs, mesh, slow_hardware(mesh, memory=memory), zero=True)
    search = mcts._Mcts(space, table, MctsOptions(min_dims=0), SILENT)
    fitted = Point(frozenset({(0, "batch"), (1, "batch"), (2, "model")}), (),
                   frozenset({(1, "model", 2), (3, "model", 1)}))
    assert search.price(fitted, search.codes(fitted)).cost.fits
    start = fitted.without((0, "batch"))
    assert not search.price(start, search.codes(start)).cost.fits
    descended = search.price(*search.descend(start, search.codes(start), (0, "batch")))
    # The actions' savings measured from the state itself, and (as the polish does) from the plan the
    # decision was dropped from, shared by its refits: both find the memory in several decisions.
    measured = [mcts_polish.Savings(search, p, codes, search.price(p, codes).cost)
                for p, codes in ((start, search.codes(start)), (fitted, search.codes(fitted)))]
    for savings in measured:
        items = savings.without((0, "batch"))
        assert items and all((item[2].group, item[2].axis) != (0, "batch") for item in items)
    for shared in measured:
        refitted_point, refitted_codes = mcts_polish.refit(search, start, (0, "batch"), shared)
        refitted = search.price(refitted_point, refitted_codes)
        assert refitted.cost.fits and refitted.rank < descended.rank
        assert (0, "batch") not in refitted_point.levels()
        assert len(refitted_point.levels().items() - start.levels().items()) >= 2


@pytest.mark.skipif(not forks(2, 2), reason="the platform does not fork")
def test_the_time_limit_counts_the_work_handed_out_not_the_clock(monkeypatch):
    """The limit is the seconds of the tasks the search hands out
    (`mcts_pricing`, "Budget"), not the clock's: with the clock stopped a
    search still stops at it, at the same point with two processes; the
    clock stops a run only three times over the limit."""
    import itertools

    mesh = Mesh.of(batch=2, model=2)
    model, nda, table, space = setup("transformer", dict(layers=2), mesh, slow_hardware(mesh, memory="60KB"))
    options = MctsOptions(iterations=300, min_dims=0)
    whole = solve(space, table, options)
    assert whole.report.stopped_by == "no-improvement" and whole.report.work_s > 0
    monkeypatch.setattr(mcts.time, "perf_counter", lambda: 0.0)
    limit = whole.report.work_s / 3
    cut = [solve(space, table, dataclasses.replace(options, time_limit_s=limit, jobs=jobs)) for jobs in (1, 2)]
    one, two = (c.report for c in cut)
    assert one.stopped_by == "time-limit" and one.iterations < whole.report.iterations
    assert limit * 0.75 < one.work_s < whole.report.work_s
    assert (one.iterations, one.evaluations, one.work_s, one.objective_s) == \
        (two.iterations, two.evaluations, two.work_s, two.objective_s)
    assert cut[0].plan == cut[1].plan
    ticks = itertools.count(step=1000.0)  # a thousand seconds between two looks at the clock
    monkeypatch.setattr(mcts.time, "perf_counter", lambda: float(next(ticks)))
    late = solve(space, table, options)
    assert late.report.stopped_by == "time-limit" and late.report.iterations == 1
