"""What a model builder returns: the program and which parameters are which."""

from __future__ import annotations

from dataclasses import dataclass

from ir.core import Function


@dataclass(frozen=True, slots=True)
class Model:
    """A built program with its metadata.

    `params` are the trainable parameters, `inputs` the per-step batch inputs
    (tokens, targets), `state` the optimizer state of a training step
    (`opt.m.<param>`, `opt.v.<param>`, `opt.step`). Every parameter of
    `function` is in exactly one of the three. A forward program's first
    result is its scalar loss.
    """

    function: Function
    params: tuple[str, ...]
    inputs: tuple[str, ...]
    state: tuple[str, ...] = ()
    # The program's own sharding constraints (an imported jax program's
    # `with_sharding_constraint`s): (value name, dimension, mesh axis). Plans
    # pin them before any tactic.
    pinned: tuple[tuple[str, int, str], ...] = ()
    # A training step's provenance (`ir.autodiff.training_step`): for each
    # value of its backward and update, the forward value (or parameter) it
    # comes from; and how many of its first ops are the forward. Empty and 0
    # for a forward program or an imported step.
    origins: tuple[tuple[str, str], ...] = ()
    forward_ops: int = 0
    # What the import changed of how the program runs (a run-time conditional
    # computes every branch: `ir.stablehlo.control`), each naming its line.
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [p.name for p in self.function.params]
        listed = list(self.params) + list(self.inputs) + list(self.state)
        if sorted(names) != sorted(listed):
            raise ValueError(f"model metadata {listed} does not partition the parameters {names}")

    @property
    def groupable(self) -> tuple[str, ...]:
        """The parameters NDA may group as repeated layers (`ir.nda.analyze`'s
        `group_params`): the trainable ones and any state that is not
        optimizer state (a decode step's per-layer key/value caches, whose
        sequence dimensions would otherwise be a color per layer). Optimizer
        state (`opt.*`) shares its parameter's colors, so it is left out."""
        return self.params + tuple(s for s in self.state if not s.startswith("opt."))

    @property
    def parameter_elements(self) -> int:
        """Scalars in all trainable parameters (the model's parameter count)."""
        return sum(self.function.param(n).type.num_elements for n in self.params)
