"""The StableHLO importer (ir/stablehlo.py) on the committed jax fixtures
(tests/fixtures/, written by tools/export_fixtures.py; no jax needed here)
and on small hand-checked texts: values, names, partitioning, errors."""

import re

import numpy as np
import pytest
from conftest import ROOT, shardplan
from spmd_check import assert_lowering_matches

from ir.interpret import run
from ir.nda import analyze
from ir.stablehlo import SUPPORTED, StableHLOError, import_stablehlo, load_stablehlo
from solver.planning.planner import collective_counts, plan_spec
from solver.planning.spec import SpecError, load_spec, parse_spec

FIXTURES = ROOT / "tests" / "fixtures"
PROGRAMS = ("mlp_train", "transformer_train")


def fixture_spec(name: str):
    return load_spec(FIXTURES / f"{name}.yaml")


# ------------------------------------------------------------------ the jax fixtures


@pytest.mark.parametrize("name", PROGRAMS)
def test_fixture_executes_to_the_values_jax_computed(name):
    spec = fixture_spec(name)
    fn = spec.build().function
    data = np.load(FIXTURES / f"{name}.npz")
    inputs = {p.name: data[f"in.{i}"] for i, p in enumerate(fn.params)}
    outputs = run(fn, inputs)
    assert len(outputs) == len([k for k in data if k.startswith("out.")])
    for i, (got, r) in enumerate(zip(outputs, fn.results)):
        # float32 on both sides; XLA fuses and reorders sums, so a few ulps apart.
        np.testing.assert_allclose(got, data[f"out.{i}"], rtol=1e-4, atol=1e-5, err_msg=f"result %{r.name}")


def test_fixture_names_and_roles():
    model = fixture_spec("transformer_train").build()
    fn = model.function
    assert fn.params[0].name == "embed" and fn.param("layers.1.wq").type.shape == (16, 2, 8)
    assert model.inputs == ("batch.targets", "batch.tokens")
    assert len(model.params) == 19 and len(model.state) == 2 * 19 + 1
    # Results are named from jax.result_info: result[1] is the new params.
    names = [r.name for r in fn.results]
    assert names[0] == "result.0" and "result.1.layers.0.wq" in names and "result.4" in names


def test_imported_transformer_has_the_builders_conflict_structure():
    """TOAST's count: the attention's conflicts fall in a few resolution
    classes whatever the depth; the imported program shares them across its
    2 layers as the builder's transformer does."""
    model = fixture_spec("transformer_train").build()
    nda = analyze(model.function, model.params)
    assert nda.conflicts and len(nda.resolution_classes) < len(nda.compat_sets)
    assert any(len(group) == 2 for group in nda.param_groups)  # layers.0.* with layers.1.*


@pytest.mark.parametrize("schedule", ["BP", "BP+MP"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_fixture_lowering_executes_like_the_global_program(name, schedule):
    spec = fixture_spec(name)
    planned = plan_spec(spec, schedule=schedule)
    assert_lowering_matches(planned.model, planned.lowered)
    counts = collective_counts(planned.lowered)
    assert counts["all_reduce"] == spec.expectations()[schedule].all_reduce


def test_check_passes_on_the_fixtures(capsys):
    code, out, _ = shardplan(capsys, "check", FIXTURES)
    assert code == 0, out
    assert "4 of 4 schedule(s) in 2 spec(s) as expected" in out


def test_explain_and_plan_work_on_an_imported_spec(capsys):
    code, out, _ = shardplan(capsys, "explain", FIXTURES / "mlp_train.yaml")
    assert code == 0 and "StableHLO mlp_train.mlir, forward" in out
    code, out, _ = shardplan(capsys, "plan", FIXTURES / "transformer_train.yaml", "--schedule", "BP+MP")
    assert code == 0 and "collectives: 28 all_reduce" in out


# ------------------------------------------------------------------ small texts

SMALL = """\
module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x2xf32> {jax.arg_info = "x"}, %arg1: tensor<3x2xf32>) -> \
(tensor<2x2xf32> {jax.result_info = "result[0]"}, tensor<3xf32> {jax.result_info = "result[1]['max']"}, \
tensor<2x2xf32>, tensor<2xf32>) {
    %cst = stablehlo.constant dense<[[1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]> : tensor<2x2xf32>
    %0 = stablehlo.concatenate %arg0, %arg1, dim = 0 : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<6x2xf32>
    %1 = stablehlo.slice %0 [1:5:2, 0:2] : (tensor<6x2xf32>) -> tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %5 = stablehlo.reduce(%arg0 init: %cst_2) applies stablehlo.maximum across dimensions = [1] : \
(tensor<3x2xf32>, tensor<f32>) -> tensor<3xf32>
    %6:2 = call @twice(%cst, %1) : (tensor<2x2xf32>, tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>)
    %cst_3 = stablehlo.constant dense<1.000000e+01> : tensor<f32>
    %7 = stablehlo.reduce(%arg1 init: %cst_3) across dimensions = [0] : (tensor<3x2xf32>, tensor<f32>) -> tensor<2xf32>
     reducer(%a: tensor<f32>, %b: tensor<f32>)  {
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }
    return %6#1, %5, %6#0, %7 : tensor<2x2xf32>, tensor<3xf32>, tensor<2x2xf32>, tensor<2xf32>
  }
  func.func private @twice(%arg0: tensor<2x2xf32>, %arg1: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<2x2xf32>
    %1 = stablehlo.multiply %arg1, %arg0 : tensor<2x2xf32>
    return %0, %1 : tensor<2x2xf32>, tensor<2x2xf32>
  }
}
"""


def test_small_text_values_and_names():
    fn = import_stablehlo(SMALL, "small.mlir")
    assert [p.name for p in fn.params] == ["x", "arg1"]  # jax.arg_info where printed, else positional
    # %6#1 comes from an inlined call: only results defined in @main are renamed.
    assert fn.results[1].name == "result.1.max"
    x = np.arange(6.0).reshape(3, 2)
    y = 10 + np.arange(6.0).reshape(3, 2)
    const = np.array([[1.0, 2.0], [3.0, 4.0]])
    sliced = np.concatenate([x, y])[1:5:2]
    got = run(fn, {"x": x, "arg1": y}, float_dtype=np.float64)
    np.testing.assert_allclose(got[0], sliced * const)
    np.testing.assert_allclose(got[1], x.max(axis=1))
    np.testing.assert_allclose(got[2], 2 * const)
    np.testing.assert_allclose(got[3], 10 + y.sum(axis=0))  # the init 10 joins the sum once


def test_param_names_override_and_must_match_the_arguments():
    fn = import_stablehlo(SMALL, "small.mlir", ["a", "b"])
    assert [p.name for p in fn.params] == ["a", "b"]
    with pytest.raises(StableHLOError, match=r"small.mlir: 1 param_names for the 2 arguments of @main"):
        import_stablehlo(SMALL, "small.mlir", ["a"])


def replace_line(old: str, new: str) -> str:
    assert old in SMALL
    return SMALL.replace(old, new)


def test_unsupported_ops_are_all_listed_with_count_and_first_line():
    text = replace_line("stablehlo.multiply %arg1, %arg0", "stablehlo.frobnicate %arg1, %arg0")
    text = text.replace("stablehlo.add", "stablehlo.twiddle")
    with pytest.raises(StableHLOError) as info:
        import_stablehlo(text, "small.mlir")
    message = str(info.value)
    uses = SMALL.count("stablehlo.add")
    first_add = next(i for i, line in enumerate(SMALL.splitlines(), 1) if "stablehlo.add" in line)
    assert message.startswith("small.mlir: 2 unsupported op kind(s):\n")
    assert "  stablehlo.frobnicate: 1 use(s), first at line 19\n" in message
    assert f"  stablehlo.twiddle: {uses} use(s), first at line {first_add}\n" in message
    assert all(op in message for op in SUPPORTED) and "stablehlo.dot_general" in message


@pytest.mark.parametrize("old, new, expected", [
    ("applies stablehlo.maximum", "applies stablehlo.multiply",
     "small.mlir:7: stablehlo.reduce: combiner stablehlo.multiply is not supported"),
    ("%1 = stablehlo.slice %0", "%1 = stablehlo.slice %9", "small.mlir:5: %9 is not defined"),
    ("-> tensor<6x2xf32>", "-> tensor<6x3xf32>",
     "small.mlir:4: stablehlo.concatenate: the text declares tensor<6x3xf32>, the op gives tensor<6x2xf32>"),
    ("%arg1: tensor<3x2xf32>)", "%arg1: tensor<3x2xf8E4M3>)", "small.mlir:2: unsupported element type f8E4M3"),
    ("call @twice", "call @thrice", "small.mlir:8: call: no function @thrice in the module"),
])
def test_errors_name_the_line(old, new, expected):
    with pytest.raises(StableHLOError) as info:
        import_stablehlo(replace_line(old, new), "small.mlir")
    assert str(info.value).startswith(expected)


def test_not_stablehlo_text():
    with pytest.raises(StableHLOError, match="no func.func found"):
        import_stablehlo("hello\n", "x.mlir")


def test_multi_operand_reduce_is_refused():
    text = SMALL.replace("%5 = stablehlo.reduce(%arg0 init: %cst_2)", "%5 = stablehlo.reduce(%arg0 init: %cst_2), "
                         "(%arg1 init: %cst_2)")
    with pytest.raises(StableHLOError, match="small.mlir:7: stablehlo.reduce: of several operands only argmax and "
                       "argmin"):
        import_stablehlo(text, "small.mlir")


def test_a_mangled_embedding_gather_fails_its_type_check():
    """collapsed_slice_dims = [1] is a general gather now, whose inferred type
    then disagrees with the declared one: the error names the line."""
    text = (FIXTURES / "transformer_train.mlir").read_text().replace("collapsed_slice_dims = [0]",
                                                                     "collapsed_slice_dims = [1]", 1)
    with pytest.raises(StableHLOError, match=r"transformer_train.mlir:\d+: stablehlo.gather: "):
        import_stablehlo(text, "transformer_train.mlir")


# ------------------------------------------------------------------ specs


def write_spec(tmp_path, model: str) -> str:
    (tmp_path / "small.mlir").write_text(SMALL)
    path = tmp_path / "s.yaml"
    path.write_text(f"model: {model}\nmesh: {{batch: 2}}\nhardware: A100-80GB\n")
    return str(path)


def test_spec_with_a_stablehlo_model_runs_it_as_written(tmp_path):
    spec = load_spec(write_spec(tmp_path, "{stablehlo: small.mlir, inputs: [arg1]}"))
    assert spec.model.step == "forward"  # an imported program is taken as the whole step
    model = spec.build()
    assert model.params == ("x",) and model.inputs == ("arg1",) and model.state == ()


@pytest.mark.parametrize("model, expected", [
    ("{stablehlo: small.mlir, args: {batch: 2}}", "model: args apply only to a builder"),
    ("{builder: mlp, inputs: [x]}", "model: inputs apply only to a stablehlo model"),
    ("{stablehlo: small.mlir, preset: gemma_2b}", "model: give one of builder, preset or stablehlo"),
])
def test_stablehlo_spec_errors(tmp_path, model, expected):
    with pytest.raises(SpecError, match=expected):
        load_spec(write_spec(tmp_path, model))


def test_stablehlo_spec_build_errors(tmp_path):
    spec = load_spec(write_spec(tmp_path, "{stablehlo: missing.mlir}"))
    with pytest.raises(SpecError, match=r"s.yaml: model.stablehlo: cannot read .*missing.mlir"):
        spec.build()
    spec = load_spec(write_spec(tmp_path, "{stablehlo: small.mlir, state: [opt.*]}"))
    with pytest.raises(SpecError, match=r"s.yaml: model.state: no parameter matches 'opt.\*'; parameters: x, arg1"):
        spec.build()
    spec = parse_spec("model: {stablehlo: small.mlir}\nmesh: {batch: 2}\nhardware: A100-80GB\n",
                      str(tmp_path / "t.yaml"))
    assert spec.build().params == ("x", "arg1")


def test_load_stablehlo_reads_a_file():
    fn = load_stablehlo(str(FIXTURES / "mlp_train.mlir"))
    assert [p.name for p in fn.params][:2] == ["arg0", "arg1"]  # no names in jax's text, none given


MIXED = """module @m {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3x4xbf16>) -> (tensor<2x4xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT], \
algorithm = <lhs_precision_type = bf16, rhs_precision_type = bf16, accumulation_type = f32, \
lhs_component_count = 1, rhs_component_count = 1, num_primitive_operations = 1, allow_imprecise_accumulation = false> \
: (tensor<2x3xf32>, tensor<3x4xbf16>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}
"""


@pytest.mark.parametrize("algorithm, computed", [(True, "bf16"), (False, "f32")])
def test_a_contraction_of_two_dtypes_runs_at_the_algorithms_precision(algorithm, computed):
    """jax's attention multiplies f32 probabilities by bf16 values, naming
    bf16 inputs in the `algorithm`: both operands are converted to it (the
    products run at bf16's rate); without an algorithm, to the wider dtype."""
    text = MIXED if algorithm else re.sub(r"algorithm = <[^>]*> ", "", MIXED)
    fn = import_stablehlo(text, "mixed.mlir")
    (dot,) = [op for op in fn.ops if op.kind == "dot_general"]
    assert [v.type.dtype for v in dot.operands] == [computed, computed]
    assert fn.results[0].type.dtype == "f32"
    x, w = np.arange(6.0).reshape(2, 3) / 4, np.arange(12.0).reshape(3, 4) / 8  # exact in bf16
    np.testing.assert_allclose(run(fn, [x, w], float_dtype=np.float64)[0], x @ w)


def test_split_top_splits_only_outside_brackets_and_quotes_with_or_without_its_fast_paths():
    # `split_top` skips its scan by character where the text has no separator or no bracket or quote:
    # the same parts as the scan on random texts of brackets, quotes, separators and `->`.
    import random

    from ir.stablehlo.reader import _split_scanned, split_top

    assert split_top("tensor<2x3xf32>, tensor<f32>") == ["tensor<2x3xf32>", "tensor<f32>"]
    assert split_top("%0:2, %1") == ["%0:2", "%1"] and split_top("a,,b,") == ["a", "", "b"]
    assert split_top('(a, b), "c, d"') == ["(a, b)", '"c, d"'] and split_top("  ") == []
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice('ab ,%:1<>()[]{}"-') for _ in range(rng.randint(0, 12)))
        for sep in ",:":
            assert split_top(text, sep) == _split_scanned(text, sep), (text, sep)
