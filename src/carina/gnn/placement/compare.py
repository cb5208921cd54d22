"""Compare placements and routings on one topology (what ``carina gnn place`` prints).

For each placement (carina's greedy, replicate-the-hottest) the batch demand is
scheduled by the LP (predicted time), executed by the fluid simulator on the
LP's routes (weighted sharing) and on fewest-hop routes with fair sharing (the
naive routing). On a described machine every figure is simulated; the result
says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carina.gnn.placement.place import Items, Placement, demands_of, evaluate, place_greedy, replicate_hottest
from carina.gnn.placement.simulate import Sharing, shortest_path_transfers, simulate, transfers_from
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = ["compare_placements", "default_capacities", "route_rows", "synthetic_items"]


def synthetic_items(
    topo: Topology, *, n_items: int = 512, alpha: float = 1.2, batch_gb: float = 2.0, seed: int = 0
) -> Items:
    """Power-law hot chunks of 1 GB; each GPU reads ``batch_gb`` per batch with its own noise."""
    rng = np.random.default_rng(seed)
    gpus = topo.of_kind(NodeKind.GPU)
    weight = 1.0 / np.arange(1, n_items + 1) ** alpha
    rng.shuffle(weight)
    noise = rng.uniform(0.5, 1.5, size=(n_items, len(gpus)))
    traffic = weight[:, None] * noise
    traffic *= batch_gb / traffic.sum(axis=0, keepdims=True)
    return Items(size_gb=np.ones(n_items), traffic=traffic, gpus=gpus)


def default_capacities(topo: Topology, items: Items, *, gpu_share: float = 0.05, dram_share: float = 0.3) -> dict:
    """Per store GB: each GPU caches ``gpu_share`` of the items, DRAM ``dram_share`` in all, SSDs the rest."""
    total = float(items.size_gb.sum())
    drams, ssds = topo.of_kind(NodeKind.DRAM), topo.of_kind(NodeKind.SSD)
    caps = dict.fromkeys(items.gpus, gpu_share * total)
    caps.update(dict.fromkeys(drams, dram_share * total / max(1, len(drams))))
    caps.update(dict.fromkeys(ssds, total))
    return caps


def _figures(topo: Topology, items: Items, placement: Placement) -> dict[str, Any]:
    sched = evaluate(topo, items, placement)
    demands = demands_of(topo, items, placement)
    lp_sim = simulate(topo, transfers_from(sched), sharing=Sharing.WEIGHTED)
    naive = simulate(topo, shortest_path_transfers(topo, demands), sharing=Sharing.FAIR)
    util = sched.utilization()
    loads = sorted(util.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "lp_time_s": sched.time_s,
        "simulated_lp_routes_s": lp_sim.makespan_s,
        "simulated_shortest_fair_s": naive.makespan_s,
        "bytes_by_source_kind_gb": _by_kind(topo, demands),
        "busiest_links": [{"link": f"{a}->{b}", "utilization": u} for (a, b), u in loads[:3]],
        "link_loads": [
            {"link": f"{a}->{b}", "gb": sched.link_gb[(a, b)], "gbps": sched.capacity[(a, b)], "utilization": u}
            for (a, b), u in loads
        ],
        "stored_gb": placement.load_gb(items),
    }


def _by_kind(topo: Topology, demands: list) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in demands:
        k = "gpu-local" if d.src == d.gpu else topo.nodes[d.src].kind.value
        out[k] = out.get(k, 0.0) + d.gb
    return out


def compare_placements(topo: Topology, items: Items, capacity_gb: dict[str, float]) -> dict[str, Any]:
    """Compare carina's placement + LP routes with replicate-hottest and naive routing."""
    ours = place_greedy(topo, items, capacity_gb=capacity_gb)
    naive = replicate_hottest(topo, items, capacity_gb=capacity_gb)
    return {
        "topology": topo.name,
        "simulated": topo.simulated,
        "items": int(items.size_gb.size),
        "gpus": len(items.gpus),
        "placements": {"carina-greedy": _figures(topo, items, ours), "replicate-hottest": _figures(topo, items, naive)},
    }


def route_rows(result: dict[str, Any], placement: str = "carina-greedy") -> list[dict[str, Any]]:
    """One row per used link of ``placement``'s LP plan in a :func:`compare_placements` result."""
    rows = result["placements"][placement]["link_loads"]
    return [{"topology": result["topology"], "placement": placement, **row} for row in rows]
