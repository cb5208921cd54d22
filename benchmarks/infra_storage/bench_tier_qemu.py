"""The tier end to end with a real client (qemu-img's own NBD client) where fio and libnbd are missing.

Systems, all started at once per block size: ``nvcomp`` (the GPU engine, nvCOMP batches of ``--codec``), ``torch``
(the GPU engine, ZVC kernels), ``inline`` (the CPU middle tier: header and payload in one process, ``--codec``),
``thread`` / ``process`` (``--workers`` codec threads / worker processes), ``forward`` (codec raw: the tier with no
payload work, the ceiling of any engine end to end); ``<system>-fe<N>`` is that system as ``N`` front-end processes
(``--clients`` qemu-img processes drive it; ``--server-cpus`` pins every server to the same cores).
Loads: fill (``qemu-img convert``, 16 in flight; then ``qemu-img compare`` checks every export bit-exact), reads
and writes at queue depth 32 (``qemu-img bench``; its writes carry a constant pattern byte).
Data: Python sources and shared libraries, all-zero blocks dropped (every block exercises the codec).

Run: python benchmarks/infra_storage/bench_tier_qemu.py --device cuda --systems nvcomp,torch,inline,process,forward \
    --main nvcomp,torch --codec lz4 [--qemu-img PATH]
Writes <results>/<machine>/<name>.json after each block size (CARINA_RESULTS_DIR overrides the folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from carina.core.bench import Figure, make_record, write_record
from carina.infra.storage.config import parse_size
from carina.infra.storage.enginebench import payload_dataset
from carina.infra.storage.qemuload import QemuLoadConfig, run_qemu_load

OPS = ("read", "write_const", "fill")


def _forward(got: dict[str, dict[str, Any]], system: str) -> dict[str, Any] | None:
    """The ``forward`` row with as many front ends as ``system`` (``torch-fe4``: ``forward-fe4``), else ``forward``."""
    _, sep, fe = system.rpartition("-fe")
    return got.get(f"forward-fe{fe}") if sep and f"forward-fe{fe}" in got else got.get("forward")


def _ratios(got: dict[str, dict[str, Any]], main: str, base: str, lab: str) -> list[Figure]:
    """``main``/``base`` per load, with forward/``base`` (no payload work at all) as the ceiling."""
    fwd = _forward(got, main)
    out = []
    for op in OPS:
        key = f"{op}_mb_s"
        if main in got and base in got and got[base][key] > 0:
            out.append(Figure(name=f"{main}_vs_{base}_{op}_{lab}", value=got[main][key] / got[base][key], unit="x",
                              ceiling=fwd[key] / got[base][key] if fwd else None,
                              ceiling_source=f"forward (no payload work) over {base}, this run"))  # fmt: skip
    return out


def figures(rows: list[dict[str, Any]], mains: list[str], base: str) -> list[Figure]:
    """Per block and load: the first main's MB/s (peers: the others; ceiling: ``forward``) and CPU/GB; every
    main's MB/s over ``base``'s."""
    out: list[Figure] = []
    ran = {r["system"] for r in rows}
    mains = [m for m in mains if m in ran] or mains  # a main that could not start (its reason is in the log)
    main = mains[0]
    for block in sorted({r["block"] for r in rows}):
        got = {r["system"]: r for r in rows if r["block"] == block}
        if main not in got:
            continue
        lab = f"{block >> 10}k"
        fwd = _forward(got, main)
        for op in OPS:
            key = f"{op}_mb_s"
            ceil = fwd[key] if fwd and not main.startswith("forward") else None
            out.append(Figure(name=f"{op}_mb_s_{lab}", value=got[main][key], unit="MB/s", ceiling=ceil,
                              ceiling_source="the same tier with codec raw (no payload work), this run",
                              peers={s: r[key] for s, r in got.items() if s != main}))  # fmt: skip
            out.append(Figure(name=f"{op}_cpu_s_per_gb_{lab}", value=got[main][f"{op}_cpu_s_per_gb"], unit="s/GB",
                              higher_is_better=False,
                              peers={s: r[f"{op}_cpu_s_per_gb"] for s, r in got.items() if s != main}))  # fmt: skip
        for m in mains:
            for b in base.split(","):  # several bases: e.g. the one-process tier and the same tier on N processes
                out += _ratios(got, m, b, lab)
        out.append(
            Figure(
                name=f"verified_{lab}",
                value=min(r["fill_verified"] for r in got.values()),
                unit="bool",
                ceiling=1.0,
                ceiling_source="qemu-img compare of every export with the data set after fill",
            )
        )
        out.append(Figure(name=f"ratio_{lab}", value=got[main]["fill_ratio"], unit="x",
                          peers={s: r["fill_ratio"] for s, r in got.items() if s != main}))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--systems", default="torch,inline,thread,forward")
    ap.add_argument("--blocks", default="4K,64K")
    ap.add_argument("--codec", default="zlib", help="codec of the CPU systems")
    ap.add_argument("--workers", type=int, default=8, help="workers of the thread and process systems")
    ap.add_argument("--gpu-workers", type=int, default=2, help="launch threads of the torch and nvcomp systems")
    ap.add_argument("--device", default="auto", help="torch engine device")
    ap.add_argument("--data", type=parse_size, default=32 << 20, help="data set (and export) bytes")
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--qemu-img", default="qemu-img")
    ap.add_argument("--clients", type=int, default=1, help="qemu-img processes per load (sharing queue depth 32)")
    ap.add_argument("--server-cpus", default="", help="taskset -c list for every server (the same cores for all)")
    ap.add_argument("--client-cpus", default="", help="taskset -c list for the qemu-img clients")
    ap.add_argument("--main", default="torch", help="system(s) compared with --base; the first gets every figure")
    ap.add_argument("--base", default="inline", help="system(s) the mains are divided by (comma-separated)")
    ap.add_argument("--name", default="infra_storage_tier_qemu")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    cfg = QemuLoadConfig(systems=args.systems.split(","), blocks=[parse_size(b) for b in args.blocks.split(",")],
                         codec=args.codec, workers=args.workers, gpu_workers=args.gpu_workers, device=args.device,
                         seconds=args.seconds, rounds=args.rounds, qemu_img=args.qemu_img, clients=args.clients,
                         server_cpus=args.server_cpus, client_cpus=args.client_cpus)  # fmt: skip
    load0 = os.getloadavg()

    def save(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        if args.no_record:
            return
        notes = (f"qemu-img {args.qemu_img} as the NBD client (its own, not libnbd); fill = qemu-img convert -m 16 -W, "
                 "read/write = qemu-img bench -d 32 (sequential offsets, writes carry a constant pattern byte). "
                 f"CPU systems and nvcomp use {args.codec}; torch runs ZVC; GPU engines on {args.device} with "
                 f"{args.gpu_workers} launch threads, thread/process pools {args.workers} workers "
                 "(per front end; -fe<N>: N front-end processes). "
                 f"{args.clients} qemu-img client(s) per load sharing queue depth 32 (fill: one slice each); "
                 f"servers pinned to CPUs [{args.server_cpus or 'all'}], clients to [{args.client_cpus or 'all'}]. "
                 "Server CPU from /proc. "
                 f"{os.cpu_count()} CPUs, load average {[round(x, 1) for x in load0]} -> "
                 f"{[round(x, 1) for x in os.getloadavg()]}.")  # fmt: skip
        record = make_record(name=args.name, figures=figures(rows, args.main.split(","), args.base), config=vars(args),
                             command=["python", *sys.argv], metrics={"rows": rows}, notes=notes)  # fmt: skip
        print("record:", write_record(record), flush=True)

    with tempfile.TemporaryDirectory(prefix="carina-qemu-load-") as tmp:
        image = Path(tmp) / "data.raw"
        image.write_bytes(payload_dataset(args.data, 64 << 10))
        run_qemu_load(cfg, image, work=Path(tmp), on_block=save)


if __name__ == "__main__":
    main()
