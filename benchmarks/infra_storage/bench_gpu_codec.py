"""The torch ZVC codec on a device: kernel throughput, PCIe copies, and the whole torch engine path.

Three numbers per block size, all on the same data (Python sources and shared
libraries, all-zero blocks dropped):

* ``kernel``: the torch engine's device work on blocks already in device memory
  (one launch sequence per batch of ``--batch``): compress = ``pack_rows`` plus the
  CRC-32 of every stored block (``RowCrc32``), decompress = CRC check plus
  ``unpack_rows``; bit-exact round trip and zlib-equal CRCs checked;
* ``pcie``: pinned host -> device and device -> host copies of the same batch
  (the bound for any codec that must move payloads over PCIe);
* ``engine`` (unless ``--engine-data 0``): the tier's ``torch`` payload engine end to
  end (arena, registered for DMA -> device -> kernels and CRCs -> arena).

nvCOMP (GPU LZ4/zstd/deflate) is not installed on these machines, so ZVC is the
only GPU codec measured. Run: ``python benchmarks/infra_storage/bench_gpu_codec.py --device cuda``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from carina.core.bench import Figure, make_record, write_record
from carina.infra.storage.codecs import Codec
from carina.infra.storage.config import EngineConfig, EngineKind, parse_size
from carina.infra.storage.enginebench import engine_rate, payload_dataset


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best(fn: Any, torch: Any, device: str, reps: int) -> float:
    """Best wall seconds of ``reps`` calls of ``fn`` (after one warm-up call)."""
    fn()
    _sync(torch, device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(data: bytes, *, block: int, batch_bytes: int, device: str, reps: int) -> dict[str, Any]:
    """Kernel and PCIe GB/s for one block size."""
    import zlib

    import torch

    from carina.infra.storage.crc import row_crc32
    from carina.infra.storage.zvc import pack_rows, unpack_rows

    n = max(1, min(batch_bytes, len(data)) // block)
    host = torch.frombuffer(bytearray(data[: n * block]), dtype=torch.uint8).view(n, block)
    pinned = host.pin_memory() if device.startswith("cuda") else host.clone()
    dev = pinned.to(device)
    crc = row_crc32(block, device)
    nbytes = n * block
    out: dict[str, Any] = {"block": block, "blocks": n, "batch_bytes": nbytes}
    out["h2d_gb_s"] = nbytes / _best(lambda: dev.copy_(pinned, non_blocking=True), torch, device, reps) / 1e9
    out["d2h_gb_s"] = nbytes / _best(lambda: pinned.copy_(dev, non_blocking=True), torch, device, reps) / 1e9
    packed: list[Any] = [None]

    def compress() -> None:
        rows, codec, size = pack_rows(dev)
        packed[0] = (rows, codec, size, crc(rows, size))

    def decompress() -> Any:
        rows, codec, size, want = packed[0]
        same = crc(rows, size) == want
        blocks, ok = unpack_rows(rows, codec, size)
        return blocks, same & ok

    out["compress_gb_s"] = nbytes / _best(compress, torch, device, reps) / 1e9
    restored: list[Any] = [None]
    out["decompress_gb_s"] = nbytes / _best(lambda: restored.__setitem__(0, decompress()), torch, device,
                                            reps) / 1e9  # fmt: skip
    blocks, good = restored[0]
    rows, _, size, crcs = packed[0]
    out["bit_exact"] = bool(torch.equal(blocks, dev)) and bool(good.all())
    first = rows[0, : int(size[0])].cpu().numpy().tobytes()
    out["crc_matches_zlib"] = int(crcs[0]) == zlib.crc32(first)
    out["ratio"] = nbytes / float(torch.clamp(size, min=0).sum().clamp(min=1))
    out["zvc_share"] = float((size < block).to(torch.float32).mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--blocks", default="4K,64K")
    ap.add_argument("--data", type=parse_size, default=256 << 20)
    ap.add_argument("--batch", type=parse_size, default=64 << 20, help="bytes per kernel launch batch")
    ap.add_argument("--request", type=parse_size, default=1 << 20, help="bytes per engine request (engine path)")
    ap.add_argument("--engine-data", type=parse_size, default=16 << 20, help="data set bytes of the engine path")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="launch threads of the torch engine (engine path)")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--name", default="infra_storage_gpu_codec")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    figs: list[Figure] = []
    for block in (parse_size(b) for b in args.blocks.split(",")):
        data = payload_dataset(args.data, block)
        row = measure(data, block=block, batch_bytes=args.batch, device=args.device, reps=args.reps)
        if args.engine_data:
            cfg = EngineConfig(kind=EngineKind.TORCH, device=args.device, workers=args.workers)
            batch = max(1, args.request // block)
            eng = engine_rate(cfg, Codec.ZVC, data[: args.engine_data], block=block, batch=batch,
                              streams=args.streams, seconds=args.seconds)  # fmt: skip
            row.update({f"engine_{k}": v for k, v in eng.items() if k.endswith(("mb_s", "per_gb", "ratio"))})
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        lab = f"{block >> 10}k"
        pcie = {"pcie_h2d_pinned": row["h2d_gb_s"], "pcie_d2h_pinned": row["d2h_gb_s"]}
        figs += [
            Figure(name=f"zvc_kernel_compress_gb_s_{lab}", value=row["compress_gb_s"], unit="GB/s", peers=pcie),
            Figure(name=f"zvc_kernel_decompress_gb_s_{lab}", value=row["decompress_gb_s"], unit="GB/s", peers=pcie),
            Figure(name=f"zvc_ratio_{lab}", value=row["ratio"], unit="x"),
        ]  # fmt: skip
        if args.engine_data:
            figs += [
                Figure(name=f"zvc_engine_compress_mb_s_{lab}", value=row["engine_compress_mb_s"], unit="MB/s",
                       ceiling=row["h2d_gb_s"] * 1e3, ceiling_source="pinned H2D copy of the same batch, this run"),
                Figure(name=f"zvc_engine_decompress_mb_s_{lab}", value=row["engine_decompress_mb_s"], unit="MB/s",
                       ceiling=row["d2h_gb_s"] * 1e3, ceiling_source="pinned D2H copy of the same batch, this run"),
            ]  # fmt: skip
        if not (row["bit_exact"] and row["crc_matches_zlib"]):
            raise SystemExit(f"ZVC round trip or CRC on {args.device} was not bit-exact at block {block}")
    if args.no_record:
        return
    notes = (f"torch ZVC codec on {args.device}; kernel figures are device-resident batches of {args.batch} B "
             "(best of reps, after a warm-up): pack_rows + RowCrc32 (compress), RowCrc32 + unpack_rows "
             "(decompress), the engine's device work; engine figures run the tier's torch engine end to end "
             "through its arena. nvCOMP is not installed, so no GPU LZ4/zstd/deflate. Data: Python sources and shared "
             "libraries, all-zero blocks dropped (ZVC suits sparse data; text does not shrink).")  # fmt: skip
    record = make_record(name=args.name, figures=figs, config=vars(args), command=["python", *sys.argv],
                         metrics={"rows": rows}, notes=notes)  # fmt: skip
    print("record:", write_record(record))


if __name__ == "__main__":
    main()
