"""Host row gathers into a fresh output per call against a reused one (what the calibration times).

Until session 10 ``carina gnn calibrate`` timed ``index_select`` into a fresh tensor per call and
recorded 4.26 GB/s on the H200, while the store's own gathers (into reused pinned staging) ran at
7.9-8.4 GB/s in the same lane and the host-gather peer's at 9.3-9.9 GB/s. This measures both ways on
one table, interleaved, the median of ``--rounds``: random 512 B rows of a ``--table-mb`` table,
``--rows`` per gather, eight gathers a round::

    PYTHONPATH=$PWD/src python benchmarks/gnn/bench_gather_rate.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from carina.core.bench import Figure, make_record, write_record


def rate(table: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None) -> float:
    """Bytes/s of eight gathers of ``idx`` (into ``out``, or a fresh tensor each time)."""
    t0 = time.perf_counter()
    for _ in range(8):
        if out is None:
            table.index_select(0, idx)
        else:
            torch.index_select(table, 0, idx, out=out)
    return 8 * idx.numel() * table.shape[1] * table.element_size() / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-mb", type=int, default=256)
    ap.add_argument("--rows", type=int, default=1 << 16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--name", default="gnn_gather_rate")
    a = ap.parse_args()
    table = torch.ones(a.table_mb * (1 << 20) // 512, 128)
    idx = torch.randint(0, table.shape[0], (a.rows,), generator=torch.Generator().manual_seed(3))
    out = torch.empty(a.rows, 128)
    rate(table, idx, out)
    fresh, reused = [], []
    for _ in range(a.rounds):
        fresh.append(rate(table, idx, None))
        reused.append(rate(table, idx, out))
    med_f, med_r = statistics.median(fresh), statistics.median(reused)
    figs = [
        Figure(name="gather_gbps.reused_output", value=med_r / 1e9, unit="GB/s", peers={"fresh output": med_f / 1e9}),
        Figure(name="gather_gbps.fresh_output", value=med_f / 1e9, unit="GB/s", peers={"reused output": med_r / 1e9}),
    ]
    rec = make_record(
        name=a.name,
        figures=figs,
        config=vars(a) | {"intra_op_threads": torch.get_num_threads()},
        metrics={"fresh_gbps": [x / 1e9 for x in fresh], "reused_gbps": [x / 1e9 for x in reused]},
        notes="Medians of interleaved rounds; a fresh output is what calibrate_machine timed before session 10, "
        "a reused one what the store's IO thread does (pinned staging from torch's caching host allocator).",
    )
    print(write_record(rec))
    for f in figs:
        print(f"{f.name:32s} {f.value:8.3f} {f.unit}  {f.peers}")


if __name__ == "__main__":
    main()
