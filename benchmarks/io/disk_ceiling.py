"""The disk's sequential read and write rates, measured in the benchmark's own run.

The out-of-core benchmarks (``bench_gemm.py``, ``bench_sort.py``) compare
their time with the time the disk needs for their bytes. This module measures
that disk rate on the benchmark's own files: with fio (``O_DIRECT``, 4 MiB
blocks, queue depth 16) when it is installed, otherwise with a large
sequential ``O_DIRECT`` read or write from 8 threads of 4 MiB ``preadv`` /
``pwritev`` calls (no carina code on either path).

fio's IO buffers are huge pages (``--iomem=mmaphuge``) whenever enough are
reserved (``/proc/sys/vm/nr_hugepages``; ``lane_h200.sh`` reserves them). With
fio's default 4 KiB-page buffers a 1 MiB request carries up to 256 physical
segments, one virtio descriptor each (and is split above ``max_segments``,
254 on the CPU machine), where a huge-page buffer is one segment; on the
virtio disks here that alone made fio read at about half the rate
(``bench_fio_buffers.py``, ``cpu/io_fio_buffers_cpu.json``: 1.21 against
2.25 GB/s for 1 MiB, 1.20 against 2.15 for 4 MiB). carina's large NumPy
buffers are transparent huge pages, so the session-5 H200 records, whose fio
ran with 4 KiB pages, show carina above "the ceiling". :func:`fio_memory` says
which buffers a run got, and every ``ceiling_source`` names them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from carina.io import aligned_buffer

__all__ = [
    "block_limits",
    "find_fio",
    "fio_memory",
    "fio_read_cmd",
    "read_ceiling",
    "read_ceiling_files",
    "write_ceiling",
]

BLOCK = 4 << 20
_MEMINFO = Path("/proc/meminfo")


def fio_memory(block: int, depth: int, meminfo: Path = _MEMINFO) -> tuple[list[str], str]:
    """fio's buffer option for ``depth`` buffers of ``block`` bytes, and words for ``ceiling_source``.

    Huge pages (``--iomem=mmaphuge``: anonymous ``MAP_HUGETLB``) when enough
    are free, so a large request is one physical segment, as carina's are;
    otherwise fio's default buffers, said in the words.
    """
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) if rest.split() else 0
    except (OSError, ValueError):
        fields = {}
    page = fields.get("Hugepagesize", 0) * 1024
    need = -(-block * depth // page) + 2 if page else 0  # fio rounds its area up and aligns it
    if page and fields.get("HugePages_Free", 0) >= need:
        return ["--iomem=mmaphuge"], f"{page >> 20} MiB huge-page buffers"
    return [], "4 KiB-page buffers (no huge pages reserved: large requests may be split, see disk_ceiling.py)"


def fio_read_cmd(
    fio: str, files: str, size: int, *, rw: str, block: int, depth: int, seconds: float, huge: bool = True
) -> tuple[list[str], str]:
    """A timed fio ``O_DIRECT`` io_uring read job (``rw``: ``read``/``randread``) and words for its buffers.

    ``files`` is fio's ``--filename`` (``a:b`` cycles over several); ``huge``
    asks for huge-page buffers (used when enough are reserved, see :func:`fio_memory`).
    """
    memory, words = fio_memory(block, depth) if huge else ([], "4 KiB-page buffers")
    cmd = [fio, "--name=ceiling", f"--filename={files}", f"--size={size}", "--direct=1", "--readonly",
           f"--rw={rw}", f"--bs={block}", "--ioengine=io_uring", f"--iodepth={depth}", "--time_based",
           f"--runtime={max(1, round(seconds))}", "--output-format=json", *memory]  # fmt: skip
    return cmd, words


def block_limits(path: Path) -> dict[str, Any]:
    """The request limits of the block device under ``path`` and the THP mode (what splits large requests)."""
    out: dict[str, Any] = {}
    try:
        st = os.stat(path)
        queue = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        queue = queue / "queue" if (queue / "queue").exists() else queue / ".." / "queue"  # a partition: its disk
        for name in ("max_segments", "max_segment_size", "max_sectors_kb", "scheduler"):
            if (queue / name).exists():
                text = (queue / name).read_text().strip()
                out[name] = int(text) if text.isdigit() else text
        out["device"] = queue.resolve().parent.name
    except OSError:
        pass
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists():
        out["transparent_hugepage"] = thp.read_text().strip()
    return out


def find_fio(given: str | None) -> str | None:
    """The fio binary: ``given`` when set (``none``: do not use fio), else fio on ``PATH`` (or None)."""
    if given == "none":
        return None
    return given or shutil.which("fio")


def _block(size: int) -> int:
    """4 MiB, or the largest 4 KiB multiple within a smaller file."""
    return max(4096, min(BLOCK, size // 4096 * 4096))


def _fio(fio: str, path: Path, size: int, rw: str, seconds: float) -> tuple[float, str]:
    last: subprocess.CalledProcessError | None = None
    memory, words = fio_memory(_block(size), 16)
    for engine in ("io_uring", "libaio", "psync"):
        cmd = [
            fio,
            "--name=ceiling",
            f"--filename={path}",
            f"--size={size}",
            "--direct=1",
            f"--rw={rw}",
            f"--bs={_block(size)}",
            f"--ioengine={engine}",
            "--iodepth=16",
            "--time_based",
            f"--runtime={max(1, round(seconds))}",
            "--output-format=json",
            *memory,
        ]
        if rw == "read":
            cmd.append("--readonly")
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        except subprocess.CalledProcessError as exc:
            last = exc
            continue
        job = json.loads(out[out.index("{") :])["jobs"][0]
        return float(job["read" if rw == "read" else "write"]["bw_bytes"]), words
    assert last is not None
    raise last


def _threaded(path: Path, size: int, write: bool, seconds: float) -> float:
    block = _block(size)
    blocks = max(1, size // block)
    flags = (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY) | os.O_DIRECT
    fd = os.open(path, flags, 0o644)
    bufs = [aligned_buffer(block) for _ in range(8)]
    for b in bufs:
        b[:] = np.arange(block, dtype=np.uint8)
    call = os.pwritev if write else os.preadv

    def one(job: tuple[int, int]) -> int:
        return call(fd, [memoryview(bufs[job[0] % 8])], (job[1] % blocks) * block)

    done, t0, turn = 0, time.perf_counter(), 0
    try:
        with ThreadPoolExecutor(8) as pool:
            while time.perf_counter() - t0 < seconds:
                jobs = [(i, turn * 8 + i) for i in range(8)]
                done += sum(pool.map(one, jobs))
                turn += 1
            if write:
                os.fsync(fd)
    finally:
        os.close(fd)
    return done / (time.perf_counter() - t0)


def read_ceiling(path: Path, size: int, fio: str | None, seconds: float = 2.0) -> tuple[float, str]:
    """Sequential ``O_DIRECT`` read rate of ``path``'s first ``size`` bytes (bytes/s, how measured)."""
    if fio:
        rate, words = _fio(fio, path, size, "read", seconds)
        return rate, f"fio seq read O_DIRECT 4 MiB QD16, {words}, same file, same run"
    rate = _threaded(path, size, False, seconds)
    return rate, "8-thread 4 MiB O_DIRECT preadv sequential read, same file, same run"


def write_ceiling(directory: Path, size: int, fio: str | None, seconds: float = 2.0) -> tuple[float, str]:
    """Sequential ``O_DIRECT`` write rate to a scratch file of ``size`` bytes in ``directory``."""
    path = directory / "ceiling-write.bin"
    try:
        if fio:
            rate, words = _fio(fio, path, size, "write", seconds)
            return rate, f"fio seq write O_DIRECT 4 MiB QD16, {words}, same folder, same run"
        rate = _threaded(path, size, True, seconds)
        return rate, "8-thread 4 MiB O_DIRECT pwritev sequential write + fsync, same folder, same run"
    finally:
        path.unlink(missing_ok=True)


def read_ceiling_files(
    paths: list[Path], fio: str | None, seconds: float = 2.0, queue_depth: int = 32
) -> tuple[float, str]:
    """Rate of ``O_DIRECT`` 4 MiB reads cycling over whole files (bytes/s, how measured).

    The benchmark's own files, read in full and repeatedly as the benchmark
    reads them, at its queue depth: whatever a cache below the guest (a VM
    host's) does for the benchmark's reads, it does for this measurement too.
    With fio: ``--filename=a:b`` (round robin over the files), io_uring,
    ``direct=1``; without: ``queue_depth`` threads of ``preadv`` on
    ``O_DIRECT`` descriptors, each taking the next block as soon as its last
    one is done.
    """
    block = _block(min(p.stat().st_size for p in paths))
    size = min(p.stat().st_size for p in paths) // block * block
    if fio:
        files = ":".join(str(p) for p in paths)
        cmd, words = fio_read_cmd(fio, files, size * len(paths), rw="read", block=block, depth=queue_depth,
                                  seconds=seconds)  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rate = float(json.loads(out[out.index("{") :])["jobs"][0]["read"]["bw_bytes"])
        return rate, (
            f"fio io_uring O_DIRECT {block >> 10} KiB sequential reads at iodepth {queue_depth}, {words}, cycling over "
            f"the benchmark's {len(paths)} files ({size * len(paths) / 1e6:.0f} MB), {max(1, round(seconds))} s, "
            "same run"
        )
    return _threaded_files(paths, size, block, queue_depth, seconds), (
        f"{queue_depth} threads of {block >> 10} KiB O_DIRECT preadv cycling over the benchmark's {len(paths)} files "
        f"({size * len(paths) / 1e6:.0f} MB), {seconds:g} s, same run (fio not installed)"
    )


def _threaded_files(paths: list[Path], size: int, block: int, threads: int, seconds: float) -> float:
    fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths]
    blocks = size // block * len(fds)
    counter = iter(range(1 << 62))
    stop = time.perf_counter() + seconds

    def worker() -> int:
        buf, done = aligned_buffer(block), 0
        while time.perf_counter() < stop:
            n = next(counter) % blocks
            done += os.preadv(fds[n % len(fds)], [memoryview(buf)], (n // len(fds)) * block)
        return done

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(lambda _: worker(), range(threads)))
    finally:
        for fd in fds:
            os.close(fd)
    return total / (time.perf_counter() - t0)
