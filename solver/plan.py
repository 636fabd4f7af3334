"""The sharding plan: the one currency between tactics, search backends,
lowering and costs.

A `Plan` holds ordered decisions (shard a color, or one pinned I-class, along
a mesh axis), one bit per resolution class, and the (I-class, axis) pairs a
`replicate` tactic keeps whole. `Plan.materialize(nda)` applies the rules of
`ir.sharding.materialize` and gives the factor sharding. Color and class ids
refer to the NDA of one program; the JSON form records them with readable
descriptions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ir.core import IRError, Mesh, Recent, Value
from ir.nda import NDA
from ir.sharding import Decision, FactorSharding, materialize

_MATERIALIZED = Recent(8)  # the last plans' shardings, by NDA identity and plan


@dataclass(frozen=True, slots=True)
class Plan:
    mesh: Mesh
    decisions: tuple[Decision, ...] = ()
    resolutions: tuple[tuple[int, int], ...] = ()  # (resolution class, bit), sorted by class
    replicated: tuple[tuple[int, str], ...] = field(default=())

    def materialize(self, nda: NDA) -> FactorSharding:
        """The plan's factor sharding of `nda`'s program, kept for the last few
        plans: pricing one plan reads it several times (the microbatch counts,
        the cost), and a large program's takes a tenth of a second or more."""
        return _MATERIALIZED.get((nda,), self, lambda: materialize(nda, self.mesh, self.decisions,
                                                                   dict(self.resolutions), self.replicated))

    def adopt(self, nda: NDA, sharding: FactorSharding) -> None:
        """Keep `sharding`, made from this plan and the same program in
        another process (a forked child: `solver.planning.floor`), as
        `materialize(nda)`."""
        _MATERIALIZED.put((nda,), self, sharding)

    def with_decisions(self, *decisions: Decision) -> Plan:
        return Plan(self.mesh, self.decisions + decisions, self.resolutions, self.replicated)

    def with_resolutions(self, bits: dict[int, int]) -> Plan:
        merged = dict(self.resolutions)
        merged.update(bits)
        return Plan(self.mesh, self.decisions, tuple(sorted(merged.items())), self.replicated)

    def with_replicated(self, pairs: list[tuple[int, str]]) -> Plan:
        return Plan(self.mesh, self.decisions, self.resolutions, self.replicated + tuple(pairs))

    def to_json(self, nda: NDA | None = None) -> dict[str, Any]:
        """JSON form; with the NDA, each decision also says what it shards."""

        # Parameter dimensions kept whole along an axis are not what a decision on it shards (a
        # search's ZeRO level keeps the weights whole and shards their optimizer state).
        kept: dict[str, set[int]] = {}
        for k, a in self.replicated:
            kept.setdefault(a, set()).add(k)
        dims = _param_dims_by_color(nda) if nda is not None else {}
        carried_by: dict[tuple[int, str], list[tuple[Value, int]]] = {}  # a schedule repeats (color, axis) per `only`

        def decision(d: Decision) -> dict[str, Any]:
            out: dict[str, Any] = {"axis": d.axis, "color": d.color}
            if d.only is not None:
                out["only"] = d.only
                out["spread"] = d.spread
            if nda is not None:
                carried = carried_by.get((d.color, d.axis))
                if carried is None:
                    carried = carried_by[d.color, d.axis] = [(v, k) for v, k, ic in dims.get(d.color, ())
                                                             if ic not in kept.get(d.axis, ())]
                out["what"] = _describe(nda, d, carried)
                out["pattern"] = _pattern(nda, d, carried)
            return out

        return {
            "mesh": dict(self.mesh.axes),
            "decisions": [decision(d) for d in self.decisions],
            "resolutions": {str(k): bit for k, bit in self.resolutions},
            "replicated": [[k, axis] for k, axis in self.replicated],
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Plan:
        try:
            mesh = Mesh.from_pairs(data["mesh"].items())
            decisions = tuple(Decision(str(d["axis"]), int(d["color"]), d.get("only"), bool(d.get("spread", False)))
                              for d in data["decisions"])
            resolutions = tuple(sorted((int(k), int(v)) for k, v in data.get("resolutions", {}).items()))
            replicated = tuple((int(k), str(a)) for k, a in data.get("replicated", []))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise IRError(f"malformed plan JSON: {err!r}") from None
        return Plan(mesh, decisions, resolutions, replicated)


def _param_dims_by_color(nda: NDA) -> dict[int, list[tuple[Value, int, int]]]:
    """Per color, the parameter dimensions it names (parameter, dimension, I-class), in order."""
    out: dict[int, list[tuple[Value, int, int]]] = {}
    for v in nda.function.params:
        for k in range(v.type.rank):
            out.setdefault(nda.def_color(v, k), []).append((v, k, nda.def_iclass(v, k)))
    return out


def _pattern(nda: NDA, d: Decision, carried: list[tuple[Value, int]]) -> str | None:
    """What a decision shards with its layer numbers as `*`: the first
    parameter dimension it shards (`carried`: its color's, less those kept
    whole; `layers.*.attn.wv[1]`), or the pinned I-class's description
    (`%layers.*.attn.wq[1] and onward`). The decisions of repeated layers
    share it, which is how the text report groups them. None for a color no
    parameter carries."""
    if d.only is not None:
        return _LAYER.sub("*", _describe(nda, d, carried))
    if not carried:
        return None
    v, k = carried[0]
    return _LAYER.sub("*", v.name) + f"[{k}]"


_LAYER = re.compile(r"(?<=\.)\d+(?=\.|\[|$)")  # a number between dots: a layer index


def _describe(nda: NDA, d: Decision, carried: list[tuple[Value, int]]) -> str:
    if d.only is not None:
        return nda.describe_iclass(d.only) + (" and onward" if d.spread else "")
    examples = [f"%{v.name}[{k}]" for v, k in carried[:3]]
    return f"color #{d.color}" + (f" ({', '.join(examples)})" if examples else "")
