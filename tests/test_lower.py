"""The rewrite engine (ir/lower.py) and materialization (ir/sharding.py),
proven by execution.

Every lowering here is checked by `check_lowering`: the global program and the
device-local one run in float64 on the same seeded inputs on a simulated mesh,
the local results are reassembled per `Lowered.result_dims` and must equal the
global ones (`unshard` also fails when replicas of a block disagree, which is
how a missing collective shows). Plans are built from picks (parameter name,
dim, mesh axis): a pick's decision shards the color of that dimension.

Covered: every model builder, forward and Adam step, under batch parallelism
(BP), BP + Megatron (MP), BP + MP + ZeRO-3 and on 1-D meshes; the simplified
attention's sequence sharding (TOAST/PartIR Figure 5b); seeded random plans
(conflicts, contended axes, non-divisible factors, pins); materialization
rules; golden device-local programs (tests/golden/, `pytest --update-golden`).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest
from conftest import TESTS
from spmd_check import assert_lowering_matches

from costmodel.evaluate import evaluate
from costmodel.hardware import preset_hardware
from ir import ops
from ir.autodiff import SGD, training_step
from ir.builder import Builder
from ir.core import Function, IRError, Mesh
from ir.lower import _RECIPES, Lowered, LowerOptions, _Lowering, lower
from ir.models import Model, build
from ir.nda import NDA, analyze
from ir.sharding import Decision, FactorSharding, _Claimed, materialize
from ir.text import parse, print_function

Pick = tuple[str, int, str]  # (parameter name, dim, mesh axis)
# A plan: decisions as a list, or a function of (nda, model, mesh) when they
# depend on the analysis or on what earlier decisions sharded (ZeRO-3).
PlanFn = Callable[[NDA, Model, Mesh], Sequence[Decision]]

TOL = 1e-9
GOLDEN = TESTS / "golden"
MESH = Mesh.of(batch=2, model=2)
NO_REUSE, REUSE = LowerOptions(reuse_resharded=False), LowerOptions(reuse_resharded=True)

# ------------------------------------------------------------------ helpers


def nda_of(model: Model) -> NDA:
    """The model's NDA, once per Function object (the analysis is pure)."""
    fn = model.function
    hit = _NDAS.get(id(fn))
    if hit is None or hit[0] is not fn:
        hit = _NDAS[id(fn)] = (fn, analyze(fn, model.params))
    return hit[1]


_NDAS: dict[int, tuple[Function, NDA]] = {}


def color_decisions(nda: NDA, picks: Sequence[Pick]) -> list[Decision]:
    """One decision per pick: the color of that parameter dimension on the axis."""
    fn = nda.function
    return [Decision(axis, nda.def_color(fn.param(name), dim)) for name, dim, axis in picks]


def pinned_decisions(nda: NDA, picks: Sequence[Pick]) -> list[Decision]:
    """Every picked dimension pinned first (`only`), then each one's color."""
    fn = nda.function
    pins = [Decision(axis, nda.def_color(fn.param(name), dim), only=nda.def_iclass(fn.param(name), dim))
            for name, dim, axis in picks]
    return pins + color_decisions(nda, picks)


def zero3_picks(model: Model, nda: NDA, mesh: Mesh, before: Sequence[Decision], axis: str) -> list[Pick]:
    """ZeRO-3 on `axis` after `before`: every trainable parameter and its
    optimizer state at its first dimension divisible by the axis size and not
    already sharded by `before`."""
    sharding = materialize(nda, mesh, before)
    names = [n for n in model.params + model.state if n != "opt.step"]
    picks = []
    for name in names:
        p = nda.function.param(name)
        dims = sharding.def_dims(nda, p)
        free = [d for d in range(p.type.rank) if not dims[d] and p.type.shape[d] % mesh.size(axis) == 0]
        if free:
            picks.append((name, free[0], axis))
    return picks


def plan(*parts: Sequence[Pick] | str) -> PlanFn:
    """A plan from pick lists applied in order; the part "zero3:AXIS" adds
    ZeRO-3 pins (then their colors) on AXIS after the previous parts."""

    def decide(nda: NDA, model: Model, mesh: Mesh) -> list[Decision]:
        decisions: list[Decision] = []
        for part in parts:
            if isinstance(part, str):
                axis = part.removeprefix("zero3:")
                decisions += pinned_decisions(nda, zero3_picks(model, nda, mesh, decisions, axis))
            else:
                decisions += color_decisions(nda, part)
        return decisions

    return decide


def collective_counts(fn: Function) -> Counter:
    """Collective ops of a device-local program, by kind."""
    return Counter(op.kind for op in fn.ops if ops.get(op.kind).is_collective)


@dataclass(frozen=True)
class Checked:
    """A lowering check_lowering proved correct, for further assertions."""

    lowered: Lowered
    sharding: FactorSharding
    nda: NDA

    @property
    def function(self) -> Function:
        return self.lowered.function

    @property
    def counts(self) -> Counter:
        return collective_counts(self.lowered.function)


def check_lowering(
    model: Model,
    mesh: Mesh,
    decisions: Sequence[Decision] | PlanFn,
    resolutions: Mapping[int, int] | None = None,
    options: LowerOptions = NO_REUSE,
    seed: int = 0,
    replicated: Sequence[tuple[int, str]] = (),
) -> Checked:
    """Analyze, materialize, lower, verify, run both programs and compare."""
    fn = model.function
    nda = nda_of(model)
    if callable(decisions):
        decisions = decisions(nda, model, mesh)
    sharding = materialize(nda, mesh, decisions, resolutions, replicated)
    lowered = lower(fn, nda, sharding, options)
    assert lowered.function.mesh == mesh
    assert len(lowered.param_dims) == len(fn.params) and len(lowered.result_dims) == len(fn.results)
    assert_lowering_matches(model, lowered, seed, rtol=TOL)
    return Checked(lowered, sharding, nda)


# ------------------------------------------------- every builder, every strategy


@dataclass(frozen=True)
class Case:
    """A model at a small size: its batch input (dim 0 is the batch, or the
    sequence for the simplified attention) and its Megatron picks (name, dim)."""

    build: Callable[[], Model]
    batch_input: str
    megatron: tuple[tuple[str, int], ...]
    true_batch: bool = True  # dim 0 of the batch input is a batch (not a sequence)


def _transformer(**options) -> Case:
    sizes = dict(layers=2, d_model=8, heads=2, head_dim=4, mlp_hidden=12, vocab=10, seq=4, batch=4)
    qkv = "wqkv" if options.get("fused_qkv") else "wq"
    sizes.update(options)
    return Case(lambda: build("transformer", **sizes), "batch.tokens",
                tuple((f"layers.{l}.{w}", 1) for l in range(2) for w in (f"attn.{qkv}", "mlp.w_up")))


CASES = {
    "mlp": Case(lambda: build("mlp", batch=4, d_in=6, hidden=10, d_out=4), "x", (("w1", 1),)),
    "deep_mlp": Case(lambda: build("deep_mlp", layers=4, d_model=6, batch=4), "x",
                     (("layers.0.w", 1), ("layers.2.w", 1))),
    "simplified_attention": Case(lambda: build("simplified_attention", seq=8, d_model=6, d_head=4), "x",
                                 (("wq", 1),), true_batch=False),
    "attention": Case(lambda: build("attention", batch=4, seq=4, d_model=6, heads=1, head_dim=4), "x",
                      (("wq", 1),)),
    "attention_mh_causal": Case(lambda: build("attention", batch=4, seq=4, d_model=6, heads=2, head_dim=3,
                                              causal=True), "x", (("wq", 1),)),
    "transformer_mha": _transformer(),
    "transformer_mqa_gated_tied": _transformer(kv_heads=1, gated_mlp=True, tied_embeddings=True),
    "transformer_fused_layernorm": _transformer(fused_qkv=True, norm="layer"),
    "transformer_gqa": _transformer(heads=4, kv_heads=2, head_dim=2, gated_mlp=True),
}


@functools.cache
def model_of(name: str, train: bool) -> Model:
    forward = CASES[name].build()
    return training_step(forward) if train else forward


def bp_picks(case: Case, axis: str = "batch") -> list[Pick]:
    return [(case.batch_input, 0, axis)]


def mp_picks(case: Case, axis: str = "model") -> list[Pick]:
    return [(name, dim, axis) for name, dim in case.megatron]


STRATEGIES: dict[str, tuple[Mesh, Callable[[Case], PlanFn]]] = {
    "BP": (MESH, lambda c: plan(bp_picks(c))),
    "BP+MP": (MESH, lambda c: plan(bp_picks(c), mp_picks(c))),
    "1d-batch": (Mesh.of(batch=4), lambda c: plan(bp_picks(c))),
    "1d-model": (Mesh.of(model=2), lambda c: plan(mp_picks(c))),
}
ZERO3: dict[str, tuple[Mesh, Callable[[Case], PlanFn]]] = {
    "BP+MP+Z3": (MESH, lambda c: plan(bp_picks(c), mp_picks(c), "zero3:batch")),
    "1d-BP+Z3": (Mesh.of(batch=2), lambda c: plan(bp_picks(c), "zero3:batch")),
}
STEPS = pytest.mark.parametrize("train", [False, True], ids=["forward", "adam"])


@STEPS
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", CASES)
def test_builder_lowers_correctly(name, strategy, train):
    case, model = CASES[name], model_of(name, train)
    mesh, make_plan = STRATEGIES[strategy]
    counts = check_lowering(model, mesh, make_plan(case)).counts
    if strategy in ("BP", "1d-batch") and case.true_batch:
        # PartIR Table 2: batch parallelism needs one all_reduce per gradient, plus the loss.
        assert set(counts) == {"all_reduce"}
        assert counts["all_reduce"] == (len(model.params) + 1 if train else 1)


@STEPS
@pytest.mark.parametrize("strategy", ZERO3)
@pytest.mark.parametrize("name", CASES)
def test_zero3_lowers_correctly_with_and_without_reuse(name, strategy, train):
    case, model = CASES[name], model_of(name, train)
    mesh, make_plan = ZERO3[strategy]
    fresh = check_lowering(model, mesh, make_plan(case), options=NO_REUSE)
    reused = check_lowering(model, mesh, make_plan(case), options=REUSE)
    fn = model.function
    for p, dims in zip(fn.params, fresh.lowered.param_dims):
        if p.name in model.params or p.name.startswith(("opt.m.", "opt.v.")):
            assert any("batch" in axes for axes in dims), f"%{p.name} is not sharded on batch: {dims}"
    assert fresh.counts["all_gather"] > 0
    # Reusing a gathered parameter never costs more gathers; in a training step
    # the backward pass reuses the forward's gathers, so strictly fewer.
    assert reused.counts["all_gather"] <= fresh.counts["all_gather"]
    if train:
        assert reused.counts["all_gather"] < fresh.counts["all_gather"]


def test_gradients_are_reduced_right_after_they_are_made():
    # ZeRO-3 on a deep MLP with Adam: each weight gradient's reduce_scatter follows the op that makes
    # it (as ZeRO/FSDP reduce buckets during the backward), not the optimizer update at the end, so the
    # serial peak holds one full gradient at a time, not all eight.
    layers, d_model = 8, 16
    model = training_step(build("deep_mlp", layers=layers, d_model=d_model, batch=8))
    mesh = Mesh.of(batch=8)
    checked = check_lowering(model, mesh, plan([("x", 0, "batch")], "zero3:batch"))
    fn = checked.function
    scatters = [i for i, op in enumerate(fn.ops) if op.kind == "reduce_scatter"]
    assert len(scatters) == layers
    for i in scatters:
        (operand,) = fn.ops[i].operands
        assert fn.ops[i - 1].results[0] == operand, f"{fn.ops[i].describe()} waits after its gradient is made"
    first_update = next(i for i, op in enumerate(fn.ops) if op.results[0].name.endswith(".new"))
    assert scatters[-1] < first_update  # every gradient leaves during the backward
    # The same program with each reduce_scatter right before its first reader, where it used to be.
    moved = {fn.ops[i] for i in scatters}
    first_reader = {op.operands[0]: next(o for o in fn.ops if op.results[0] in o.operands) for op in moved}
    waiting = Function(fn.name, fn.params, tuple(
        placed for op in fn.ops if op not in moved
        for placed in [s for s in moved if first_reader[s.operands[0]] is op] + [op]), fn.results, fn.mesh)
    hardware = preset_hardware("A100-80GB", mesh.names)
    saved = evaluate(waiting, hardware).peak_memory_bytes - evaluate(fn, hardware).peak_memory_bytes
    # The eight full gradients were held at once at the end of the backward; now the peak is the
    # updated parameters and moments at the end, an eighth of a gradient's size each.
    assert saved >= layers // 2 * d_model * d_model * 4


# ------------------------------------------ sequence sharding (Figure 5b)


def simplified_attention() -> Model:
    return build("simplified_attention", seq=8, d_model=6, d_head=4)


def producer_of(fn: Function, name: str):
    return next(op for op in fn.ops if op.result.name == name)


def test_sequence_sharding_is_figure_5b():
    # x on `seq`, resolution bit 1 (shard the queries): k is gathered whole
    # before a = k @ q^T and z = s @ v leaves a partial sum over keys that one
    # reduce_scatter brings back to a query shard.
    model = simplified_attention()
    checked = check_lowering(model, Mesh.of(seq=2), plan([("x", 0, "seq")]), resolutions={0: 1})
    a = producer_of(model.function, "a").result
    assert checked.sharding.def_dims(checked.nda, a) == ((), ("seq",))  # keys whole, queries sharded
    fn = checked.function
    assert checked.counts == Counter(all_gather=1, reduce_scatter=1, all_reduce=1)
    (gather,) = [op for op in fn.ops if op.kind == "all_gather"]
    assert gather.operands[0].name == "k" and gather.attrs["axes"] == ("seq",)
    local_a = producer_of(fn, "a")
    assert local_a.kind == "dot_general" and local_a.operands[0] is gather.result
    (scatter,) = [op for op in fn.ops if op.kind == "reduce_scatter"]
    assert scatter.operands[0].name == "z" and scatter.attrs["axes"] == ("seq",)
    (loss,) = [op for op in fn.ops if op.kind == "all_reduce"]
    assert loss.operands[0].name == "loss" and loss.result in fn.results


def test_sequence_sharding_other_resolution_executes_correctly():
    model = simplified_attention()
    checked = check_lowering(model, Mesh.of(seq=2), plan([("x", 0, "seq")]), resolutions={0: 0})
    a = producer_of(model.function, "a").result
    # Bit 0 keeps the other side: a's key dimension is sharded, its query dimension whole.
    assert checked.sharding.def_dims(checked.nda, a) == (("seq",), ())


# ------------------------------------------------------------- random plans

RANDOM_MODELS: dict[str, Callable[[], Model]] = {
    # Sizes 2, 3, 4 and 6 against axes of 2 and 3: some factors do not divide.
    "mlp_train": lambda: training_step(build("mlp", batch=6, d_in=4, hidden=6, d_out=3)),
    "transformer_train": lambda: training_step(build(
        "transformer", layers=1, d_model=6, heads=2, head_dim=3, mlp_hidden=6, vocab=6, seq=4, batch=2)),
    "simplified_attention": lambda: build("simplified_attention", seq=6, d_model=4, d_head=3),
    "attention_mh": lambda: build("attention", batch=2, seq=6, d_model=4, heads=2, head_dim=3, causal=True),
}
RANDOM_MESHES = (Mesh.of(a=2, b=3), Mesh.of(a=2, b=2))
SEEDS_PER_MODEL = 10


@dataclass(frozen=True)
class RandomPlan:
    model: str
    mesh: Mesh
    decisions: tuple[Decision, ...]
    resolutions: dict[int, int]
    options: LowerOptions


def random_plan(seed: int, model_name: str) -> RandomPlan:
    """Random colors on random axes, some pinned to one I-class (`only`, with or
    without `spread`), random resolution bits, and on purpose some second
    decisions on an axis already decided for a color sharing an op."""
    rng = random.Random(seed)
    nda = nda_of(random_model(model_name))
    mesh = rng.choice(RANDOM_MESHES)
    decisions: list[Decision] = []
    for _ in range(rng.randint(1, 5)):
        color, axis = rng.randrange(nda.num_colors), rng.choice(mesh.names)
        if rng.random() < 0.3:
            decisions.append(Decision(axis, color, only=rng.choice(nda.color_iclasses[color]),
                                      spread=rng.random() < 0.5))
        else:
            decisions.append(Decision(axis, color))
        if rng.random() < 0.4:
            partners = sorted(sharing_an_op(nda)[color] - {color})
            if partners:
                decisions.append(Decision(axis, rng.choice(partners)))
    bits = {k: rng.randint(0, 1) for k in range(len(nda.resolution_classes))}
    return RandomPlan(model_name, mesh, tuple(decisions), bits, REUSE if rng.random() < 0.5 else NO_REUSE)


@functools.cache
def random_model(name: str) -> Model:
    return RANDOM_MODELS[name]()


def sharing_an_op(nda: NDA) -> dict[int, set[int]]:
    """color -> the colors of the factors of every op it has a factor in."""
    out: dict[int, set[int]] = {c: set() for c in range(nda.num_colors)}
    for factors in nda.op_factor_iclass:
        colors = {nda.iclasses[k].color for k in factors if k >= 0}
        for c in colors:
            out[c] |= colors
    return out


def plan_features(p: RandomPlan) -> set[str]:
    """Which situations a random plan puts materialization in."""
    nda = nda_of(random_model(p.model))
    deselected = set().union(*(nda.resolutions(k)[bit] for k, bit in p.resolutions.items()))
    features = set()
    for i, d in enumerate(p.decisions):
        targets = nda.color_iclasses[d.color] if d.only is None else (d.only,)
        if deselected & set(nda.color_iclasses[d.color]):
            features.add("conflict")
        if any(nda.iclasses[k].size % p.mesh.size(d.axis) for k in targets):
            features.add("non-divisible")
        if d.only is not None:
            features.add("spread" if d.spread else "only")
        if any(e.axis == d.axis and e.color != d.color and e.color in sharing_an_op(nda)[d.color]
               for e in p.decisions[:i]):
            features.add("contention")
    return features


RANDOM_CASES = [(name, seed) for name in RANDOM_MODELS for seed in range(SEEDS_PER_MODEL)]


def test_random_plans_cover_conflicts_contention_and_non_divisible_factors():
    seen = Counter(f for name, seed in RANDOM_CASES for f in plan_features(random_plan(seed, name)))
    for feature in ("conflict", "contention", "non-divisible", "only", "spread"):
        assert seen[feature] >= 3, (feature, seen)


@pytest.mark.parametrize(("name", "seed"), RANDOM_CASES)
def test_random_plan_lowers_correctly(name, seed):
    p = random_plan(seed, name)
    check_lowering(random_model(name), p.mesh, p.decisions, p.resolutions, p.options, seed=seed)


def lowered_afresh(fn: Function, nda: NDA, sharding: FactorSharding, options: LowerOptions) -> Lowered:
    """`lower` with every op lowered afresh, no recipe replayed."""
    lowering = _Lowering(fn, nda, sharding, options)
    lowering.recipes = None
    return lowering.run()


def assert_replays_lower_afresh(fn: Function, nda: NDA, sharding: FactorSharding, options: LowerOptions) -> int:
    """The lowering with recipes (`lower`) is the lowering afresh, op for op and
    name for name; returns how many ops were replayed."""
    got, want = lower(fn, nda, sharding, options), lowered_afresh(fn, nda, sharding, options)
    assert print_function(got.function) == print_function(want.function)
    ops.verify(got.function, types=True)  # `lower` checks SSA alone: a replayed op's types are its recipe's
    assert (got.param_dims, got.result_dims) == (want.param_dims, want.result_dims)
    return len(fn.ops) - len(_RECIPES.get((fn,), sharding.mesh, dict)) if not options.reuse_resharded else 0


@pytest.mark.parametrize(("name", "seed"), RANDOM_CASES)
def test_a_random_plans_replayed_lowering_is_its_lowering_afresh(name, seed):
    p = random_plan(seed, name)
    model = random_model(name)
    nda = nda_of(model)
    assert_replays_lower_afresh(model.function, nda, materialize(nda, p.mesh, p.decisions, p.resolutions), p.options)


@pytest.mark.parametrize("strategy", ["megatron", "zero3"])
def test_repeated_layers_replay_their_lowering(strategy):
    # Four layers of a training step, Megatron's split (partial sums flowing into the residual) or ZeRO-3
    # (each gradient's reduce_scatter hoisted right after its op): every layer after the first is lowered
    # from recipes, and the program is the one lowered op by op.
    model = training_step(build("transformer", layers=4, d_model=8, heads=2, head_dim=4, mlp_hidden=16,
                                vocab=8, seq=4, batch=4))
    nda = nda_of(model)
    mesh = Mesh.of(batch=2, model=2)
    picks = [("batch.tokens", 0, "batch"), ("layers.0.attn.wq", 1, "model"), ("layers.0.mlp.w_up", 1, "model")]
    decisions = plan(picks)(nda, model, mesh) if strategy == "megatron" else \
        plan([("batch.tokens", 0, "batch")], "zero3:batch")(nda, model, mesh)
    sharding = materialize(nda, mesh, decisions)
    lowered = lower(model.function, nda, sharding)
    kinds = Counter(op.kind for op in lowered.function.ops)
    assert kinds["reduce_scatter" if strategy == "zero3" else "all_reduce"] >= 4
    replayed = assert_replays_lower_afresh(model.function, nda, sharding, NO_REUSE)
    assert replayed > len(model.function.ops) // 2


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_a_plan_materialized_on_one_mesh_is_read_on_another_only_where_it_claims_the_same(name):
    # The same decisions on meshes of other sizes (the mesh screen's case): an answer is kept and read
    # on a mesh that divides what it took and refuses again each claim refused for its size; every
    # answer is the one applying the decisions on that mesh gives.
    nda = nda_of(random_model(name))
    meshes = [Mesh.of(a=a, b=b) for a, b in ((2, 2), (2, 3), (3, 2), (4, 2), (2, 6), (1, 2), (3, 3), (2, 9))]
    read = read_refusing = 0
    for seed in range(SEEDS_PER_MODEL):
        p = random_plan(seed, name)
        got = [materialize(nda, mesh, p.decisions, p.resolutions) for mesh in meshes]
        for k, (mesh, sharding) in enumerate(zip(meshes, got)):
            fresh = _Claimed.of(nda, mesh, p.decisions, p.resolutions, ())
            assert sharding.axes == fresh.axes, (seed, mesh)
            earlier = any(g.axes is sharding.axes for g in got[:k])
            read += earlier
            read_refusing += earlier and bool(fresh.refused)
    assert read and read_refusing  # some meshes read an earlier mesh's answer, some one that refused a claim
    with pytest.raises(IRError, match="unknown mesh axis"):
        materialize(nda, Mesh.of(a=2), p.decisions + (Decision("b", 0),), p.resolutions)


# ---------------------------------------------------------- materialization


def mlp(hidden: int = 10) -> Model:
    return build("mlp", batch=4, d_in=6, hidden=hidden, d_out=4)


def mlp_colors(nda: NDA) -> dict[str, int]:
    """TOAST's Figure 4c: x[B, X], w1[X, U], w2[U, W]."""
    fn = nda.function
    x, w2 = fn.param("x"), fn.param("w2")
    return {"B": nda.def_color(x, 0), "X": nda.def_color(x, 1), "U": nda.def_color(w2, 0),
            "W": nda.def_color(w2, 1)}


def dims_of(checked: Checked, name: str) -> tuple:
    """How a named value (parameter or op result) of the global program is sharded."""
    fn = checked.nda.function
    value = next(v for v in fn.values() if v.name == name)
    return checked.sharding.def_dims(checked.nda, value)


def first_matmul(fn: Function) -> int:
    return next(i for i, op in enumerate(fn.ops) if op.kind == "dot_general")


def test_earlier_decision_wins_a_contended_axis():
    model = mlp()
    c = mlp_colors(nda_of(model))
    mesh = Mesh.of(a=2)
    # U first: w1 and the first matmul take `a` on U, so X loses it there (x
    # keeps it: x has no U dimension) and x is gathered for the matmul.
    u_first = check_lowering(model, mesh, [Decision("a", c["U"]), Decision("a", c["X"])])
    assert dims_of(u_first, "w1") == ((), ("a",))
    assert dims_of(u_first, "x") == ((), ("a",))
    assert u_first.sharding.use_dims(u_first.nda, first_matmul(model.function), 0) == ((), ())
    assert u_first.counts["all_gather"] == 1
    # X first: w1 and the matmul take `a` on X (a partial sum), U loses it
    # there, but relu (no X factor) takes it: a reduce_scatter feeds relu.
    x_first = check_lowering(model, mesh, [Decision("a", c["X"]), Decision("a", c["U"])])
    assert dims_of(x_first, "w1") == (("a",), ())
    assert dims_of(x_first, "x") == ((), ("a",))
    assert dims_of(x_first, "h") == ((), ("a",))
    assert x_first.counts["reduce_scatter"] == 1 and x_first.counts["all_gather"] == 0


def test_non_divisible_factors_are_skipped():
    mesh = Mesh.of(a=2, b=2)
    three = check_lowering(mlp(hidden=3), mesh, lambda nda, m, mesh: [Decision("a", mlp_colors(nda)["U"])])
    assert dims_of(three, "w1") == ((), ()) and dims_of(three, "h") == ((), ())
    assert not three.counts
    # 6 splits over `a` (2 devices) but not further over `b` (4 devices).
    six = check_lowering(mlp(hidden=6), mesh, lambda nda, m, mesh: [Decision(ax, mlp_colors(nda)["U"]) for ax in "ab"])
    assert dims_of(six, "w1") == ((), ("a",)) and dims_of(six, "w2") == (("a",), ())
    four = check_lowering(mlp(hidden=4), mesh, lambda nda, m, mesh: [Decision(ax, mlp_colors(nda)["U"])
                                                                    for ax in "ab"])
    assert dims_of(four, "w1") == ((), ("a", "b")) and dims_of(four, "h") == ((), ("a", "b"))


def test_replicated_pairs_are_blocked():
    model = mlp()
    nda = nda_of(model)
    w1 = model.function.param("w1")
    checked = check_lowering(model, Mesh.of(a=2), [Decision("a", mlp_colors(nda)["U"])],
                             replicated=[(nda.def_iclass(w1, 1), "a")])
    assert dims_of(checked, "w1") == ((), ())  # kept whole on `a`, sliced locally where used
    assert dims_of(checked, "w2") == (("a",), ()) and dims_of(checked, "h") == ((), ("a",))
    assert checked.counts == Counter(all_slice=1, all_reduce=1)


@pytest.mark.parametrize("bit", [0, 1])
def test_resolution_bits_deselect_their_side(bit):
    model = simplified_attention()
    nda = nda_of(model)
    color = nda.def_color(model.function.param("x"), 0)
    off, other = nda.resolutions(0)[bit], nda.resolutions(0)[1 - bit]
    assert off and other and not off & other
    checked = check_lowering(model, Mesh.of(seq=2), [Decision("seq", color)], resolutions={0: bit})
    for k in nda.color_iclasses[color]:
        got = checked.sharding.of(k)
        if k in off:
            assert got == (), nda.describe_iclass(k)
        elif nda.iclasses[k].shardable:
            assert got == ("seq",), nda.describe_iclass(k)


# ----------------------------------------------------- known lowering bugs

def pinned_weight(shape: tuple[int, int], consumer: str) -> tuple[Model, PlanFn]:
    """A weight w pinned to one axis per dim; its consumer wants another layout
    of the two axes: `x @ w` wants (a, b) swapped, `neg(w)` wants (b, a) as (a, -)."""
    b = Builder(consumer)
    w = b.param("w", list(shape))
    if consumer == "matmul":
        y = b.matmul(b.param("x", [4, shape[0]]), w, name="y")
    else:
        y = b.neg(w, name="y")
    fn = b.build([y])
    model = Model(fn, ("w",), tuple(p.name for p in fn.params if p.name != "w"))

    def decide(nda: NDA, model: Model, mesh: Mesh) -> list[Decision]:
        c0, c1 = nda.def_color(w, 0), nda.def_color(w, 1)
        if consumer == "matmul":  # w is (a, b); the matmul wants (b, a)
            return [Decision("a", c0, only=nda.def_iclass(w, 0)), Decision("b", c1, only=nda.def_iclass(w, 1)),
                    Decision("b", c0), Decision("a", c1)]
        # w is (b, a); neg wants (a, -)
        return [Decision("b", c0, only=nda.def_iclass(w, 0)), Decision("a", c1, only=nda.def_iclass(w, 1)),
                Decision("a", c0)]

    return model, decide


# Layouts where axes move between dimensions that keep other axes. A naive
# lowering (all_to_alls planned on the original layout, emitted first) once
# got these wrong: all_to_all<a: 0 -> 1> made dim 1 (b, a), then moving or
# gathering b removed a non-trailing axis (wrong blocks), or a destination
# of size 2 could not hold (b, a) (OpError).
REDISTRIBUTE_CASES = [
    pytest.param("matmul", (4, 4), id="swap"),  # (a, b) -> (b, a)
    pytest.param("matmul", (4, 2), id="swap-small"),
    pytest.param("neg", (4, 4), id="move"),  # (b, a) -> (a, -)
    pytest.param("neg", (2, 4), id="move-small"),
]
LAYOUTS = {"matmul": ((("a",), ("b",)), (("b",), ("a",))), "neg": ((("b",), ("a",)), (("a",), ()))}


@pytest.mark.parametrize(("consumer", "shape"), [c.values[:2] for c in REDISTRIBUTE_CASES])
def test_axis_moving_repro_has_the_layouts_it_claims(consumer, shape):
    model, decide = pinned_weight(shape, consumer)
    mesh = Mesh.of(a=2, b=2)
    nda = nda_of(model)
    sharding = materialize(nda, mesh, decide(nda, model, mesh))
    operand = 1 if consumer == "matmul" else 0
    have = sharding.def_dims(nda, model.function.param("w"))
    want = sharding.use_dims(nda, 0, operand)
    assert (have, want) == LAYOUTS[consumer]


@pytest.mark.parametrize(("consumer", "shape"), REDISTRIBUTE_CASES)
def test_axes_moving_between_dimensions_that_keep_other_axes(consumer, shape):
    model, decide = pinned_weight(shape, consumer)
    check_lowering(model, Mesh.of(a=2, b=2), decide)


# ------------------------------------------------------------------- golden


@dataclass(frozen=True)
class Golden:
    """A small case whose device-local program is kept in tests/golden/NAME.ir;
    `counts` are the collectives its comment promises."""

    build: Callable[[], Model]
    mesh: Mesh
    plan: PlanFn
    counts: Counter
    resolutions: dict[int, int] | None = None


GOLDEN_CASES = {
    "mlp_forward_bp_mp": Golden(mlp, MESH, plan([("x", 0, "batch")], [("w1", 1, "model")]),
                                Counter(all_reduce=2)),
    "mlp_sgd_step_bp": Golden(lambda: training_step(mlp(), optimizer=SGD(0.5)), Mesh.of(batch=2),
                              plan([("x", 0, "batch")]), Counter(all_reduce=3)),
    "simplified_attention_sequence_figure_5b": Golden(simplified_attention, Mesh.of(seq=2),
                                                      plan([("x", 0, "seq")]),
                                                      Counter(all_gather=1, reduce_scatter=1, all_reduce=1), {0: 1}),
    "mlp_zero3_forward": Golden(mlp, Mesh.of(batch=2), plan([("x", 0, "batch")], "zero3:batch"),
                                Counter(all_gather=2, all_reduce=1)),
}


def split_comment(text: str) -> tuple[str, str]:
    """The leading `// ` comment lines of a golden file, and the rest."""
    lines = text.splitlines(keepends=True)
    n = next((i for i, line in enumerate(lines) if not line.startswith("//")), len(lines))
    return "".join(lines[:n]), "".join(lines[n:])


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_device_local_program(name, request):
    case = GOLDEN_CASES[name]
    checked = check_lowering(case.build(), case.mesh, case.plan, case.resolutions)
    assert checked.counts == case.counts
    path = GOLDEN / f"{name}.ir"
    assert path.is_file(), f"create {path} with `// ` lines stating its property, then run pytest --update-golden"
    comment, body = split_comment(path.read_text())
    assert comment.startswith("// "), f"{path} must start with `// ` lines stating the property it shows"
    text = print_function(checked.function)
    if request.config.getoption("--update-golden"):
        path.write_text(comment + text)
        body = text
    assert body == text, f"{path} differs from the lowering (regenerate with pytest --update-golden)"
    assert parse(body) == checked.function  # the golden text is a program, not just a string
