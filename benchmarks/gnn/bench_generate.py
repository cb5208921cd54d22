"""How fast ``carina gnn prepare`` makes a dataset, split into its parts, to predict a device run.

Times, on this machine: the Chung-Lu topology (edges per second), the feature hash
(``node_features``, bytes per second on ``--device``), the feature writer's disk path alone
(the same chunked, double-buffered carina.io writes of constant bytes: bytes per second), and
the whole ``prepare`` end to end. The writer overlaps hashing with writing, so features take
about ``bytes / min(hash rate, write rate)``.

    python benchmarks/gnn/bench_generate.py --nodes 262144 --write-mb 1024
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch

from carina.core.bench import Figure, make_record, write_record
from carina.gnn.dataset import PrepareConfig, prepare
from carina.gnn.graph import chung_lu, node_features
from carina.io import IOConfig, IOEngine, aligned_buffer


def write_rate(path: Path, total_mb: int, chunk_mb: int = 128) -> float:
    """Bytes/s of chunked, two-buffer carina.io writes (the writer's disk path, no hashing)."""
    chunk = chunk_mb << 20
    bufs = [aligned_buffer(chunk) for _ in range(2)]
    pending: list = [None, None]
    t0 = time.perf_counter()
    with IOEngine(IOConfig(queue_depth=8)) as eng:
        h = eng.open(str(path), "w", size=total_mb << 20)
        for i in range(total_mb // chunk_mb):
            if pending[i % 2] is not None:
                pending[i % 2].result()
            bufs[i % 2][:] = i & 0xFF
            pending[i % 2] = eng.write(h, i * chunk, bufs[i % 2])
        for f in pending:
            if f is not None:
                f.result()
        eng.fsync(h)
        eng.close_file(h)
    rate = (total_mb << 20) / (time.perf_counter() - t0)
    path.unlink()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/carina-gnn-gen"))
    ap.add_argument("--nodes", type=int, default=1 << 18)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--write-mb", type=int, default=1024)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="gnn_generate")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    g = chung_lu(num_nodes=args.nodes, avg_degree=15.0, gamma=2.1, device=args.device)
    sync()
    topo_s = time.perf_counter() - t0
    ids = torch.arange(0, min(args.nodes, 1 << 18), device=args.device)
    node_features(ids[:1024], dim=args.dim)
    sync()
    t0 = time.perf_counter()
    node_features(ids, dim=args.dim).cpu()
    hash_rate = ids.numel() * args.dim * 4 / (time.perf_counter() - t0)
    wrate = write_rate(args.dir / "write.bin", args.write_mb)
    data = args.dir / "ds"
    shutil.rmtree(data, ignore_errors=True)
    t0 = time.perf_counter()
    prepare(PrepareConfig(num_nodes=args.nodes, feature_dim=args.dim, train_fraction=0.05), data, device=args.device)
    prep_s = time.perf_counter() - t0
    feat_bytes = (data / "features.bin").stat().st_size
    shutil.rmtree(data, ignore_errors=True)
    figures = [
        Figure(name="topology_edges_per_s", value=g.num_edges / topo_s, unit="edges/s"),
        Figure(name="feature_hash_bytes_per_s", value=hash_rate, unit="B/s"),
        Figure(name="feature_write_bytes_per_s", value=wrate, unit="B/s"),
        Figure(name="prepare_s", value=prep_s, unit="s", higher_is_better=False),
    ]
    rec = make_record(
        name=args.name,
        figures=figures,
        config=vars(args) | {"dir": str(args.dir)},
        metrics={
            "edges": g.num_edges,
            "topology_s": topo_s,
            "feature_bytes": feat_bytes,
            "loadavg_at_end": os.getloadavg(),
        },
        notes="features take about bytes / min(hash rate, write rate): the writer overlaps them",
    )
    print(write_record(rec))
    print(
        f"topology {g.num_edges / topo_s / 1e6:.1f} Medges/s, hash {hash_rate / 1e9:.3f} GB/s, "
        f"write {wrate / 1e9:.2f} GB/s, prepare {prep_s:.1f} s for {feat_bytes / 1e9:.2f} GB of features"
    )


if __name__ == "__main__":
    main()
