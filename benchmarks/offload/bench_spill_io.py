"""A spilled block's optimizer state through the NVMe tier: one tensor at a time against all in flight.

The spill writes each spilled block's AdamW state (``exp_avg`` and ``exp_avg_sq`` of its 9 tensors:
18 tensors, 1.62 GB for a Llama-2-7B block) after its update and reads it back before the next.
Until session 9 every tensor was written and read on its own, waiting for each (``TensorStore.put`` /
``read_into``); since then a block's tensors are all in flight at once (``TensorStore.put_nvme`` /
``read_nvme``). This runs both on the same file system, rounds interleaved, next to the tier probe
that the spill's disk roofline uses (``bench_s2.disk_rates``: 8 large tensors in flight), and writes
``benchmarks/results/cpu/offload_spill_io_cpu.json``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_spill_io.py --dir /var/tmp
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from carina.core.bench import Figure, make_record, write_record
from carina.memory import TensorStore, Tier, TierBudgets

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: One Llama-2-7B decoder block's parameter shapes (hidden 4096, MLP 11008): q, k, v, o, gate, up, down, 2 norms.
BLOCK = [(4096, 4096)] * 4 + [(11008, 4096), (11008, 4096), (4096, 11008), (4096,), (4096,)]


def block_state(scale: float) -> list[torch.Tensor]:
    """exp_avg and exp_avg_sq of every tensor of a block, rows scaled by ``scale``, random values."""
    out = []
    for shape in BLOCK:
        rows = max(1, int(shape[0] * scale)) if len(shape) > 1 else shape[0]
        out += [torch.randn((rows, *shape[1:])) for _ in range(2)]
    return out


def one_at_a_time(store: TensorStore, key: str, state: list[torch.Tensor], back: list[torch.Tensor]) -> None:
    """The spill before session 9: each tensor written, then each read, waiting for every one."""
    for i, t in enumerate(state):
        store.put(f"{key}/{i}", t, Tier.NVME)
    for i, out in enumerate(back):
        store.read_into(f"{key}/{i}", out)
        store.drop(f"{key}/{i}")


def all_in_flight(store: TensorStore, key: str, state: list[torch.Tensor], back: list[torch.Tensor]) -> None:
    """The spill since session 9: the block's writes in flight at once, then its reads."""
    store.put_nvme([(f"{key}/{i}", t) for i, t in enumerate(state)])
    store.read_nvme([(f"{key}/{i}", out) for i, out in enumerate(back)])
    for i in range(len(back)):
        store.drop(f"{key}/{i}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="file system of the NVMe tier")
    ap.add_argument("--scale", type=float, default=1.0, help="rows of each tensor, as a fraction of 7B's")
    ap.add_argument("--blocks", type=int, default=2, help="blocks written then read back per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from bench_s2 import disk_rates

    blocks = [block_state(args.scale) for _ in range(args.blocks)]
    nbytes = sum(t.numel() * 4 for t in blocks[0])
    backs = [[torch.empty_like(t) for t in b] for b in blocks]
    probe = disk_rates(args.dir, nbytes=nbytes * args.blocks, pieces=8, rounds=2)
    store = TensorStore(TierBudgets(host=1 << 40, nvme=4 * nbytes * args.blocks, nvme_path=Path(args.dir)))
    methods = {"one_at_a_time": one_at_a_time, "all_in_flight": all_in_flight}
    times: dict[str, list[float]] = {m: [] for m in methods}
    try:
        for r in range(args.rounds):
            order = list(methods) if r % 2 == 0 else list(methods)[::-1]  # interleaved, order alternated
            for name in order:
                t0 = time.perf_counter()
                for k, (state, back) in enumerate(zip(blocks, backs, strict=True)):
                    methods[name](store, f"{name}/{r}/{k}", state, back)
                times[name].append(time.perf_counter() - t0)
                for state, back in zip(blocks, backs, strict=True):
                    assert all(torch.equal(a, b) for a, b in zip(state, back, strict=True)), "read back other bytes"
                    for b in back:
                        b.zero_()
    finally:
        store.close()
    moved = 2 * nbytes * args.blocks  # written and read
    best = {m: min(ts) for m, ts in times.items()}
    median = {m: statistics.median(ts) for m, ts in times.items()}
    serial_probe_s = nbytes * args.blocks / 1e9 * (1 / probe["write_gbps"] + 1 / probe["read_gbps"])
    rate = {m: moved / t / 1e9 for m, t in median.items()}
    for m in methods:
        print(
            f"{m:14} median {median[m]:.2f} s (best {best[m]:.2f})  {rate[m]:.2f} GB/s  "
            f"({median[m] / serial_probe_s:.2f}x the probe's time)"
        )
    print(
        f"probe: write {probe['write_gbps']:.2f}  read {probe['read_gbps']:.2f}  mixed {probe['mixed_gbps']:.2f} GB/s"
    )
    fig = Figure(
        name="spill_state_gbps",
        value=rate["all_in_flight"],
        unit="GB/s",
        ceiling=moved / serial_probe_s / 1e9,
        ceiling_source="the tier probe in the same run (8 tensors in flight): the block's bytes written at its "
        "write rate, then read at its read rate, as the spill's disk roofline counts them",
        peers={"one tensor at a time (before session 9)": rate["one_at_a_time"]},
    )
    rec = make_record(
        name="offload_spill_io_cpu",
        figures=[fig],
        config={
            "dir_fs": args.dir,
            "scale": args.scale,
            "blocks": args.blocks,
            "rounds": args.rounds,
            "tensors_per_block": len(blocks[0]),
            "block_state_bytes": nbytes,
        },
        metrics={
            "times_s": times,
            "best_s": best,
            "median_s": median,
            "median_gbps": rate,
            "probe": probe,
            "probe_serial_s": serial_probe_s,
        },
        notes="Rates are medians over rounds. Each round writes every block's state and reads it back, per "
        "method; rounds interleave the "
        "methods in alternating order; bytes are checked after every round. The CPU machine's disk, not the "
        "H200's: this tells whether waiting per tensor costs throughput on a real file system, not the "
        "H200's figures.",
    )
    print("wrote", write_record(rec))


if __name__ == "__main__":
    main()
