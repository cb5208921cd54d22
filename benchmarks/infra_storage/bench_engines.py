"""Payload engines alone (no network): inline vs thread pool vs process pool vs torch, interleaved rounds.

Run (2-core CPU machine, the committed record):
  .venv/bin/python benchmarks/infra_storage/bench_engines.py
On the GPU machine (benchmarks/infra_storage/h200.sh): --workers 1,2,4,8,16 --torch-device cuda --codecs zlib,lz4,zvc.
With a torch device, codec zvc runs on the torch engine (``--torch-workers`` launch threads each) and, as the same
codec on the CPU, on ``inline``; each GPU case gets a ``gpu_vs_cpu_tier`` figure per CPU codec: the GPU engine's
MB/s over the best CPU configuration that uses no more cores than the GPU engine's host side did (measured from its
CPU-seconds), with pinned PCIe copies of the same run as the ceiling.
Writes <results>/<machine>/infra_storage_engines[<suffix>].json (CARINA_RESULTS_DIR overrides the folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

from carina.core.bench import Figure, make_record, write_record
from carina.infra.storage.codecs import Codec
from carina.infra.storage.config import EngineConfig, EngineKind, parse_size
from carina.infra.storage.enginebench import available_cores, engine_rate, payload_dataset


def _configs(args: argparse.Namespace) -> list[tuple[str, EngineConfig]]:
    out = [("inline", EngineConfig(kind=EngineKind.INLINE, workers=1))]
    for kind in args.pools.split(","):
        counts = args.process_workers if kind == "process" and args.process_workers else args.workers
        for w in (int(x) for x in counts.split(",")):
            # loop_below=0: every job goes to the pool, so the figures stay the pool's own (the tier's default
            # decompresses small blocks in the event loop, which would measure the loop here)
            out.append((f"{kind}x{w}", EngineConfig(kind=EngineKind(kind), workers=w, loop_below=0)))
    return out


def _row(rows: list[dict[str, Any]], rnd: int, label: str, r: dict[str, Any]) -> None:
    rows.append({"round": rnd, "system": label, "load1": os.getloadavg()[0], **r})
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)


def _case(args: argparse.Namespace, data: bytes, codec: str, block: int, rnd: int) -> list[dict[str, Any]]:
    """Every configuration of one codec and block size, once."""
    rows: list[dict[str, Any]] = []
    batch = max(1, args.request // block)
    if codec != "zvc":
        for label, cfg in _configs(args):
            r = engine_rate(cfg, Codec[codec.upper()], data, block=block, batch=batch, streams=args.streams,
                            seconds=args.seconds)  # fmt: skip
            _row(rows, rnd, label, r)
        return rows
    if not args.torch_device:  # zvc runs on the torch engine (and, as the same codec on the CPU, inline)
        return rows
    zvc = [(f"torch-{args.torch_device}x{w}", EngineConfig(kind=EngineKind.TORCH, device=args.torch_device,
            workers=int(w))) for w in args.torch_workers.split(",")]  # fmt: skip
    for label, cfg in [*zvc, ("inline", EngineConfig(kind=EngineKind.INLINE))]:
        try:  # a failing GPU engine must not take the CPU rows of this run with it
            r = engine_rate(cfg, Codec.ZVC, data, block=block, batch=batch, streams=args.streams, seconds=args.seconds)
        except Exception as exc:  # reported, the run goes on
            print(f"!! {label} zvc {block}: {exc!r}", flush=True)
            continue
        _row(rows, rnd, label, r)
    return rows


def _measure(args: argparse.Namespace, data: dict[int, bytes], on_case: Any = None) -> list[dict[str, Any]]:
    """All cases, block size by block size in the order given, zvc (the GPU) first; ``on_case(rows)`` after each."""
    from carina.infra.storage.codecs import codec_available

    codecs = [c for c in args.codecs.split(",") if c == "zvc" or not codec_available(Codec[c.upper()])]
    for c in set(args.codecs.split(",")) - set(codecs):
        print(f"skipping {c}: {codec_available(Codec[c.upper()])}", flush=True)
    cases = [(c, b) for b in data for c in sorted(codecs, key=lambda c: c != "zvc")]
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):  # every configuration once per round: load drift hits all alike
        for codec, block in cases:
            rows += _case(args, data[block], codec, block, rnd)
            if on_case is not None:
                on_case(rows)
    return rows


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def figures(rows: list[dict[str, Any]], main: str) -> list[Figure]:
    """Per codec and block: the ``main`` pool's MB/s with every other system as a peer, and its speedup."""
    out: list[Figure] = []
    for codec, block in sorted({(r["codec"], r["block"]) for r in rows}):
        case = [r for r in rows if r["codec"] == codec and r["block"] == block]
        systems = sorted({r["system"] for r in case})
        lab = f"{codec}_{block >> 10}k"
        if main not in systems:
            out += _cross_codec(rows, case, lab)
            continue
        for op in ("compress", "decompress"):
            key = f"{op}_mb_s"
            med = {s: _median([r for r in case if r["system"] == s], key) for s in systems}
            out.append(Figure(name=f"{lab}_{op}_mb_s", value=med[main], unit="MB/s",
                              peers={s: v for s, v in med.items() if s != main}))  # fmt: skip
            cpu = {s: _median([r for r in case if r["system"] == s], f"{op}_cpu_s_per_gb") for s in systems}
            out.append(Figure(name=f"{lab}_{op}_cpu_s_per_gb", value=cpu[main], unit="s/GB", higher_is_better=False,
                              peers={s: v for s, v in cpu.items() if s != main}))  # fmt: skip
            ratios = []
            for rnd in sorted({r["round"] for r in case}):
                got = {r["system"]: r[key] for r in case if r["round"] == rnd}
                if "inline" in got and main in got and got["inline"] > 0:
                    ratios.append(got[main] / got["inline"])
            if ratios:
                workers = int(main.rsplit("x", 1)[1]) if "x" in main else 1
                out.append(Figure(name=f"{lab}_{op}_speedup", value=float(statistics.median(ratios)), unit="x",
                                  ceiling=float(min(workers, os.cpu_count() or 1)),
                                  ceiling_source="workers, capped by the machine's cores (no other load)"))  # fmt: skip
    return out


def _cross_codec(rows: list[dict[str, Any]], case: list[dict[str, Any]], lab: str) -> list[Figure]:
    """A torch (GPU) ZVC case against every CPU configuration of the other codecs at the same block size."""
    out: list[Figure] = []
    for system in sorted({r["system"] for r in case if r["engine"] == "torch"}):
        mine = [r for r in case if r["system"] == system]
        others = [r for r in rows if r["block"] == mine[0]["block"] and r["engine"] != "torch"]
        for op in ("compress", "decompress"):
            key = f"{op}_mb_s"
            peers = {f"{s} ({c})": _median([r for r in others if (r["system"], r["codec"]) == (s, c)], key)
                     for s, c in sorted({(r["system"], r["codec"]) for r in others})}  # fmt: skip
            out.append(Figure(name=f"{lab}_{system}_{op}_mb_s", value=_median(mine, key), unit="MB/s", peers=peers))
            out.append(Figure(name=f"{lab}_{system}_{op}_cpu_s_per_gb", value=_median(mine, f"{op}_cpu_s_per_gb"),
                              unit="s/GB", higher_is_better=False))  # fmt: skip
    return out


def _workers(system: str) -> int:
    return int(system.rsplit("x", 1)[1]) if "x" in system else 1


def gpu_vs_cpu_tier(rows: list[dict[str, Any]], pcie: dict[str, float]) -> list[Figure]:
    """Per block, op and CPU codec: the fastest GPU engine over the best CPU tier on no more cores.

    The GPU engine's cores are its host side's CPU-seconds per second (CPU-s/GB
    times GB/s, rounded up to whole cores); the CPU tier's configurations are
    ``inline`` (one core) and the pools with at most that many workers. The
    ceiling is the pinned copy rate (H2D for compress, D2H for decompress) over
    the same CPU figure: the speedup a GPU engine running at PCIe speed would show.
    """
    out: list[Figure] = []
    for block in sorted({r["block"] for r in rows}):
        gpu = [r for r in rows if r["block"] == block and r["engine"] == "torch"]
        cpu = [r for r in rows if r["block"] == block and r["engine"] != "torch" and r["codec"] != "zvc"]
        if not gpu or not cpu:
            continue
        for op in ("compress", "decompress"):
            key = f"{op}_mb_s"
            best = max(gpu, key=lambda r: r[key])
            cores = max(1, math.ceil(best[key] * best[f"{op}_cpu_s_per_gb"] / 1e3 - 0.05))
            copy = pcie.get("h2d_gb_s" if op == "compress" else "d2h_gb_s", 0.0) * 1e3
            for codec in sorted({r["codec"] for r in cpu}):
                mine = {s: _median([r for r in cpu if (r["system"], r["codec"]) == (s, codec)], key)
                        for s in sorted({r["system"] for r in cpu if r["codec"] == codec})}  # fmt: skip
                fair = {s: v for s, v in mine.items() if _workers(s) <= cores}
                if not fair:  # a record cut short may lack them
                    continue
                base_sys = max(fair, key=fair.__getitem__)
                base = fair[base_sys]
                out.append(Figure(
                    name=f"gpu_vs_cpu_tier_{codec}_{block >> 10}k_{op}", value=best[key] / base, unit="x",
                    ceiling=copy / base if copy else None,
                    ceiling_source=(f"pinned {'H2D' if op == 'compress' else 'D2H'} copy {copy:.0f} MB/s this run "
                                    f"over the same CPU baseline ({base_sys}, {codec}, {base:.0f} MB/s)"),
                    peers={f"{best['system']} MB/s": best[key], f"{base_sys} ({codec}) MB/s": base,
                           "gpu host cores": float(cores), "inline (1 core) MB/s": mine.get("inline", 0.0)},
                ))  # fmt: skip
    return out


def pcie_rates(device: str, nbytes: int = 64 << 20, reps: int = 5) -> dict[str, float]:
    """Pinned host<->device copy GB/s (best of ``reps``) on ``device``; empty off CUDA."""
    if not device.startswith("cuda"):
        return {}
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out: dict[str, float] = {}
    for name, dst, src in (("h2d_gb_s", dev, host), ("d2h_gb_s", host, dev)):
        best = float("inf")
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[name] = nbytes / best / 1e9
    return out


def _cores_figure(cores: list[float]) -> Figure:
    return Figure(
        name="available_cores",
        value=min(cores),
        unit="cores",
        ceiling=float(os.cpu_count() or 1),
        ceiling_source="os.cpu_count(); the value is the CPU busy-looping processes got (lower of before/after)",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--codecs", default="lz4,zlib,zstd")
    ap.add_argument("--blocks", default="4K,64K")
    ap.add_argument("--pools", default="thread,process")
    ap.add_argument("--workers", default="2", help="comma-separated pool sizes")
    ap.add_argument("--process-workers", default="", help="pool sizes of the process pool (default: --workers)")
    ap.add_argument("--main", default="", help="system the figures are about (default: first pool, most workers)")
    ap.add_argument("--request", type=parse_size, default=64 << 10, help="bytes per submitted batch (NBD request)")
    ap.add_argument("--streams", type=int, default=16, help="batches in flight (queue depth)")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=parse_size, default=32 << 20)
    ap.add_argument("--torch-device", default="", help="run the torch engine on this device for codec zvc")
    ap.add_argument("--torch-workers", default="2", help="comma-separated launch-thread counts of the torch engine")
    ap.add_argument("--name", default="infra_storage_engines")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    blocks = [parse_size(b) for b in args.blocks.split(",")]
    data = {b: payload_dataset(args.data, b) for b in blocks}
    load0, t0 = os.getloadavg(), time.time()
    cores = [available_cores(0.5)]
    pcie = pcie_rates(args.torch_device) if args.torch_device else {}
    main_sys = args.main or f"{args.pools.split(',')[0]}x{max(int(w) for w in args.workers.split(','))}"

    def save(rows: list[dict[str, Any]]) -> None:
        """Write the record with what has run so far (after every case: a timeout keeps what finished)."""
        if args.no_record:
            return
        after = f"{cores[1]:.2f} after" if len(cores) > 1 else "(run cut short or still running: no after)"
        notes = (
            f"Payload engines alone, in one process (no NBD, no client): {args.streams} batches of {args.request} B "
            f"in flight, interleaved rounds, median. Data: Python sources and shared libraries (60/40), all-zero "
            f"blocks dropped. {os.cpu_count()} CPUs; load average {[round(x, 1) for x in load0]} -> "
            f"{[round(x, 1) for x in os.getloadavg()]} over {time.time() - t0:.0f} s (other jobs shared the "
            f"machine); {os.cpu_count()} busy-looping processes got {cores[0]:.2f} cores before and {after}."
        )
        record = make_record(
            name=args.name,
            figures=[_cores_figure(cores), *gpu_vs_cpu_tier(rows, pcie), *figures(rows, main_sys)],
            config=vars(args),
            command=["python", *sys.argv],
            metrics={"rows": rows, "main": main_sys, "available_cores": cores, "pcie": pcie},
            notes=notes,
        )
        print("record:", write_record(record), flush=True)

    rows = _measure(args, data, on_case=save)
    cores.append(available_cores(0.5))
    print(f"available cores before/after: {cores[0]:.2f} / {cores[1]:.2f} of {os.cpu_count()}", flush=True)
    save(rows)


if __name__ == "__main__":
    main()
