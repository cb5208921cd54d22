"""Why the fork writer was slow to durable, by measurement: page-cache writes, then serial checksums.

The forked child cannot use carina.io (a child of a multi-threaded process must
not start threads), so it wrote with buffered ``pwrite`` and fsync and then
checksummed. It now forks a grandchild that writes the arena with ``O_DIRECT``
while it checksums (carina.ckpt.forkwrite). One process saves a synthetic state
of ``--size-mb`` with (no training; ``carina ckpt bench``'s loop, ``quick_bench``):

- ``carina-fork`` (the writer as shipped: an O_DIRECT grandchild keeping ``forkwrite.DEPTH`` writes
  in flight through its own io_uring ring, checksums meanwhile),
- ``carina-fork-qd1`` (the same grandchild with one synchronous write at a time: session 7's writer),
- ``carina-fork-direct-serial`` (the child writes with O_DIRECT itself, then checksums),
- ``carina-fork-buffered`` (the child's old path: buffered pwrite + fsync, then checksums),
- ``carina-process`` (carina.io, O_DIRECT, checksums overlapped with the writes),
- ``torch.save`` (+fsync: buffered, as the old child),

and the disk's O_DIRECT write bandwidth (fio when present) in the same run; the
figure is each writer's time until durable (``save()`` called to ``latest`` naming
the new checkpoint, fsynced) against ``bytes / bandwidth``. ``done_s`` adds
retention (``keep_last=1`` deletes the previous save; on a filesystem mounted with
``discard`` an unlink trims every block), which the writer runs after the commit
and before its next job.
``metrics.fork_fault`` times a checksum of a touched shared mapping of the same
size here and in a forked child: fork() does not copy a shared mapping's page
tables, so every forked writer faults the whole arena in again (the persistent
``process`` writer maps each arena once).

    python benchmarks/ckpt/bench_fork_write.py --size-mb 1024 --reps 3
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_stall import disk_ceiling
from stall_record import env

from carina.ckpt import commit, forkwrite
from carina.ckpt.checksum import BACKEND
from carina.ckpt.quickbench import quick_bench
from carina.core.bench import Figure, make_record, write_record


def _buffered(path: str, data: memoryview) -> Any:
    commit.write_file(path, data)
    return lambda: None


#: variant -> the child's writer (the child inherits the patched module attribute at fork).
VARIANTS = {
    "carina-fork-qd1": functools.partial(forkwrite.forked_write, aligned=commit.serial_direct),
    "carina-fork-direct-serial": commit.pwrite_file,
    "carina-fork-buffered": _buffered,
}


def fork_variant(name: str, size_mb: int, reps: int, root: str) -> dict[str, Any]:
    """The fork writer with another child writer (one of VARIANTS)."""
    shipped = forkwrite.forked_write
    forkwrite.forked_write = VARIANTS[name]
    try:
        [row] = quick_bench(size_mb, reps, ["fork"], root, torch_save=False)
    finally:
        forkwrite.forked_write = shipped
    return {**row, "method": name}


def fault_cost(size_mb: int) -> dict[str, float]:
    """Checksum a touched shared anonymous mapping (an arena) here and in a forked child: the child's extra time.

    fork() does not copy the page tables of a shared mapping, so each forked process faults every page of
    the arena in again before it can read it (writing it with O_DIRECT or checksumming it alike).
    """
    import mmap
    import os
    import time

    from carina.ckpt.checksum import crc32

    mm = mmap.mmap(-1, size_mb << 20, flags=mmap.MAP_SHARED)
    view = memoryview(mm)
    for off in range(0, len(mm), 64 << 20):
        mm[off : off + (64 << 20)] = b"\1" * min(64 << 20, len(mm) - off)
    t0 = time.perf_counter()
    crc32(view)
    here = time.perf_counter() - t0
    read_fd, write_fd = os.pipe()
    if (pid := os.fork()) == 0:
        t0 = time.perf_counter()
        crc32(view)
        os.write(write_fd, repr(time.perf_counter() - t0).encode())
        os._exit(0)
    os.close(write_fd)
    child = float(os.read(read_fd, 64))
    os.close(read_fd)
    os.waitpid(pid, 0)
    view.release()
    mm.close()
    gib = size_mb / 1024
    return {"crc_here_s": round(here, 4), "crc_in_fork_child_s": round(child, 4),
            "child_extra_s_per_GiB": round((child - here) / gib, 4)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"fork variants run, of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-forkw-"))
    root.mkdir(parents=True, exist_ok=True)
    nbytes = args.size_mb << 20
    bw, src = disk_ceiling(root, nbytes)
    rows = quick_bench(args.size_mb, args.reps, ["fork", "process"], str(root))  # + torch.save
    rows[1:1] = [fork_variant(name, args.size_mb, args.reps, str(root)) for name in variants]
    bound = 1.2 * nbytes / bw + 0.5
    for r in rows:
        r["durable_GBps"] = round(nbytes / r["durable_s"] / 1e9, 3)
        r["of_disk_bw"] = round(nbytes / r["durable_s"] / bw, 3)
        r["within_bound"] = r["durable_s"] <= bound
    by = {r["method"]: r["durable_s"] for r in rows}
    done = {r["method"]: r["done_s"] for r in rows}
    figures = []
    for m in ("carina-fork", *variants):
        figures.append(Figure(name=f"time_to_durable_{m.removeprefix('carina-')}", value=round(by[m], 4), unit="s",
                              higher_is_better=False, ceiling=round(nbytes / bw, 4),
                              ceiling_source=f"bytes / {src} ({bw / 1e9:.2f} GB/s, same run)",
                              peers={p: round(v, 4) for p, v in by.items() if p != m}))  # fmt: skip
    figures.append(Figure(name="retention_s_fork", value=round(done["carina-fork"] - by["carina-fork"], 4), unit="s",
                          higher_is_better=False, ceiling_source="none: retention deletes the previous save",
                          peers={p: round(done[p] - v, 4) for p, v in by.items() if p != "carina-fork"}))  # fmt: skip
    metrics = {"summary": rows, "state_bytes": nbytes, "disk_write_Bps": bw, "disk_ceiling_source": src,
               "durable_bound_s": bound, "checksum_backend": BACKEND,
               "fork_fault": fault_cost(args.size_mb)}  # fmt: skip
    notes = (
        f"synthetic {args.size_mb} MiB state saved {args.reps} times per writer (the first two saves of "
        "each carina writer, which allocate its two arenas, left out; medians), no training; durable = until latest "
        "names the save (fsynced), done = also retention (keep_last=1 deletes the previous save); carina-fork-qd1 "
        "is the fork writer with one direct write in flight (session 7's), carina-fork-buffered is "
        "the fork writer with its child's pre-O_DIRECT path (buffered, then checksums), "
        "carina-fork-direct-serial with O_DIRECT but the checksums after the writes, carina-fork the grandchild "
        f"writing while the child checksums; bound = 1.2 x bytes / disk bw + 0.5 s; checksums {BACKEND}."
    )
    rec = make_record(name=args.name or "ckpt_fork_write_cpu", figures=figures, config=vars(args), metrics=metrics,
                      notes=notes, environment=env())  # fmt: skip
    print(write_record(rec), file=sys.stderr)
    for r in rows:
        print(r, file=sys.stderr)


if __name__ == "__main__":
    main()
