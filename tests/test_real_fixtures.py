"""Training and inference steps written with real JAX libraries (HF
transformers' Flax GPT-2, Llama and Gemma, flax.linen CNN and MLP, GPT-2
with dropout, an nn.scan transformer, a GPT-2 decoding step with its key/
value cache, a flax mixture of experts routed by lax.top_k, an MLP under
optax.MultiSteps, an MLP whose middle flax.linen.cond chooses at run
time), as jax printed them (tests/fixtures/real/, written by
tools/export_real_fixtures.py; no jax needed here): each imports, executes
to the values jax computed, is planned by NDA + CP-SAT and by MCTS, and its
batch-parallel plan executes on the simulated mesh like the global program
with the collectives PartIR's formulas predict."""

import functools
import json

import numpy as np
import pytest
from conftest import ROOT, shardplan

from ir.interpret import run, run_spmd, shard, unshard
from solver.planning.planner import SearchOverrides, collective_counts, plan_spec, prepare
from solver.planning.spec import load_spec

REAL = ROOT / "tests" / "fixtures" / "real"
NAMES = ["gpt2_train", "gpt2_dropout_train", "llama_train", "gemma_train", "cnn_train", "mlp_train_flax",
         "scan_train", "gpt2_decode", "moe_train", "multisteps_train", "cond_train", "moe_grouped_train"]
TRAINING = [n for n in NAMES if n != "gpt2_decode"]


@functools.cache
def prepared(name: str):
    spec = load_spec(REAL / f"{name}.yaml")
    return spec, prepare(spec)


def npz(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = np.load(REAL / f"{name}.npz")
    count = {side: sum(k.startswith(side + ".") for k in data) for side in ("in", "out")}
    return [data[f"in.{i}"] for i in range(count["in"])], [data[f"out.{i}"] for i in range(count["out"])]


def test_the_library_versions_are_recorded():
    versions = json.loads((REAL / "versions.json").read_text())
    assert set(versions) == {"jax", "flax", "optax", "transformers"}
    assert all(f"{lib} {v}" in (REAL / "gpt2_train.yaml").read_text() for lib, v in versions.items())


@pytest.mark.parametrize("name", NAMES)
def test_fixture_executes_to_the_values_jax_computed(name):
    spec, prep = prepared(name)
    fn = prep.model.function
    inputs, outputs = npz(name)
    got = run(fn, inputs)
    assert len(got) == len(outputs)
    for r, value, want in zip(fn.results, got, outputs):
        # float32 on both sides; XLA fuses and reorders sums, so a few ulps apart.
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(value, want, rtol=2e-4, atol=2e-5, err_msg=f"result %{r.name}")
        else:
            np.testing.assert_array_equal(value, want, err_msg=f"result %{r.name}")


def assert_executes_like_the_global_program(name: str, model, lowered) -> None:
    fn, local = model.function, lowered.function
    inputs, _ = npz(name)
    inputs = [x.astype(np.float64) if x.dtype == np.float32 else x for x in inputs]
    want = run(fn, inputs, float_dtype=np.float64)
    sharded = {p.name: shard(x, dims, local.mesh) for p, x, dims in zip(fn.params, inputs, lowered.param_dims)}
    got = run_spmd(local, sharded, float_dtype=np.float64)
    for r, blocks, dims, expected in zip(fn.results, got, lowered.result_dims, want):
        actual = unshard(blocks, dims, local.mesh, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-9, err_msg=f"result %{r.name}")


@pytest.mark.parametrize("name", NAMES)
def test_batch_parallel_plan_executes_like_the_global_program(name):
    spec, prep = prepared(name)
    planned = plan_spec(spec, schedule="BP", prepared=prep)
    assert_executes_like_the_global_program(name, planned.model, planned.lowered)
    # PartIR's Table 2, written into each spec by the export script with its formula:
    # one all_reduce per parameter gradient and one for the loss, plus what BatchNorm reduces
    # over the batch, and per layer slice of a scanned stack's gradients.
    counts = collective_counts(planned.lowered)
    expected = spec.expectations()["BP"].counts()
    assert {k: counts.get(k, 0) for k in expected} == expected
    params = [p for p in planned.model.params if p.startswith("params.")]
    if name not in ("cnn_train", "scan_train", "gpt2_decode", "moe_train", "moe_grouped_train"):
        assert counts["all_reduce"] == len(params) + 1 == len(planned.model.params) + 1


def test_check_passes_on_the_real_fixtures(capsys):
    code, out, _ = shardplan(capsys, "check", REAL)
    assert code == 0, out
    specs = len(NAMES) + 2  # and the expert-parallel moe_train_ep.yaml, moe_grouped_train_ep.yaml
    assert f"{specs} of {specs} schedule(s) in {specs} spec(s) as expected" in out


def test_expert_parallel_moe_executes_like_the_global_program():
    """moe_train_ep.yaml: the flax MoE step with its experts' weights over an expert axis (router columns,
    w_in, w_out: one color), the tokens over batch; the plan's collectives are its `expect:`'s."""
    spec = load_spec(REAL / "moe_train_ep.yaml")
    planned = plan_spec(spec, schedule="EP", prepared=prepare(spec))
    w_in = planned.model.function.param("params.moe.w_in")
    assert planned.sharding.def_dims(planned.nda, w_in)[0] == ("expert",)
    assert_executes_like_the_global_program("moe_train", planned.model, planned.lowered)
    counts = collective_counts(planned.lowered)
    assert {k: counts.get(k, 0) for k in ("all_reduce", "all_gather", "all_slice")} == {
        "all_reduce": 18, "all_gather": 3, "all_slice": 3}


def test_gshard_expert_parallel_moe_moves_the_experts_inputs_with_all_to_all():
    """moe_grouped_train_ep.yaml: the MoE routed in groups (each sequence its own capacity), the sequences over
    batch x expert and the experts' weights over expert, the routing kept whole on expert (`replicate`): the
    experts' inputs go to the experts and their outputs come back with all_to_all (GShard)."""
    spec = load_spec(REAL / "moe_grouped_train_ep.yaml")
    planned = plan_spec(spec, schedule="EP", prepared=prepare(spec))
    fn = planned.model.function
    assert planned.sharding.def_dims(planned.nda, fn.param("params.moe.w_in"))[0] == ("expert",)
    assert planned.sharding.def_dims(planned.nda, fn.param("batch.input_ids"))[0] == ("batch", "expert")
    assert_executes_like_the_global_program("moe_grouped_train", planned.model, planned.lowered)
    counts = collective_counts(planned.lowered)
    assert {k: v for k, v in counts.items() if v} == {"all_reduce": 11, "all_to_all": 4, "all_gather": 1,
                                                       "reduce_scatter": 1}


@pytest.mark.parametrize("name", NAMES)
def test_cpsat_plans_every_fixture(name):
    spec, prep = prepared(name)
    planned = plan_spec(spec, solver="cpsat", prepared=prep, overrides=SearchOverrides(time_limit_s=20))
    (report,) = planned.search
    assert report.status in ("optimal", "feasible")
    assert planned.assessment.cost.fits
    # Never worse than the batch-parallel schedule it was hinted with.
    bp = plan_spec(spec, schedule="BP", prepared=prep)
    assert planned.assessment.cost.step_time_s <= bp.assessment.cost.step_time_s * (1 + 1e-6)
    assert_executes_like_the_global_program(name, planned.model, planned.lowered)


@pytest.mark.parametrize("name", NAMES)
def test_mcts_plans_every_fixture(name):
    spec, prep = prepared(name)
    planned = plan_spec(spec, solver="mcts", prepared=prep, overrides=SearchOverrides(iterations=20, seed=0))
    assert planned.search and planned.assessment.cost.fits
    assert_executes_like_the_global_program(name, planned.model, planned.lowered)


def test_the_moe_routes_with_top_k_and_the_run_time_cond_computes_both_branches():
    _, moe = prepared("moe_train")
    kinds = [op.kind for op in moe.model.function.ops]
    # lax.top_k of the router's probabilities (the forward; its backward scatters to the positions).
    assert kinds.count("sort") == 1 and "argsort" in kinds and moe.model.notes == ()
    # MultiSteps' lax.cond asks whether to skip the step, which is known (never): one branch, no note.
    assert prepared("multisteps_train")[1].model.notes == ()
    # flax.linen.cond on the batch's flag: the forward's case and the backward's, both noted.
    notes = prepared("cond_train")[1].model.notes
    assert len(notes) == 2 and all("stablehlo.case with an index known only at run time" in n for n in notes)
    inputs, outputs = npz("cond_train")
    fn = prepared("cond_train")[1].model.function
    deep = next(i for i, p in enumerate(fn.params) if p.name == "batch.deep")
    shallow = run(fn, [np.bool_(False) if i == deep else x for i, x in enumerate(inputs)])
    # The other branch runs where the flag says so: the loss moves.
    assert not np.isclose(shallow[0], outputs[0])


@pytest.mark.parametrize("command", ["explain", "plan"])
def test_explain_and_plan_show_the_notes_of_a_run_time_cond(capsys, command):
    code, out, _ = shardplan(capsys, command, REAL / "cond_train.yaml")
    assert code == 0 and out.count("note: line ") == 2
    code, out, _ = shardplan(capsys, command, REAL / "cond_train.yaml", "--json")
    assert code == 0 and len(json.loads(out)["notes"]) == 2
    code, out, _ = shardplan(capsys, command, REAL / "mlp_train_flax.yaml", "--json")
    assert code == 0 and json.loads(out)["notes"] == []
