"""The fork writer's time to durable against its variants, process and torch.save, in interleaved rounds.

The forked child cannot use carina.io (a child of a multi-threaded process must
not start threads): it forks a grandchild that writes the arena with ``O_DIRECT``
while it checksums (carina.ckpt.forkwrite). One process saves a synthetic state
of ``--size-mb`` (no training) with each method, one save per method per round,
the order rotated every round (so a drift of the disk is spread over every
method), after two untimed saves per carina writer (its two arenas):

- ``carina-fork`` (the writer as shipped: the grandchild writes one 64 MiB O_DIRECT request at a time),
- ``carina-fork-queued`` (the grandchild keeps ``forkwrite.DEPTH`` x ``forkwrite.CHUNK``, 8 x 16 MiB, in
  flight through its own io_uring ring: session 8's default),
- ``carina-fork-queued-4x64`` (the same ring with 4 x 64 MiB in flight),
- ``carina-fork-direct-serial`` (the child writes with O_DIRECT itself, then checksums),
- ``carina-fork-buffered`` (the child's first path: buffered pwrite + fsync, then checksums),
- ``carina-process`` (carina.io, O_DIRECT, checksums overlapped with the writes),
- ``torch.save`` (+fsync: buffered; the previous file deleted untimed),

and the disk's O_DIRECT write bandwidth in the same run (``bench_stall.disk_ceiling``:
fio when present, else the best of several carina.io passes after an untimed one).
Each save's figures are kept (``metrics.per_save``); the summary gives medians,
the spread and whether each writer is within the bound ``1.2 x bytes / bw + 0.5 s``.
Durable is ``save()`` called to ``latest`` naming the save (fsynced); done adds
retention (``keep_last=1`` deletes the previous save). During every save the
io-wq worker threads (``iou-wrk-*``) of this process's descendants are counted
(``io_wq_workers_max``): io_uring hands a write it cannot issue without blocking
to those kernel workers, which is what a queued grandchild's queue depth rests on.
``metrics.fork_fault`` times a checksum of a touched shared mapping here and in a
forked child (fork() does not copy a shared mapping's page tables: every forked
writer faults the arena in again).
The record is rewritten after every round.

    python benchmarks/ckpt/bench_fork_write.py --size-mb 512 --reps 4
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_stall import disk_ceiling
from stall_record import env

from carina.ckpt import commit, forkwrite
from carina.ckpt.checksum import BACKEND
from carina.ckpt.quickbench import timed_save, torch_save_fsync
from carina.core.bench import Figure, make_record, write_record


def _buffered(path: str, data: memoryview) -> Any:
    commit.write_file(path, data)
    return lambda: None


_QUEUED_4X64 = functools.partial(forkwrite.queued_direct, depth=4, chunk=64 << 20)
#: variant -> the child's ``forked_write`` (the child inherits the patched module attribute at fork).
VARIANTS = {
    "carina-fork-queued": functools.partial(forkwrite.forked_write, aligned=forkwrite.queued_direct),
    "carina-fork-queued-4x64": functools.partial(forkwrite.forked_write, aligned=_QUEUED_4X64),
    "carina-fork-direct-serial": commit.pwrite_file,
    "carina-fork-buffered": _buffered,
}
FIELDS = ("blocking_s", "durable_s", "done_s", "io_wq_workers_max")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The fork writer's child writing like ``name`` (as shipped for any other name)."""
    shipped = forkwrite.forked_write
    forkwrite.forked_write = VARIANTS.get(name, shipped)
    try:
        yield
    finally:
        forkwrite.forked_write = shipped


def _descends(pid: int, me: int, depth: int = 4) -> bool:
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])  # ppid
        except (OSError, ValueError, IndexError):
            return False
        if pid == me:
            return True
    return False


class IoWqWorkers:
    """The most ``iou-wrk-*`` threads of this process's descendants at once while open (sampled every 5 ms).

    Threads that existed when it opened (a persistent writer's idle workers) are not counted.
    """

    def __init__(self) -> None:
        self.max = 0
        self._stop = threading.Event()
        self._before = self._workers()
        self._thread = threading.Thread(target=self._run, name="iou-wrk-count", daemon=True)

    @staticmethod
    def _workers() -> set[str]:
        me, owners, out = os.getpid(), dict[str, bool](), set()
        for comm in Path("/proc").glob("[0-9]*/task/*/comm"):
            try:
                if comm.read_text().startswith("iou-wrk"):
                    owner = comm.parts[2]
                    if owner not in owners:
                        owners[owner] = _descends(int(owner), me)
                    if owners[owner]:
                        out.add(comm.parts[4])
            except (OSError, ValueError):
                continue
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.max = max(self.max, len(self._workers() - self._before))

    def __enter__(self) -> IoWqWorkers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def fault_cost(size_mb: int) -> dict[str, float]:
    """Checksum a touched shared anonymous mapping (an arena) here and in a forked child: the child's extra time.

    fork() does not copy the page tables of a shared mapping, so each forked process faults every page of
    the arena in again before it can read it (writing it with O_DIRECT or checksumming it alike).
    """
    import mmap
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


def one_save(name: str, ckpt: Any, step: int, state: dict[str, Any], tdir: Path) -> dict[str, float]:
    """One timed save of ``name`` (a carina method through ``ckpt``, or ``torch.save``)."""
    if name == "torch.save":
        took = torch_save_fsync(str(tdir), state, step)
        (tdir / f"{step - 1}.pt").unlink(missing_ok=True)  # untimed: keep one file, like keep_last=1
        return {"blocking_s": took, "durable_s": took, "done_s": took, "io_wq_workers_max": 0}
    with variant(name), IoWqWorkers() as workers:
        blocking, durable, done = timed_save(ckpt, step, state)
    return {"blocking_s": blocking, "durable_s": durable, "done_s": done, "io_wq_workers_max": workers.max}


def rounds(args: Any, methods: list[str], root: Path, on_round: Any) -> dict[str, list[dict[str, float]]]:
    """Warm every carina method (two saves), then ``--reps`` rounds of one save each, order rotated."""
    import torch

    from carina.ckpt.checkpointer import Checkpointer
    from carina.ckpt.config import CheckpointConfig
    from carina.ckpt.writers import WriterKind

    state = {"blob": torch.randn(args.size_mb << 18)}  # 4-byte floats: size_mb MiB
    per: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    (root / "torch").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        ckpts: dict[str, Any] = {}
        for m in methods:
            if m != "torch.save":
                kind = WriterKind.PROCESS if m == "carina-process" else WriterKind.FORK
                cfg = CheckpointConfig(dir=str(root / m), writer=kind, keep_last=1)
                ckpts[m] = stack.enter_context(Checkpointer(cfg))
        for step in (1, 2):  # untimed: each checkpointer maps (and pins) one arena per save
            for m, ckpt in ckpts.items():
                one_save(m, ckpt, step, state, root / "torch")
        for rep in range(args.reps):
            for m in methods[rep % len(methods) :] + methods[: rep % len(methods)]:
                per[m].append(one_save(m, ckpts.get(m), rep + 3, state, root / "torch"))
            on_round(per)
    return per


def summarize(per: dict[str, list[dict[str, float]]], nbytes: int, bw: float) -> list[dict[str, Any]]:
    """Per method: medians, the durable spread, GB/s, share of the disk bandwidth, within the bound."""
    bound = 1.2 * nbytes / bw + 0.5
    rows = []
    for m, saves in per.items():
        durable = [s["durable_s"] for s in saves]
        row: dict[str, Any] = {"method": m, "saves": len(saves)}
        row.update({f: statistics.median(s[f] for s in saves) for f in FIELDS})
        row.update({"durable_min_s": min(durable), "durable_max_s": max(durable),
                    "durable_GBps": round(nbytes / row["durable_s"] / 1e9, 3),
                    "of_disk_bw": round(nbytes / row["durable_s"] / bw, 3),
                    "within_bound": row["durable_s"] <= bound})  # fmt: skip
        rows.append(row)
    return rows


def record(args: Any, per: dict[str, list[dict[str, float]]], bw: float, src: str, fault: dict[str, float]) -> Any:
    """The benchmark record: one figure per carina method (its median time to durable), peers the others."""
    nbytes = args.size_mb << 20
    rows = summarize({m: s for m, s in per.items() if s}, nbytes, bw)
    by = {r["method"]: r["durable_s"] for r in rows}
    figures = [Figure(name=f"time_to_durable_{m.removeprefix('carina-')}", value=round(v, 4), unit="s",
                      higher_is_better=False, ceiling=round(nbytes / bw, 4),
                      ceiling_source=f"bytes / {src} ({bw / 1e9:.2f} GB/s, same run)",
                      peers={p: round(w, 4) for p, w in by.items() if p != m})
               for m, v in by.items() if m.startswith("carina-")]  # fmt: skip
    per_save = {m: [{f: round(v, 4) for f, v in s.items()} for s in saves] for m, saves in per.items()}
    metrics = {"summary": rows, "per_save": per_save, "state_bytes": nbytes, "disk_write_Bps": bw,
               "disk_ceiling_source": src, "durable_bound_s": 1.2 * nbytes / bw + 0.5, "checksum_backend": BACKEND,
               "fork_fault": fault}  # fmt: skip
    notes = (
        f"synthetic {args.size_mb} MiB state, no training; {args.reps} rounds of one save per method, the order "
        "rotated each round, after two untimed saves per carina writer (its two arenas); summary = medians (and "
        "the durable min/max), metrics.per_save every save; durable = until latest names the save (fsynced), "
        "done = also retention (keep_last=1); carina-fork writes one 64 MiB O_DIRECT request at a time from its "
        "grandchild (shipped), carina-fork-queued keeps 8 x 16 MiB in flight through io_uring (session 8's "
        "default), carina-fork-queued-4x64 4 x 64 MiB; io_wq_workers_max = new iou-wrk threads of this "
        f"process's descendants during the save; bound = 1.2 x bytes / disk bw + 0.5 s; checksums {BACKEND}."
    )
    return make_record(name=args.name or "ckpt_fork_write_cpu", figures=figures, config=vars(args),
                       metrics=metrics, notes=notes, environment=env())  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--reps", type=int, default=4, help="rounds: one timed save per method each")
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--variants", default="carina-fork-queued", help=f"fork variants run, of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    forkwrite.prepare()  # the ring module imported here: a forked child must not import
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-forkw-"))
    root.mkdir(parents=True, exist_ok=True)
    bw, src = disk_ceiling(root, args.size_mb << 20)
    fault = fault_cost(args.size_mb)
    methods = ["carina-fork", *variants, "carina-process", "torch.save"]

    def on_round(per: dict[str, list[dict[str, float]]]) -> None:
        print(write_record(record(args, per, bw, src, fault)), file=sys.stderr, flush=True)

    try:
        per = rounds(args, methods, root / "run", on_round)
    finally:
        shutil.rmtree(root / "run", ignore_errors=True)
    for row in summarize(per, args.size_mb << 20, bw):
        print(row, file=sys.stderr)


if __name__ == "__main__":
    main()
