"""Core objects and the verifier: SSA, straight-line order, types."""

import numpy as np
import pytest

from ir import ops
from ir.builder import Builder
from ir.core import Attrs, Function, IRError, Mesh, Op, TensorType, Value, VerifyError, tensor
from ir.ops import verify


def small_mlp() -> Function:
    b = Builder("mlp")
    x, w = b.param("x", [3, 5]), b.param("w", [5, 7])
    return b.build([b.relu(b.matmul(x, w, name="h"), name="y")])


def test_tensor_type_prints_mlir_style():
    assert str(tensor([4096, 128], "bf16")) == "tensor<4096x128xbf16>"
    assert str(tensor([], "f32")) == "tensor<f32>"
    assert tensor([3, 5], "i32").num_bytes == 60


@pytest.mark.parametrize("shape,dtype,fragment", [
    ((3,), "f8", "unknown dtype 'f8'"),
    ((3, -1), "f32", "invalid shape"),
    ((3.5,), "f32", "invalid shape"),
])
def test_tensor_type_rejects_bad_input(shape, dtype, fragment):
    with pytest.raises(IRError, match=fragment):
        TensorType(shape, dtype)


def test_values_compare_by_identity_functions_by_structure():
    a, b = Value("x", tensor([2])), Value("x", tensor([2]))
    assert a != b and len({a, b}) == 2
    assert small_mlp() == small_mlp()
    assert hash(small_mlp()) == hash(small_mlp())
    b2 = Builder("mlp")
    x, w = b2.param("x", [3, 5]), b2.param("w", [5, 7])
    other = b2.build([b2.relu(b2.matmul(x, w, name="h"), name="z")])
    assert other != small_mlp()


def test_attrs_are_sorted_frozen_and_hashable():
    attrs = Attrs.of({"b": [1, [2, 3]], "a": 1})
    assert attrs.items == (("a", 1), ("b", (1, (2, 3))))
    assert attrs["b"] == (1, (2, 3)) and "a" in attrs and attrs.get("c", 7) == 7
    assert hash(attrs) == hash(Attrs.of({"a": 1, "b": (1, (2, 3))}))
    assert attrs.replace(a=2)["a"] == 2 and attrs["a"] == 1


def test_attrs_spelled_otherwise_are_other_attrs_and_normalize_as_given():
    """1, 1.0 and True are equal in Python and hash alike; as attributes
    they are spelled otherwise (the text form prints each as given), so the
    op registry's memo of normalized attributes must not hand one op's 1
    to another's 1.0 (it did: the memo was keyed by equal Attrs)."""
    from ir.opdef import normalize_attrs

    spelled = [Attrs.of({"shape": [2], "dtype": "f32", "value": v}) for v in (1, 1.0, True)]
    assert len(set(spelled)) == 3
    for attrs, value in zip(spelled, (1, 1.0, True)):
        assert type(normalize_attrs("full", attrs)["value"]) is type(value)
    # Nested, and numpy's scalars as the Python numbers they are.
    assert Attrs.of({"v": [(1, 2), 3]}) != Attrs.of({"v": [(1, 2.0), 3]})
    assert Attrs.of({"v": [np.float32(0.5)]}) == Attrs.of({"v": (0.5,)})
    assert Attrs.of({"v": [np.int64(3)], "s": "x"}) == Attrs.of({"v": (3,), "s": "x"})


def test_verifier_accepts_builder_programs():
    fn = small_mlp()
    assert verify(fn) is fn


def test_verifier_rejects_use_before_def():
    fn = small_mlp()
    swapped = Function(fn.name, fn.params, fn.ops[::-1], fn.results)
    with pytest.raises(VerifyError, match=r"value %h is used before it is defined, in op #0 '%y = relu\(%h\)'"):
        verify(swapped)


def test_verifier_rejects_duplicate_names():
    fn = small_mlp()
    x = fn.params[0]
    clash = ops.make_op("neg", [x], result_names=["h"])
    with pytest.raises(VerifyError, match=r"value %h is defined twice \(again as op #2"):
        verify(Function(fn.name, fn.params, fn.ops + (clash,), fn.results))
    with pytest.raises(VerifyError, match="value %x is defined twice"):
        verify(Function(fn.name, fn.params + (Value("x", tensor([1])),), fn.ops, fn.results))


def test_verifier_rejects_type_mismatch():
    fn = small_mlp()
    h = fn.ops[0].results[0]
    wrong = Op("relu", (h,), (Value("y", tensor([3, 8])),))
    with pytest.raises(VerifyError, match=r"type mismatch in op #1 '%y = relu\(%h\)': declared tensor<3x8xf32>, "
                                         r"but relu gives tensor<3x7xf32>"):
        verify(Function(fn.name, fn.params, (fn.ops[0], wrong), (wrong.results[0],)))
    # Without types (a pipeline's task, cut from ops checked where they were made): SSA and order alone.
    mistyped = Function(fn.name, fn.params, (fn.ops[0], wrong), (wrong.results[0],))
    assert verify(mistyped, types=False) is mistyped
    with pytest.raises(VerifyError, match=r"value %h is used before it is defined"):
        verify(Function(fn.name, fn.params, (wrong, fn.ops[0]), (wrong.results[0],)), types=False)


def test_verifier_rejects_shape_errors_inside_ops():
    x, w = Value("x", tensor([3, 5])), Value("w", tensor([4, 7]))
    attrs = Attrs.of({"batch": ((), ()), "contract": ((1,), (0,))})
    bad = Op("dot_general", (x, w), (Value("y", tensor([3, 7])),), attrs)
    with pytest.raises(VerifyError, match="contracting dimension sizes differ: lhs dim 1 is 5, rhs dim 0 is 4"):
        verify(Function("f", (x, w), (bad,), (bad.results[0],)))


def test_verifier_rejects_foreign_values_and_undefined_results():
    fn = small_mlp()
    stranger = Value("x", tensor([3, 5]))  # same name and type, but not the parameter
    op = Op("neg", (stranger,), (Value("n", tensor([3, 5])),))
    with pytest.raises(VerifyError, match="not the value defined under that name"):
        verify(Function(fn.name, fn.params, fn.ops + (op,), fn.results))
    with pytest.raises(VerifyError, match="returns %n, which is not defined"):
        verify(Function(fn.name, fn.params, fn.ops, (op.results[0],)))


def test_verifier_rejects_unnormalized_attrs():
    x = Value("x", tensor([3, 5]))
    op = Op("reduce", (x,), (Value("s", tensor([3])),), Attrs.of({"dims": (1,)}))  # combiner missing
    with pytest.raises(VerifyError, match="missing required|not in normal form"):
        verify(Function("f", (x,), (op,), (op.results[0],)))


def test_mesh_groups_order_members_by_listed_axes():
    mesh = Mesh.of(batch=2, model=3)
    assert mesh.device_coords()[4] == (1, 1)
    assert mesh.groups(("model",)) == [[0, 1, 2], [3, 4, 5]]
    assert mesh.groups(("batch",)) == [[0, 3], [1, 4], [2, 5]]
    assert mesh.groups(("batch", "model")) == [[0, 1, 2, 3, 4, 5]]
    assert mesh.groups(("model", "batch")) == [[0, 3, 1, 4, 2, 5]]
    with pytest.raises(IRError, match="unknown mesh axis 'data'; mesh axes are"):
        mesh.groups(("data",))


def test_mesh_rejects_bad_axes():
    with pytest.raises(IRError, match="distinct"):
        Mesh.from_pairs([("a", 2), ("a", 3)])
    with pytest.raises(IRError, match="size >= 1"):
        Mesh.of(a=0)


def test_users_are_each_functions_own_and_kept_for_the_last_two():
    from ir.core import users
    from ir.models.mlp import deep_mlp, mlp

    functions = [mlp(batch=4).function, deep_mlp(layers=2, d_model=8, batch=4).function, mlp(batch=8).function]
    for fn in functions:
        readers = users(fn)
        assert users(fn) is readers  # kept: a plan's pricing reads it more than once
        for v, reading in readers.items():
            assert reading == [op for op in fn.ops if v in op.operands]
        assert set(readers) == set(fn.values())
    # Equal-looking functions are distinct programs: each gets its own map, never another's.
    assert users(functions[0]) is not users(functions[2])
    assert all(op in functions[0].ops for reading in users(functions[0]).values() for op in reading)
