"""The text form: golden printing, exact round trips, located parse errors."""

import pytest
from conftest import EXAMPLES
from program_gen import random_program

from ir.builder import Builder
from ir.core import Mesh
from ir.text import ParseError, parse, parse_file, print_function

MLP_TEXT = """\
func @mlp(%x: tensor<3x5xf32>, %w1: tensor<5x7xf32>, %w2: tensor<7x5xf32>) -> (tensor<3x5xf32>) {
  %0 = dot_general(%x, %w1) {contract = [[1], [0]]} : tensor<3x7xf32>
  %1 = relu(%0) : tensor<3x7xf32>
  %y = dot_general(%1, %w2) {contract = [[1], [0]]} : tensor<3x5xf32>
  return %y
}
"""


def build_mlp():
    b = Builder("mlp")
    x, w1, w2 = b.param("x", [3, 5]), b.param("w1", [5, 7]), b.param("w2", [7, 5])
    return b.build([b.matmul(b.relu(b.matmul(x, w1)), w2, name="y")])


def test_golden_print_of_the_paper_mlp():
    # Default attributes (dot_general's empty batch dims) are not printed.
    assert print_function(build_mlp()) == MLP_TEXT


def test_parse_of_golden_text_gives_the_built_function():
    assert parse(MLP_TEXT) == build_mlp()


def test_attribute_values_round_trip():
    b = Builder("attrs")
    x = b.param("x", [4, 6])
    y = b.full([2], float("-inf"))
    z = b.full([2], 1e-5)
    i = b.full([2], 3, "i32")
    k = b.full([2], True, "bool")
    s = b.slice(x, [1, 0], [4, 6], [2, 3])
    fn = b.build([y, z, i, k, s])
    text = print_function(fn)
    assert "value = -inf" in text and "value = 1e-05" in text and "value = true" in text
    assert "stride = [2, 3]" in text
    assert parse(text) == fn


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_round_trip(seed):
    mesh = Mesh.of(a=2, b=3) if seed % 2 else None
    fn = random_program(seed, num_ops=14, mesh=mesh)
    text = print_function(fn)
    again = parse(text)
    assert again == fn
    assert print_function(again) == text  # printing is a fixed point


@pytest.mark.parametrize("name", ["mlp.ir", "mlp_bp_mp.ir"])
def test_examples_parse_and_reprint_stably(name):
    fn = parse_file(str(EXAMPLES / name))
    assert parse(print_function(fn)) == fn


def parse_error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(text, "bad.ir")
    return info.value


HEADER = "func @f(%x: tensor<3x5xf32>) -> (tensor<3x5xf32>) {\n"


@pytest.mark.parametrize("body,line,col,fragment", [
    ("  %y = frobnicate(%x) : tensor<3x5xf32>\n  return %y\n}", 2, 8, "unknown op 'frobnicate'; known ops: abs, acos,"),
    ("  %y = neg(%x, %x) : tensor<3x5xf32>\n  return %y\n}", 2, 8, "neg takes 1 operand(s), got 2"),
    ("  %y = neg(%x) : tensor<5x3xf32>\n  return %y\n}", 2, 16,
     "type mismatch: declared tensor<5x3xf32>, but neg gives tensor<3x5xf32>"),
    ("  %y = add(%x, %z) : tensor<3x5xf32>\n  return %y\n}", 2, 16, "value %z is used before it is defined"),
    ("  %x = neg(%x) : tensor<3x5xf32>\n  return %x\n}", 2, 3, "value %x is defined twice"),
    ("  %y = reduce(%x) {dims = 1} : tensor<3xf32>\n  return %y\n}", 2, 19,
     "reduce: attribute 'dims': expected a list of ints, got 1"),
    ("  %y = reduce(%x) {axis = [1]} : tensor<3xf32>\n  return %y\n}", 2, 19,
     "reduce: unknown attribute 'axis' (allowed: dims, combiner)"),
    ("  %y = neg(%x) : tensor<3x5xf8>\n  return %y\n}", 2, 18, "unknown element type 'f8'"),
    ("  %y = neg(%x) ; tensor<3x5xf32>\n  return %y\n}", 2, 16, "unexpected character ';'"),
    ("  %y = neg(%x) : tensor<3x5xf32>\n}", 3, 1, "expected an op ('%name = kind(...)') or 'return', found '}'"),
    ("  return\n}", 2, 3, "return types () differ from the declared result types (tensor<3x5xf32>)"),
    ("  %y = all_reduce(%x) {axes = [\"model\"]} : tensor<3x5xf32>\n  return %y\n}", 2, 8,
     "all_reduce: collectives need a device mesh"),
    ("  %y = dot_general(%x, %x) {contract = [[1], [1]], batch = [[0]]} : tensor<3x3xf32>\n  return %y\n}", 2, 28,
     "dot_general: attribute 'batch': expected two lists of ints"),
    ("  %y = dot_general(%x, %x) {contract = [[1], [0]]} : tensor<3x5xf32>\n  return %y\n}", 2, 8,
     "contracting dimension sizes differ: lhs dim 1 is 5, rhs dim 0 is 3"),
    ("  %y = neg(%x) : tensor<3x5xf32>\n  return %y\n} trailing", 4, 3, "expected eof, found 'trailing'"),
])
def test_parse_errors_name_line_and_column(body, line, col, fragment):
    err = parse_error(HEADER + body)
    assert fragment in err.message
    assert (err.line, err.col) == (line, col)
    assert str(err).startswith(f"bad.ir:{line}:{col}: ")


def test_parse_error_in_header_and_mesh():
    err = parse_error("func @f(%x: tensor<3x5xf32>) -> (tensor<3x5xf32>) mesh<a=2, a=3> {\n  return %x\n}")
    assert "mesh axis names must be distinct" in err.message and err.line == 1
    err = parse_error("func f(%x: tensor<3xf32>) -> () {\n  return\n}")
    assert err.message == "expected symbol, found 'f'" and (err.line, err.col) == (1, 6)


def test_comments_and_blank_lines_are_ignored():
    text = "// leading comment\n\n" + MLP_TEXT.replace("  return %y", "  // the result\n  return %y  // done")
    assert parse(text) == build_mlp()


def test_parse_file_rejects_binary(tmp_path):
    path = tmp_path / "junk.ir"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ParseError, match="not UTF-8 text"):
        parse_file(str(path))
