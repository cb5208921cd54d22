"""Are out-of-core losses bit-identical to in-memory ones, with and without deterministic algorithms?

On one generated dataset, with one sampler seed and one model init, train:

* in memory twice and carina (static cache + reads through carina.io + pipeline) at each cache
  budget, with torch's default (possibly atomic, non-deterministic) CUDA kernels;
* the same with ``TrainConfig.deterministic`` (``torch.use_deterministic_algorithms(True)``).

It records, per mode, whether in-memory equals itself run to run, whether carina equals
in-memory, the largest loss difference, whether every assembled batch has the same exact
integer checksum as in memory (the rows are the same bytes), and carina's seeds/s (the
non-deterministic runs are the throughput re-measurement with hole merging on)::

    python benchmarks/gnn/bench_determinism.py --data /tmp/gnn-det --nodes 65536 --batches 4
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from outofcore_peers import measure

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.cache import CacheConfig, HotnessSource
from carina.gnn.costmodel import MachineSpec, best_gap_pages
from carina.gnn.dataset import Dataset, PrepareConfig, prepare
from carina.gnn.runner import RunConfig, build_cache
from carina.gnn.store import OutOfCoreFeatures, StoreConfig
from carina.gnn.train import InMemoryFeatures, TrainConfig
from carina.io import IOConfig, IOEngine


def _mode(ds: Dataset, cfg: RunConfig, budgets: list[float], store_cfg: StoreConfig, warmup: int) -> dict:
    feats = ds.read_all_features()
    mem = [measure(ds, cfg, InMemoryFeatures(feats, device=cfg.device), warmup) for _ in range(2)]
    out: dict = {"in-memory": mem[0], "in-memory again": mem[1]}
    n = ds.manifest.num_nodes
    with IOEngine(IOConfig(queue_depth=128, workers=8)) as eng:
        for b in budgets:
            cfg.cache = CacheConfig(
                gpu_rows=int(b / 3 * n), host_rows=int(2 * b / 3 * n), hotness=HotnessSource.PRESAMPLE
            )
            store = OutOfCoreFeatures(ds, engine=eng, device=cfg.device, config=store_cfg)
            try:
                store.attach_cache(build_cache(ds, cfg, store))
                out[f"carina@{b:g}"] = measure(ds, cfg, store, warmup) | {
                    "fetch": store.stats.as_dict(ds.manifest.row_bytes)
                }
            finally:
                store.close()
    ref = out["in-memory"]
    return {
        k: {
            "losses_equal": v["losses"] == ref["losses"],
            "rows_equal": v["row_checksums"] == ref["row_checksums"],
            "max_abs_loss_diff": max(abs(a - b) for a, b in zip(v["losses"], ref["losses"], strict=True)),
            "seeds_per_s": v["seeds_per_s"],
            "losses": v["losses"],
        }
        | ({"fetch": v["fetch"]} if "fetch" in v else {})
        for k, v in out.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/carina-gnn-det"))
    ap.add_argument("--nodes", type=int, default=1 << 16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budgets", default="0,0.6")
    ap.add_argument("--machine", type=Path, default=None, help="MachineSpec JSON: hole size from its calibration")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="gnn_determinism")
    args = ap.parse_args()
    if not (args.data / "manifest.json").is_file():
        pc = PrepareConfig(num_nodes=args.nodes, feature_dim=args.dim, avg_degree=15.0, train_fraction=0.05)
        prepare(pc, args.data, device=args.device)
    ds = Dataset.open(args.data)
    gap = best_gap_pages(MachineSpec.load(args.machine)) if args.machine else 0
    store_cfg = StoreConfig(gap_pages=gap, max_run_pages=256)
    budgets = [float(b) for b in args.budgets.split(",")]
    modes = {}
    for det in (False, True):
        tc = TrainConfig(
            fanouts=[int(f) for f in args.fanouts.split(",")],
            batch_size=args.batch_size,
            hidden=args.hidden,
            max_batches=args.batches,
            deterministic=det,
        )
        try:
            modes["deterministic" if det else "default"] = _mode(
                ds, RunConfig(train=tc, device=args.device), budgets, store_cfg, args.warmup
            )
        except RuntimeError as exc:  # an op without a deterministic kernel: keep the other mode's results
            if not det:
                raise
            modes["deterministic"] = {"error": f"{type(exc).__name__}: {exc}"}
    figures = []
    for mode, runs in modes.items():
        for k, v in runs.items():
            if k != "in-memory" and k != "error":
                figures.append(
                    Figure(
                        name=f"{mode}.max_abs_loss_diff.{k}",
                        value=v["max_abs_loss_diff"],
                        unit="loss",
                        higher_is_better=False,
                        basis=Basis.MEASURED,
                    )
                )
    for b in budgets:
        run = modes["default"][f"carina@{b:g}"]
        figures.append(
            Figure(
                name=f"seeds_per_s@cache{b:g}",
                value=run["seeds_per_s"],
                unit="seeds/s",
                ceiling=modes["default"]["in-memory"]["seeds_per_s"],
                ceiling_source="in-memory run, same batches",
            )
        )
    rec = make_record(
        name=args.name,
        figures=figures,
        config=vars(args) | {"data": str(args.data), "machine": str(args.machine)},
        metrics={
            "modes": modes,
            "gap_pages": gap,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "dataset": ds.manifest.to_dict(),
            "loadavg_at_end": os.getloadavg(),
        },
        notes="'default': torch's default kernels; 'deterministic': TrainConfig.deterministic "
        "(torch.use_deterministic_algorithms(True), loss by log_softmax+gather). losses_equal and rows_equal "
        "compare with the in-memory run of the same mode (rows_equal: exact integer checksums of every "
        "assembled batch); seeds/s figures come from the default mode.",
    )
    print(write_record(rec))
    for mode, runs in modes.items():
        for k, v in runs.items():
            if k == "error":
                print(f"{mode}: {v}")
                continue
            print(
                f"{mode:13s} {k:16s} losses_equal={v['losses_equal']!s:5s} rows_equal={v['rows_equal']!s:5s} "
                f"max_diff={v['max_abs_loss_diff']:.3g} seeds/s={v['seeds_per_s']:.0f}"
            )


if __name__ == "__main__":
    main()
