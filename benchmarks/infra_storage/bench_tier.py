"""Throughput of the storage middle tier vs a plain NBD server, with real clients (fio, nbdcopy).

Run: .venv/bin/python benchmarks/infra_storage/bench_tier.py [--quick] [--codec zlib]
Writes benchmarks/results/<machine>/infra_storage_tier.json (infra_storage_tier_<codec>.json for codecs
other than lz4).
"""

from __future__ import annotations

import argparse
import json
import sys

from carina.infra.storage.loadtest import BenchConfig, run_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small image, one short run (smoke test)")
    ap.add_argument("--image-mib", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--codec", default="lz4", choices=["lz4", "zstd", "zlib"])
    ap.add_argument("--systems", default="process,inline,forward,nbdkit", help="comma-separated systems to run")
    ap.add_argument("--main", default="process", help="system the record's figures are about")
    ap.add_argument("--name", default="", help="record name (default infra_storage_tier[_<codec>])")
    ap.add_argument("--clients", type=int, default=1, help="fio connections sharing queue depth 32 (-fe<N> systems)")
    ap.add_argument("--notes", default="", help="added to the record's notes (e.g. what else ran on the machine)")
    args = ap.parse_args()
    systems = args.systems.split(",")
    if args.quick:
        cfg = BenchConfig(
            image_bytes=32 << 20,
            seconds=1.0,
            runs=1,
            workers=args.workers,
            codec=args.codec,
            systems=systems,
            clients=args.clients,
        )
    else:
        cfg = BenchConfig(
            image_bytes=args.image_mib << 20,
            seconds=args.seconds,
            runs=args.runs,
            workers=args.workers,
            codec=args.codec,
            systems=systems,
            clients=args.clients,
        )
    result = run_bench(
        cfg, record=not args.quick, command=["python", *sys.argv], name=args.name, main=args.main, notes=args.notes
    )
    for row in result["rows"]:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
    print(json.dumps({"ceilings": result["ceilings"], "record": result.get("record")}))


if __name__ == "__main__":
    main()
