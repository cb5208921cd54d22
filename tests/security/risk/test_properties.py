"""Property tests of the scorers on random small models."""

from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.security.risk.graph import RiskGraph
from carina.security.risk.model import Layer, Model, Node
from carina.security.risk.reach import _factoring, reach_exact
from carina.security.risk.scoring import score
from carina.security.risk.strong import StrongConfig, StrongScorer

SCORERS = ("strong", "reach", "mincut", "kpaths")


@st.composite
def models(draw: st.DrawFn, max_nodes: int = 8) -> Model:
    n = draw(st.integers(3, max_nodes))
    probs = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    impacts = draw(st.lists(st.floats(0.0, 4.0), min_size=n, max_size=n))
    pairs = list(itertools.combinations(range(n), 2))
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=min(len(pairs), 3 * n), unique=True))
    names = [f"l.n{i}" for i in range(n)]
    nodes = {names[i]: Node(name=names[i], layer="l", probability=probs[i], impact=impacts[i]) for i in range(n)}
    from carina.security.risk.source import Located

    here = Located("<test>", 1)
    return Model(
        nodes=nodes,
        links=[(names[a], names[b], here) for a, b in chosen],
        attackers=[names[0]],
        targets=[names[-1]],
        layers={"l": Layer(name="l")},
    )


def _values(model: Model) -> dict[str, float]:
    return {s: score(model, s)[0].value for s in SCORERS}


@settings(max_examples=60, deadline=None)
@given(models(), st.data())
def test_lowering_a_probability_never_raises_any_score(model: Model, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(model.nodes)))
    factor = data.draw(st.floats(0.0, 1.0))
    lowered = model.with_probabilities({name: model.nodes[name].probability * factor})
    before, after = _values(model), _values(lowered)
    for s in SCORERS:
        assert after[s] <= before[s] * (1 + 1e-12) + 1e-15, s
    assert (
        score(lowered, "strong")[0].details.get("p_total", 0)
        <= score(model, "strong")[0].details.get("p_total", 0) + 1e-15
    )


@settings(max_examples=60, deadline=None)
@given(models(), st.lists(st.integers(0, 7), min_size=1, max_size=4))
def test_a_zero_probability_node_changes_no_reachability(model: Model, hooks: list[int]) -> None:
    from carina.security.risk.source import Located

    names = list(model.nodes)
    extra = Model(
        nodes={**model.nodes, "l.zero": Node(name="l.zero", layer="l", probability=0.0, impact=4.0)},
        links=model.links + [("l.zero", names[h % len(names)], Located("<t>", 1)) for h in hooks],
        attackers=model.attackers,
        targets=model.targets,
        layers=model.layers,
    )
    assert score(extra, "reach")[0].value == pytest.approx(score(model, "reach")[0].value, abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(models(), st.randoms(use_true_random=False))
def test_scores_are_invariant_under_renaming_and_reordering(model: Model, rnd: random.Random) -> None:
    new = [f"x.{rnd.getrandbits(32):08x}{i}" for i in range(len(model.nodes))]
    renamed = model.renamed(dict(zip(model.nodes, new, strict=True)))
    items = list(renamed.nodes.items())
    rnd.shuffle(items)
    renamed.nodes = dict(items)
    a, b = _values(model), _values(renamed)
    for s in SCORERS:
        assert b[s] == pytest.approx(a[s], rel=1e-12, abs=1e-300), s


def _brute_force(graph: RiskGraph, target: int) -> float:
    g = nx.DiGraph() if graph.directed else nx.Graph()
    g.add_nodes_from(range(graph.n))
    g.add_edges_from(graph.edges())
    src = int(graph.attackers[0])
    others = [v for v in range(graph.n) if v != src]
    total = 0.0
    for ups in itertools.product((False, True), repeat=len(others)):
        w = math.prod(graph.probability[v] if u else 1 - graph.probability[v] for v, u in zip(others, ups, strict=True))
        if w == 0.0:
            continue
        keep = [src] + [v for v, u in zip(others, ups, strict=True) if u]
        sub = g.subgraph(keep)
        if target in sub and nx.has_path(sub, src, target):
            total += w
    return total


@settings(max_examples=60, deadline=None)
@given(models(max_nodes=7), st.booleans())
def test_exact_reachability_equals_brute_force(model: Model, directed: bool) -> None:
    model.directed = directed
    g = RiskGraph.from_model(model)
    t = int(g.targets[0])
    p, _ = reach_exact(g, t)
    assert p == pytest.approx(_brute_force(g, t), abs=1e-12)
    if not directed:
        assert _factoring(g, t, 10**6)[0] == pytest.approx(p, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(models())
def test_reachability_never_exceeds_the_cut_bound(model: Model) -> None:
    g = RiskGraph.from_model(model)
    assert score(g, "reach")[0].value <= score(g, "mincut")[0].value + 1e-12


@settings(max_examples=40, deadline=None)
@given(models(), st.floats(1e-6, 1e-2))
def test_pruned_bounds_always_contain_the_exact_risk(model: Model, eps: float) -> None:
    g = RiskGraph.from_model(model)
    (exact,) = StrongScorer().score(g)
    (pruned,) = StrongScorer(StrongConfig(prune_below=eps)).score(g)
    lo, hi = pruned.bounds or (pruned.value, pruned.value)
    assert lo <= exact.value * (1 + 1e-12) + 1e-300
    assert exact.value <= hi * (1 + 1e-12) + 1e-300
