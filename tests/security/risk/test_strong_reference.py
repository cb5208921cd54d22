"""The STRonG-compatible scorer reproduces the original's printed figures."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from carina.security.risk.graph import RiskGraph
from carina.security.risk.loader import load_model
from carina.security.risk.scoring import score
from carina.security.risk.strong import StrongConfig, StrongScorer
from carina.testing import shared_data


def _model(rel: str) -> RiskGraph:
    return RiskGraph.from_model(load_model(shared_data("strong") / rel))


def test_testcase_matches_original() -> None:
    (r,) = score(_model("test/testcase.yml"))
    d = r.details
    assert d["paths"] == 10
    assert (d["shortest"], d["longest"]) == (5, 10)
    assert round(d["p_total"], 6) == 0.206514
    assert round(r.value, 6) == 2.493951
    assert round(d["shift"], 4) == 0.1692


def test_tcp_cfa_matches_original_every_digit() -> None:
    (r,) = score(_model("openstack/openstack_tcp_CFA.yml"))
    d = r.details
    assert d["paths"] == 4584
    assert (d["shortest"], d["shortest_count"], d["longest"], d["longest_count"]) == (5, 1, 19, 32)
    # Figures the original prints in full (STRonG README, same model).
    assert r.value == pytest.approx(0.08703838580207088, rel=1e-12)
    assert d["p_total"] == pytest.approx(0.0030686767364933587, rel=1e-9)
    assert d["shift"] == -0.0118408203125
    assert d["mean_length"] == pytest.approx(14.462478184991275, rel=1e-12)
    assert d["stdev_length"] == pytest.approx(2.1095641773852725, rel=1e-12)
    assert d["median_length"] == 15.0
    assert d["mode_lengths"] == [15]
    assert d["avg_pp"] == pytest.approx(6.703271999670881e-07, rel=1e-9)
    assert d["exploitability"] == pytest.approx(0.011845092202864364, rel=1e-9)
    assert d["impact"]["min"] == pytest.approx(22.25309563648847, rel=1e-12)
    assert d["impact"]["max"] == pytest.approx(95.62039299529577, rel=1e-12)
    assert d["impact"]["avg"] == pytest.approx(73.0154458823329, rel=1e-12)
    assert d["vrisk"]["max"] == pytest.approx(1.8734052059461341, rel=1e-12)
    assert d["prisk"]["max"] == pytest.approx(0.017625612102005094, rel=1e-12)
    assert d["prisk"]["min"] == pytest.approx(8.525729180947748e-14, rel=1e-9)
    assert d["modes"][0] == {"paths": 4272, "nodes": ["os.fwOS.grouped"]}


def test_shc_cfa_matches_original() -> None:
    (r,) = score(_model("openstack/openstack_shc_CFA.yml"))
    d = r.details
    assert d["paths"] == 518_806
    assert (d["shortest"], d["longest"]) == (5, 33)
    assert round(r.value, 7) == 0.0468293
    assert round(d["p_total"], 7) == 0.0015435
    assert round(d["shift"], 5) == -0.03900
    assert d["modes"][0] == {"paths": 496_857, "nodes": ["os.computeOS.grouped"]}


def _naive(graph: RiskGraph) -> tuple[int, float, float]:
    """The original approach: list every simple path, then score each in Python."""
    g = nx.Graph() if not graph.directed else nx.DiGraph()
    g.add_edges_from(graph.edges())
    a, t = int(graph.attackers[0]), int(graph.targets[0])
    deg = graph.out_degree
    count, risk, log_keep = 0, 0.0, 0.0
    for path in nx.all_simple_paths(g, a, t, cutoff=max(50, int(0.85 * graph.n))):
        p = math.prod(float(graph.probability[v]) for v in path[1:])
        imp = sum(float(graph.impact[v]) * math.sqrt(deg[v]) for v in path[1:])
        count, risk, log_keep = count + 1, risk + p * imp, log_keep + math.log1p(-p)
    return count, risk, -math.expm1(log_keep)


@pytest.mark.parametrize("rel", ["test/testcase.yml", "openstack/openstack_tcp_CFA.yml"])
def test_compiled_search_equals_naive_enumeration(rel: str) -> None:
    graph = _model(rel)
    count, risk, p_total = _naive(graph)
    (r,) = score(graph)
    assert r.details["paths"] == count
    assert r.value == pytest.approx(risk, rel=1e-12)
    assert r.details["p_total"] == pytest.approx(p_total, rel=1e-12)


def test_certified_pruning_brackets_exact_value() -> None:
    graph = _model("openstack/openstack_shc_CFA.yml")
    (exact,) = score(graph)
    (pruned,) = StrongScorer(StrongConfig(prune_below=1e-9)).score(graph)
    assert not pruned.exact and pruned.details["pruned_prefixes"] > 0
    assert pruned.details["paths"] < exact.details["paths"]
    assert pruned.bounds is not None
    lo, hi = pruned.bounds
    assert lo <= exact.value <= hi
    assert hi - lo < 1e-3 * exact.value
    plo, phi = pruned.details["p_total_bounds"]
    assert plo <= exact.details["p_total"] <= phi


def test_drop_below_drops_unlikely_paths_like_original_cutoff() -> None:
    graph = _model("openstack/openstack_tcp_CFA.yml")
    (r,) = StrongScorer(StrongConfig(drop_below=1e-6)).score(graph)
    assert r.details["dropped_paths"] > 0
    assert r.details["paths"] + r.details["dropped_paths"] == 4584
    assert r.details["prisk"]["min"] >= 1e-6 * r.details["impact"]["min"]
