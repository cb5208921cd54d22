"""Host CPU of the torch engine's launch thread per batch: ZvcBatcher's steps (StepClock), on the CPU.

Session 12 on the H200 measured 652 µs of launch-thread CPU per 64 KiB batch (plan, upload, device,
download, scatter). This times the same steps without a GPU: ``requests`` one-block requests per batch,
each in its own slot of a tier-like arena (source and destination never back to back across requests),
realistic data (:func:`~carina.infra.storage.enginebench.payload_dataset`), compress batches and then
decompress batches of what they stored, ``raw_reads`` and ``device_crc`` on as on a GPU. ``device`` runs
the kernels on the CPU, so its time is not the GPU's; ``host`` is the batch's thread CPU minus the
``device`` step. Every round trip is compared with its source (a fast but wrong batcher fails).

With ``--trees label=src,...`` each round runs every tree in a child process of its own (A B A B), and
one record per tree is written as ``<name>_<label>`` (figures of the others as peers)::

    git archive 98f8e8c src | tar -x -C /tmp/s13base
    python benchmarks/infra_storage/bench_batch_host.py --trees s13_base=/tmp/s13base/src,s13=src --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

STEPS = ("plan", "upload", "device", "download", "scatter", "cpu")


def _measure(block: int, requests: int, batches: int, device: str) -> list[dict[str, Any]]:
    """One child: compress then decompress ``batches`` batches at ``block``; per-batch µs per step."""
    import numpy as np

    from carina.infra.storage.codecs import Codec, Job, Op
    from carina.infra.storage.enginebench import payload_dataset
    from carina.infra.storage.zvcbatch import ZvcBatcher

    data = payload_dataset(requests * block * 8, block)
    slot = 2 * (block + block) + 2 * block  # inp (S+B), out (S+B), edge (2B) for one-block requests, as slots.py
    arena = memoryview(bytearray(requests * slot + block))
    batcher = ZvcBatcher(arena, device, raw_reads=True, device_crc=True)
    prep = ZvcBatcher(arena, device)  # stores the decompress batches' blocks (its clock is not read)
    batches = max(20, batches * 4096 // block)  # a 64 KiB batch's kernels take ~16x a 4 KiB one's on the CPU
    rows = []
    nblocks = len(data) // block
    for op in ("compress", "decompress"):
        batcher.clock.reset()
        cpu = 0.0
        for k in range(batches + 1):
            srcs = [data[(k * requests + i) % nblocks * block : ((k * requests + i) % nblocks + 1) * block]
                    for i in range(requests)]  # fmt: skip
            for i, blk in enumerate(srcs):
                arena[i * slot : i * slot + block] = blk
            comp: list[Job] = [
                (Op.COMPRESS, Codec.ZVC, i * slot, block, i * slot + 2 * block, block, 0) for i in range(requests)
            ]
            if op == "compress":
                jobs: list[Job] = comp
            else:
                stored = prep.run(comp)
                jobs = [(Op.DECOMPRESS, c, i * slot + 2 * block, s, i * slot + 4 * block, block, crc)
                        for i, (c, s, crc) in enumerate(stored) if s]  # fmt: skip
            if k == 1:  # batch 0 warms up (lazy tables, first allocations): not timed
                batcher.clock.reset()
            c0 = time.thread_time()
            got = batcher.run(jobs)
            if k:
                cpu += time.thread_time() - c0
            if op == "decompress":
                assert all(r[1] == block for r in got), "a decompress job failed"
                kept = [i for i, (c, s, crc) in enumerate(stored) if s]
                for i in kept:
                    assert bytes(arena[i * slot + 4 * block : i * slot + 5 * block]) == srcs[i], "round trip differs"
            else:
                assert all(r[1] >= 0 for r in got), "a compress job failed"
        rep = batcher.clock.report()
        row: dict[str, Any] = {"block": block, "op": op, "requests": requests, "batches": batches,
                               "batch_cpu_us": cpu / batches * 1e6}  # fmt: skip
        for s in STEPS:
            row[f"{s}_cpu_us"] = rep.get(f"engine_step_{s}_cpu_s", 0.0) / batches * 1e6
        row["host_cpu_us"] = row["batch_cpu_us"] - row["device_cpu_us"]
        row["host_cpu_us_per_req"] = row["host_cpu_us"] / requests
        rows.append(row)
    np.asarray(arena)  # keep the arena alive to the end
    return rows


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)  # one launch thread: its kernels on one core, as the engine's own thread
    out = []
    for requests in (int(r) for r in args.requests.split(",")):
        for b in args.blocks.split(","):
            block = int(b[:-1]) << 10 if b.upper().endswith("K") else int(b)
            out += _measure(block, requests, args.batches, args.device)
    print("ROWS " + json.dumps(out), flush=True)


def _figures(rows: dict[str, list[dict[str, Any]]], label: str) -> list[Any]:
    from carina.core.bench import Figure

    figs = []
    for key in sorted({(r["requests"], r["block"], r["op"]) for r in rows[label]}):

        def med(lab: str, col: str, key: tuple[int, int, str] = key) -> float:
            return float(statistics.median(r[col] for r in rows[lab] if (r["requests"], r["block"], r["op"]) == key))

        for col in ("host_cpu_us", "plan_cpu_us", "upload_cpu_us", "download_cpu_us", "scatter_cpu_us"):
            peers = {lab: med(lab, col) for lab in rows if lab != label}
            name = f"{key[2]}_{key[1] >> 10}k_{key[0]}req_{col}"
            figs.append(Figure(name=name, value=med(label, col), unit="µs/batch", higher_is_better=False, peers=peers))
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", default="4K,64K")
    ap.add_argument("--requests", default="32", help="one-block requests per batch (comma-separated: each)")
    ap.add_argument(
        "--batches", type=int, default=200, help="timed batches per op at 4 KiB (fewer at larger blocks, at least 20)"
    )
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--trees", default="", help="label=src_path,... (each round runs each, in this order)")
    ap.add_argument("--name", default="infra_storage_batch_host")
    ap.add_argument("--notes", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    from carina.core.bench import make_record, write_record

    trees = [t.split("=", 1) for t in args.trees.split(",")] if args.trees else [["this", ""]]
    rows: dict[str, list[dict[str, Any]]] = {lab: [] for lab, _ in trees}
    load0 = os.getloadavg()
    child = [sys.executable, __file__, "--child", "--blocks", args.blocks, "--requests", args.requests,
             "--batches", str(args.batches), "--device", args.device]  # fmt: skip
    for rnd in range(args.rounds):
        for lab, path in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path)) if path else dict(os.environ)
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
            got = json.loads(out.split("ROWS ", 1)[1])
            for r in got:
                r |= {"round": rnd, "tree": lab, "load1": os.getloadavg()[0]}
                print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
            rows[lab] += got
    for lab, _ in trees:
        name = f"{args.name}_{lab}" if args.trees else args.name
        notes = (f"CPU machine, host steps only (not a GPU measurement): ZvcBatcher on device={args.device}, "
                 f"{args.requests} one-block requests per batch (each), {args.batches} timed batches per op and block, "
                 f"{args.rounds} rounds, trees run in the order {[t[0] for t in trees]} each round (A B A B), "
                 f"medians over rounds. {os.cpu_count()} CPUs, load average {[round(x, 1) for x in load0]} -> "
                 f"{[round(x, 1) for x in os.getloadavg()]}. {args.notes}")  # fmt: skip
        metrics = {"rows": rows[lab], "tree": lab}
        record = make_record(name=name, figures=_figures(rows, lab), config=vars(args),
                             command=["python", *sys.argv], metrics=metrics, notes=notes)  # fmt: skip
        print("record:", write_record(record), flush=True)


if __name__ == "__main__":
    main()
