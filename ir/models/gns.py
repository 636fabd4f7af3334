"""A Graph Network Simulator (Sanchez-Gonzalez et al. 2020, "Learning to
simulate complex physics with graph networks", as evaluated by PartIR): an
encode-process-decode graph network with an MSE loss on per-node targets.

Function @gns(graph.nodes [nodes, node_features], graph.edges [edges,
edge_features], graph.senders [edges] i32, graph.receivers [edges] i32,
graph.target [nodes, out_features], weights) -> (loss,)

  encoder    v = MLP(nodes) [nodes, latent], e = MLP(edges) [edges, latent]
  processor  `steps` message-passing steps, each with residual updates:
             e' = e + MLP_e(e A + v[senders] B + v[receivers] C)
             agg = segment sum of e' over receivers (scatter_add)
             v' = v + MLP_v(v D + agg E)
  decoder    y = MLP(v) [nodes, out_features]; loss = mean((y - target)**2)

Every MLP has `mlp_layers` matmuls, `hidden` wide inside, relu between (none
after the last). Weights only: no biases, and no layer norm (the paper has
it after each MLP but the decoder's; it adds no new sharding question).

Parameters, in order (`{i}` an MLP layer, `{s}` a processor step):
  encoder.node.{i}.w, encoder.edge.{i}.w
  process.{s}.edge.0.w_edge, .w_sender, .w_receiver [latent, hidden] (A, B, C)
  process.{s}.edge.{i}.w for i >= 1
  process.{s}.node.0.w_node, .w_agg [latent, hidden] (D, E)
  process.{s}.node.{i}.w for i >= 1
  decoder.{i}.w
Layer 0 of an MLP maps its input width to `hidden` (to its output width when
mlp_layers == 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ir.builder import Builder
from ir.core import Value
from ir.models.base import Model
from ir.models.losses import mean_squared_error

GRAPH_INPUTS = ("graph.nodes", "graph.edges", "graph.senders", "graph.receivers", "graph.target")


@dataclass(frozen=True, slots=True)
class _Mlp:
    """The shape every MLP of the network shares."""

    hidden: int
    layers: int
    dtype: str

    def width(self, layer: int, out: int) -> int:
        return out if layer == self.layers - 1 else self.hidden

    def __call__(self, b: Builder, parts: Sequence[tuple[Value, str]], prefix: str, out: int,
                 name: str | None = None) -> Value:
        """The MLP `prefix` applied to its inputs; `parts` pairs each input with
        the name of its layer-0 weight (`{prefix}.0.{suffix}`); `name` names
        the output."""
        h = self._first_layer(b, parts, prefix, out, name if self.layers == 1 else None)
        for layer in range(1, self.layers):
            w = b.param(f"{prefix}.{layer}.w", [self.width(layer - 1, out), self.width(layer, out)], self.dtype)
            h = b.matmul(b.relu(h), w, name=name if layer == self.layers - 1 else None)
        return h

    def _first_layer(self, b: Builder, parts: Sequence[tuple[Value, str]], prefix: str, out: int,
                     name: str | None) -> Value:
        """The sum of one matmul per input, not one matmul of their
        concatenation: a concatenated feature dim is opaque to sharding (block
        sharding does not commute with concatenation), so it would keep the
        latent dim of v and e whole wherever they meet an MLP."""
        h = None
        for i, (x, suffix) in enumerate(parts):
            w = b.param(f"{prefix}.0.{suffix}", [x.type.shape[-1], self.width(0, out)], self.dtype)
            last = name if i == len(parts) - 1 else None
            h = b.matmul(x, w, name=last) if h is None else b.add(h, b.matmul(x, w), name=last)
        return h


def gns(nodes: int = 8, edges: int = 16, node_features: int = 4, edge_features: int = 3, latent: int = 8,
        hidden: int = 8, mlp_layers: int = 2, steps: int = 2, out_features: int = 2, dtype: str = "f32") -> Model:
    """MSE loss of an encode-process-decode graph network (see the module docstring)."""
    b = Builder("gns")
    v = b.param(GRAPH_INPUTS[0], [nodes, node_features], dtype)
    e = b.param(GRAPH_INPUTS[1], [edges, edge_features], dtype)
    senders = b.param(GRAPH_INPUTS[2], [edges], "i32")
    receivers = b.param(GRAPH_INPUTS[3], [edges], "i32")
    target = b.param(GRAPH_INPUTS[4], [nodes, out_features], dtype)
    mlp = _Mlp(hidden, mlp_layers, dtype)
    v = mlp(b, [(v, "w")], "encoder.node", latent, name="encoder.node.out")
    e = mlp(b, [(e, "w")], "encoder.edge", latent, name="encoder.edge.out")
    for step in range(steps):
        v, e = _process(b, mlp, v, e, senders, receivers, f"process.{step}")
    y = mlp(b, [(v, "w")], "decoder", out_features, name="decoder.out")
    fn = b.build([mean_squared_error(b, y, target)])
    return Model(fn, tuple(p.name for p in fn.params if p.name not in GRAPH_INPUTS), GRAPH_INPUTS)


def _process(b: Builder, mlp: _Mlp, v: Value, e: Value, senders: Value, receivers: Value,
             prefix: str) -> tuple[Value, Value]:
    """One message-passing step: edges from their two end nodes, then nodes
    from the sum of their incoming edges; both residual."""
    sent = b.gather(v, senders, axis=0, name=f"{prefix}.sent")
    received = b.gather(v, receivers, axis=0, name=f"{prefix}.received")
    latent = e.type.shape[-1]
    message = mlp(b, [(e, "w_edge"), (sent, "w_sender"), (received, "w_receiver")], f"{prefix}.edge", latent,
                  name=f"{prefix}.edge.out")
    e = b.add(e, message, name=f"{prefix}.edges")
    # The segment sum over receivers: sharding the edges leaves partial sums.
    agg = b.scatter_add(e, receivers, axis=0, size=v.type.shape[0], name=f"{prefix}.agg")
    update = mlp(b, [(v, "w_node"), (agg, "w_agg")], f"{prefix}.node", v.type.shape[-1], name=f"{prefix}.node.out")
    return b.add(v, update, name=f"{prefix}.nodes"), e
