"""Persist one staged shard and commit the checkpoint atomically.

This is the code a writer runs, in a thread, a spawned process or a forked
child. It uses only ``os``, ``json`` and the CRC-32 of :mod:`carina.ckpt.checksum` on a
memoryview built before the writer started (no torch, no CUDA, no locks a fork could have copied held).

Protocol, per checkpoint ``step_N``::

    every rank:  step_N.<token>.tmp/rankR.safetensors  write, fsync
                 step_N.<token>.tmp/partR.json         write, fsync, fsync dir
    rank 0:      wait for every part -> manifest.json  write, fsync, fsync dir
                 rename tmp -> step_N, fsync parent
                 latest.tmp -> latest (rename), fsync parent
                 prune beyond keep_last (only now: the new one is durable)

A directory named ``step_N`` (no suffix) that holds a manifest is committed; all
else is debris that restore ignores and the next commit deletes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from carina.ckpt.checksum import crc32
from carina.ckpt.layout import Slot
from carina.ckpt.manifest import MANIFEST_NAME, Manifest, ShardEntry, TensorEntry, parse_shard
from carina.core.errors import CheckpointError, DeviceFull

__all__ = [
    "CHUNK",
    "PHASES",
    "LATEST",
    "CommitJob",
    "committed_steps",
    "fault_hook",
    "fault_phase",
    "fsync_dir",
    "pwrite_file",
    "write_file_direct",
    "serial_direct",
    "prune",
    "run_job",
    "step_dir_name",
    "tmp_dir_name",
]

LATEST = "latest"
CHUNK = 64 << 20
#: The points of the pipeline where :data:`fault_hook` is called, in order.
PHASES = ("begin", "data_chunk", "checksums", "data", "part_named", "part", "manifest", "rename", "fsync_parent",
          "latest", "done")  # fmt: skip
_STEP_RE = re.compile(r"^step_(\d{10})$")
_TMP_RE = re.compile(r"^step_(\d{10})\.[0-9a-f]+\.(tmp|old)$")

#: Test-only: called with (phase, step) at each phase; ``carina.testing.ckpt`` injects crashes with it.
fault_hook: Callable[[str, int], None] | None = None
_current_step = -1


@dataclass(frozen=True)
class CommitJob:
    """Everything a writer needs to persist one rank's shard (picklable, no torch)."""

    root: str
    step: int
    token: str
    rank: int
    world_size: int
    header: bytes
    slots: tuple[Slot, ...]
    objects: Any
    keep_last: int
    commit_timeout_s: float
    #: Tensor name -> (global shape, global offset) for pieces of DTensors.
    chunks: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes of the shard file."""
        return len(self.header) + sum(s.nbytes for s in self.slots)

    @property
    def tmp_dir(self) -> str:
        """The directory this attempt writes into."""
        return os.path.join(self.root, tmp_dir_name(self.step, self.token))


def step_dir_name(step: int) -> str:
    """``step_0000000042``: sortable, one directory per checkpoint."""
    return f"step_{step:010d}"


def tmp_dir_name(step: int, token: str) -> str:
    """Where save attempt ``token`` of ``step`` is written before its commit renames it."""
    return f"{step_dir_name(step)}.{token}.tmp"


def _phase(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name, _current_step)


#: :data:`fault_hook`'s call point, for writers outside this module.
fault_phase = _phase


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Starts writing ``data`` to a new file; returns a function that waits until it is durable.
Writer = Callable[[str, memoryview], Callable[[], None]]


def _done() -> None:
    return None


def pwrite_file(path: str, data: memoryview) -> Callable[[], None]:
    """The forked child's :data:`Writer`: :func:`write_file_direct`, done when it returns."""
    write_file_direct(path, data)
    return _done


#: O_DIRECT needs the buffer address, file offset and length aligned to the logical block size (<= 4096).
_ALIGN = 4096


def _address(data: memoryview) -> int | None:
    """The buffer's address (None for a read-only buffer, whose address ctypes cannot take)."""
    if data.readonly or not data.c_contiguous:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(data))


#: Writes the aligned head ``[0, head)`` of a buffer at ``addr`` to an O_DIRECT descriptor; returns bytes written.
AlignedWriter = Callable[[int, memoryview, int, int], int]


def serial_direct(fd: int, data: memoryview, addr: int, head: int) -> int:
    """The plain :data:`AlignedWriter`: synchronous ``pwrite``\\ s of up to :data:`CHUNK` bytes, one at a time."""
    done = 0
    while done < head:
        n = os.pwrite(fd, data[done : min(done + CHUNK, head)], done)
        done += n
        if n % _ALIGN:  # a short direct write (rare): the rest goes through the page cache
            break
        _phase("data_chunk")
    return done


def write_file_direct(path: str, data: memoryview, aligned: AlignedWriter = serial_direct) -> None:
    """Write ``data`` to a new file bypassing the page cache where it can, and fsync it (no threads).

    The forked writer's path: the file is preallocated to its size (so no write extends it: a
    filesystem may serialize extending direct writes), the aligned head of a page-aligned buffer (a
    staging arena) goes out with ``O_DIRECT`` through ``aligned`` (:func:`serial_direct`, or the
    queued writer of :mod:`carina.ckpt.forkwrite`), the last partial block through the page cache,
    then one fsync. Buffered writes copy every byte into the page cache and leave it to writeback; on
    the H200 machine that path (``torch.save``'s too) ran at about a quarter of the disk's O_DIRECT
    bandwidth. Falls back to :func:`write_file` where the buffer is unaligned or read-only, or the
    filesystem refuses ``O_DIRECT`` (``EINVAL``, e.g. older tmpfs).
    """
    head = len(data) - len(data) % _ALIGN
    addr = _address(data) if head else None
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or addr is None or addr % _ALIGN:
        return write_file(path, data)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return write_file(path, data)
        raise
    try:
        _preallocate(fd, len(data))
        done = aligned(fd, data, addr, head)
        if done < len(data):
            tail = os.open(path, os.O_WRONLY)
            try:
                while done < len(data):
                    done += os.pwrite(tail, data[done : done + CHUNK], done)
            finally:
                os.close(tail)
        os.fsync(fd)  # the inode's data and size, whichever descriptor wrote them
    finally:
        os.close(fd)
    return None


def _preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes (ENOSPC now, not mid-write); a filesystem without fallocate is left as is."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def write_file(path: str, data: memoryview) -> None:
    """Write ``data`` to a new file with plain ``pwrite`` and fsync it (safe in a forked child)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done : done + CHUNK], done)
            _phase("data_chunk")
        os.fsync(fd)
    finally:
        os.close(fd)


def run_job(
    job: CommitJob, image: memoryview, write: Writer = pwrite_file, ready: Callable[[int], int] | None = None
) -> float:
    """Persist ``image`` (header + tensor bytes) for ``job`` and, on rank 0, commit.

    ``ready(n)`` (the process writer's :meth:`carina.ckpt.progress.Progress.gate`) returns once the bytes
    below ``n`` are final; it is called before bytes are checksummed (``write`` calls it before writing).

    Returns:
        The ``time.monotonic()`` at which this rank's work was durable: its part file (ranks > 0),
        the ``latest`` pointer (rank 0). Retention, which follows, is not part of it: deleting an old
        checkpoint can take a while (an unlink on a filesystem mounted with ``discard`` trims every block).

    Raises:
        DeviceFull: The disk filled up; the attempt's files are removed.
        CheckpointError: Any other failure, including other ranks not finishing in time.
    """
    global _current_step
    _current_step = job.step
    try:
        _phase("begin")
        os.makedirs(job.tmp_dir, exist_ok=True)
        # Rank 0 renames the directory as soon as every part exists, so this rank
        # fsyncs it through a descriptor opened before its part, not by path.
        dir_fd = os.open(job.tmp_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            shard = _write_shard(job, image, write, ready)
            part = os.path.join(job.tmp_dir, f"part{job.rank}.json")
            # Written under another name and renamed: rank 0 takes a part as done once it exists, so it must
            # never see it created but not yet written (an empty read: seen once in CI with 2 ranks).
            _write_json(f"{part}.tmp", {"shard": asdict(shard), "objects": job.objects})
            os.rename(f"{part}.tmp", part)
            _phase("part_named")  # visible to rank 0, its name not yet fsynced
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        _phase("part")
        return _commit(job) if job.rank == 0 else time.monotonic()
    except OSError as exc:
        shutil.rmtree(job.tmp_dir, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise DeviceFull("disk full while writing checkpoint", path=job.tmp_dir) from exc
        raise CheckpointError(f"checkpoint write failed: {exc}", path=job.tmp_dir) from exc


def _write_shard(job: CommitJob, image: memoryview, write: Writer, ready: Callable[[int], int] | None) -> ShardEntry:
    start = len(job.header)
    if len(image) < job.size or bytes(image[:start]) != job.header:
        raise CheckpointError("staged image does not match its layout", path=job.tmp_dir)
    file = f"rank{job.rank:05d}.safetensors"
    finish = write(os.path.join(job.tmp_dir, file), image[: job.size])
    try:
        crcs = [_crc(image, start + s.offset, s.nbytes, ready) for s in job.slots]
    except BaseException:
        with contextlib.suppress(BaseException):
            finish()  # its gate fails as well: the file is closed, never committed
        raise
    tensors = tuple(
        TensorEntry(s.name, s.dtype, s.shape, s.offset, s.nbytes, crc, *job.chunks.get(s.name, (None, None)))
        for s, crc in zip(job.slots, crcs, strict=True)
    )
    _phase("checksums")
    finish()
    _phase("data")
    return ShardEntry(job.rank, file, job.size, start, crc32(job.header), tensors)


def _crc(image: memoryview, offset: int, nbytes: int, ready: Callable[[int], int] | None = None) -> int:
    crc = 0
    for off in range(offset, offset + nbytes, CHUNK):
        end = min(off + CHUNK, offset + nbytes)
        if ready is not None:
            ready(end)
        crc = crc32(image[off:end], crc)
    return crc


def _write_json(path: str, data: Any) -> None:
    text = json.dumps(data, sort_keys=True, allow_nan=False).encode()
    write_file(path, memoryview(text))


def _commit(job: CommitJob) -> float:
    parts = _gather_parts(job)
    manifest = Manifest(
        step=job.step,
        world_size=job.world_size,
        shards=tuple(p[0] for p in parts),
        objects={str(r): p[1] for r, p in enumerate(parts)},
        attempt=job.token,
    )
    write_file(os.path.join(job.tmp_dir, MANIFEST_NAME), memoryview(manifest.to_json().encode()))
    fsync_dir(job.tmp_dir)
    _phase("manifest")
    final = os.path.join(job.root, step_dir_name(job.step))
    old = None
    if os.path.exists(final):  # the same step saved again (e.g. after a restore)
        old = f"{final}.{job.token}.old"
        os.rename(final, old)
    os.rename(job.tmp_dir, final)
    _phase("rename")
    fsync_dir(job.root)
    _phase("fsync_parent")
    _point_latest(job.root, step_dir_name(job.step))
    durable = time.monotonic()
    _phase("latest")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(job.root, job.step, job.keep_last)
    _phase("done")
    return durable


def _gather_parts(job: CommitJob) -> list[tuple[ShardEntry, Any]]:
    deadline = time.monotonic() + job.commit_timeout_s
    paths = [os.path.join(job.tmp_dir, f"part{r}.json") for r in range(job.world_size)]
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [r for r, p in enumerate(paths) if not os.path.exists(p)]
            raise CheckpointError(f"ranks {missing} did not finish their shards in time", path=job.tmp_dir)
        time.sleep(0.005)
    parts = []
    for p in paths:
        with open(p, "rb") as fh:
            raw = json.loads(fh.read())
        parts.append((parse_shard(raw["shard"], path=p), raw["objects"]))
    return parts


def _point_latest(root: str, name: str) -> None:
    tmp = os.path.join(root, f"{LATEST}.tmp")
    write_file(tmp, memoryview(name.encode()))
    os.rename(tmp, os.path.join(root, LATEST))
    fsync_dir(root)


def committed_steps(root: str) -> list[int]:
    """Steps with a committed directory (a ``step_N`` holding a manifest), ascending."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        m = _STEP_RE.match(name)
        if m and os.path.isfile(os.path.join(root, name, MANIFEST_NAME)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def prune(root: str, keep_last: int) -> list[str]:
    """Delete committed checkpoints beyond the newest ``keep_last`` and older debris; return what went."""
    before = set(os.listdir(root))
    steps = committed_steps(root)
    if steps:
        _prune(root, steps[-1], keep_last)
    return sorted(before - set(os.listdir(root)))


def _prune(root: str, newest: int, keep_last: int) -> None:
    if keep_last > 0:
        for step in committed_steps(root)[:-keep_last]:
            if step != newest:
                shutil.rmtree(os.path.join(root, step_dir_name(step)), ignore_errors=True)
    for name in os.listdir(root):
        m = _TMP_RE.match(name)
        if m and int(m.group(1)) <= newest:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
