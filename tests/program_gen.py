"""A seeded generator of random valid programs, for round-trip and executor tests.

Each step picks a recipe (an op family) and operands from the values built
so far, so programs mix every kind of op with realistic def-use chains.
With a mesh, it also emits collectives on values whose dims divide evenly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ir.builder import Builder
from ir.core import Function, Mesh, Value

SIZES = (2, 3, 4, 5, 6)
UNARY = ("neg", "exp", "tanh", "relu", "gelu", "logistic")


class _Gen:
    def __init__(self, seed: int, mesh: Mesh | None):
        self.rng = np.random.default_rng(seed)
        self.b = Builder(f"random{seed}", mesh)
        self.mesh = mesh
        self.floats: list[Value] = []
        self.params = 0

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def new_param(self, shape, dtype="f32") -> Value:
        self.params += 1
        v = self.b.param(f"p{self.params}", shape, dtype)
        if dtype == "f32":
            self.floats.append(v)
        return v

    def float_value(self, rank: int | None = None) -> Value:
        pool = [v for v in self.floats if v.type.rank == rank or (rank is None and v.type.rank >= 1)]
        if pool and self.rng.random() < 0.8:
            return self.pick(pool)
        rank = rank if rank is not None else int(self.rng.integers(1, 4))
        return self.new_param([self.pick(SIZES) for _ in range(rank)])

    def same_shape(self, x: Value) -> Value:
        pool = [v for v in self.floats if v.type.shape == x.type.shape and v is not x]
        return self.pick(pool) if pool and self.rng.random() < 0.6 else self.new_param(x.type.shape)

    def emit(self, v: Value) -> None:
        if v.type.dtype == "f32":
            self.floats.append(v)

    # recipes: each returns a new value
    def unary(self):
        return self.b.unary(self.pick(UNARY), self.float_value())

    def binary(self):
        x = self.float_value()
        return self.b.op(self.pick(("add", "sub", "mul", "max", "min")), [x, self.same_shape(x)])

    def matmul(self):
        x = self.float_value(2)
        w = self.new_param([x.type.shape[1], self.pick(SIZES)])
        return self.b.matmul(x, w)

    def batched_dot(self):
        x = self.float_value(3)
        w = self.new_param([x.type.shape[0], x.type.shape[2], self.pick(SIZES)])
        return self.b.dot_general(x, w, [[2], [1]], [[0], [0]])

    def reduce(self):
        x = self.float_value()
        dims = sorted(set(int(d) for d in self.rng.integers(0, x.type.rank, 2)))
        return self.b.reduce(x, dims, self.pick(("sum", "max", "min")))

    def transpose(self):
        x = self.float_value()
        return self.b.transpose(x, [int(d) for d in self.rng.permutation(x.type.rank)])

    def reshape(self):
        x = self.float_value()
        shape = list(x.type.shape)
        if len(shape) >= 2 and self.rng.random() < 0.5:
            i = int(self.rng.integers(len(shape) - 1))
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        else:
            i = int(self.rng.integers(len(shape)))
            divisors = [d for d in range(2, shape[i]) if shape[i] % d == 0]
            if divisors:
                d = self.pick(divisors)
                shape[i:i + 1] = [d, shape[i] // d]
            else:
                shape.insert(i, 1)
        return self.b.reshape(x, shape)

    def broadcast(self):
        x = self.float_value()
        shape = [self.pick(SIZES)] + list(x.type.shape)
        return self.b.broadcast_in_dim(x, shape, range(1, len(shape)))

    def slice(self):
        x = self.float_value()
        start = [int(self.rng.integers(s)) for s in x.type.shape]
        limit = [int(self.rng.integers(a + 1, s + 1)) for a, s in zip(start, x.type.shape)]
        return self.b.slice(x, start, limit, [int(self.rng.integers(1, 3)) for _ in start])

    def concatenate(self):
        x = self.float_value()
        return self.b.concatenate([x, self.same_shape(x), x], int(self.rng.integers(x.type.rank)))

    def select(self):
        x = self.float_value()
        y = self.same_shape(x)
        pred = self.b.compare(x, y, self.pick(("lt", "le", "gt", "ge", "eq", "ne")))
        return self.b.select(pred, x, y)

    def gather(self):
        table = self.float_value(2)
        idx = self.new_param([self.pick(SIZES)], "i32")
        return self.b.gather(table, idx, int(self.rng.integers(2)))

    def generators(self):
        shape = [self.pick(SIZES) for _ in range(2)]
        choice = self.pick(("iota", "full", "constant"))
        if choice == "iota":
            return self.b.convert(self.b.iota(shape, int(self.rng.integers(2))), "f32")
        if choice == "full":
            return self.b.full(shape, float(self.rng.normal()))
        return self.b.constant(self.rng.normal(size=shape).round(3))

    def collective(self):
        x = self.float_value()
        axes = tuple(self.rng.permutation(list(self.mesh.names))[: int(self.rng.integers(1, 3))])
        k = self.mesh.group_size(axes)
        kind = self.pick(("all_reduce", "all_gather", "all_slice", "reduce_scatter", "all_to_all"))
        divisible = [d for d in range(x.type.rank) if x.type.shape[d] % k == 0]
        if kind == "all_reduce" or (kind != "all_gather" and not divisible):
            return self.b.op("all_reduce", [x], axes=list(axes))
        if kind == "all_gather":
            return self.b.op(kind, [x], axes=list(axes), dim=int(self.rng.integers(x.type.rank)))
        if kind == "all_to_all" and x.type.rank > 1:
            dst = self.pick(divisible)
            src = self.pick([d for d in range(x.type.rank) if d != dst])
            return self.b.op(kind, [x], axes=list(axes), src_dim=src, dst_dim=dst)
        return self.b.op("reduce_scatter" if kind == "reduce_scatter" else "all_slice", [x], axes=list(axes),
                         dim=self.pick(divisible))


def random_program(seed: int, num_ops: int = 12, mesh: Mesh | None = None) -> Function:
    """A valid random program of about `num_ops` recipe steps."""
    g = _Gen(seed, mesh)
    recipes: list[Callable[[], Value]] = [
        g.unary, g.binary, g.matmul, g.batched_dot, g.reduce, g.transpose, g.reshape, g.broadcast,
        g.slice, g.concatenate, g.select, g.gather, g.generators,
    ]
    if mesh:
        recipes += [g.collective] * 3
    made: list[Value] = []
    for _ in range(num_ops):
        v = g.pick(recipes)()
        g.emit(v)
        made.append(v)
    outputs = list(dict.fromkeys(made[-3:]))
    return g.b.build(outputs)
