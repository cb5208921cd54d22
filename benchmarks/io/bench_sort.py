"""External sort of uint64 keys at least 4x larger than its memory budget, through carina.io.

Phase 1 reads the input in runs of ``budget / 8`` bytes, sorts each on the
device (``torch.sort``; uint64 order through the sign-bit flip of int64) and
writes it back; the next run's read and the last run's write overlap the sort.
Phase 2 merges all runs at once: each run streams through two blocks of
``budget / (8 * runs)`` bytes (one in use, one being read ahead); each step
takes from every run the keys up to the smallest last key among the current
blocks, sorts them (``torch.sort`` on CUDA, NumPy's run-aware stable sort on
CPU) and appends them to one of two output buffers written behind the merge.
Budget: 2 input + 2 output host buffers and the device sort's three arrays in
phase 1 (7/8 of it); blocks, candidates and output buffers in phase 2.

The disk-bound floor: the keys are read and written twice (runs, merge), so
floor = 2 * size / read rate + 2 * size / write rate, with both rates measured
in the same run (fio, or large sequential ``O_DIRECT`` reads and writes).
Reported: size / wall in GB/s and floor / wall (goal >= 0.8); the peer is the
same sort with every read and write waited for at once. The output file is
checked after the timed part: sorted, and the same count, sum, xor and sum of
squares (mod 2^64) as the input.

Usage: python benchmarks/io/bench_sort.py --device cuda --size 4G --budget 1G
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk_ceiling import find_fio, read_ceiling, write_ceiling

from carina.core.bench import Figure, make_record, write_record
from carina.io import FileHandle, IOConfig, IOEngine, aligned_buffer
from carina.io.workload import parse_size

CHUNK = 4 << 20
DEPTH = 4  # blocks per run in the merge: one in use, three read ahead
OUT_SLOTS = 4  # output slots in the merge: one filling, three being written
SIGN = -(1 << 63)


def checksum(keys: np.ndarray, acc: np.ndarray | None = None) -> np.ndarray:
    """Running (count, sum, xor, sum of squares) of uint64 keys, all mod 2^64."""
    acc = np.zeros(4, dtype=np.uint64) if acc is None else acc
    with np.errstate(over="ignore"):
        acc += np.array([len(keys), keys.sum(dtype=np.uint64), 0, (keys * keys).sum(dtype=np.uint64)], dtype=np.uint64)
        acc[2] ^= np.bitwise_xor.reduce(keys) if len(keys) else np.uint64(0)
    return acc


def device_sort(keys: np.ndarray, device: str) -> np.ndarray:
    """Sort uint64 ``keys`` with torch.sort on ``device``; returns a host array."""
    t = torch.from_numpy(keys.view(np.int64)).to(device) ^ SIGN  # unsigned order as signed order
    t = torch.sort(t).values ^ SIGN
    return t.cpu().numpy().view(np.uint64)


def device_sort_into(keys: np.ndarray, out: np.ndarray, device: str) -> None:
    """Sort uint64 ``keys`` on ``device`` straight into ``out`` (host; registered memory on CUDA)."""
    if device == "cpu":
        out[:] = device_sort(keys, device)
        return
    t = torch.from_numpy(keys.view(np.int64)).to(device, non_blocking=True) ^ SIGN
    torch.from_numpy(out.view(np.int64)).copy_(torch.sort(t).values ^ SIGN)


def io_chunks(h: FileHandle, offset: int, buf: np.ndarray) -> list[tuple[FileHandle, int, np.ndarray]]:
    """Jobs of at most CHUNK bytes covering ``buf`` at ``offset``."""
    flat = buf.view(np.uint8)
    return [(h, offset + o, flat[o : o + CHUNK]) for o in range(0, flat.nbytes, CHUNK)]


class Pending:
    """A group of futures of one buffer; ``wait`` returns once all are done."""

    def __init__(self, futs: list[Any]) -> None:
        self.futs = futs

    def wait(self) -> None:
        for f in self.futs:
            f.result()


def write_input(eng: IOEngine, path: Path, nkeys: int, chunk_keys: int, seed: int = 7) -> np.ndarray:
    """Write ``nkeys`` random uint64 keys (NumPy's PCG64, the same on every machine); return their checksum."""
    h = eng.open(path, "w", size=nkeys * 8)
    bufs = [aligned_buffer(chunk_keys * 8).view(np.uint64) for _ in range(2)]
    pending: list[Pending | None] = [None, None]
    acc = checksum(np.empty(0, dtype=np.uint64))
    gen = np.random.default_rng(seed)
    for n, start in enumerate(range(0, nkeys, chunk_keys)):
        count = min(chunk_keys, nkeys - start)
        slot = n % 2
        if pending[slot] is not None:
            pending[slot].wait()  # type: ignore[union-attr]
        out = bufs[slot][:count]
        out[:] = gen.integers(np.iinfo(np.uint64).max, size=count, dtype=np.uint64, endpoint=True)
        acc = checksum(out, acc)
        pending[slot] = Pending(eng.write_batch(io_chunks(h, start * 8, out), coalesce=False))
    for p in pending:
        if p is not None:
            p.wait()
    eng.fsync(h)
    eng.close_file(h)
    return acc


def make_runs(eng: IOEngine, src: Path, dst: Path, nkeys: int, run_keys: int, device: str, overlap: bool) -> int:
    """Phase 1: sorted runs of ``run_keys`` keys from ``src`` into ``dst``; returns the number of runs."""
    hin, hout = eng.open(src, "r"), eng.open(dst, "w", size=nkeys * 8)
    mem = HostBuffers(device)
    inbufs = [mem.keys(run_keys) for _ in range(2)]
    outbufs = [mem.keys(run_keys) for _ in range(2)]
    starts = list(range(0, nkeys, run_keys))
    reads: list[Pending | None] = [None, None]
    writes: list[Pending | None] = [None, None]

    def issue_read(n: int) -> None:
        count = min(run_keys, nkeys - starts[n])
        reads[n % 2] = Pending(eng.read_batch(io_chunks(hin, starts[n] * 8, inbufs[n % 2][:count]), coalesce=False))

    issue_read(0)
    for n, start in enumerate(starts):
        count = min(run_keys, nkeys - start)
        reads[n % 2].wait()  # type: ignore[union-attr]
        if overlap and n + 1 < len(starts):
            issue_read(n + 1)
        if writes[n % 2] is not None:
            writes[n % 2].wait()  # type: ignore[union-attr]
        out = outbufs[n % 2][:count]
        device_sort_into(inbufs[n % 2][:count], out, device)
        writes[n % 2] = Pending(eng.write_batch(io_chunks(hout, start * 8, out), coalesce=False))
        if not overlap:
            writes[n % 2].wait()  # type: ignore[union-attr]
            if n + 1 < len(starts):
                issue_read(n + 1)
    for w in writes:
        if w is not None:
            w.wait()
    mem.close()
    eng.fsync(hout)
    eng.close_file(hin)
    eng.close_file(hout)
    return len(starts)


class HostBuffers:
    """Aligned host buffers (``O_DIRECT``), page-locked with ``cudaHostRegister`` when sorting on CUDA.

    Registered memory makes the host<->device copies DMA at full speed and lets
    them run ``non_blocking``; :meth:`close` unregisters everything.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self._registered: list[int] = []

    def keys(self, count: int) -> np.ndarray:
        """A zeroed, 4 KiB-aligned uint64 array of ``count`` keys."""
        buf = aligned_buffer(count * 8).view(np.uint64)
        if self.device != "cpu":
            ptr = buf.ctypes.data
            try:
                ok = int(torch.cuda.cudart().cudaHostRegister(ptr, buf.nbytes, 0)) == 0
            except (AttributeError, RuntimeError):  # no cudart binding: pageable copies, still correct
                ok = False
            if ok:
                self._registered.append(ptr)
        return buf

    def close(self) -> None:
        """Unregister every registered buffer."""
        for ptr in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        self._registered.clear()


@dataclass(eq=False)
class RunCursor:
    """One sorted run streaming through a ring of blocks: ``current`` in use, the others read ahead."""

    pos: int  # next key of the run to read
    end: int  # one past the run's last key
    blocks: list[np.ndarray]
    current: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    next_block: int = 0
    ahead: collections.deque[tuple[np.ndarray, Pending]] = field(default_factory=collections.deque)

    def issue(self, eng: IOEngine, h: FileHandle, limit: int) -> None:
        """Read the run's next blocks into free ones until ``limit`` reads are ahead (or the run ends)."""
        while self.pos < self.end and len(self.ahead) < limit:
            count = min(len(self.blocks[0]), self.end - self.pos)
            buf = self.blocks[self.next_block][:count]
            self.next_block = (self.next_block + 1) % len(self.blocks)
            self.ahead.append((buf, Pending(eng.read_batch(io_chunks(h, self.pos * 8, buf), coalesce=False))))
            self.pos += count

    def refill(self, eng: IOEngine, h: FileHandle, overlap: bool) -> None:
        """Called when ``current`` is empty: take the oldest block read ahead and read further."""
        if not self.ahead:
            self.issue(eng, h, 1)
        if not self.ahead:
            return
        buf, pending = self.ahead.popleft()
        pending.wait()
        self.current = buf
        if overlap:  # every block but the current one may be in flight
            self.issue(eng, h, len(self.blocks) - 1)


class OutputRing:
    """Sorted keys go into a ring of aligned slots; a full slot is written while the next ones fill."""

    def __init__(self, eng: IOEngine, h: FileHandle, slots: list[np.ndarray], overlap: bool) -> None:
        self.eng, self.h, self.slots, self.overlap = eng, h, slots, overlap
        self.writes: list[Pending | None] = [None] * len(slots)
        self.which = self.fill = self.written = 0

    def free(self) -> np.ndarray:
        """The writable rest of the current slot (waits for its previous write first)."""
        pending = self.writes[self.which]
        if pending is not None:
            pending.wait()
            self.writes[self.which] = None
        return self.slots[self.which][self.fill :]

    def advance(self, count: int) -> None:
        """``count`` keys were put into :meth:`free`; write the slot out once it is full."""
        self.fill += count
        if self.fill == len(self.slots[self.which]):
            self.flush()

    def flush(self) -> None:
        """Write the current slot's keys and move to the next slot."""
        if not self.fill:
            return
        keys = self.slots[self.which][: self.fill]
        pending = Pending(self.eng.write_batch(io_chunks(self.h, self.written * 8, keys), coalesce=False))
        if not self.overlap:
            pending.wait()
        self.writes[self.which] = pending
        self.written, self.fill, self.which = self.written + self.fill, 0, (self.which + 1) % len(self.slots)

    def close(self) -> None:
        """Flush and wait for every write."""
        self.flush()
        for pending in self.writes:
            if pending is not None:
                pending.wait()


def sorted_into(cand: np.ndarray, out: OutputRing, device: str) -> None:
    """Sort ``cand`` (on ``device``) and append it to ``out`` slot by slot."""
    if device == "cpu":
        cand.sort(kind="stable")  # k sorted pieces: the run-aware sort merges them
        merged: Any = cand
    else:
        t = torch.from_numpy(cand.view(np.int64)).to(device, non_blocking=True) ^ SIGN
        merged = torch.sort(t).values ^ SIGN
    pos = 0
    while pos < len(cand):
        free = out.free()
        take = min(len(cand) - pos, len(free))
        if device == "cpu":
            free[:take] = merged[pos : pos + take]
        else:
            torch.from_numpy(free[:take].view(np.int64)).copy_(merged[pos : pos + take])  # waits for the copy
        pos += take
        out.advance(take)


def merge_runs(
    eng: IOEngine, src: Path, dst: Path, nkeys: int, run_keys: int, budget: int, device: str, overlap: bool
) -> None:
    """Phase 2: merge every run of ``src`` into ``dst``.

    Budget: half for the runs' blocks (``DEPTH`` per run), a quarter for the
    output slots, a quarter for one step's candidates (each step takes about
    one block per run, a sixth of the blocks' share, so it fits).
    """
    nruns = -(-nkeys // run_keys)
    block_keys = max(512, budget // 2 // (8 * nruns * DEPTH) // 512 * 512)
    slot_keys = max(512, budget // 4 // 8 // OUT_SLOTS // 512 * 512)
    hin, hout = eng.open(src, "r"), eng.open(dst, "w", size=nkeys * 8)
    mem = HostBuffers(device)
    runs = []
    for r in range(nruns):
        cur = RunCursor(r * run_keys, min(nkeys, (r + 1) * run_keys), [mem.keys(block_keys) for _ in range(DEPTH)])
        cur.issue(eng, hin, DEPTH - 1 if overlap else 1)
        runs.append(cur)
    for cur in runs:
        cur.refill(eng, hin, overlap)
    out = OutputRing(eng, hout, [mem.keys(slot_keys) for _ in range(OUT_SLOTS)], overlap)
    cand_buf = mem.keys(nruns * block_keys)
    try:
        while True:
            live = [c for c in runs if len(c.current)]
            if not live:
                break
            bound = min(c.current[-1] for c in live)
            fill = 0
            for c in live:
                n = int(np.searchsorted(c.current, bound, side="right"))
                cand_buf[fill : fill + n] = c.current[:n]
                fill += n
                c.current = c.current[n:]
                if not len(c.current):
                    c.refill(eng, hin, overlap)
            sorted_into(cand_buf[:fill], out, device)
        out.close()
    finally:
        mem.close()
    assert out.written == nkeys, f"merged {out.written} of {nkeys} keys"
    eng.fsync(hout)
    eng.close_file(hin)
    eng.close_file(hout)


def verify(eng: IOEngine, path: Path, nkeys: int, chunk_keys: int) -> tuple[bool, np.ndarray]:
    """(whether ``path`` is sorted, its checksum)."""
    h = eng.open(path, "r")
    buf = aligned_buffer(chunk_keys * 8).view(np.uint64)
    ok, prev, acc = True, np.uint64(0), checksum(np.empty(0, dtype=np.uint64))
    for start in range(0, nkeys, chunk_keys):
        keys = buf[: min(chunk_keys, nkeys - start)]
        Pending(eng.read_batch(io_chunks(h, start * 8, keys), coalesce=False)).wait()
        ok = ok and bool(keys[0] >= prev) and bool((keys[1:] >= keys[:-1]).all())
        prev = keys[-1]
        acc = checksum(keys, acc)
    eng.close_file(h)
    return ok, acc


def sort_file(eng: IOEngine, work: Path, nkeys: int, budget: int, device: str, overlap: bool) -> dict[str, float]:
    """Both phases on ``work/input.bin`` into ``work/sorted.bin``; seconds of each."""
    run_keys = max(512, budget // 8 // 8 // 512 * 512)
    t0 = time.perf_counter()
    nruns = make_runs(eng, work / "input.bin", work / "runs.bin", nkeys, run_keys, device, overlap)
    t1 = time.perf_counter()
    merge_runs(eng, work / "runs.bin", work / "sorted.bin", nkeys, run_keys, budget, device, overlap)
    t2 = time.perf_counter()
    (work / "runs.bin").unlink()
    return {"runs_s": t1 - t0, "merge_s": t2 - t1, "total_s": t2 - t0, "runs": nruns, "run_keys": run_keys}


def time_run_sort(path: Path, nkeys: int, budget: int, device: str) -> float:
    """Seconds phase 1's sorts take without IO: one run's sort (data from ``path``), times the runs."""
    run_keys = max(512, budget // 8 // 8 // 512 * 512)
    keys = np.fromfile(path, dtype=np.uint64, count=min(run_keys, nkeys))
    device_sort(keys[:1024], device)  # warm-up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        device_sort(keys, device)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * -(-nkeys // run_keys)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Input, ceilings, the overlapped sort (checked), the synchronous peer."""
    size = args.size // 4096 * 4096
    nkeys = size // 8
    fio = find_fio(args.fio)
    result: dict[str, Any] = {"bytes": size, "keys": nkeys, "budget": args.budget}
    with IOEngine(IOConfig(backend=args.backend, queue_depth=args.queue_depth, bounce_bytes=0)) as eng:
        result["backend"] = eng.backend.name
        want = write_input(eng, work / "input.bin", nkeys, max(512, args.budget // 8 // 8 // 512 * 512))
        probe = min(size, 1 << 30)
        result["read_bytes_per_s"], result["read_source"] = read_ceiling(
            work / "input.bin", probe, fio, args.ceiling_seconds
        )
        result["write_bytes_per_s"], result["write_source"] = write_ceiling(work, probe, fio, args.ceiling_seconds)
        result["run_sort_s"] = time_run_sort(work / "input.bin", nkeys, args.budget, args.device)
        result["overlapped"] = sort_file(eng, work, nkeys, args.budget, args.device, True)
        ok, got = verify(eng, work / "sorted.bin", nkeys, 4 << 20)
        result["sorted"], result["checksum_equal"] = ok, bool((got == want).all())
        result["checksum"] = [int(x) for x in want]
        (work / "sorted.bin").unlink()
        if args.peer:
            result["synchronous"] = sort_file(eng, work, nkeys, args.budget, args.device, False)
    result["floor_s"] = 2 * size / result["read_bytes_per_s"] + 2 * size / result["write_bytes_per_s"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="64M", help="bytes of keys to sort")
    p.add_argument("--budget", default="16M", help="memory budget; --size must be at least 4x it")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True, help="run the synchronous peer")
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--backend", default="auto")
    p.add_argument("--dir", type=Path, default=None, help="scratch folder on the disk under test")
    p.add_argument("--fio", default=None, help="fio binary; 'none' for threaded O_DIRECT reads/writes")
    p.add_argument("--ceiling-seconds", type=float, default=2.0)
    p.add_argument("--name", default="io_sort")
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    args = p.parse_args()
    args.size, args.budget = parse_size(args.size), parse_size(args.budget)
    if args.size < 4 * args.budget or args.budget < 1 << 20:
        sys.exit("--size must be at least 4x --budget, and --budget at least 1M")
    if args.device == "cpu":  # leave a core to the IO threads: spinning OpenMP workers starve them
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    work = Path(tempfile.mkdtemp(prefix="carina-sort-", dir=args.dir))
    try:
        r = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not (r["sorted"] and r["checksum_equal"]):
        sys.exit(f"output wrong: sorted={r['sorted']} checksum_equal={r['checksum_equal']}")
    wall = r["overlapped"]["total_s"]
    print(f"{r['bytes'] / wall / 1e9:.3g} GB/s, {r['floor_s'] / wall:.0%} of the disk-bound floor")
    print(  # the key figures reach the log even if the record is lost
        f"wall {wall:.2f} s (runs {r['overlapped']['runs_s']:.2f} s, merge {r['overlapped']['merge_s']:.2f} s), "
        f"floor {r['floor_s']:.2f} s (read {r['read_bytes_per_s'] / 1e9:.3g} GB/s, write "
        f"{r['write_bytes_per_s'] / 1e9:.3g} GB/s), output checked"
        + (f", synchronous peer {r['synchronous']['total_s']:.2f} s" if args.peer else "")
    )
    fig = Figure(
        name="external_sort",
        value=r["bytes"] / wall / 1e9,
        unit="GB/s",
        ceiling=r["bytes"] / r["floor_s"] / 1e9,
        ceiling_source="size / (2 size / read rate + 2 size / write rate); "
        + r["read_source"]
        + "; "
        + r["write_source"],
        peers={"synchronous_same_algorithm": r["bytes"] / r["synchronous"]["total_s"] / 1e9} if args.peer else {},
    )
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("dir", "out", "fio")}
    record = make_record(
        name=args.name, figures=[fig], config=cfg, metrics=r, notes="GB/s = keys' bytes / wall of both phases."
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
