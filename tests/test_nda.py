"""Named Dimension Analysis: the TOAST paper's examples and the analysis' invariants."""

import networkx as nx
import numpy as np
import pytest

from ir.autodiff import training_step
from ir.builder import Builder
from ir.models import build
from ir.nda import ParityUnionFind, analyze, components

SMALL_TRANSFORMER = dict(d_model=12, heads=3, head_dim=4, mlp_hidden=20, vocab=11, seq=5, batch=2)


def param_colors(nda, name):
    p = nda.function.param(name)
    return [nda.def_color(p, d) for d in range(p.type.rank)]


@pytest.mark.parametrize("train", [False, True])
def test_paper_mlp_has_colors_b_x_u_w(train):
    model = build("mlp", batch=8, d_in=6, hidden=10, d_out=4)
    if train:
        model = training_step(model)
    nda = analyze(model.function)
    b, x = param_colors(nda, "x")
    x2, u = param_colors(nda, "w1")
    u2, w = param_colors(nda, "w2")
    b2, w2 = param_colors(nda, "target")
    assert (x2, u2, b2, w2) == (x, u, b, w)  # Figure 4c: x[B, X], w1[X, U], w2[U, W]
    assert len({b, x, u, w}) == 4
    assert nda.num_colors == 4
    assert nda.conflicts == ()


def test_matmul_with_own_transpose_has_one_conflict():
    bld = Builder("xxt")
    x = bld.param("x", [6, 4])
    fn = bld.build([bld.matmul(x, bld.transpose(x, [1, 0]), name="y")])
    nda = analyze(fn)
    assert len(nda.conflicts) == 1
    (conflict,) = nda.conflicts
    y = fn.results[0]
    assert set(conflict.iclasses) == {nda.def_iclass(y, 0), nda.def_iclass(y, 1)}
    assert nda.def_color(y, 0) == nda.def_color(y, 1) == nda.def_color(x, 0)


def test_a_conflict_is_counted_once_however_many_tensors_it_annotates():
    # d = div(a, c): div's factor pair annotates d and the uses of a and c.
    bld = Builder("div")
    k = bld.param("k", [6, 4])
    a = bld.matmul(k, bld.transpose(k, [1, 0]), name="a")
    c = bld.exp(a, name="c")
    d = bld.div(a, c, name="d")
    nda = analyze(bld.build([d]))
    assert len(nda.conflicts) == 3  # matmul, exp, div
    fn = nda.function
    div_index = next(i for i, op in enumerate(fn.ops) if op.kind == "div")
    div_pair = {nda.use_iclass(div_index, 0, 0), nda.use_iclass(div_index, 0, 1)}
    assert div_pair == {nda.use_iclass(div_index, 1, 0), nda.use_iclass(div_index, 1, 1)}
    assert div_pair == {nda.def_iclass(d, 0), nda.def_iclass(d, 1)}
    assert sum(set(c.iclasses) == div_pair for c in nda.conflicts) == 1


def test_simplified_attention_has_five_conflicts_in_one_set_with_two_resolutions():
    nda = analyze(build("simplified_attention", seq=8, d_model=6, d_head=4).function)
    assert len(nda.conflicts) == 5
    assert len(nda.compat_sets) == 1 and len(nda.resolution_classes) == 1
    (cs,) = nda.compat_sets
    assert len(cs.conflicts) == 5 and len(cs.sides[0]) == len(cs.sides[1]) == 5
    fn = nda.function
    a = next(op.result for op in fn.ops if op.result.name == "a")
    keys, queries = nda.def_iclass(a, 0), nda.def_iclass(a, 1)
    off0, off1 = nda.resolutions(0)
    # One resolution keeps a's key dim, the other its query dim (the paper's
    # sequence sharding of Figure 5b shards the queries).
    assert {frozenset({keys, queries}) & off0, frozenset({keys, queries}) & off1} == {
        frozenset({keys}), frozenset({queries})}
    assert off0 | off1 == cs.sides[0] | cs.sides[1] and not off0 & off1


@pytest.mark.parametrize("options", [{}, {"kv_heads": 1, "gated_mlp": True, "tied_embeddings": True}])
def test_transformer_resolution_classes_do_not_grow_with_depth(options):
    counts = set()
    for layers in (2, 4, 8):
        step = training_step(build("transformer", layers=layers, **SMALL_TRANSFORMER, **options))
        nda = analyze(step.function, step.params)
        assert nda.conflicts and nda.resolution_classes
        counts.add(len(nda.resolution_classes))
    assert len(counts) == 1


@pytest.mark.parametrize("layers", [2, 3, 5])
def test_transformer_parameter_groups_have_one_member_per_layer(layers):
    step = training_step(build("transformer", layers=layers, **SMALL_TRANSFORMER))
    nda = analyze(step.function, step.params)
    per_layer = sorted(n.split(".", 2)[2] for n in step.params if n.startswith("layers.0."))
    assert sorted(g[0].split(".", 2)[2] for g in nda.param_groups) == per_layer
    for group in nda.param_groups:
        assert [n.split(".")[1] for n in group] == [str(i) for i in range(layers)]
        assert len({n.split(".", 2)[2] for n in group}) == 1


def test_isomorphic_compat_sets_share_a_resolution_class():
    bld = Builder("twins")
    outs = []
    for i in range(2):
        k = bld.param(f"k{i}", [6, 4])
        outs.append(bld.matmul(k, bld.transpose(k, [1, 0])))
    k = bld.param("k2", [6, 4])
    outs.append(bld.exp(bld.matmul(k, bld.transpose(k, [1, 0]))))  # a different structure
    nda = analyze(bld.build(outs))
    assert len(nda.compat_sets) == 3
    classes = [cs.resolution_class for cs in nda.compat_sets]
    assert classes[0] == classes[1] != classes[2]
    assert len(nda.resolution_classes) == 2


def test_queries_are_consistent():
    step = training_step(build("transformer", layers=2, **SMALL_TRANSFORMER))
    nda = analyze(step.function)
    fn = nda.function
    for i, op in enumerate(fn.ops):
        for j, v in enumerate(op.operands):
            for d in range(v.type.rank):
                assert nda.use_color(i, j, d) == nda.def_color(v, d)  # M joins defs to uses
                assert nda.use_iclass(i, j, d) in nda.op_factor_iclass[i]
    for color, members in enumerate(nda.color_iclasses):
        assert all(nda.iclasses[m].color == color for m in members)
    for c in nda.conflicts:
        assert c.id in nda.color_conflicts[c.color]
    assert sum(nda.color_names) == len(nda.name_iclass)


def test_iclasses_are_described_and_deterministic():
    fn = build("simplified_attention", seq=8, d_model=6, d_head=4).function
    first, again = analyze(fn), analyze(fn)
    assert [ic.label for ic in first.iclasses] == [ic.label for ic in again.iclasses]
    assert first.compat_sets == again.compat_sets
    described = [first.describe_iclass(i) for i in first.conflicts[0].iclasses]
    assert described == ["m0 of '%a = dot_general(%k, %qt)'", "n0 of '%a = dot_general(%k, %qt)'"]
    assert first.describe_iclass(0) == "%x[0]"


def test_components_are_labelled_by_their_smallest_member():
    assert components(6, np.array([4, 5, 3]), np.array([2, 4, 1])).tolist() == [0, 1, 2, 1, 2, 2]
    assert components(3, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == [0, 1, 2]
    # Long chains in shuffled order (a residual stream through many layers), against a graph search.
    rng = np.random.default_rng(0)
    for n in (50, 2000):
        edges = rng.integers(0, n, size=(n, 2))
        order = rng.permutation(n)
        chain = np.stack([order[:-1], order[1:]], 1)[: n // 2]
        a, b = np.concatenate([edges[:, 0], chain[:, 0]]), np.concatenate([edges[:, 1], chain[:, 1]])
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(zip(a.tolist(), b.tolist()))
        expected = [0] * n
        for members in nx.connected_components(graph):
            for m in members:
                expected[m] = min(members)
        assert components(n, a, b).tolist() == expected


def test_parity_union_find_refuses_contradictions():
    puf = ParityUnionFind()
    assert puf.union(1, 2, differ=1) and puf.union(2, 3, differ=1)
    assert puf.find(3)[1] == puf.find(1)[1]  # 1 and 3 are on the same side
    assert not puf.union(1, 3, differ=1)
    assert puf.union(1, 3, differ=0)
