"""The graph network simulator (ir/models/gns.py): its forward loss against a
numpy implementation written here, and its Adam training step lowered under
edge sharding (ES, PartIR's GNS strategy) and ES plus sharding of the latent
dim, executed on a {batch: 2, model: 2} mesh against the global program.

Collective counts are formulas in the number of processor steps S and MLP
layers L, derived in the comments from the model's structure and checked at
S = 1, 2, 3 (so each is affine in S).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_collective_counts import counts_by_axes
from test_lower import MESH, Checked, check_lowering, plan

from ir.autodiff import training_step
from ir.core import Function, producers
from ir.interpret import random_inputs, run
from ir.models import Model, build
from ir.text import parse, print_function

STEPS = (1, 2, 3)
# Distinct sizes, so a swapped dimension shows; 7 edges into 5 nodes means
# some node receives several messages (the segment sum adds them).
SMALL = dict(nodes=5, edges=7, node_features=3, edge_features=2, latent=4, hidden=6, out_features=2)
# The lowering needs the edges (and latent) to divide by the mesh axes' size 2.
EVEN = dict(SMALL, edges=8)
# The edges' dim 0 (one color: the edge MLPs and gathered node features share it).
ES = [("graph.edges", 0, "batch"), ("graph.senders", 0, "batch"), ("graph.receivers", 0, "batch")]
# The latent dim of the node states v and of the edge states e (two colors).
LATENT = [("encoder.node.1.w", 1, "model"), ("encoder.edge.1.w", 1, "model")]


# ----------------------------------------------------------------- forward


def relu(x):
    return np.maximum(x, 0)


def np_mlp(p, parts, prefix, layers):
    """Layer 0 is the sum of each input times its own weight, relu between layers."""
    h = sum(x @ p[f"{prefix}.0.{suffix}"] for x, suffix in parts)
    for layer in range(1, layers):
        h = relu(h) @ p[f"{prefix}.{layer}.w"]
    return h


def np_gns(p, steps, layers):
    """The loss, with explicit fancy indexing and np.add.at for the segment sum."""
    v = np_mlp(p, [(p["graph.nodes"], "w")], "encoder.node", layers)
    e = np_mlp(p, [(p["graph.edges"], "w")], "encoder.edge", layers)
    senders, receivers = p["graph.senders"], p["graph.receivers"]
    for s in range(steps):
        parts = [(e, "w_edge"), (v[senders], "w_sender"), (v[receivers], "w_receiver")]
        e = e + np_mlp(p, parts, f"process.{s}.edge", layers)
        agg = np.zeros_like(v)
        np.add.at(agg, receivers, e)
        v = v + np_mlp(p, [(v, "w_node"), (agg, "w_agg")], f"process.{s}.node", layers)
    y = np_mlp(p, [(v, "w")], "decoder", layers)
    return np.mean((y - p["graph.target"]) ** 2)


@pytest.mark.parametrize("layers", [1, 3])
def test_forward_matches_numpy(layers):
    model = build("gns", steps=2, mlp_layers=layers, **SMALL)
    inputs = {k: x.astype(np.float64) if x.dtype.kind == "f" else x
              for k, x in random_inputs(model.function, seed=1).items()}
    assert len(set(inputs["graph.receivers"].tolist())) < SMALL["edges"]  # a node with several messages
    (loss,) = run(model.function, inputs, float_dtype=np.float64)
    np.testing.assert_allclose(loss, np_gns(inputs, 2, layers), rtol=1e-12)


def test_parameters_inputs_and_shapes():
    model = build("gns", steps=1, mlp_layers=2, **SMALL)
    shapes = {p.name: p.type.shape for p in model.function.params}
    n, e, f_n, f_e, lat, hid, out = (SMALL[k] for k in ("nodes", "edges", "node_features", "edge_features",
                                                         "latent", "hidden", "out_features"))
    assert list(shapes.items()) == [
        ("graph.nodes", (n, f_n)), ("graph.edges", (e, f_e)), ("graph.senders", (e,)), ("graph.receivers", (e,)),
        ("graph.target", (n, out)),
        ("encoder.node.0.w", (f_n, hid)), ("encoder.node.1.w", (hid, lat)),
        ("encoder.edge.0.w", (f_e, hid)), ("encoder.edge.1.w", (hid, lat)),
        ("process.0.edge.0.w_edge", (lat, hid)), ("process.0.edge.0.w_sender", (lat, hid)),
        ("process.0.edge.0.w_receiver", (lat, hid)), ("process.0.edge.1.w", (hid, lat)),
        ("process.0.node.0.w_node", (lat, hid)), ("process.0.node.0.w_agg", (lat, hid)),
        ("process.0.node.1.w", (hid, lat)),
        ("decoder.0.w", (lat, hid)), ("decoder.1.w", (hid, out)),
    ]
    assert model.function.param("graph.senders").type.dtype == "i32"
    assert model.inputs == ("graph.nodes", "graph.edges", "graph.senders", "graph.receivers", "graph.target")
    assert model.params == tuple(shapes)[5:] and model.state == ()
    assert model.function.results[0].type.shape == ()
    assert parse(print_function(model.function)) == model.function


# ------------------------------------------------------------ edge sharding


def edge_weights(steps: int, layers: int) -> set[str]:
    """The weights applied to edge-indexed activations: the edge encoder's and
    each step's edge MLP (layer 0's three weights, then layers 1..L-1)."""
    names = {f"encoder.edge.{i}.w" for i in range(layers)}
    for s in range(steps):
        names |= {f"process.{s}.edge.0.{w}" for w in ("w_edge", "w_sender", "w_receiver")}
        names |= {f"process.{s}.edge.{i}.w" for i in range(1, layers)}
    return names


def reduced_gradients(fn: Function, model: Model) -> set[str]:
    """The parameters whose gradient reaches Adam through an all_reduce: the
    first moment's update `opt.m.<p>.new = m * b1 + g * (1 - b1)` is the
    gradient's first use, where a partial sum is reduced."""
    made_by = producers(fn)
    out = set()
    for op in fn.ops:
        name = op.result.name
        if name.startswith("opt.m.") and name.endswith(".new"):
            g = made_by[op.operands[1]].operands[0]
            if made_by[g].kind == "all_reduce":
                out.add(name.removeprefix("opt.m.").removesuffix(".new"))
    assert out <= set(model.params)
    return out


def param_dims(checked: Checked) -> dict[str, tuple]:
    """How each parameter of the global program is sharded (mesh axes per dim)."""
    return {p.name: dims for p, dims in zip(checked.nda.function.params, checked.lowered.param_dims)}


def reduced_kinds(checked: Checked) -> Counter:
    """What produced each all_reduced value (in the device-local program)."""
    fn = checked.function
    made_by = producers(fn)
    return Counter(made_by[op.operands[0]].kind for op in fn.ops if op.kind == "all_reduce")


@pytest.mark.parametrize("steps", STEPS)
def test_edge_sharded_forward_all_reduces_each_segment_sum(steps):
    # Edge MLPs and gathers of (replicated) node states are local to an edge
    # shard; the segment sum leaves each node's messages partial over the
    # edge shards: one all_reduce per step. Node MLPs, the decoder and the
    # loss are over nodes, replicated: the loss needs no all_reduce.
    checked = check_lowering(build("gns", steps=steps, **EVEN), MESH, plan(ES))
    assert param_dims(checked)["graph.edges"] == (("batch",), ())
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): steps})
    assert reduced_kinds(checked) == Counter(scatter_add=steps)


def edge_sharded_step(steps: int, layers: int) -> Checked:
    """The Adam step under ES, with its all_reduces checked as derived:

    per processor step (3 segment sums, L + 2 edge-MLP gradients)
      forward   the segment sum agg                                          1
      backward  gather's VJP is a scatter_add over the edge shards, so the
                cotangent of v[senders] and of v[receivers] each reaches v
                partial (added to v's replicated cotangent, it is reduced)   2
                gradients of w_edge, w_sender, w_receiver and edge layers
                1..L-1: a contraction over the sharded edges               L + 2
    encoder     the edge MLP's L gradients, contracted over edges           L
    Node weights see only replicated node activations and cotangents (the
    backward's segment-sum cotangents are reduced before the node MLPs use
    them), and the loss is over nodes: nothing else is reduced.
    Total: S (L + 5) + L over `batch`.
    """
    model = training_step(build("gns", steps=steps, mlp_layers=layers, **EVEN))
    checked = check_lowering(model, MESH, plan(ES))
    assert param_dims(checked)["graph.receivers"] == (("batch",),)
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): steps * (layers + 5) + layers})
    assert reduced_kinds(checked) == Counter(scatter_add=3 * steps, dot_general=steps * (layers + 2) + layers)
    assert reduced_gradients(checked.function, model) == edge_weights(steps, layers)
    return checked


@pytest.mark.parametrize("steps", STEPS)
def test_edge_sharded_training_step(steps):
    edge_sharded_step(steps, layers=2)  # 7 S + 2


@pytest.mark.parametrize("layers", [1, 3])
def test_edge_sharded_training_step_with_other_mlp_depths(layers):
    edge_sharded_step(2, layers)


# ------------------------------------------------- edge and latent sharding


@pytest.mark.parametrize("steps", STEPS)
def test_edge_and_latent_sharded_training_step(steps):
    """ES on `batch`, the latent dims of v and e on `model` (L = 2).

    `model`: each MLP whose input is latent (every processor MLP, the
    decoder) contracts it in layer 0, a partial sum the relu needs reduced:
    2 per step + 1 forward. Backward, the cotangent of such an MLP's hidden
    activation comes from its last layer contracting the latent: reduced at
    relu's VJP (a select), once per processor MLP (2 per step) and once per
    encoder MLP (2); the decoder's last layer outputs out_features, not
    latent. Everything that contracted the latent was reduced, so the node
    and edge states stay sharded on it with no other collective.
    `batch`: as under ES alone (7 S + 2), now of latent-sharded values.
    """
    forward = build("gns", steps=steps, mlp_layers=2, **EVEN)
    checked = check_lowering(forward, MESH, plan(ES, LATENT))
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): steps,
                                               ("all_reduce", ("model",)): 2 * steps + 1})
    model = training_step(forward)
    checked = check_lowering(model, MESH, plan(ES, LATENT))
    assert counts_by_axes(checked) == Counter({("all_reduce", ("batch",)): 7 * steps + 2,
                                               ("all_reduce", ("model",)): 4 * steps + 3})
    dims = param_dims(checked)
    assert dims["graph.edges"] == (("batch",), ())
    for s in range(steps):  # the latent dim of every processor weight is on `model`
        for w in ("edge.0.w_edge", "edge.0.w_sender", "node.0.w_node", "node.0.w_agg"):
            assert dims[f"process.{s}.{w}"] == (("model",), ()), (s, w)
        assert dims[f"process.{s}.edge.1.w"] == dims[f"process.{s}.node.1.w"] == ((), ("model",))
    assert dims["decoder.0.w"] == (("model",), ()) and dims["decoder.1.w"] == ((), ())
