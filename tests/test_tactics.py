"""Tactics and schedules: plans from manual/replicate/resolve tactics, their
errors, plan JSON, and execution of every bundled small spec's plan."""

import json

import pytest
from conftest import ROOT
from spmd_check import assert_lowering_matches

from ir.autodiff import training_step
from ir.core import Mesh
from ir.lower import lower
from ir.models import build
from ir.nda import analyze
from solver.plan import Plan
from solver.planning.planner import collective_counts, plan_spec
from solver.planning.spec import load_spec, parse_spec
from solver.planning.tactics import FIRST_DIVISIBLE, Manual, Replicate, Resolve, TacticError, apply_schedule

SMALL = dict(layers=2, d_model=8, heads=2, head_dim=4, mlp_hidden=12, vocab=10, seq=4, batch=4)
MESH = Mesh.of(batch=2, model=2)
BP = Manual("batch", (("batch.tokens", 0),))
MP = Manual("model", (("layers.*.attn.wq", 1), ("layers.*.mlp.w_up", 1)))
Z3 = Manual("batch", (("*", FIRST_DIVISIBLE),))  # batch inputs already use `batch`: left as they are


def lowered_for(model, schedule, mesh=MESH, options=None):
    nda = analyze(model.function, model.params)
    plan = apply_schedule(nda, mesh, schedule)
    return nda, plan, lower(model.function, nda, plan.materialize(nda), options)


@pytest.mark.parametrize("spec", ["mlp", "simplified_attention", "transformer"])
def test_bundled_spec_plans_execute_correctly(spec):
    planned = plan_spec(load_spec(ROOT / "specs" / f"{spec}.yaml"))
    assert_lowering_matches(planned.model, planned.lowered)


@pytest.mark.parametrize("options", [{}, {"kv_heads": 1, "gated_mlp": True, "tied_embeddings": True}])
@pytest.mark.parametrize("schedule", [[BP], [BP, MP], [BP, MP, Z3]], ids=["BP", "BP+MP", "BP+MP+Z3"])
def test_transformer_schedules_execute_correctly(schedule, options):
    model = training_step(build("transformer", **SMALL, **options))
    _, _, lowered = lowered_for(model, schedule)
    assert_lowering_matches(model, lowered)


def test_zero3_shards_every_parameter_and_its_state_without_resharding_updates():
    model = training_step(build("transformer", **SMALL))
    nda, plan, lowered = lowered_for(model, [BP, MP, Z3])
    sharding = plan.materialize(nda)
    for name in model.params + model.state[:-1]:  # opt.step is a scalar
        dims = sharding.def_dims(nda, model.function.param(name))
        assert any("batch" in axes for axes in dims), name
    counts = collective_counts(lowered)
    assert counts["all_to_all"] == 0  # propagation stops where the axis is taken
    assert counts["all_gather"] > 0 and counts["reduce_scatter"] > 0


def test_manual_pins_before_propagating():
    # ZeRO-3 on the MLP: both weights on their first dimension. w1's second
    # dimension shares w2's first dimension's color; pinning first keeps w1 on
    # dimension 0 whatever the order of the patterns.
    model = build("mlp", batch=8, d_in=6, hidden=10, d_out=4)
    for order in ((("w2", 0), ("w1", 0)), (("w1", 0), ("w2", 0))):
        nda, plan, _ = lowered_for(model, [Manual("batch", order)], Mesh.of(batch=2))
        sharding = plan.materialize(nda)
        fn = model.function
        assert sharding.def_dims(nda, fn.param("w1")) == (("batch",), ())
        assert sharding.def_dims(nda, fn.param("w2")) == (("batch",), ())


def test_replicate_keeps_a_value_whole_and_earlier_tactics_win():
    model = build("mlp", batch=8, d_in=6, hidden=10, d_out=4)
    nda, plan, lowered = lowered_for(model, [Replicate("model", ("w2",)), Manual("model", (("w1", 1),))])
    fn = model.function
    sharding = plan.materialize(nda)
    assert sharding.def_dims(nda, fn.param("w1")) == ((), ("model",))
    assert sharding.def_dims(nda, fn.param("w2")) == ((), ())  # replicated, sliced at its use
    assert collective_counts(lowered)["all_slice"] == 1
    assert_lowering_matches(model, lowered)


def test_resolve_selects_the_figure_5b_program():
    model = build("simplified_attention", seq=8, d_model=6, d_head=4)
    seq = Manual("seq", (("x", 0),))
    _, _, fig5b = lowered_for(model, [seq, Resolve(((0, 1),))], Mesh.of(seq=2))
    counts = collective_counts(fig5b)
    assert (counts["all_gather"], counts["reduce_scatter"]) == (1, 1)
    gather = next(op for op in fig5b.function.ops if op.kind == "all_gather")
    assert gather.operands[0].name == "k"
    scatter = next(op for op in fig5b.function.ops if op.kind == "reduce_scatter")
    assert scatter.operands[0].name == "z"
    assert_lowering_matches(model, fig5b)
    _, _, other = lowered_for(model, [seq, Resolve(((0, 0),))], Mesh.of(seq=2))
    assert_lowering_matches(model, other)


@pytest.mark.parametrize("tactic,message", [
    (Manual("batch", (("w3", 0),)), "schedule.0.manual: no parameter matches 'w3'; parameters: x, target, w1, w2"),
    (Manual("data", (("w1", 0),)), "schedule.0.manual: unknown mesh axis 'data'; mesh axes: batch, model"),
    (Manual("batch", (("w1", 2),)), "schedule.0.manual: %w1 is tensor<6x10xf32>: dimension 2 is not one of 0..1"),
    (Replicate("batch", ("nope*",)), "schedule.0.replicate: no parameter or result matches 'nope*'"),
    (Resolve(((0, 1),)), "schedule.0.resolve: no resolution class 0; classes: none"),
])
def test_tactic_errors_name_the_problem_and_the_valid_choices(tactic, message):
    model = build("mlp", batch=8, d_in=6, hidden=10, d_out=4)
    with pytest.raises(TacticError) as info:
        apply_schedule(analyze(model.function), MESH, [tactic])
    assert message in str(info.value)


def test_auto_tactic_needs_a_search_backend():
    from solver.planning.tactics import Auto

    model = build("mlp")
    with pytest.raises(TacticError, match="schedule.0.auto: an auto tactic needs a search backend"):
        apply_schedule(analyze(model.function), MESH, [Auto(("batch",))])
    with pytest.raises(TacticError, match="unknown mesh axis 'data'"):
        apply_schedule(analyze(model.function), MESH, [Auto(("data",))], search=lambda plan, auto, where: plan)


def test_plan_json_round_trip():
    model = training_step(build("transformer", **SMALL))
    nda, plan, _ = lowered_for(model, [BP, MP, Resolve(((0, 1),))])
    data = json.loads(json.dumps(plan.to_json(nda)))
    again = Plan.from_json(data)
    assert again == plan
    assert again.materialize(nda) == plan.materialize(nda)
    assert all("what" in d for d in data["decisions"])


def test_spec_schedule_errors():
    head = "model: {builder: mlp}\nmesh: {batch: 2}\nhardware: A100-80GB\nschedule:\n"
    text = head + "  - manual: {axis: model, values: {w1: 1}}\n"
    with pytest.raises(Exception, match="t.yaml: schedule.0: unknown mesh axis 'model'; mesh axes: batch"):
        parse_spec(text, "t.yaml")
    text = head + "  - {}\n"
    with pytest.raises(Exception, match="exactly one of manual, replicate, resolve, remat, ring_attention, auto"):
        parse_spec(text, "t.yaml")


@pytest.mark.parametrize("solver, setting, expected", [
    ("cpsat", None, 30.0), ("mcts", None, 50.0), ("cpsat", 7.0, 7.0), ("mcts", 7.0, 7.0)])
def test_each_backend_gets_its_own_default_budget_and_a_set_one_as_is(monkeypatch, solver, setting, expected):
    # CP-SAT's budget is sized so `plan --solver cpsat` answers in under a minute; the MCTS's is a
    # backstop its searches stop before: a spec or `--time-limit` that sets one gives it to either.
    from solver.search import cpsat, mcts

    seen = []
    for module in (cpsat, mcts):
        real = module.solve
        monkeypatch.setattr(module, "solve", lambda space, table, options, *a, real=real, **kw:
                            seen.append(options.time_limit_s) or real(space, table, options, *a, **kw))
    limit = "" if setting is None else f", time_limit: {setting}"
    spec = parse_spec(f"""
model: {{builder: mlp, args: {{batch: 8, d_in: 16, hidden: 32, d_out: 8}}, step: forward}}
devices: 4
mesh: {{batch: 2, model: 2}}
hardware: H100-SXM
schedules:
  S:
    tactics:
      - auto: {{axes: [batch, model], solver: {solver}{limit}}}
""")
    plan_spec(spec, solver, floor=False)
    assert seen and set(seen) == {expected}
