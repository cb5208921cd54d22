"""Why synchronous per-row reads beat carina on the GPU machines: the cost of a request.

The feature store used to hand a batch's page runs to ``IOEngine.read_batch``: one Python
request (future, view, transfer) per run. This benchmark reads the same planned batches
three ways and records, for each, reads per second and CPU seconds per 1,000 reads:

* ``read_batch``  one ``read_batch`` request per run (the store before the fix)
* ``gather``      one vectorised ``IOEngine.gather`` per batch (the store now)
* ``sync-reads``  one blocking ``os.preadv`` per missing row, one thread (the Ginex-like peer)

once with the page cache warm and ``O_DIRECT`` off (the request path's own cost: no disk
in the way) and once with ``O_DIRECT`` (the disk's). The reads issued and bytes read are
counted (machine-independent) and must be equal for the two carina paths; every row read
is checked against the id-derived features.

    python benchmarks/gnn/bench_read_path.py --nodes 131072 --batches 4 --gaps 0,4
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from carina.core.bench import Figure, make_record, write_record
from carina.gnn.dataset import PAGE, Dataset, PrepareConfig, prepare
from carina.gnn.graph import node_features
from carina.gnn.sampler import NeighborSampler
from carina.gnn.store import FetchPlan, OutOfCoreFeatures, StoreConfig
from carina.io import Direct, IOConfig, IOEngine, aligned_buffer


def legacy_read(store: OutOfCoreFeatures, plan: FetchPlan) -> int:
    """The store's former read: one ``read_batch`` request per run."""
    runs = plan.runs
    buf = aligned_buffer(max(runs.total_pages, 1) * PAGE)
    reqs = [
        (store.handle, int(f) * PAGE, buf[int(b) * PAGE : int(b + n) * PAGE])
        for f, n, b in zip(runs.run_first, runs.run_pages, runs.run_buf, strict=True)
    ]
    for fut in store.engine.read_batch(reqs, coalesce=False):
        fut.result()
    return len(reqs)


def sync_read(fd: int, plan: FetchPlan, stride: int, row_bytes: int) -> int:
    """One blocking ``preadv`` of the page(s) of each missing row."""
    buf = memoryview(aligned_buffer(-(-stride // PAGE) * PAGE + PAGE))
    for v in plan.lookup.miss_ids.tolist():
        first = v * stride // PAGE * PAGE
        os.preadv(fd, [buf[: -(-(v * stride + row_bytes - first) // PAGE) * PAGE]], first)
    return plan.lookup.miss_ids.numel()


def timed(fn, plans: list[FetchPlan]) -> dict[str, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    reads = sum(fn(p) for p in plans)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "reads": reads,
        "read_s_per_batch": wall / len(plans),
        "reads_per_s": reads / wall,
        "cpu_s_per_1k_reads": 1e3 * cpu / reads,
    }


def run_mode(ds: Dataset, plans_ids: list[torch.Tensor], direct: Direct, gap: int, qd: int) -> dict:
    m = ds.manifest
    with IOEngine(IOConfig(direct=direct, queue_depth=qd, workers=8)) as eng:
        store = OutOfCoreFeatures(ds, engine=eng, config=StoreConfig(gap_pages=gap, max_run_pages=256))
        plans = [store.plan(ids) for ids in plans_ids]
        for p in plans[:1]:  # bit-exact rows on the new path, and warm every path once
            rows = store.read(p, count=False)
            assert torch.equal(rows, node_features(p.lookup.miss_ids, dim=m.feature_dim, seed=m.feature_seed or 0))
            legacy_read(store, p)
        before = dict(eng.stats)
        out = {"gather": timed(lambda p: (store.read(p), p.runs.run_first.size)[1], plans)}
        gather_ops = eng.stats["ops"] - before["ops"]
        before = dict(eng.stats)
        out["read_batch"] = timed(lambda p: legacy_read(store, p), plans)
        legacy_ops = eng.stats["ops"] - before["ops"]
        flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if store.handle.direct else 0)
        fd = os.open(ds.features_path, flags)
        try:
            out["sync-reads"] = timed(lambda p: sync_read(fd, p, m.row_stride, m.row_bytes), plans)
        finally:
            os.close(fd)
        store.close()
    out["counts"] = {
        "direct": bool(direct is not Direct.OFF),
        "ios_gather": gather_ops,
        "ios_read_batch": legacy_ops,
        "runs": int(sum(p.runs.run_first.size for p in plans)),
        "pages": int(sum(p.runs.total_pages for p in plans)),
        "missed_rows": int(sum(p.lookup.miss_ids.numel() for p in plans)),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/carina-gnn-readpath"))
    ap.add_argument("--nodes", type=int, default=1 << 17)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--gaps", default="0,4", help="hole pages read through (the store's gap_pages), one run each")
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--name", default="gnn_read_path")
    args = ap.parse_args()
    if not (args.data / "manifest.json").is_file():
        prepare(PrepareConfig(num_nodes=args.nodes, feature_dim=128, train_fraction=0.05), args.data)
    ds = Dataset.open(args.data)
    sampler = NeighborSampler(ds.graph, fanouts=[int(f) for f in args.fanouts.split(",")], seed=0)
    ids = [b.n_id for _, b in zip(range(args.batches), sampler.batches(ds.train_idx, args.batch_size), strict=False)]
    modes = {}
    for gap in (int(g) for g in args.gaps.split(",")):
        modes[f"warm.gap{gap}"] = run_mode(ds, ids, Direct.OFF, gap, args.queue_depth)
        modes[f"direct.gap{gap}"] = run_mode(ds, ids, Direct.AUTO, gap, args.queue_depth)
    figures = []
    for mode, res in modes.items():
        for path in ("gather", "read_batch"):
            peers = {k: res[k]["read_s_per_batch"] for k in ("gather", "read_batch", "sync-reads") if k != path}
            figures.append(
                Figure(
                    name=f"{mode}.{path}.read_s_per_batch",
                    value=res[path]["read_s_per_batch"],
                    unit="s",
                    higher_is_better=False,
                    peers=peers,
                )
            )
        figures.append(
            Figure(
                name=f"{mode}.read_batch.cpu_s_per_1k_reads",
                value=res["read_batch"]["cpu_s_per_1k_reads"],
                unit="s",
                higher_is_better=False,
                peers={"gather": res["gather"]["cpu_s_per_1k_reads"]},
            )
        )
    rec = make_record(
        name=args.name,
        figures=figures,
        config=vars(args) | {"data": str(args.data)},
        metrics={"modes": modes, "dataset": ds.manifest.to_dict(), "loadavg_at_end": os.getloadavg()},
        notes="read_batch = the store's read before the fix (one Python request per run); gather = now; "
        "the two issue the same reads (counts.ios_*); warm = page cache warm, O_DIRECT off (the request "
        "path's cost); direct = O_DIRECT (the disk's). sync-reads reads one row at a time, so its reads "
        "are the missed rows, not the runs.",
    )
    print(write_record(rec))
    for mode, res in modes.items():
        line = " ".join(
            f"{k}={res[k]['reads_per_s']:.0f}/s,{res[k]['read_s_per_batch'] * 1e3:.0f}ms/batch"
            for k in ("gather", "read_batch", "sync-reads")
        )
        print(f"{mode}: {line} counts={res['counts']}")


if __name__ == "__main__":
    main()
