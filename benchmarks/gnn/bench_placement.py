"""Placement and transfer scheduling on simulated multi-GPU machines (all figures simulated/modeled).

For each built-in 8-GPU topology: synthetic power-law feature chunks, each GPU reading
``--batch-gb`` per batch; carina's greedy placement with LP routes against replicate-the-hottest
placement, each executed by the fluid simulator on LP routes (weighted sharing) and on fewest-hop
routes with fair sharing (naive routing). Also the greedy heuristic's gap to the exact MILP on small
instances. No figure here was measured on several GPUs (none exist on the machines used).

    python benchmarks/gnn/bench_placement.py
"""

from __future__ import annotations

import argparse

import numpy as np

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.placement.compare import compare_placements, default_capacities, route_rows, synthetic_items
from carina.gnn.placement.place import Items, evaluate, place_exact, place_greedy
from carina.gnn.placement.topology import builtin
from carina.testing.gnn import small_machine


def greedy_gaps(n: int) -> list[float]:
    t = small_machine()
    gaps = []
    for seed in range(n):
        rng = np.random.default_rng(seed)
        items = Items(
            size_gb=np.ones(6), traffic=rng.uniform(0, 2, (6, 2)) * rng.zipf(2.0, (6, 1)), gpus=["gpu0", "gpu1"]
        )
        _, t_exact = place_exact(t, items)
        t_greedy = evaluate(t, items, place_greedy(t, items, replicate=(0.0,))).time_s
        gaps.append(t_greedy / t_exact if t_exact > 0 else 1.0)
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--batch-gb", type=float, default=2.0)
    ap.add_argument("--gap-instances", type=int, default=12)
    ap.add_argument("--route-rows", type=int, default=10, help="busiest links per topology in metrics.routes")
    args = ap.parse_args()
    figures: list[Figure] = []
    metrics: dict = {"routes": []}
    for name in ("pcie-8gpu-2socket", "nvswitch-8gpu"):
        topo = builtin(name)
        items = synthetic_items(topo, n_items=args.items, batch_gb=args.batch_gb)
        res = compare_placements(topo, items, default_capacities(topo, items))
        ours, naive = res["placements"]["carina-greedy"], res["placements"]["replicate-hottest"]
        metrics[name] = res
        metrics["routes"] += route_rows(res)[: args.route_rows]  # the busiest links; all are in link_loads
        figures.append(
            Figure(
                name=f"{name}.batch_time_lp",
                value=ours["lp_time_s"] * 1e3,
                unit="ms",
                higher_is_better=False,
                basis=Basis.MODELED,
                peers={
                    "replicate-hottest (LP routes)": naive["lp_time_s"] * 1e3,
                    "carina placement, shortest-path fair routing": ours["simulated_shortest_fair_s"] * 1e3,
                    "replicate-hottest, shortest-path fair routing": naive["simulated_shortest_fair_s"] * 1e3,
                },
            )
        )
        figures.append(
            Figure(
                name=f"{name}.batch_time_simulated",
                value=ours["simulated_lp_routes_s"] * 1e3,
                unit="ms",
                higher_is_better=False,
                basis=Basis.SIMULATED,
                peers={"LP prediction": ours["lp_time_s"] * 1e3},
            )
        )
    gaps = greedy_gaps(args.gap_instances)
    metrics["greedy_vs_exact"] = {"ratios": gaps, "max": max(gaps), "mean": float(np.mean(gaps))}
    figures.append(
        Figure(
            name="greedy_over_exact_max",
            value=max(gaps),
            unit="x",
            higher_is_better=False,
            basis=Basis.MODELED,
            ceiling=1.0,
            ceiling_source="exact MILP (scipy.optimize.milp), same instances",
        )
    )
    rec = make_record(
        name="gnn_placement",
        figures=figures,
        config=vars(args),
        metrics=metrics,
        notes="simulated 8-GPU machines (built-in descriptions); no multi-GPU hardware was used",
    )
    print(write_record(rec))


if __name__ == "__main__":
    main()
