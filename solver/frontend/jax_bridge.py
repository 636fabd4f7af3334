"""The JAX user's entry point: plan a jax function, and run it under XLA
with exactly the shardings shardplan chose. The one module that imports
jax (an optional extra: `pip install shardplan[jax]`).

    mesh = auto_mesh((4, 2), ("batch", "model"))
    plan = plan_jax(train_step, (params, opt_state, batch), mesh=mesh, hardware="H100-SXM",
                    state=["1.*"])                   # the batch (argument 2) is found by its leading dim
    print(plan.summary())
    new_params, new_opt_state, loss = plan.function(params, opt_state, batch)

`plan_jax` lowers the function (`jax.jit(f).lower(*args).as_text()`),
writes that text and a spec beside it into `workdir` (a temporary folder by
default), so the same plan can be re-run from the command line (`shardplan
plan WORKDIR/step.yaml`), plans it, writes the plan back into the module as
Shardy annotations (`solver.frontend.annotate`) and compiles that module. Argument
names are the pytree paths of `args` (`0.layers.3.wq`, `2.tokens`).

`compile_annotated` compiles any annotated module for a mesh: the tools
that compare XLA's collectives with the plan use it on the fixtures.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import yaml
from jax._src.lib.mlir import ir as mlir_ir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solver.frontend.annotate import annotate_planned
from solver.frontend.hlo_collectives import xla_collectives  # noqa: F401 - the bridge's API
from solver.planning.planner import Planned, SearchOverrides, plan_spec
from solver.planning.spec import load_spec


def auto_mesh(shape: Sequence[int], axes: Sequence[str]) -> jax.sharding.Mesh:
    """A mesh whose axes XLA may shard along freely (`AxisType.Auto`), which
    sharding annotations need (jax's default axes are Explicit)."""
    return jax.make_mesh(tuple(shape), tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def partition_spec(dims: Sequence[Sequence[str]]) -> P:
    return P(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in dims])


def compile_annotated(text: str, mesh: jax.sharding.Mesh, args: Any, out_shapes: Any,
                      in_dims: Sequence[Sequence[Sequence[str]]],
                      out_dims: Sequence[Sequence[Sequence[str]]],
                      compiler_options: Mapping[str, Any] | None = None) -> jax.stages.Compiled:
    """Compile an annotated module (`solver.frontend.annotate`) whose @main takes the
    leaves of `args` and returns the leaves of `out_shapes` (pytrees of
    arrays or ShapeDtypeStructs), sharded per dimension as `in_dims` and
    `out_dims` say. The result is called like a jitted function of `args`.
    `compiler_options`: XLA debug options for this compilation only (e.g.
    `{"xla_dump_to": folder}`, which `hlo_shardings` reads).

    jax has no public way to compile a module text, so a stand-in function
    with the same signature and shardings is lowered, and its module is
    replaced by ours before compilation (its calling convention, shardings
    and pytrees stay jax's own)."""
    in_leaves, in_tree = jax.tree.flatten(tuple(args))
    out_leaves, out_tree = jax.tree.flatten(out_shapes)
    in_shardings = in_tree.unflatten([NamedSharding(mesh, partition_spec(d)) for d in in_dims])
    out_shardings = out_tree.unflatten([NamedSharding(mesh, partition_spec(d)) for d in out_dims])

    def stand_in(*_: Any) -> Any:
        return out_tree.unflatten([jnp.zeros(s.shape, s.dtype) for s in out_leaves])

    shapes = in_tree.unflatten([jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in in_leaves])
    lowered = jax.jit(stand_in, in_shardings=in_shardings, out_shardings=out_shardings,
                      keep_unused=True).lower(*shapes)
    with lowered._lowering._hlo.context:  # noqa: SLF001 - see the docstring
        lowered._lowering._hlo = mlir_ir.Module.parse(text)  # noqa: SLF001
    return lowered.compile(dict(compiler_options or {}))


@dataclasses.dataclass
class JaxPlan:
    """What `plan_jax` returns: the plan, its annotated module, and the
    shardings and compiled function to run it with."""

    planned: Planned
    annotated: str  # the StableHLO module with the plan as Shardy annotations
    mesh: jax.sharding.Mesh
    in_shardings: Any  # pytree like the arguments, of NamedSharding
    out_shardings: Any  # pytree like the results
    function: Callable[..., Any]  # the compiled annotated module, called like the jitted function
    workdir: pathlib.Path

    def summary(self) -> str:
        from solver.planning.plan_json import plan_report
        from solver.planning.plan_text import format_cost
        from solver.planning.planner import collective_counts

        report = plan_report(self.planned, "")
        counts = ", ".join(f"{k} {v}" for k, v in collective_counts(self.planned.lowered).items() if v)
        return "\n".join([f"plan of {self.workdir / 'step.mlir'}: collectives {counts or 'none'}",
                          *format_cost(report["cost"])])


def path_name(path: Any) -> str:
    """`0.layers.3.wq` from a pytree key path (keys, indices, attribute names)."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return re.sub(r"[^\w.\-]", "_", ".".join(parts)) or "arg"


def plan_jax(fn: Callable[..., Any], args: Sequence[Any], *, mesh: jax.sharding.Mesh,
             hardware: str | Mapping[str, Any] = "H100-SXM", memory: str | int | None = None,
             solver: str = "cpsat", inputs: Sequence[str] | None = None, state: Sequence[str] = (),
             tactics: Sequence[Mapping[str, Any]] | None = None, time_limit_s: float | None = None,
             seed: int = 0, workdir: str | pathlib.Path | None = None) -> JaxPlan:
    """Plan `fn(*args)` on `mesh` and compile it with the plan (see the
    module docstring).

    - `hardware`: a preset name, or the spec's `hardware:` mapping (links
      per axis, inline figures, achievable fractions); `memory` overrides
      the device memory (`"40GiB"`, or bytes).
    - `inputs` and `state`: globs over the argument names (pytree paths,
      `2.tokens`) that mark the batch inputs and the optimizer or model
      state; the rest are trainable parameters. `inputs` defaults to the
      batch found in `args` (`batch_inputs`).
    - `tactics`: the schedule, as a spec writes it (`[{"manual": {...}},
      {"remat": {...}}]`); by default batch parallelism over the mesh's
      first axis on the inputs. `solver` `cpsat` or `mcts` searches from
      it (it is the floor the search must beat), `none` runs it as is.
    - `time_limit_s` and `seed`: the search's budget (None: the solver's
      default, `solver.search.default_time_limit_s`) and seed.
    """
    args = tuple(args)
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [path_name(path) for path, _ in leaves]
    if inputs is None:
        inputs = batch_inputs(args)
    text = jax.jit(fn, keep_unused=True).lower(*args).as_text()
    folder = pathlib.Path(workdir) if workdir is not None else pathlib.Path(tempfile.mkdtemp(prefix="shardplan-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step.mlir").write_text(text)
    (folder / "step.yaml").write_text(spec_text(names, mesh, hardware, memory, inputs, state, tactics))
    spec = load_spec(folder / "step.yaml")
    planned = plan_spec(spec, solver=solver, overrides=SearchOverrides(time_limit_s=time_limit_s, seed=seed))
    annotated = annotate_planned(planned)
    (folder / "step.annotated.mlir").write_text(annotated)
    out_shapes = jax.eval_shape(fn, *args)
    compiled = compile_annotated(annotated, mesh, args, out_shapes, planned.lowered.param_dims,
                                 planned.lowered.result_dims)
    in_tree, out_tree = jax.tree.structure(args), jax.tree.structure(out_shapes)
    in_shardings = in_tree.unflatten([NamedSharding(mesh, partition_spec(d)) for d in planned.lowered.param_dims])
    out_shardings = out_tree.unflatten([NamedSharding(mesh, partition_spec(d))
                                        for d in planned.lowered.result_dims])
    return JaxPlan(planned, annotated, mesh, in_shardings, out_shardings, compiled, folder)


def batch_inputs(args: Sequence[Any]) -> list[str]:
    """The globs of the batch inputs among `args` (by their pytree paths):
    whatever sits under a key or attribute named `batch`; else the one
    top-level argument whose arrays all share their leading dimension
    (parameters and optimizer state rarely do). None or several such is a
    ValueError that names them and asks for `inputs=`."""
    leaves = jax.tree_util.tree_flatten_with_path(tuple(args))[0]
    named = []
    for path, _ in leaves:
        parts = path_name(path).split(".")
        if "batch" in parts[1:]:
            glob = ".".join(parts[:parts.index("batch", 1) + 1])
            named.append(glob if glob == path_name(path) else glob + ".*")
    if named:
        return list(dict.fromkeys(named))
    leading: dict[int, set[int | None]] = {}
    for path, leaf in leaves:
        shape = getattr(leaf, "shape", ())
        leading.setdefault(int(path_name(path[:1])), set()).add(shape[0] if shape else None)
    batches = [i for i, sizes in sorted(leading.items()) if len(sizes) == 1 and None not in sizes]
    if len(batches) != 1:
        shown = "; ".join(f"argument {i}: leading dimensions {sorted(map(str, sizes))}"
                          for i, sizes in sorted(leading.items()))
        found = ("none of them" if not batches else
                 "arguments " + ", ".join(map(str, batches)) + " all")
        raise ValueError(f"plan_jax: cannot tell which argument is the batch ({shown}): {found} "
                         "have one leading dimension shared by all their arrays; pass inputs=[...] (globs over "
                         "the argument names, e.g. inputs=['2.*']), or name the batch `batch`")
    (i,) = batches
    is_leaf = all(len(path) == 1 for path, _ in leaves if int(path_name(path[:1])) == i)
    return [str(i)] if is_leaf else [f"{i}.*"]


def spec_text(names: list[str], mesh: jax.sharding.Mesh, hardware: str | Mapping[str, Any],
              memory: str | int | None, inputs: Sequence[str], state: Sequence[str],
              tactics: Sequence[Mapping[str, Any]] | None) -> str:
    """The spec `plan_jax` writes beside the module (`shardplan plan` runs it again)."""
    axes = dict(zip(mesh.axis_names, (int(n) for n in mesh.devices.shape)))
    if memory is not None:
        memory = f"{memory}B" if isinstance(memory, int) else memory
        hardware = {"preset": hardware, "memory": memory} if isinstance(hardware, str) else {**hardware,
                                                                                          "memory": memory}
    if tactics is None:
        tactics = [{"manual": {"axis": mesh.axis_names[0], "values": {inputs[0]: 0}}}] if inputs else []
    data: dict[str, Any] = {
        "description": "a jax function planned by plan_jax",
        "model": {"stablehlo": "step.mlir", "param_names": list(names), "inputs": list(inputs),
                  "state": list(state)},
        "mesh": axes,
        "hardware": hardware if isinstance(hardware, str) else dict(hardware),
        "schedule": [dict(t) for t in tactics],
    }
    return "# Written by shardplan's plan_jax.\n" + yaml.safe_dump(data, sort_keys=False)
