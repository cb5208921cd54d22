import numpy as np
import pytest

from carina.core.errors import CapacityError, ConfigError
from carina.gnn.placement.compare import compare_placements, default_capacities, route_rows, synthetic_items
from carina.gnn.placement.place import Items, evaluate, place_exact, place_greedy, replicate_hottest
from carina.gnn.placement.topology import builtin
from carina.testing.gnn import small_machine

#: Stated bound of the single-holder greedy against the exact MILP on small instances.
GREEDY_BOUND = 1.5


@pytest.mark.parametrize("seed", range(6))
def test_greedy_within_bound_of_exact(seed):
    rng = np.random.default_rng(seed)
    t = small_machine()
    items = Items(size_gb=np.ones(6), traffic=rng.uniform(0, 2, (6, 2)) * rng.zipf(2.0, (6, 1)), gpus=["gpu0", "gpu1"])
    exact, t_exact = place_exact(t, items)
    assert evaluate(t, items, exact).time_s == pytest.approx(t_exact, rel=1e-6, abs=1e-9)
    greedy = place_greedy(t, items, replicate=(0.0,))
    t_greedy = evaluate(t, items, greedy).time_s
    assert t_exact <= t_greedy * (1 + 1e-6) + 1e-9
    assert t_greedy <= GREEDY_BOUND * t_exact + 1e-9
    for store, gb in greedy.load_gb(items).items():  # capacities
        assert gb <= t.nodes[store].capacity_gb + 1e-9


def test_replication_never_worse_than_single_holder():
    t = builtin("nvswitch-8gpu")
    items = synthetic_items(t, n_items=96, seed=1)
    caps = default_capacities(t, items)
    single = evaluate(t, items, place_greedy(t, items, capacity_gb=caps, replicate=(0.0,))).time_s
    best = evaluate(t, items, place_greedy(t, items, capacity_gb=caps)).time_s
    assert best <= single * (1 + 1e-9)


def test_replicate_hottest_baseline_respects_capacity():
    t = builtin("pcie-8gpu-2socket")
    items = synthetic_items(t, n_items=100, seed=2)
    caps = default_capacities(t, items, gpu_share=0.1, dram_share=0.2)
    p = replicate_hottest(t, items, capacity_gb=caps)
    load = p.load_gb(items)
    for store, gb in load.items():
        assert gb <= caps[store] + 1e-9
    assert sum(len(h) > 1 for h in p.holders) == 10  # the 10 hottest on every GPU


def test_compare_reports_simulated_figures():
    t = builtin("nvswitch-8gpu")
    items = synthetic_items(t, n_items=64, seed=0)
    res = compare_placements(t, items, default_capacities(t, items))
    assert res["simulated"] is True
    ours, naive = res["placements"]["carina-greedy"], res["placements"]["replicate-hottest"]
    assert ours["lp_time_s"] <= naive["lp_time_s"] * (1 + 1e-9)
    for r in (ours, naive):
        assert r["simulated_lp_routes_s"] == pytest.approx(r["lp_time_s"], rel=1e-3)
        assert r["simulated_shortest_fair_s"] >= r["lp_time_s"] * (1 - 1e-6)


@pytest.mark.parametrize("name", ["pcie-8gpu-2socket", "nvswitch-8gpu"])
def test_route_rows_are_the_plans_link_loads(name):
    t = builtin(name)
    items = synthetic_items(t, n_items=40, batch_gb=2.0)
    res = compare_placements(t, items, default_capacities(t, items))
    rows = route_rows(res)
    lp_s = res["placements"]["carina-greedy"]["lp_time_s"]
    assert rows and {r["topology"] for r in rows} == {name}
    for r in rows:  # each link carries at most what its capacity moves in the LP's time
        assert r["gb"] == pytest.approx(r["utilization"] * r["gbps"] * lp_s, rel=1e-9)
        assert 0 < r["utilization"] <= 1 + 1e-6
    assert rows[0]["utilization"] == pytest.approx(1.0, rel=1e-4)  # the bottleneck is saturated, listed first
    into_gpus = sum(r["gb"] for r in rows if r["link"].split("->")[1] in items.gpus)
    by_kind = res["placements"]["carina-greedy"]["bytes_by_source_kind_gb"]
    remote = sum(gb for kind, gb in by_kind.items() if kind != "gpu-local")
    assert into_gpus == pytest.approx(remote, rel=1e-6)  # every remote GB arrives over exactly one GPU-bound link


def test_too_little_capacity_is_refused():
    t = small_machine()
    items = Items(size_gb=np.full(4, 10.0), traffic=np.ones((4, 2)), gpus=["gpu0", "gpu1"])
    with pytest.raises(CapacityError):
        place_greedy(t, items, replicate=(0.0,))
    with pytest.raises(ConfigError):
        Items(size_gb=np.ones(3), traffic=np.ones((2, 2)), gpus=["gpu0", "gpu1"])
