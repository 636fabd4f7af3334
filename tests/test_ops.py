"""Registry-driven tests: every op kind in `ir.ops.REGISTRY`, one table.

Each non-collective kind has sample cases in CASES: operand types (distinct
sizes, so a swapped dimension shows; some even, so factors can be split in
two), attributes, and a numpy reference written here, independent of the
registry's `impl`. From that one table:

  * the shape rule matches the reference's result shape and dtype;
  * the interpreter matches the reference on seeded random inputs;
  * every factor that block sharding can split, split in two, gives local
    results that are blocks of (parallel, broadcast) or combine to
    (reduction) the global result, with attributes localized by the op;
  * factor sizes multiply to the dimension sizes, and opaque factors sit
    exactly where the layout docstring says.

Collectives (kinds with `spmd_impl`) have their own table in
test_collective_ops.py. The completeness test fails when a registered kind
has no cases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import cases_attention
import cases_bitwise
import cases_indexing
import cases_sorting
import cases_windows
import numpy as np
import pytest
from op_cases import (
    F32,
    I32,
    Case,
    Gen,
    assert_same,
    default_gen,
    f64,
    ints,
    nonzero_ints,
    positive,
    scaled,
    t,
)

from ir import ops
from ir.builder import Builder
from ir.core import NUMPY_DTYPES, Function, Op, TensorType, Value
from ir.interpret import run
from ir.ops import REGISTRY, FactorKind, FactorRule, OpError


def einsum_ref(spec: str) -> Callable[..., np.ndarray]:
    return f64(lambda a, b: np.einsum(spec, a, b))


def ref_broadcast(shape: tuple[int, ...], dims: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """Element by element: result[r] = x[r[dims[0]], r[dims[1]], ...] (0 on size-1 dims)."""
    def ref(x: np.ndarray) -> np.ndarray:
        out = np.empty(shape, x.dtype)
        for r in np.ndindex(*shape):
            out[r] = x[tuple(0 if x.shape[i] == 1 else r[d] for i, d in enumerate(dims))]
        return out
    return ref


def ref_transpose(perm: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """Element by element: result dim i walks operand dim perm[i]."""
    def ref(x: np.ndarray) -> np.ndarray:
        out = np.empty(tuple(x.shape[p] for p in perm), x.dtype)
        for r in np.ndindex(*out.shape):
            src = [0] * x.ndim
            for i, p in enumerate(perm):
                src[p] = r[i]
            out[r] = x[tuple(src)]
        return out
    return ref


def ref_int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero: sign(a*b) * (|a| // |b|)."""
    return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(I32)


def ref_pad(low: Sequence[int], interior: Sequence[int], shape: Sequence[int]) -> Callable[[np.ndarray], np.ndarray]:
    """Zero padding, element by element: x[i] lands at low + i * (interior + 1)."""
    def ref(x: np.ndarray) -> np.ndarray:
        out = np.zeros(shape, x.dtype)
        for i in np.ndindex(*x.shape):
            out[tuple(lo + k * (it + 1) for lo, k, it in zip(low, i, interior))] = x[i]
        return out
    return ref


def ref_scatter_add(axis: int, size: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Loop over every update element and add it at its index."""
    def ref(updates: np.ndarray, idx: np.ndarray) -> np.ndarray:
        rest = updates.shape[axis + idx.ndim:]
        out = np.zeros(updates.shape[:axis] + (size,) + rest, np.float64)
        for pos in np.ndindex(*updates.shape):
            j = pos[axis:axis + idx.ndim]
            target = pos[:axis] + (int(idx[j]),) + pos[axis + idx.ndim:]
            out[target] += updates[pos]
        return out.astype(updates.dtype)
    return ref


def conv_output(x_spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence) -> tuple:
    """(ho, wo): the window positions that fit in the padded input."""
    return tuple((x_spatial[d] + sum(padding[d]) - kernel[d]) // stride[d] + 1 for d in (0, 1))


def conv_taps(x_spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence) -> list:
    """Every (output pixel, kernel tap, input pixel) of a 2-D convolution whose
    input pixel is inside the unpadded input (padding reads zeros), by loops."""
    (h, w), (kh, kw), (sh, sw), (pt, pl) = x_spatial, kernel, stride, (padding[0][0], padding[1][0])
    ho, wo = conv_output(x_spatial, kernel, stride, padding)
    taps = []
    for y, x, i, j in itertools.product(range(ho), range(wo), range(kh), range(kw)):
        r, c = y * sh + i - pt, x * sw + j - pl
        if 0 <= r < h and 0 <= c < w:
            taps.append(((y, x), (i, j), (r, c)))
    return taps


def ref_conv(stride: Sequence[int], padding: Sequence) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """y[:, out] = sum over taps of x[:, in] @ w[tap] (NHWC, HWIO)."""
    def ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        out = np.zeros((x.shape[0], *conv_output(x.shape[1:3], w.shape[:2], stride, padding), w.shape[3]))
        for o, k, i in conv_taps(x.shape[1:3], w.shape[:2], stride, padding):
            out[:, o[0], o[1]] += x[:, i[0], i[1]] @ w[k]
        return out
    return ref


def ref_conv_input_grad(stride: Sequence[int], padding: Sequence,
                        spatial: Sequence[int]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """dx[:, in] = sum over taps reading it of g[:, out] @ w[tap]^T."""
    def ref(g: np.ndarray, w: np.ndarray) -> np.ndarray:
        out = np.zeros((g.shape[0], *spatial, w.shape[2]))
        for o, k, i in conv_taps(spatial, w.shape[:2], stride, padding):
            out[:, i[0], i[1]] += g[:, o[0], o[1]] @ w[k].T
        return out
    return ref


def ref_conv_kernel_grad(stride: Sequence[int], padding: Sequence,
                         kernel: Sequence[int]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """dw[tap] = sum over output pixels of x[:, in]^T @ g[:, out]."""
    def ref(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        out = np.zeros((*kernel, x.shape[3], g.shape[3]))
        for o, k, i in conv_taps(x.shape[1:3], kernel, stride, padding):
            out[k] += x[:, i[0], i[1]].T @ g[:, o[0], o[1]]
        return out
    return ref


def ref_gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    return x / 2 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def unary_cases() -> list[Case]:
    refs: dict[str, tuple[Callable, Gen | None]] = {
        "neg": (lambda x: 0 - x, None),
        "exp": (np.exp, None),
        "log": (np.log, positive),
        "tanh": (lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1), None),
        "sqrt": (lambda x: x ** 0.5, positive),
        "rsqrt": (lambda x: x ** -0.5, positive),
        "relu": (lambda x: np.where(x > 0, x, 0.0), scaled(3.0)),
        "gelu": (ref_gelu, scaled(3.0)),
        "logistic": (lambda x: 0.5 * (1 + np.tanh(x / 2)), scaled(3.0)),
    }
    cases = [Case(k, "f32", (t(6, 5),), {}, f64(ref), (gen,)) for k, (ref, gen) in refs.items()]
    cases.append(Case("neg", "i32", (t(6, 5, dtype="i32"),), {}, lambda x: (0 - x).astype(I32)))
    cases.append(Case("relu", "i32", (t(5, 6, dtype="i32"),), {}, lambda x: np.where(x > 0, x, 0).astype(I32)))
    return cases


def binary_cases() -> list[Case]:
    refs = {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "max": lambda a, b: np.where(a > b, a, b),
        "min": lambda a, b: np.where(a < b, a, b),
    }
    cases = [Case(k, "f32", (t(6, 7), t(6, 7)), {}, f64(ref)) for k, ref in refs.items()]
    cases.append(Case("div", "i32_truncates", (t(6, 7, dtype="i32"),) * 2, {}, ref_int_div,
                      (ints(-20, 21), nonzero_ints(-6, 7))))
    cases.append(Case("max", "i32", (t(7, 6, dtype="i32"),) * 2, {}, lambda a, b: np.where(a > b, a, b)))
    cases.append(Case("pow", "f32", (t(6, 7), t(6, 7)), {}, f64(np.power), (positive, default_gen)))
    return cases


COMPARE_REFS = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}

# (name, x, w, y, stride, padding) of a convolution, for its three kinds' cases
CONV_GEOMETRIES = [
    ("stride1_pad", t(2, 5, 6, 4), t(3, 2, 4, 6), t(2, 5, 6, 6), [1, 1], [[1, 1], [0, 1]]),
    ("stride2_uneven", t(4, 7, 9, 2), t(3, 4, 2, 6), t(4, 3, 3, 6), [2, 3], [[0, 1], [2, 0]]),
]

CASES: dict[str, list[Case]] = {}
for _case in unary_cases() + binary_cases() + [
    # compare: small integers, so that ties (eq, le, ge) really occur
    *(Case("compare", d, (t(6, 5, dtype="i32"),) * 2, {"direction": d}, ref, (ints(-2, 3), ints(-2, 3)))
      for d, ref in COMPARE_REFS.items()),
    Case("compare", "lt_f32", (t(6, 5), t(6, 5)), {"direction": "lt"}, lambda a, b: a < b),
    Case("select", "f32", (t(6, 5, dtype="bool"), t(6, 5), t(6, 5)), {},
         lambda p, a, b: np.array([x if c else y for c, x, y in zip(p.ravel(), a.ravel(), b.ravel())],
                                  F32).reshape(p.shape)),
    Case("convert", "f32_to_i32", (t(6, 5),), {"dtype": "i32"},
         lambda x: (np.sign(x) * np.floor(np.abs(x))).astype(I32), (scaled(10.0),)),
    Case("convert", "i32_to_f32", (t(6, 5, dtype="i32"),), {"dtype": "f32"}, lambda x: x.astype(F32)),
    # dot_general: result dims are batch, lhs free, rhs free
    Case("dot_general", "matmul", (t(6, 10), t(10, 7)), {"contract": [[1], [0]]}, einsum_ref("mk,kn->mn")),
    Case("dot_general", "batch", (t(4, 3, 10), t(10, 4, 7)), {"batch": [[0], [1]], "contract": [[2], [0]]},
         einsum_ref("bmk,kbn->bmn")),
    Case("dot_general", "two_contracting", (t(6, 3, 10), t(10, 7, 6)), {"contract": [[0, 2], [2, 0]]},
         einsum_ref("pmq,qnp->mn")),
    Case("dot_general", "two_free_each", (t(3, 10, 5), t(7, 10, 2)), {"contract": [[1], [1]]},
         einsum_ref("akb,nkp->abnp")),
    # reduce
    Case("reduce", "sum_0_2", (t(6, 10, 7),), {"dims": [0, 2], "combiner": "sum"}, f64(lambda x: x.sum(axis=(0, 2)))),
    Case("reduce", "max_1_2", (t(6, 10, 7),), {"dims": [1, 2], "combiner": "max"}, lambda x: x.max(axis=(1, 2))),
    Case("reduce", "min_2_0", (t(6, 10, 7),), {"dims": [2, 0], "combiner": "min"}, lambda x: x.min(axis=(2, 0))),
    # Running sums by a loop over positions (not np.cumsum): forward from the start, reverse from the end.
    Case("cumsum", "forward_1", (t(6, 10, 4),), {"dim": 1},
         f64(lambda x: np.stack([x[:, :i + 1].sum(axis=1) for i in range(x.shape[1])], axis=1))),
    Case("cumsum", "reverse_0_i32", (t(6, 4, dtype="i32"),), {"dim": 0, "direction": "reverse"},
         lambda x: np.stack([x[i:].sum(axis=0) for i in range(x.shape[0])]).astype(I32)),
    Case("reduce", "sum_i32", (t(6, 5, dtype="i32"),), {"dims": [1]}, lambda x: x.sum(axis=1).astype(I32)),
    Case("reduce", "sum_all", (t(6, 5),), {"dims": [0, 1]}, f64(lambda x: x.sum())),
    # broadcast_in_dim
    Case("broadcast_in_dim", "stretch", (t(1, 10),), {"shape": [6, 5, 10], "dims": [0, 2]},
         ref_broadcast((6, 5, 10), (0, 2))),
    Case("broadcast_in_dim", "new_dims", (t(5),), {"shape": [6, 5, 4], "dims": [1]}, ref_broadcast((6, 5, 4), (1,))),
    Case("broadcast_in_dim", "unordered", (t(10, 3),), {"shape": [3, 7, 10], "dims": [2, 0]},
         ref_broadcast((3, 7, 10), (2, 0))),
    Case("transpose", "3d", (t(6, 5, 14),), {"perm": [2, 0, 1]}, ref_transpose((2, 0, 1))),
    # reshape (row-major): split, merge, split+merge, no common refinement, size-1 dims
    Case("reshape", "split", (t(6, 4, 10),), {"shape": [2, 3, 2, 2, 10]},
         lambda x: x.flatten().reshape(2, 3, 2, 2, 10)),
    Case("reshape", "merge", (t(6, 4),), {"shape": [24]}, lambda x: x.flatten()),
    Case("reshape", "split_merge", (t(6, 4),), {"shape": [2, 12]}, lambda x: x.flatten().reshape(2, 12)),
    Case("reshape", "opaque", (t(4, 6),), {"shape": [3, 8]}, lambda x: x.flatten().reshape(3, 8)),
    Case("reshape", "unit_dims", (t(1, 6, 10),), {"shape": [6, 1, 10]}, lambda x: x.flatten().reshape(6, 1, 10)),
    Case("reshape", "unit_in_group", (t(2, 1, 5, 3),), {"shape": [10, 3]}, lambda x: x.flatten().reshape(10, 3)),
    Case("concatenate", "three", (t(6, 3), t(6, 5), t(6, 7)), {"dim": 1}, lambda a, b, c: np.hstack([a, b, c])),
    Case("slice", "start_limit", (t(6, 10, 7),), {"start": [0, 2, 1], "limit": [6, 9, 7]},
         lambda x: x[:, 2:9, 1:7]),
    Case("slice", "stride", (t(6, 10, 7),), {"start": [0, 1, 0], "limit": [6, 10, 7], "stride": [1, 3, 2]},
         lambda x: x[:, 1:10:3, 0:7:2]),
    Case("gather", "axis0", (t(7, 10), t(6, 5, dtype="i32")), {"axis": 0}, lambda x, i: x[i], (None, ints(0, 7))),
    Case("gather", "axis1", (t(6, 7, 5), t(3, 4, dtype="i32")), {"axis": 1}, lambda x, i: x[:, i], (None, ints(0, 7))),
    Case("gather", "clamps", (t(7, 6), t(10, dtype="i32")), {"axis": 0}, lambda x, i: x[np.clip(i, 0, 6)],
         (None, ints(-5, 12))),
    Case("pad", "low_high_interior", (t(6, 5, 7),), {"low": [0, 1, 2], "high": [0, 2, 0], "interior": [0, 1, 0]},
         ref_pad((0, 1, 2), (0, 1, 0), (6, 12, 9))),
    Case("pad", "edges_only", (t(6, 5),), {"low": [1, 0], "high": [2, 0]}, ref_pad((1, 0), (0, 0), (9, 5))),
    Case("scatter_add", "axis0", (t(6, 5, 7), t(6, 5, dtype="i32")), {"axis": 0, "size": 4},
         ref_scatter_add(0, 4), (None, ints(0, 4))),
    Case("scatter_add", "axis1", (t(3, 4, 10), t(4, dtype="i32")), {"axis": 1, "size": 6},
         ref_scatter_add(1, 6), (None, ints(0, 6))),
    Case("iota", "dim1", (), {"shape": [6, 5], "dtype": "i32", "dimension": 1},
         lambda: np.indices((6, 5))[1].astype(I32)),
    Case("iota", "dim0_f32", (), {"shape": [5, 6], "dtype": "f32"}, lambda: np.indices((5, 6))[0].astype(F32)),
    Case("full", "f32", (), {"shape": [6, 5], "dtype": "f32", "value": 2.5}, lambda: np.full((6, 5), 2.5, F32)),
    Case("full", "i32", (), {"shape": [3, 4], "dtype": "i32", "value": -7}, lambda: np.full((3, 4), -7, I32)),
    Case("constant", "f32", (), {"shape": [2, 3], "dtype": "f32", "value": [1.5, -2, 3, 0, 5, 6.25]},
         lambda: np.array([[1.5, -2, 3], [0, 5, 6.25]], F32)),
    Case("constant", "i32", (), {"shape": [3], "dtype": "i32", "value": [4, -1, 9]}, lambda: np.array([4, -1, 9], I32)),
    # raw little-endian bytes: 1.0, 2.0, -0.5 as f32 and as bf16 (the top halves)
    Case("constant", "data_f32", (), {"shape": [3, 1], "dtype": "f32", "data": "0x0000803F00000040000000BF"},
         lambda: np.array([[1.0], [2.0], [-0.5]], F32)),
    Case("constant", "data_bf16", (), {"shape": [3], "dtype": "bf16", "data": "0x803F004000BF"},
         lambda: np.array([1.0, 2.0, -0.5], F32)),
    # convolution and its transposes: NHWC x, HWIO w; "uneven" strides leave
    # padded rows and columns no window reads (7 + 1 - 3 = 5 rows, stride 2)
    *(Case("convolution", name, (x, w), {"stride": s, "padding": p}, f64(ref_conv(s, p)))
      for name, x, w, _, s, p in CONV_GEOMETRIES),
    *(Case("conv_input_grad", name, (y, w), {"stride": s, "padding": p, "input_spatial": list(x.shape[1:3])},
           f64(ref_conv_input_grad(s, p, x.shape[1:3]))) for name, x, w, y, s, p in CONV_GEOMETRIES),
    *(Case("conv_kernel_grad", name, (x, y), {"stride": s, "padding": p, "kernel_spatial": list(w.shape[:2])},
           f64(ref_conv_kernel_grad(s, p, w.shape[:2]))) for name, x, w, y, s, p in CONV_GEOMETRIES),
] + cases_attention.CASES + cases_bitwise.CASES + cases_indexing.CASES + cases_sorting.CASES + cases_windows.CASES:
    CASES.setdefault(_case.kind, []).append(_case)

ALL_CASES = [c for cases in CASES.values() for c in cases]
CASE_PARAMS = [pytest.param(c, id=c.id) for c in ALL_CASES]


def case_named(case_id: str) -> Case:
    return next(c for c in ALL_CASES if c.id == case_id)


# --------------------------------------------------------------------------
# Completeness


def test_every_registered_kind_has_cases_and_every_field():
    local = {k for k, d in REGISTRY.items() if not d.is_collective}
    collective = {k for k, d in REGISTRY.items() if d.is_collective}
    assert sorted(local - set(CASES)) == [], "op kinds without cases in CASES"
    assert sorted(set(CASES) - local) == [], "CASES names kinds that are not registered (or are collectives)"
    assert collective == {"all_reduce", "all_gather", "all_slice", "reduce_scatter", "all_to_all",
                          "collective_permute"}, \
        "a new collective needs cases in test_collective_ops.COLLECTIVE_CASES"
    for name, opdef in REGISTRY.items():
        assert opdef.name == name
        for part in (opdef.infer, opdef.factors, opdef.cost, opdef.localize):
            assert callable(part), f"{name} lacks a rule"
        assert (opdef.impl is None) != (opdef.spmd_impl is None), f"{name} needs exactly one of impl, spmd_impl"
        assert opdef.doc, f"{name} has no doc"


def test_registering_a_kind_twice_raises():
    with pytest.raises(AssertionError, match="twice"):
        ops.register(REGISTRY["add"])


# --------------------------------------------------------------------------
# Shape rules and numpy semantics


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_shape_rule_matches_reference(case: Case):
    expected = case.expected()
    (ty,) = ops.infer_results(case.kind, case.operands, ops.normalize_attrs(case.kind, case.attrs))
    assert ty.shape == expected.shape
    assert np.dtype(NUMPY_DTYPES[ty.dtype]) == expected.dtype
    op = case.op()
    assert op.result.type == ty


def one_op_function(case: Case) -> Function:
    """`y = kind(x0, x1, ...)`, built and verified by the Builder."""
    b = Builder("one_op")
    params = [b.param(f"x{i}", ty.shape, ty.dtype) for i, ty in enumerate(case.operands)]
    return b.build([b.op(case.kind, params, **case.attrs)])


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_interpreter_matches_reference(case: Case):
    for seed in (0, 1):
        (got,) = run(one_op_function(case), case.inputs(seed))
        assert_same(got, case.expected(seed))


def test_known_answers():
    """A few values worked out by hand (not by formula), where the reference
    functions above could share a mistake with the implementation."""
    def run1(kind: str, xs: Sequence[np.ndarray], in_dtype: str, **attrs: Any) -> np.ndarray:
        case = Case(kind, "known", tuple(t(*np.shape(x), dtype=in_dtype) for x in xs), attrs, lambda *_: None)
        return run(one_op_function(case), list(xs))[0]

    a, b = np.array([-7, 7, -7, 7, 0, -1], I32), np.array([2, 2, -2, -2, 3, 2], I32)
    assert run1("div", [a, b], "i32").tolist() == [-3, 3, 3, -3, 0, 0]
    assert run1("convert", [np.array([-2.7, -0.5, 0.5, 2.7], F32)], "f32", dtype="i32").tolist() == [-2, 0, 0, 2]
    # Published values of the tanh-approximated GELU.
    gelu = run1("gelu", [np.array([-1.0, 0.0, 1.0, 10.0, -10.0], F32)], "f32")
    np.testing.assert_allclose(gelu, [-0.158808, 0.0, 0.841192, 10.0, 0.0], atol=2e-6)


# --------------------------------------------------------------------------
# Factor rules


def dims_with_major(rule_dims: tuple, f: int) -> list[tuple[int, ...]]:
    """For each tensor, the dims whose major (first) factor is `f`."""
    return [tuple(d for d, factors in enumerate(tensor) if factors[0] == f) for tensor in rule_dims]


def splittable(rule: FactorRule, f: int) -> bool:
    """Can block sharding split factor f in two: not opaque, even, and the
    major factor of every dim it appears in."""
    factor = rule.factors[f]
    appearances = [d for tensors in (rule.operands, rule.results) for tensor in tensors for d in tensor if f in d]
    return factor.kind is not FactorKind.OPAQUE and factor.size % 2 == 0 and all(d[0] == f for d in appearances)


def block(x: np.ndarray, dims: Sequence[int], k: int, parts: int = 2) -> np.ndarray:
    """Block k of `parts` equal blocks along each of `dims`."""
    index = [slice(None)] * x.ndim
    for d in dims:
        step = x.shape[d] // parts
        index[d] = slice(k * step, (k + 1) * step)
    return x[tuple(index)]


def halved(ty: TensorType, dims: Sequence[int]) -> TensorType:
    return ty.with_shape(tuple(s // 2 if d in dims else s for d, s in enumerate(ty.shape)))


def factor_params() -> list:
    params = []
    for case in ALL_CASES:
        try:
            rule = ops.factor_rule(case.op())
        except Exception:  # noqa: BLE001 - a broken rule fails test_factor_sizes instead
            continue
        for f, factor in enumerate(rule.factors):
            if splittable(rule, f):
                params.append(pytest.param(case, factor.name, id=f"{case.id}-{factor.name}"))
    return params


FACTOR_PARAMS = factor_params()
COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def run_impl(kind: str, inputs: Sequence[np.ndarray], attrs: Any, result_types: Sequence[TensorType]) -> list:
    """The kind's impl, each result rounded to its declared dtype as the
    executors do (an impl may return any dtype that holds its values)."""
    outs = ops.get(kind).impl(list(inputs), attrs)
    assert [np.shape(o) for o in outs] == [ty.shape for ty in result_types]
    return [np.asarray(o).astype(NUMPY_DTYPES[ty.dtype]) for o, ty in zip(outs, result_types)]


def sharded_run(case: Case, op: Op, operand_dims: list, result_dims: list, k: int) -> list[np.ndarray]:
    """Run the op's impl on block k of every operand, with localized attrs."""
    local_operands = tuple(halved(ty, dims) for ty, dims in zip(case.operands, operand_dims))
    local_results = tuple(halved(v.type, dims) for v, dims in zip(op.results, result_dims))
    attrs = ops.get(case.kind).localize(op.attrs, local_operands, local_results)
    assert ops.infer_results(case.kind, local_operands, attrs) == local_results, "localized attrs do not fit"
    inputs = [block(x, dims, k) for x, dims in zip(case.inputs(), operand_dims)]
    return run_impl(case.kind, inputs, attrs, local_results)


@pytest.mark.parametrize("case,factor_name", FACTOR_PARAMS)
def test_sharding_a_factor_in_two_preserves_results(case: Case, factor_name: str):
    op = case.op()
    rule = ops.factor_rule(op)
    f = next(i for i, x in enumerate(rule.factors) if x.name == factor_name)
    factor = rule.factors[f]
    operand_dims, result_dims = dims_with_major(rule.operands, f), dims_with_major(rule.results, f)
    in_operands, in_results = any(operand_dims), any(result_dims)
    assert (in_operands, in_results) == {
        FactorKind.PARALLEL: (True, True), FactorKind.REDUCTION: (True, False), FactorKind.BROADCAST: (False, True),
    }[factor.kind]
    full = run_impl(case.kind, case.inputs(), op.attrs, [v.type for v in op.results])
    local = [sharded_run(case, op, operand_dims, result_dims, k) for k in range(2)]
    for i, whole in enumerate(full):
        if factor.kind is FactorKind.REDUCTION:
            assert_same(COMBINE[factor.combiner](local[0][i], local[1][i]), whole)
        else:
            for k in range(2):
                assert_same(local[k][i], block(whole, result_dims[i], k))


def test_every_kind_but_constant_has_a_splittable_factor_case():
    covered = {p.values[0].kind for p in FACTOR_PARAMS}
    assert covered == set(CASES) - {"constant"}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_factor_sizes_multiply_to_dim_sizes(case: Case):
    op = case.op()
    rule = ops.factor_rule(op)
    tensors = [(v.type, dims) for v, dims in zip(op.operands, rule.operands)]
    tensors += [(v.type, dims) for v, dims in zip(op.results, rule.results)]
    assert len(rule.operands) == len(op.operands) and len(rule.results) == len(op.results)
    for ty, dims in tensors:
        assert len(dims) == ty.rank
        for size, factors in zip(ty.shape, dims):
            assert math.prod(rule.factors[i].size for i in factors) == size, f"{ty}: {dims}"


# Dims holding an opaque factor, per operand and per result; cases not listed
# must have none. Straight from the layout docstring.
OPAQUE_DIMS: dict[str, tuple[list[set[int]], list[set[int]]]] = {
    "broadcast_in_dim-stretch": ([{0}], [set()]),  # the size-1 operand dim
    "cumsum-forward_1": ([{1}], [{1}]),  # the summed dim
    "cumsum-reverse_0_i32": ([{0}], [{0}]),
    "reshape-opaque": ([{0, 1}], [{0, 1}]),  # [4,6]->[3,8]: no common refinement
    "reshape-unit_dims": ([{0}], [{1}]),  # size-1 dims carry unit factors
    "reshape-unit_in_group": ([{1}], [set()]),
    "concatenate-three": ([{1}, {1}, {1}], [{1}]),
    "slice-start_limit": ([{1, 2}], [{1, 2}]),
    "slice-stride": ([{1, 2}], [{1, 2}]),
    "gather-axis0": ([{0}, set()], [set()]),
    "gather-axis1": ([{1}, set()], [set()]),
    "gather-clamps": ([{0}, set()], [set()]),
    "pad-low_high_interior": ([{1, 2}], [{1, 2}]),
    "pad-edges_only": ([{0}], [{0}]),
    "scatter_add-axis0": ([set(), set()], [{0}]),
    "scatter_add-axis1": ([set(), set()], [{1}]),
    "iota-dim1": ([], [{1}]),
    "iota-dim0_f32": ([], [{0}]),
    "constant-f32": ([], [{0, 1}]),
    "constant-i32": ([], [{0}]),
    "constant-data_f32": ([], [{0, 1}]),
    "constant-data_bf16": ([], [{0}]),
    # spatial dims and the kernel window are opaque in all three convolution kinds
    **{f"convolution-{g[0]}": ([{1, 2}, {0, 1}], [{1, 2}]) for g in CONV_GEOMETRIES},
    **{f"conv_input_grad-{g[0]}": ([{1, 2}, {0, 1}], [{1, 2}]) for g in CONV_GEOMETRIES},
    **{f"conv_kernel_grad-{g[0]}": ([{1, 2}, {1, 2}], [{0, 1}]) for g in CONV_GEOMETRIES},
}
# Each family's case module lists its own.
for _module in (cases_attention, cases_bitwise, cases_indexing, cases_sorting, cases_windows):
    OPAQUE_DIMS.update(getattr(_module, "OPAQUE_DIMS", {}))


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_opaque_factors_are_where_expected(case: Case):
    rule = ops.factor_rule(case.op())

    def opaque(tensors: tuple) -> list[set[int]]:
        return [{d for d, fs in enumerate(dims) if any(rule.factors[i].kind is FactorKind.OPAQUE for i in fs)}
                for dims in tensors]

    no_opaque = ([set()] * len(case.operands), [set()])
    assert (opaque(rule.operands), opaque(rule.results)) == OPAQUE_DIMS.get(case.id, no_opaque)


@pytest.mark.parametrize("kind,operands,attrs,text", [
    ("dot_general", (t(3, 5), t(5, 7)), {"contract": [[1], [0]]}, "(m0,k0),(k0,n0)->(m0,n0) {k0:sum}"),
    ("dot_general", (t(2, 3, 5), t(2, 5, 7)), {"batch": [[0], [0]], "contract": [[2], [1]]},
     "(b0,m0,k0),(b0,k0,n0)->(b0,m0,n0) {k0:sum}"),
    ("reduce", (t(3, 5),), {"dims": [1], "combiner": "max"}, "(d0,r1)->(d0) {r1:max}"),
    ("transpose", (t(3, 5, 7),), {"perm": [2, 0, 1]}, "(d0,d1,d2)->(d2,d0,d1)"),
    ("broadcast_in_dim", (t(5),), {"shape": [3, 5], "dims": [1]}, "(d1)->(d0,d1) {d0:broadcast}"),
    ("reshape", (t(6),), {"shape": [2, 3]}, "([g0a*g0b])->(g0a,g0b)"),
    ("reshape", (t(6, 4),), {"shape": [2, 12]}, "([g0a*g0b],g0c)->(g0a,[g0b*g0c])"),
    ("gather", (t(7, 5), t(3, dtype="i32")), {"axis": 0}, "(v,p1),(i0)->(i0,p1) {v:opaque}"),
    ("add", (t(3, 5), t(3, 5)), {}, "(d0,d1),(d0,d1)->(d0,d1)"),
])
def test_printed_factor_rules(kind: str, operands: tuple, attrs: dict, text: str):
    op = ops.make_op(kind, [Value(f"x{i}", ty) for i, ty in enumerate(operands)], attrs, ["y"])
    assert str(ops.factor_rule(op)) == text


# --------------------------------------------------------------------------
# Costs


def make(kind: str, operands: Sequence[TensorType], **attrs: Any) -> Op:
    return ops.make_op(kind, [Value(f"x{i}", ty) for i, ty in enumerate(operands)], attrs, ["y"])


def test_costs():
    mm = ops.op_cost(make("dot_general", [t(3, 5), t(5, 7)], contract=[[1], [0]]))
    assert (mm.flops, mm.bytes) == (2 * 3 * 7 * 5, 4 * (3 * 5 + 5 * 7 + 3 * 7))
    bmm = ops.op_cost(make("dot_general", [t(2, 3, 5), t(5, 2, 7)], batch=[[0], [1]], contract=[[2], [0]]))
    assert (bmm.flops, bmm.bytes) == (2 * 2 * 3 * 7 * 5, 4 * (2 * 3 * 5 + 5 * 2 * 7 + 2 * 3 * 7))
    two = ops.op_cost(make("dot_general", [t(6, 3, 10), t(10, 7, 6)], contract=[[0, 2], [2, 0]]))
    assert two.flops == 2 * 3 * 7 * 6 * 10
    red = ops.op_cost(make("reduce", [t(3, 5, 7)], dims=[0, 2]))
    assert (red.flops, red.bytes) == (3 * 5 * 7, 4 * (3 * 5 * 7 + 5))
    assert ops.op_cost(make("reshape", [t(6, 4)], shape=[24])).bytes == 0
    assert ops.op_cost(make("add", [t(3, 5), t(3, 5)])).flops == 15


# --------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("value", [None, {"a": 1}], ids=["None", "dict"])
def test_unsupported_attribute_value_raises_op_error_naming_it(value: Any):
    with pytest.raises(OpError, match="reduce: attribute 'dims'"):
        make("reduce", [t(3, 5)], dims=value)


def test_numpy_scalar_attributes_become_python_numbers():
    op = make("reduce", [t(3, 5)], dims=[np.int64(1)])
    assert op.attrs["dims"] == (1,) and type(op.attrs["dims"][0]) is int


@pytest.mark.parametrize("combiner,dtype,identity", [
    ("max", "f32", -np.inf), ("min", "f32", np.inf), ("max", "i32", np.iinfo(I32).min),
])
def test_reduce_over_an_empty_dim_gives_the_identity(combiner: str, dtype: str, identity: float):
    case = Case("reduce", "empty", (t(0, 5, dtype=dtype),), {"dims": [0], "combiner": combiner}, lambda x: None)
    x = np.zeros((0, 5), NUMPY_DTYPES[dtype])
    (got,) = run(one_op_function(case), [x])
    assert_same(got, np.full(5, identity, NUMPY_DTYPES[dtype]))


def test_unknown_op_lists_known_ops():
    with pytest.raises(OpError, match="unknown op 'nope'.*dot_general"):
        ops.get("nope")


@pytest.mark.parametrize("kind,operands,attrs,pattern", [
    ("add", [t(3, 5)], {}, "takes 2 operand"),
    ("neg", [t(3, 5), t(3, 5)], {}, "takes 1 operand"),
    ("concatenate", [], {"dim": 0}, "at least one operand"),
    ("reduce", [t(3, 5)], {"dims": [0], "axis": 1}, "unknown attribute 'axis'"),
    ("transpose", [t(3, 5)], {}, "missing required attribute 'perm'"),
    ("reduce", [t(3, 5)], {"dims": "0"}, "attribute 'dims'"),
    ("reduce", [t(3, 5)], {"dims": [0], "combiner": "mean"}, "attribute 'combiner'"),
    ("slice", [t(3, 5)], {"start": [0, 0], "limit": [3, 5.0]}, "attribute 'limit'"),
    ("full", [], {"shape": [2], "dtype": "f8", "value": 1}, "attribute 'dtype'"),
    ("add", [t(3, 5), t(5, 3)], {}, "shapes differ"),
    ("add", [t(3, 5), t(3, 5, dtype="i32")], {}, "dtypes differ"),
    ("dot_general", [t(3, 5), t(7, 5)], {"contract": [[1], [0]]}, "sizes differ"),
    ("reshape", [t(3, 5)], {"shape": [4, 4]}, "cannot reshape"),
])
def test_misuse_raises_op_error(kind: str, operands: list, attrs: dict, pattern: str):
    with pytest.raises(OpError, match=pattern):
        make(kind, operands, **attrs)


# --------------------------------------------------------------------------
# VJPs: reverse mode against central finite differences, per op kind


def test_every_local_kind_has_a_vjp():
    assert [k for k, d in REGISTRY.items() if d.vjp is None and not d.is_collective] == []


# Kinds that are themselves derivatives and have no VJP of their own (fused attention's backward kernels),
# and ring attention's block (made after autodiff, ir/ring_attention.py).
FIRST_ORDER_ONLY = {"attention_dq", "attention_dkv"}
NO_VJP_CASES = {"attention-stats"}


def differentiable(case: Case) -> bool:
    """A float result of float operands, at inputs where central differences are finite (not sort's NaN case)."""
    result = case.op().results[0].type
    return (case.kind not in FIRST_ORDER_ONLY and case.id not in NO_VJP_CASES and result.dtype == "f32"
            and any(ty.dtype == "f32" for ty in case.operands)
            and all(np.isfinite(x).all() for x in case.inputs(seed=3) if x.dtype == F32))


VJP_PARAMS = [pytest.param(c, id=c.id) for c in ALL_CASES if differentiable(c)]


def weighted_loss_function(case: Case, weights: np.ndarray) -> Function:
    """loss = sum(kind(x0, x1, ...) * weights): its gradient is the op's VJP of `weights`."""
    b = Builder("vjp")
    params = [b.param(f"x{i}", ty.shape, ty.dtype) for i, ty in enumerate(case.operands)]
    y = b.op(case.kind, params, **case.attrs)
    loss = b.sum(b.mul(y, b.constant(weights)), list(range(y.type.rank)))
    return b.build([loss])


@pytest.mark.parametrize("case", VJP_PARAMS)
def test_vjp_matches_central_differences(case: Case):
    from ir.autodiff import grad

    rng = np.random.default_rng(7)
    weights = rng.standard_normal(case.op().results[0].type.shape).round(3)
    fn = weighted_loss_function(case, weights)
    floats = [i for i, ty in enumerate(case.operands) if ty.dtype == "f32"]
    gradient_fn = grad(fn, [f"x{i}" for i in floats])
    inputs = [x.astype(np.float64) if x.dtype == F32 else x for x in case.inputs(seed=3)]
    grads = run(gradient_fn, inputs, float_dtype=np.float64)[1:]

    def loss(xs: list[np.ndarray]) -> float:
        return float(run(fn, xs, float_dtype=np.float64)[0])

    eps = 1e-6
    for i, g in zip(floats, grads):
        for _ in range(3):  # directional derivatives along random directions
            u = rng.standard_normal(case.operands[i].shape)
            plus = [x + eps * u if j == i else x for j, x in enumerate(inputs)]
            minus = [x - eps * u if j == i else x for j, x in enumerate(inputs)]
            numeric = (loss(plus) - loss(minus)) / (2 * eps)
            assert float(np.sum(g * u)) == pytest.approx(numeric, rel=1e-6, abs=1e-6), f"operand x{i}"
