"""A tracing builder: the DSL model builders and tests write programs in.

    b = Builder("mlp")
    x = b.param("x", [256, 32])
    w1 = b.param("w1", [32, 64])
    w2 = b.param("w2", [64, 32])
    y = b.matmul(b.relu(b.matmul(x, w1)), w2)
    fn = b.build([y])

Every helper emits registry ops through `Builder.op`, which infers result
types at once, so a shape error surfaces at the line that caused it.
Elementwise helpers broadcast numpy-style (inserting `broadcast_in_dim`)
and accept Python numbers (emitted as `full`). `build` runs the verifier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ir import ops
from ir.core import FLOAT_DTYPES, Attrs, Function, IRError, Mesh, Op, TensorType, Value, check_name
from ir.opset.convolution import explicit_padding

Operand = Value | int | float


class Builder:
    def __init__(self, name: str, mesh: Mesh | None = None):
        self.name = check_name(name, "function")
        self.mesh = mesh or Mesh()
        self.params: list[Value] = []
        self.body: list[Op] = []
        self._names: set[str] = set()
        self._counter = 0
        # The ops `emit` made, by id: `make_op` inferred their types, so `build` checks them for SSA and order
        # alone. An op put in `body` otherwise is verified in full. Held here, so that no op dropped from the
        # body leaves its id to another.
        self._inferred: dict[int, Op] = {}

    # ------------------------------------------------------------ basics

    def _fresh(self, name: str | None) -> str:
        if name is None:
            while str(self._counter) in self._names:
                self._counter += 1
            name = str(self._counter)
            self._counter += 1
        check_name(name, "value")
        if name in self._names:
            raise IRError(f"value name %{name} is already used in @{self.name}")
        self._names.add(name)
        return name

    def param(self, name: str, shape: Sequence[int], dtype: str = "f32") -> Value:
        value = Value(self._fresh(name), TensorType(tuple(shape), dtype))
        self.params.append(value)
        return value

    def adopt(self, fn: Function) -> None:
        """Take over `fn`'s parameters and ops (the same Value objects), so new
        ops can extend it: how autodiff appends a backward pass."""
        for v in fn.values():
            self._fresh(v.name)
        self.params.extend(fn.params)
        self.body.extend(fn.ops)

    def add_param(self, value: Value) -> None:
        """A parameter made elsewhere, named as a verified program names one
        (`ir.lower`: a global parameter's local form)."""
        self.take_name(value.name)
        self.params.append(value)

    def take_name(self, name: str) -> None:
        """Reserve the name of a result made elsewhere: `ir.lower` replays the
        ops it lowered once (their types already inferred), appending them
        to `body` itself, and builds with `types=False`."""
        if name in self._names:
            raise IRError(f"value name %{name} is already used in @{self.name}")
        self._names.add(name)

    def op(self, kind: str, operands: Sequence[Value], name: str | None = None, **attrs: Any) -> Value:
        """Emit a single-result op and return its result."""
        return self.emit(kind, operands, name, attrs)

    def emit(self, kind: str, operands: Sequence[Value], name: str | None, attrs: Mapping[str, Any] | Attrs) -> Value:
        """`op` with the attributes as one mapping (an `Attrs` another op carries, say)."""
        op = ops.make_op(kind, operands, attrs, [self._fresh(name)], self.mesh)
        self.body.append(op)
        self._inferred[id(op)] = op
        return op.result

    def build(self, outputs: Sequence[Value], types: bool = True) -> Function:
        """The function of the body's ops, verified (`ops.verify`): the types of
        those not made by `emit`, which inferred them; `types=False`: of none,
        where the caller knows them checked (`ir.lower`'s replayed ops)."""
        fn = Function(self.name, tuple(self.params), tuple(self.body), tuple(outputs), self.mesh)
        return ops.verify(fn, types=types, inferred=self._inferred)

    # ------------------------------------------------------ elementwise

    def _lift(self, x: Operand, like: Value) -> Value:
        if isinstance(x, Value):
            return x
        return self.full(like.type.shape, x, like.type.dtype)

    def _binary(self, kind: str, a: Operand, b: Operand, name: str | None, **attrs: Any) -> Value:
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise IRError(f"{kind}: at least one operand must be a Value")
        a = self._lift(a, b) if isinstance(b, Value) else a
        b = self._lift(b, a)
        shape = tuple(np.broadcast_shapes(a.type.shape, b.type.shape))
        return self.op(kind, [self.broadcast_to(a, shape), self.broadcast_to(b, shape)], name, **attrs)

    def add(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("add", a, b, name)

    def sub(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("sub", a, b, name)

    def mul(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("mul", a, b, name)

    def div(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("div", a, b, name)

    def maximum(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("max", a, b, name)

    def minimum(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self._binary("min", a, b, name)

    def compare(self, a: Operand, b: Operand, direction: str, name: str | None = None) -> Value:
        return self._binary("compare", a, b, name, direction=direction)

    def select(self, pred: Value, on_true: Operand, on_false: Operand, name: str | None = None) -> Value:
        like = on_true if isinstance(on_true, Value) else on_false
        if not isinstance(like, Value):
            raise IRError("select: at least one branch must be a Value")
        shape = tuple(np.broadcast_shapes(pred.type.shape, like.type.shape))
        branches = [self.broadcast_to(self._lift(v, like), shape) for v in (on_true, on_false)]
        return self.op("select", [self.broadcast_to(pred, shape), *branches], name)

    def unary(self, kind: str, x: Value, name: str | None = None) -> Value:
        return self.op(kind, [x], name)

    def neg(self, x: Value, name: str | None = None) -> Value:
        return self.unary("neg", x, name)

    def exp(self, x: Value, name: str | None = None) -> Value:
        return self.unary("exp", x, name)

    def log(self, x: Value, name: str | None = None) -> Value:
        return self.unary("log", x, name)

    def tanh(self, x: Value, name: str | None = None) -> Value:
        return self.unary("tanh", x, name)

    def sqrt(self, x: Value, name: str | None = None) -> Value:
        return self.unary("sqrt", x, name)

    def rsqrt(self, x: Value, name: str | None = None) -> Value:
        return self.unary("rsqrt", x, name)

    def relu(self, x: Value, name: str | None = None) -> Value:
        return self.unary("relu", x, name)

    def gelu(self, x: Value, name: str | None = None) -> Value:
        return self.unary("gelu", x, name)

    def logistic(self, x: Value, name: str | None = None) -> Value:
        return self.unary("logistic", x, name)

    def convert(self, x: Value, dtype: str, name: str | None = None) -> Value:
        return self.op("convert", [x], name, dtype=dtype)

    # ----------------------------------------------------------- layout

    def broadcast_in_dim(self, x: Value, shape: Sequence[int], dims: Sequence[int], name: str | None = None) -> Value:
        return self.op("broadcast_in_dim", [x], name, shape=list(shape), dims=list(dims))

    def broadcast_to(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        """Numpy-style broadcast (trailing dims aligned); a no-op when shapes match."""
        shape = tuple(shape)
        if x.type.shape == shape:
            return x
        offset = len(shape) - x.type.rank
        if offset < 0:
            raise IRError(f"cannot broadcast {x.type} to shape {list(shape)}")
        return self.broadcast_in_dim(x, shape, range(offset, len(shape)), name)

    def transpose(self, x: Value, perm: Sequence[int], name: str | None = None) -> Value:
        return self.op("transpose", [x], name, perm=list(perm))

    def reshape(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        return self.op("reshape", [x], name, shape=list(shape))

    def concatenate(self, xs: Sequence[Value], dim: int, name: str | None = None) -> Value:
        return self.op("concatenate", list(xs), name, dim=dim)

    def slice(self, x: Value, start: Sequence[int], limit: Sequence[int], stride: Sequence[int] = (),
              name: str | None = None) -> Value:
        return self.op("slice", [x], name, start=list(start), limit=list(limit), stride=list(stride))

    def gather(self, table: Value, indices: Value, axis: int = 0, name: str | None = None) -> Value:
        return self.op("gather", [table, indices], name, axis=axis)

    def scatter_add(self, updates: Value, indices: Value, axis: int, size: int, name: str | None = None) -> Value:
        return self.op("scatter_add", [updates, indices], name, axis=axis, size=size)

    def pad(self, x: Value, low: Sequence[int], high: Sequence[int], interior: Sequence[int] = (),
            name: str | None = None) -> Value:
        return self.op("pad", [x], name, low=list(low), high=list(high), interior=list(interior))

    def iota(self, shape: Sequence[int], dimension: int = 0, dtype: str = "i32", name: str | None = None) -> Value:
        return self.op("iota", [], name, shape=list(shape), dtype=dtype, dimension=dimension)

    def full(self, shape: Sequence[int], value: float | int | bool, dtype: str = "f32",
             name: str | None = None) -> Value:
        if dtype in FLOAT_DTYPES:
            value = float(value)
        return self.op("full", [], name, shape=list(shape), dtype=dtype, value=value)

    def zeros(self, shape: Sequence[int], dtype: str = "f32", name: str | None = None) -> Value:
        return self.full(shape, 0, dtype, name)

    def constant(self, values: Any, dtype: str = "f32", name: str | None = None) -> Value:
        array = np.asarray(values)
        return self.op("constant", [], name, shape=list(array.shape), dtype=dtype, value=array.ravel().tolist())

    # ------------------------------------------------------ contraction

    def dot_general(self, a: Value, b: Value, contract: Sequence[Sequence[int]],
                    batch: Sequence[Sequence[int]] = ((), ()), name: str | None = None) -> Value:
        return self.op("dot_general", [a, b], name, contract=[list(c) for c in contract],
                       batch=[list(c) for c in batch])

    def matmul(self, a: Value, b: Value, name: str | None = None) -> Value:
        """`a @ b`: contracts a's last dim with b's first (b 2-D), or numpy-style
        batched matmul when both have the same rank > 2."""
        if b.type.rank == 2:
            return self.dot_general(a, b, [[a.type.rank - 1], [0]], name=name)
        if a.type.rank != b.type.rank:
            raise IRError(f"matmul: ranks of {a.type} and {b.type} do not match")
        batch = list(range(a.type.rank - 2))
        return self.dot_general(a, b, [[a.type.rank - 1], [b.type.rank - 2]], [batch, batch], name)

    def einsum(self, spec: str, a: Value, b: Value, name: str | None = None) -> Value:
        """Two-operand einsum, e.g. "bsd,df->bsf": a dot_general, plus a
        transpose when the output order differs from dot_general's."""
        inputs, out = spec.replace(" ", "").split("->")
        sa, sb = inputs.split(",")
        if len(sa) != a.type.rank or len(sb) != b.type.rank or len(set(out)) != len(out):
            raise IRError(f"einsum {spec!r} does not fit operands {a.type}, {b.type}")
        for letters, x in ((sa, a), (sb, b)):
            lonely = [c for c in letters if c not in out and c not in (sa if x is b else sb)]
            if lonely:
                raise IRError(f"einsum {spec!r}: summing {lonely} over one operand is not supported; "
                              "reduce it first")
        batch = [c for c in sa if c in sb and c in out]
        contract = [c for c in sa if c in sb and c not in out]
        order = batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
        if sorted(order) != sorted(out):
            raise IRError(f"einsum {spec!r}: output letters do not match the operands")
        in_order = order == list(out)
        y = self.dot_general(a, b, [[sa.index(c) for c in contract], [sb.index(c) for c in contract]],
                             [[sa.index(c) for c in batch], [sb.index(c) for c in batch]],
                             name if in_order else None)
        return y if in_order else self.transpose(y, [order.index(c) for c in out], name)

    # ------------------------------------------------------ convolution

    def conv2d(self, x: Value, w: Value, stride: Sequence[int] = (1, 1),
               padding: str | Sequence[Sequence[int]] = "SAME", name: str | None = None) -> Value:
        """2-D convolution of x [n, h, w, c] by w [kh, kw, c, o]: `padding` is
        "SAME" (output ceil(size / stride)), "VALID" (none) or [[top, bottom],
        [left, right]]."""
        pairs = explicit_padding(padding, x.type.shape[1:3], w.type.shape[:2], stride)
        return self.op("convolution", [x, w], name, stride=list(stride), padding=[list(p) for p in pairs])

    def conv_input_grad(self, g: Value, w: Value, input_spatial: Sequence[int], stride: Sequence[int] = (1, 1),
                        padding: Sequence[Sequence[int]] = ((0, 0), (0, 0)), name: str | None = None) -> Value:
        """The convolution's transpose in x: g [n, ho, wo, o] -> [n, h, w, c], (h, w) = `input_spatial`."""
        return self.op("conv_input_grad", [g, w], name, stride=list(stride), padding=[list(p) for p in padding],
                       input_spatial=list(input_spatial))

    def conv_kernel_grad(self, x: Value, g: Value, kernel_spatial: Sequence[int], stride: Sequence[int] = (1, 1),
                         padding: Sequence[Sequence[int]] = ((0, 0), (0, 0)), name: str | None = None) -> Value:
        """The convolution's transpose in w: x, g [n, ho, wo, o] -> [kh, kw, c, o], (kh, kw) = `kernel_spatial`."""
        return self.op("conv_kernel_grad", [x, g], name, stride=list(stride), padding=[list(p) for p in padding],
                       kernel_spatial=list(kernel_spatial))

    # --------------------------------------------------------- reductions

    def _dims(self, x: Value, dims: int | Sequence[int]) -> list[int]:
        dims = [dims] if isinstance(dims, int) else list(dims)
        return sorted(d % x.type.rank for d in dims)

    def reduce(self, x: Value, dims: int | Sequence[int], combiner: str = "sum", keepdims: bool = False,
               name: str | None = None) -> Value:
        dims = self._dims(x, dims)
        y = self.op("reduce", [x], None if keepdims else name, dims=dims, combiner=combiner)
        if keepdims:
            kept = [d for d in range(x.type.rank) if d not in dims]
            shape = [1 if d in dims else s for d, s in enumerate(x.type.shape)]
            return self.broadcast_in_dim(y, shape, kept, name)
        return y

    def sum(self, x: Value, dims: int | Sequence[int], keepdims: bool = False, name: str | None = None) -> Value:
        return self.reduce(x, dims, "sum", keepdims, name)

    def max(self, x: Value, dims: int | Sequence[int], keepdims: bool = False, name: str | None = None) -> Value:
        return self.reduce(x, dims, "max", keepdims, name)

    def mean(self, x: Value, dims: int | Sequence[int], keepdims: bool = False, name: str | None = None) -> Value:
        dims = self._dims(x, dims)
        total = self.sum(x, dims, keepdims)
        return self.mul(total, 1.0 / math.prod(x.type.shape[d] for d in dims), name)

    # ------------------------------------------------------- composites

    def softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        """exp(x - max) / sum(exp(x - max)) along `axis` (numerically stable)."""
        shifted = self.sub(x, self._expand(self.max(x, axis), x, axis))
        e = self.exp(shifted)
        return self.div(e, self._expand(self.sum(e, axis), x, axis), name)

    def log_softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        shifted = self.sub(x, self._expand(self.max(x, axis), x, axis))
        lse = self.log(self.sum(self.exp(shifted), axis))
        return self.sub(shifted, self._expand(lse, x, axis), name)

    def layer_norm(self, x: Value, gamma: Value | None = None, beta: Value | None = None, eps: float = 1e-5,
                   name: str | None = None) -> Value:
        """Normalize over the last dim: (x - mean) / sqrt(var + eps) * gamma + beta."""
        centered = self.sub(x, self._expand(self.mean(x, -1), x, -1))
        var = self.mean(self.mul(centered, centered), -1)
        return self._scale(centered, self.rsqrt(self.add(var, eps)), gamma, beta, name)

    def rms_norm(self, x: Value, gamma: Value | None = None, eps: float = 1e-6, name: str | None = None) -> Value:
        """x / sqrt(mean(x**2) + eps) * gamma over the last dim."""
        ms = self.mean(self.mul(x, x), -1)
        return self._scale(x, self.rsqrt(self.add(ms, eps)), gamma, None, name)

    def _scale(self, x: Value, inv: Value, gamma: Value | None, beta: Value | None, name: str | None) -> Value:
        """x * inv (broadcast over the last dim) * gamma + beta; `name` goes to the last op."""
        steps = [("mul", gamma), ("add", beta)]
        last = max([0] + [i + 1 for i, (_, v) in enumerate(steps) if v is not None])
        y = self.mul(x, self._expand(inv, x, -1), name if last == 0 else None)
        for i, (kind, v) in enumerate(steps):
            if v is not None:
                y = self._binary(kind, y, v, name if last == i + 1 else None)
        return y

    def _expand(self, reduced: Value, like: Value, axis: int) -> Value:
        """Broadcast a tensor reduced over `axis` back to the shape of `like`."""
        axis %= like.type.rank
        kept = [d for d in range(like.type.rank) if d != axis]
        return self.broadcast_in_dim(reduced, like.type.shape, kept)
