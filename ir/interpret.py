"""Executors: the numpy reference executor and the SPMD executor on a
simulated mesh, both one walk over the ops (`walk`) with different semantics.

`run(fn, inputs)` executes a global program. `run_spmd(fn, inputs)` executes
a device-local program (one with a mesh) on every device of that mesh: one
numpy array per device and value; ordinary ops run per device, collectives
run across devices through their `spmd_impl`, literally.

`shard` and `unshard` move between a global array and per-device blocks for
a dim-to-axes sharding, which is how tests compare a partitioned program
with the unpartitioned one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ir import ops
from ir.core import FLOAT_DTYPES, NUMPY_DTYPES, Function, IRError, Mesh, Op, TensorType, Value

T = TypeVar("T")

# One tuple of mesh axes per tensor dimension, major to minor: ((), ("model",))
# shards dim 1 over the model axis and replicates dim 0.
DimAxes = Sequence[Sequence[str]]


class InterpretError(IRError):
    """Bad inputs to an executor, or an op kind's semantics broke its shape rule."""


def walk(fn: Function, env: dict[Value, T], apply: Callable[[Op, list[T]], Sequence[T]]) -> dict[Value, T]:
    """Evaluate `fn` over an abstract domain: `apply` maps an op and its operand
    values to its result values. `env` holds the parameters' values."""
    for op in fn.ops:
        results = apply(op, [env[v] for v in op.operands])
        for value, result in zip(op.results, results):
            env[value] = result
    return env


def numpy_dtype(dtype: str, float_dtype: Any = None) -> Any:
    """The numpy dtype an IR dtype executes in; `float_dtype` overrides floats
    (e.g. float64 for finite-difference checks)."""
    if float_dtype is not None and dtype in FLOAT_DTYPES:
        return float_dtype
    return NUMPY_DTYPES[dtype]


def _conform(array: np.ndarray, ty: TensorType, float_dtype: Any, what: str) -> np.ndarray:
    if array.shape != ty.shape:
        raise InterpretError(f"{what}: expected shape {list(ty.shape)} ({ty}), got {list(array.shape)}")
    return np.asarray(array, dtype=numpy_dtype(ty.dtype, float_dtype))


def _bind(fn: Function, inputs: Mapping[str, Any] | Sequence[Any], convert: Callable[[Value, Any], Any]) -> dict:
    if isinstance(inputs, Mapping):
        missing = [p.name for p in fn.params if p.name not in inputs]
        extra = sorted(set(inputs) - {p.name for p in fn.params})
        if missing or extra:
            problems = [f"{what} inputs {names}" for what, names in (("missing", missing), ("unexpected", extra))
                        if names]
            raise InterpretError(f"@{fn.name}: {', '.join(problems)}; it takes {[p.name for p in fn.params]}")
        return {p: convert(p, inputs[p.name]) for p in fn.params}
    if len(inputs) != len(fn.params):
        raise InterpretError(f"@{fn.name} takes {len(fn.params)} inputs, got {len(inputs)}")
    return {p: convert(p, x) for p, x in zip(fn.params, inputs)}


def _apply_local(op: Op, args: list[np.ndarray], float_dtype: Any) -> list[np.ndarray]:
    opdef = ops.get(op.kind)
    if opdef.impl is None:
        raise InterpretError(f"{op.describe()} is a collective: run the program with run_spmd on its mesh")
    results = opdef.impl(args, op.attrs)
    what = f"semantics of {op.kind}"
    return [_conform(np.asarray(r), v.type, float_dtype, what) for r, v in zip(results, op.results)]


def run(fn: Function, inputs: Mapping[str, Any] | Sequence[Any], *, float_dtype: Any = None) -> list[np.ndarray]:
    """Execute a global program on numpy arrays; returns the results in order."""
    env = _bind(fn, inputs, lambda p, x: _conform(np.asarray(x), p.type, float_dtype, f"input %{p.name}"))
    env = walk(fn, env, lambda op, args: _apply_local(op, args, float_dtype))
    return [env[r] for r in fn.results]


def run_spmd(
    fn: Function, inputs: Mapping[str, Sequence[Any]] | Sequence[Sequence[Any]], *, float_dtype: Any = None
) -> list[list[np.ndarray]]:
    """Execute a device-local program on its simulated mesh.

    Each input is a list with one array per device (device ids row-major over
    `fn.mesh`); each result comes back the same way.
    """
    if not fn.mesh:
        raise InterpretError(f"@{fn.name} has no mesh; use run() for global programs")
    n = fn.mesh.num_devices

    def convert(p: Value, per_device: Any) -> list[np.ndarray]:
        if len(per_device) != n:
            raise InterpretError(f"input %{p.name}: expected {n} per-device arrays, got {len(per_device)}")
        return [_conform(np.asarray(x), p.type, float_dtype, f"input %{p.name} on device {d}")
                for d, x in enumerate(per_device)]

    def apply(op: Op, args: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        opdef = ops.get(op.kind)
        if opdef.spmd_impl is None:
            per_device = [_apply_local(op, [a[d] for a in args], float_dtype) for d in range(n)]
        else:
            raw = opdef.spmd_impl([tuple(a[d] for a in args) for d in range(n)], op.attrs, fn.mesh)
            per_device = [[_conform(np.asarray(r), v.type, float_dtype, f"semantics of {op.kind}")
                           for r, v in zip(res, op.results)] for res in raw]
        return [[per_device[d][i] for d in range(n)] for i in range(len(op.results))]

    env = walk(fn, _bind(fn, inputs, convert), apply)
    return [env[r] for r in fn.results]


# ----------------------------------------------------------- global <-> local


def _block_index(mesh: Mesh, coord: tuple[int, ...], axes: Sequence[str]) -> tuple[int, int]:
    """(index of this device's block, number of blocks) along one sharded dim."""
    index, count = 0, 1
    for a in axes:
        i = mesh.axis_index(a)
        index, count = index * mesh.axes[i][1] + coord[i], count * mesh.axes[i][1]
    return index, count


def _check_dim_axes(shape: tuple[int, ...], dim_axes: DimAxes, mesh: Mesh) -> None:
    if len(dim_axes) != len(shape):
        raise InterpretError(f"sharding {list(map(list, dim_axes))} needs one entry per dim of shape {list(shape)}")
    used = [a for axes in dim_axes for a in axes]
    if len(set(used)) != len(used):
        raise InterpretError(f"sharding {list(map(list, dim_axes))} uses a mesh axis twice")
    for size, axes in zip(shape, dim_axes):
        if size % mesh.group_size(tuple(axes)):
            raise InterpretError(f"dim of size {size} is not divisible by the devices of axes {list(axes)}")


def shard(array: np.ndarray, dim_axes: DimAxes, mesh: Mesh) -> list[np.ndarray]:
    """Split a global array into per-device blocks (row-major device ids)."""
    array = np.asarray(array)
    _check_dim_axes(array.shape, dim_axes, mesh)
    out = []
    for coord in mesh.device_coords():
        index = []
        for size, axes in zip(array.shape, dim_axes):
            block, count = _block_index(mesh, coord, axes)
            step = size // count
            index.append(slice(block * step, (block + 1) * step))
        out.append(array[tuple(index)].copy())
    return out


def unshard(blocks: Sequence[np.ndarray], dim_axes: DimAxes, mesh: Mesh,
            *, rtol: float = 1e-5, atol: float = 1e-6) -> np.ndarray:
    """Assemble per-device blocks into the global array.

    Devices holding the same block (replicas along unused axes) must agree to
    the given tolerance; a disagreement means the program is wrong and raises.
    """
    local_shape = np.asarray(blocks[0]).shape
    counts = [mesh.group_size(tuple(axes)) for axes in dim_axes]
    global_shape = tuple(s * c for s, c in zip(local_shape, counts))
    _check_dim_axes(global_shape, dim_axes, mesh)
    out = np.empty(global_shape, np.asarray(blocks[0]).dtype)
    seen: dict[tuple[int, ...], int] = {}
    for device, (coord, block) in enumerate(zip(mesh.device_coords(), blocks)):
        ids = tuple(_block_index(mesh, coord, axes)[0] for axes in dim_axes)
        index = tuple(slice(i * s, (i + 1) * s) for i, s in zip(ids, local_shape))
        if ids in seen:
            if not np.allclose(out[index], block, rtol=rtol, atol=atol, equal_nan=True):
                worst = float(np.max(np.abs(out[index].astype(np.float64) - block)))
                raise InterpretError(f"replicas disagree: device {device} differs from device {seen[ids]} "
                                     f"by up to {worst:.3g} on block {ids}")
        else:
            seen[ids] = device
            out[index] = block
    return out


def random_inputs(fn: Function, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random values for every parameter: floats ~ N(0, 1), bools fair
    coin flips, integers valid as indices wherever they feed a gather."""
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(fn)
    out = {}
    for p in fn.params:
        ty = p.type
        if ty.dtype in FLOAT_DTYPES:
            out[p.name] = rng.standard_normal(ty.shape).astype(numpy_dtype(ty.dtype))
        elif ty.dtype == "bool":
            out[p.name] = rng.random(ty.shape) < 0.5
        else:
            out[p.name] = rng.integers(0, bounds.get(p, 10), ty.shape).astype(numpy_dtype(ty.dtype))
    return out


def _index_bounds(fn: Function) -> dict[Value, int]:
    """Integer parameters used as gather indices: the smallest table size they index."""
    bounds: dict[Value, int] = {}
    for op in fn.ops:
        if op.kind == "gather":
            table, idx = op.operands
            size = table.type.shape[op.attrs["axis"]]
            bounds[idx] = min(bounds.get(idx, size), size)
    return bounds
