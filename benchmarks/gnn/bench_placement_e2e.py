"""Single-GPU end to end: the placement LP's batch transfer time, from calibrated links, against measured.

The machine (``carina gnn calibrate`` JSON) gives the link rates of a one-GPU topology:
``ssd0 -> cpu0`` at the batch's effective disk rate (its bytes over
:func:`~carina.gnn.diskcost.disk_seconds` with the machine's disk cost form, by default the
additive one: a request's own cost plus its bytes at the bandwidth), ``dram0 -> cpu0`` at the host
gather rate and ``cpu0 <-> gpu0`` at the measured pinned H2D rate. Per batch the demand is
the disk pages the store reads for the cache misses (``ssd0 -> gpu0``) and the host-cache
rows (``dram0 -> gpu0``); :func:`schedule_lp` predicts the time. Measured: the same batch's
disk read (carina.io, on a thread) concurrent with the host rows' gather and copy, then the
missing rows' copy, to the device::

    python benchmarks/gnn/bench_placement_e2e.py --data /tmp/gnn-det --machine machine.json
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.cache import CacheConfig, HotnessSource
from carina.gnn.costmodel import MachineSpec, best_gap_pages, disk_seconds
from carina.gnn.dataset import PAGE, Dataset
from carina.gnn.placement.schedule import Demand, schedule_lp
from carina.gnn.placement.topology import NodeKind, Topology
from carina.gnn.runner import RunConfig, build_cache
from carina.gnn.sampler import NeighborSampler
from carina.gnn.store import OutOfCoreFeatures, StoreConfig
from carina.gnn.train import TrainConfig
from carina.io import IOConfig, IOEngine


def topology(machine: MachineSpec, disk_gbps: float) -> Topology:
    """One GPU, one socket, one disk, with the calibrated rates (GB/s)."""
    t = Topology(name="calibrated-single-gpu")
    t.add("cpu0", NodeKind.CPU)
    t.add("dram0", NodeKind.DRAM)
    t.add("gpu0", NodeKind.GPU)
    t.add("ssd0", NodeKind.SSD)
    t.connect("dram0", "cpu0", machine.host_gather_gbps, both=False)
    t.connect("cpu0", "gpu0", machine.pcie_gbps, both=False)
    t.connect("ssd0", "cpu0", disk_gbps, both=False)
    return t


def one_batch(store: OutOfCoreFeatures, plan, device: str, pool: ThreadPoolExecutor) -> dict:
    """Measure one batch's transfers; return measured and predicted seconds."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    lk = plan.lookup
    sync()
    t0 = time.perf_counter()
    fut = pool.submit(lambda: (store.read(plan), time.perf_counter()))
    if lk.host_pos.numel():
        store.cache.host[lk.host_slot].to(device, non_blocking=True)
    sync()
    t_host = time.perf_counter() - t0
    missing, t_disk_end = fut.result()
    missing.to(device)
    sync()
    return {
        "measured_s": time.perf_counter() - t0,
        "disk_s": t_disk_end - t0,
        "host_s": t_host,
        "pages": plan.runs.total_pages,
        "ios": len(plan.runs.run_first),
        "host_rows": int(lk.host_pos.numel()),
        "miss_rows": int(lk.miss_ids.numel()),
    }


def predict(machine: MachineSpec, row: dict, row_bytes: int) -> float:
    disk_b = row["pages"] * PAGE
    t_disk = disk_seconds(machine, row["ios"], row["pages"])
    rate = disk_b / t_disk / 1e9 if t_disk else machine.ssd_read_gbps
    demand = [Demand("ssd0", "gpu0", disk_b / 1e9), Demand("dram0", "gpu0", row["host_rows"] * row_bytes / 1e9)]
    return schedule_lp(topology(machine, rate), demand).time_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--machine", type=Path, required=True)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--cache", type=float, default=0.2, help="share of rows cached: 1/3 device, 2/3 host")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="gnn_placement_e2e")
    args = ap.parse_args()
    ds, machine = Dataset.open(args.data), MachineSpec.load(args.machine)
    n, m = ds.manifest.num_nodes, ds.manifest
    tc = TrainConfig(fanouts=[int(f) for f in args.fanouts.split(",")], batch_size=args.batch_size)
    cache = CacheConfig(
        gpu_rows=int(args.cache / 3 * n), host_rows=int(2 * args.cache / 3 * n), hotness=HotnessSource.PRESAMPLE
    )
    cfg = RunConfig(train=tc, cache=cache, device=args.device)
    gap = best_gap_pages(machine)
    rows = []
    with IOEngine(IOConfig(queue_depth=128, workers=8)) as eng, ThreadPoolExecutor(1) as pool:
        store = OutOfCoreFeatures(ds, engine=eng, device=args.device, config=StoreConfig(gap_pages=gap))
        store.attach_cache(build_cache(ds, cfg, store))
        sampler = NeighborSampler(ds.graph, fanouts=tc.fanouts, device=args.device, seed=tc.seed)
        for i, batch in enumerate(sampler.batches(ds.train_idx, tc.batch_size)):
            if i > args.batches:  # batch 0 warms up
                break
            row = one_batch(store, store.plan(batch.n_id), args.device, pool)
            row["predicted_s"] = predict(machine, row, m.row_bytes)
            rows.append(row)
        store.close()
    rows = rows[1:]
    meas = float(np.mean([r["measured_s"] for r in rows]))
    pred = float(np.mean([r["predicted_s"] for r in rows]))
    ratios = [r["measured_s"] / r["predicted_s"] for r in rows if r["predicted_s"] > 0]
    figures = [
        Figure(
            name="batch_transfer_ms",
            value=meas * 1e3,
            unit="ms",
            higher_is_better=False,
            peers={"LP prediction (calibrated links)": pred * 1e3},
        ),
        Figure(
            name="predicted_batch_transfer_ms",
            value=pred * 1e3,
            unit="ms",
            higher_is_better=False,
            basis=Basis.MODELED,
            peers={"measured": meas * 1e3},
        ),
    ]
    rec = make_record(
        name=args.name,
        figures=figures,
        config=vars(args) | {"data": str(args.data), "machine": str(args.machine)},
        metrics={
            "batches": rows,
            "measured_over_predicted": {"mean": float(np.mean(ratios)), "min": min(ratios), "max": max(ratios)},
            "machine": machine.to_dict(),
            "gap_pages": gap,
            "dataset": m.to_dict(),
            "loadavg_at_end": os.getloadavg(),
        },
        notes="Topology: one GPU, one socket, one disk; link rates from the machine calibration, the disk link at "
        f"each batch's effective rate (disk_seconds, disk_cost={machine.disk_cost}). Measured: disk read on a "
        "thread concurrent with the host rows' gather and H2D copy, then the missing rows' copy; batch 0 is a warm-up.",
    )
    print(write_record(rec))
    print(
        f"placement e2e: measured {meas * 1e3:.1f} ms/batch, LP predicted {pred * 1e3:.1f} ms "
        f"(measured/predicted {np.mean(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
