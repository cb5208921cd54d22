"""Out-of-core GNN training throughput against in-memory, mmap and synchronous reads.

One run, one generated dataset, one sampler seed and one model for every system:

* ``in-memory``   all features in device memory (the ideal, S0)
* ``host-gather`` features in (pinned) host memory, gathered and copied per batch (S1; GPU only)
* ``mmap``        np.memmap of the feature file, page cache dropped first (S2)
* ``sync-reads``  same static cache as carina, then one O_DIRECT pread per missing row, no overlap (S3)
* ``carina``      static cache + page-coalesced batched reads through carina.io + pipeline (S4)

carina is measured at several cache budgets (share of rows in device + host cache); the peers at
the middle budget. The cost model (calibrated in the same run) predicts carina's seeds/s per budget.
Every system must produce the same losses as in-memory (checked, recorded).

    python benchmarks/gnn/bench_outofcore.py --nodes 262144 --dim 128 --batches 12
    python benchmarks/gnn/bench_outofcore.py --preset igb-like --nodes 65536 --name gnn_outofcore_igb

``--preset igb-like`` generates an IGB-HOM-like graph offline: 1024-d fp32 features (one 4 KiB
page per row), Chung-Lu power law with IGB-HOM's average degree (3.87e9 edges / 2.693e8 nodes =
14.4) and 19 classes; the exponent (2.3) is our assumption for a citation graph, not measured
from IGB.
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from pathlib import Path

import numpy as np
import torch

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.cache import CacheConfig, HotnessSource
from carina.gnn.calibrate import calibrate_machine, profile_workload
from carina.gnn.costmodel import MachineSpec, best_gap_pages, predict
from carina.gnn.dataset import PAGE, Dataset, PrepareConfig, prepare
from carina.gnn.runner import RunConfig, build_cache, train_once
from carina.gnn.store import OutOfCoreFeatures, StoreConfig
from carina.gnn.train import InMemoryFeatures, TrainConfig
from carina.io import IOConfig, IOEngine, drop_cache

PRESETS: dict[str, dict] = {
    "papers-like": {"dim": 128, "avg_degree": 15.0, "gamma": 2.1, "classes": 16},
    "igb-like": {"dim": 1024, "avg_degree": 14.4, "gamma": 2.3, "classes": 19},
}


class MmapFeatures:
    """PyG+-style baseline: fancy indexing into a memory map of the feature file."""

    def __init__(self, ds: Dataset, device: str) -> None:
        m = ds.manifest
        self.m, self.device = m, torch.device(device)
        self.rows = np.memmap(ds.features_path, dtype=np.uint8, mode="r", shape=(m.num_nodes, m.row_stride))

    def plan(self, n_id: torch.Tensor) -> torch.Tensor:
        return n_id.cpu()

    def read(self, plan: torch.Tensor) -> torch.Tensor:
        raw = np.ascontiguousarray(self.rows[plan.numpy(), : self.m.row_bytes])
        return torch.from_numpy(raw).view(self.m.torch_dtype).reshape(-1, self.m.feature_dim)

    def assemble(self, plan: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
        return missing.to(self.device)


class SyncReadFeatures:
    """Ginex-like baseline: carina's cache lookup, then one blocking O_DIRECT pread per missing row."""

    def __init__(self, store: OutOfCoreFeatures, path: Path) -> None:
        self.store, self.m = store, store.manifest
        flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
        self.fd = os.open(path, flags)
        span = -(-self.m.row_stride // PAGE) * PAGE + PAGE
        self.buf = mmap.mmap(-1, span)  # page aligned

    def plan(self, n_id: torch.Tensor):
        return self.store.plan(n_id)

    def read(self, plan) -> torch.Tensor:
        m, ids = self.m, plan.lookup.miss_ids.tolist()
        out = torch.empty(len(ids), m.row_bytes, dtype=torch.uint8)
        view = memoryview(self.buf)
        for i, v in enumerate(ids):
            off = v * m.row_stride
            first = off // PAGE * PAGE
            n = -(-(off + m.row_bytes - first) // PAGE) * PAGE
            os.preadv(self.fd, [view[:n]], first)
            lo = off - first
            out[i] = torch.frombuffer(self.buf, dtype=torch.uint8, count=m.row_bytes, offset=lo)
        return out.view(m.torch_dtype).reshape(len(ids), m.feature_dim)

    def assemble(self, plan, missing: torch.Tensor) -> torch.Tensor:
        return self.store.assemble(plan, missing)


class Checksummed:
    """Wraps a source; records an exact integer checksum of every assembled batch."""

    def __init__(self, source) -> None:
        self.source, self.sums = source, []

    def plan(self, n_id):
        return self.source.plan(n_id)

    def read(self, plan):
        return self.source.read(plan)

    def assemble(self, plan, missing):
        x = self.source.assemble(plan, missing)
        self.sums.append(int(x.contiguous().view(torch.int32).to(torch.int64).sum()))
        return x


def measure(ds: Dataset, cfg: RunConfig, source, warmup: int) -> dict:
    """Train ``warmup + measured`` batches; seeds/s over the measured ones."""
    stamps: list[float] = []
    src = Checksummed(source)
    res = train_once(ds, cfg, src, on_batch=lambda i, loss: stamps.append(time.perf_counter()))
    n = len(stamps) - warmup - 1
    dt = stamps[-1] - stamps[warmup]
    return {
        "seeds_per_s": n * cfg.train.batch_size / dt if dt > 0 else 0.0,
        "losses": res.losses,
        "row_checksums": src.sums,
        "stage_s": res.stage_s,
        "max_in_flight": res.max_in_flight,
    }


def run_carina(
    ds: Dataset, cfg: RunConfig, eng: IOEngine, frac_gpu: float, frac_host: float, warmup: int, store_cfg: StoreConfig
) -> dict:
    n = ds.manifest.num_nodes
    cfg.cache = CacheConfig(gpu_rows=int(frac_gpu * n), host_rows=int(frac_host * n), hotness=HotnessSource.PRESAMPLE)
    store = OutOfCoreFeatures(ds, engine=eng, device=cfg.device, config=store_cfg)
    store.attach_cache(build_cache(ds, cfg, store))
    out = measure(ds, cfg, store, warmup)
    stats = store.stats.as_dict(ds.manifest.row_bytes)
    out |= {"fetch": stats, "cache_bytes": store.cache.nbytes if store.cache else {}}
    return out | {"store": store}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/carina-gnn-bench"))
    ap.add_argument("--nodes", type=int, default=1 << 18)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--avg-degree", type=float, default=15.0)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budgets", default="0,0.05,0.2,0.5", help="total cache share; 1/3 on device, 2/3 host")
    ap.add_argument("--name", default="gnn_outofcore")
    ap.add_argument("--gap", default="auto", help="hole pages read through to merge IOs: auto (from calibration) or N")
    ap.add_argument("--deterministic", action="store_true", help="train under torch deterministic algorithms")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="dataset shape (overrides dim, degree)")
    ap.add_argument("--gamma", type=float, default=2.1, help="Chung-Lu power-law exponent")
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--machine", type=Path, default=None, help="MachineSpec JSON instead of calibrating here")
    ap.add_argument("--skip", default="", help="comma list of mmap, ablations to leave out (time budget)")
    args = ap.parse_args()
    for k, v in PRESETS.get(args.preset or "", {}).items():
        setattr(args, k, v)

    if not (args.data / "manifest.json").is_file():
        prepare(
            PrepareConfig(
                num_nodes=args.nodes,
                feature_dim=args.dim,
                avg_degree=args.avg_degree,
                gamma=args.gamma,
                num_classes=args.classes,
                train_fraction=0.05,
            ),
            args.data,
            device=args.device,
        )
    ds = Dataset.open(args.data)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    tc = TrainConfig(
        fanouts=fanouts,
        batch_size=args.batch_size,
        hidden=args.hidden,
        max_batches=args.batches,
        deterministic=args.deterministic,
    )
    cfg = RunConfig(train=tc, device=args.device)
    skip = set(filter(None, args.skip.split(",")))
    machine = (
        MachineSpec.load(args.machine)
        if args.machine
        else calibrate_machine(args.data, size_mb=128, device=args.device)
    )
    work = profile_workload(ds, cfg)
    gap = best_gap_pages(machine) if args.gap == "auto" else int(args.gap)
    store_cfg = StoreConfig(gap_pages=gap, max_run_pages=256)

    drop_cache(ds.features_path)
    mem = measure(ds, cfg, InMemoryFeatures(ds.read_all_features(), device=args.device), args.warmup)
    results: dict[str, dict] = {"in-memory": mem}
    if args.device.startswith("cuda"):
        host = ds.read_all_features().pin_memory()
        results["host-gather"] = measure(ds, cfg, _HostGather(host, args.device), args.warmup)
    budgets = [float(b) for b in args.budgets.split(",")]
    mid = budgets[len(budgets) // 2]
    figures, carina_runs = [], {}
    with IOEngine(IOConfig(queue_depth=128, workers=8)) as eng:
        n = ds.manifest.num_nodes
        for b in budgets:
            run = run_carina(ds, cfg, eng, b / 3, 2 * b / 3, args.warmup, store_cfg)
            carina_runs[b] = run
            pred = predict(
                machine, work, gpu_cache_rows=int(b / 3 * n), host_cache_rows=int(2 * b / 3 * n), gap_pages=gap
            )
            run["predicted"] = {"seeds_per_s": pred.seeds_per_s, "bottleneck": pred.bottleneck, "stages": pred.stages}
        ablations = {}
        if "ablations" not in skip:
            no_holes = StoreConfig(gap_pages=0)
            ablations["no-hole-coalescing"] = run_carina(ds, cfg, eng, mid / 3, 2 * mid / 3, args.warmup, no_holes)
            serial = RunConfig.from_dict(cfg.to_dict())
            serial.train.pipeline_depth = 1
            ablations["no-pipelining"] = run_carina(ds, serial, eng, mid / 3, 2 * mid / 3, args.warmup, store_cfg)
        if "mmap" not in skip:
            drop_cache(ds.features_path)
            results["mmap"] = measure(ds, cfg, MmapFeatures(ds, args.device), args.warmup)
        sync_cfg = RunConfig.from_dict(cfg.to_dict())
        sync_cfg.train.pipeline_depth = 1
        store = carina_runs[mid]["store"]
        results["sync-reads"] = measure(ds, sync_cfg, SyncReadFeatures(store, ds.features_path), args.warmup)
        for run in [*carina_runs.values(), *ablations.values()]:
            run.pop("store").close()
    # in-memory again at the end: on a shared machine the load drifts; the better of the two is the ceiling
    again = measure(ds, cfg, InMemoryFeatures(ds.read_all_features(), device=args.device), args.warmup)
    mem["seeds_per_s_runs"] = [mem["seeds_per_s"], again["seeds_per_s"]]
    mem["repeat_losses_equal"] = again["losses"] == mem["losses"]  # in memory vs itself: run-to-run determinism
    mem["seeds_per_s"] = max(mem["seeds_per_s_runs"])

    peers_mid = {k: v["seeds_per_s"] for k, v in results.items()}
    for b, run in carina_runs.items():
        others = {k: v for k, v in peers_mid.items() if k != "in-memory"}
        others |= {f"carina {k}": v["seeds_per_s"] for k, v in ablations.items()}
        peers = {"in-memory": mem["seeds_per_s"]} | (others if b == mid else {})
        figures.append(
            Figure(
                name=f"seeds_per_s@cache{b:g}",
                value=run["seeds_per_s"],
                unit="seeds/s",
                ceiling=mem["seeds_per_s"],
                ceiling_source="in-memory run, same batches",
                peers=peers,
            )
        )
        figures.append(
            Figure(
                name=f"predicted_seeds_per_s@cache{b:g}",
                value=run["predicted"]["seeds_per_s"],
                unit="seeds/s",
                basis=Basis.MODELED,
                peers={"measured": run["seeds_per_s"]},
            )
        )
    everything = results | {f"carina@{b:g}": r for b, r in carina_runs.items()} | ablations
    losses_equal = {k: v["losses"] == mem["losses"] for k, v in everything.items()}
    rows_equal = {k: v["row_checksums"] == mem["row_checksums"] for k, v in everything.items()}
    loss_diff = {
        k: max(abs(a - b) for a, b in zip(v["losses"], mem["losses"], strict=True)) for k, v in everything.items()
    }
    metrics = {
        "systems": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("losses", "row_checksums")} for k, v in results.items()
        },
        "carina": {
            f"{b:g}": {k: v for k, v in r.items() if k not in ("losses", "row_checksums")}
            for b, r in carina_runs.items()
        },
        "losses_equal_to_in_memory": losses_equal,
        "rows_equal_to_in_memory": rows_equal,
        "max_abs_loss_diff": loss_diff,
        "in_memory_losses": mem["losses"],
        "in_memory_repeat_losses_equal": mem["repeat_losses_equal"],
        "deterministic": args.deterministic,
        "gap_pages": gap,
        "ablations": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("losses", "row_checksums")} for k, v in ablations.items()
        },
        "loadavg_at_end": os.getloadavg(),
        "machine": machine.to_dict(),
        "workload": work.to_dict() | {"hotness_curve": work.hotness_curve[::10]},
        "dataset": ds.manifest.to_dict(),
    }
    rec = make_record(
        name=args.name,
        figures=figures,
        config=vars(args) | {"data": str(args.data), "machine": str(args.machine)},
        metrics=metrics,
        notes="mmap: page cache dropped (POSIX_FADV_DONTNEED) before its run, then it warms (the file fits in RAM); "
        "budgets split 1/3 device, 2/3 host; peers and ablations at the middle budget; "
        "rows_equal compares exact integer checksums of every assembled batch.",
    )
    print(write_record(rec))
    for k, v in everything.items():  # the key figures in the log too
        print(f"{k:24s} seeds/s={v['seeds_per_s']:.0f} losses_equal={losses_equal[k]} rows_equal={rows_equal[k]}")
    for b, run in carina_runs.items():
        print(
            f"carina@{b:g} predicted seeds/s={run['predicted']['seeds_per_s']:.0f} ({run['predicted']['bottleneck']})"
        )
    print(f"in-memory run twice: losses equal={mem['repeat_losses_equal']} (deterministic={args.deterministic})")


class _HostGather:
    def __init__(self, host: torch.Tensor, device: str) -> None:
        self.host, self.device = host, device

    def plan(self, n_id):
        return n_id.cpu()

    def read(self, plan):
        return self.host.index_select(0, plan)

    def assemble(self, plan, missing):
        return missing.to(self.device, non_blocking=True)


if __name__ == "__main__":
    main()
