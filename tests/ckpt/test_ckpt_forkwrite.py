"""carina.ckpt.forkwrite: the fork writer's grandchild writes the file while the caller goes on."""

from __future__ import annotations

import mmap
import os
import random
import signal
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from carina.ckpt import commit, forkwrite
from carina.ckpt.checksum import crc32
from carina.ckpt.forkwrite import forked_write
from carina.core.errors import CheckpointError


def _start(path: str, data: memoryview) -> Callable[[], None]:
    with warnings.catch_warnings():  # the test process may have threads; the grandchild only writes and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        return forked_write(path, data)


def _arena(data: bytes) -> memoryview:
    mm = mmap.mmap(-1, len(data) + 4096)
    mm[: len(data)] = data
    return memoryview(mm)[: len(data)]


def test_the_grandchild_writes_the_exact_bytes(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(7 * 4096 + 123)
    finish = _start(str(tmp_path / "f"), _arena(data))
    crc = crc32(data)  # the caller's own work while the grandchild writes
    finish()
    assert (tmp_path / "f").read_bytes() == data
    assert crc32((tmp_path / "f").read_bytes()) == crc


def test_an_os_error_keeps_its_errno(tmp_path: Path) -> None:
    finish = _start(str(tmp_path / "missing" / "f"), _arena(b"x" * 5000))
    with pytest.raises(FileNotFoundError):
        finish()


def test_a_killed_grandchild_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()

    def hook(phase: str, step: int) -> None:
        if phase == "data_chunk" and os.getpid() != me:
            os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(commit, "fault_hook", hook)
    finish = _start(str(tmp_path / "f"), _arena(b"y" * 3 * 4096))
    with pytest.raises(CheckpointError, match="grandchild killed by SIGKILL"):
        finish()


@pytest.mark.parametrize("ring", [True, False], ids=["io_uring", "refused"])
def test_queued_writes_land_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ring: bool) -> None:
    """Many 64 KiB direct writes in flight (or, io_uring refused, one at a time) give the exact file."""
    from carina.io.backends import _ring

    if ring and not forkwrite.prepare():
        pytest.skip("io_uring refused here")
    if not ring:

        def refuse(entries: int) -> None:
            raise OSError(38, "io_uring refused (test)")

        monkeypatch.setattr(_ring, "Ring", refuse)
    monkeypatch.setattr(forkwrite, "CHUNK", 64 << 10)  # 40 chunks, DEPTH of them in flight
    chunks: list[int] = []
    monkeypatch.setattr(commit, "fault_hook", lambda phase, step: chunks.append(1) if phase == "data_chunk" else None)
    data = random.Random(2).randbytes((40 << 16) + 3 * 4096 + 77)  # a partial last chunk and an unaligned tail
    commit.write_file_direct(str(tmp_path / "f"), _arena(data), forkwrite.queued_direct)
    assert (tmp_path / "f").read_bytes() == data
    assert len(chunks) == (41 if ring else (len(data) + commit.CHUNK - 1) // commit.CHUNK)


def test_a_failed_queued_write_keeps_its_errno(tmp_path: Path) -> None:
    """A write the kernel fails (a read-only descriptor: EBADF) raises with its errno, not a short count."""
    if not forkwrite.prepare():
        pytest.skip("io_uring refused here")
    data = _arena(b"z" * 8 * 4096)
    (tmp_path / "f").write_bytes(b"")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            forkwrite.queued_direct(fd, data, commit._address(data) or 0, len(data))
    finally:
        os.close(fd)
    assert info.value.errno == 9  # EBADF


def test_the_shipped_grandchild_writes_one_request_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """forked_write's default is commit.serial_direct: one 64 KiB-chunk write per data_chunk phase (patched)."""
    import inspect

    assert inspect.signature(forked_write).parameters["aligned"].default is commit.serial_direct
    monkeypatch.setattr(commit, "CHUNK", 64 << 10)
    chunks: list[int] = []
    monkeypatch.setattr(commit, "fault_hook", lambda phase, step: chunks.append(1) if phase == "data_chunk" else None)
    data = random.Random(3).randbytes((5 << 16) + 4096 + 9)
    commit.write_file_direct(str(tmp_path / "f"), _arena(data), commit.serial_direct)
    assert (tmp_path / "f").read_bytes() == data
    assert len(chunks) == 6  # 5 full chunks and one partial aligned chunk; the unaligned tail has no phase


def test_queued_depth_and_chunk_can_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """queued_direct(depth=, chunk=) (the benchmark's 4 x 64 MiB variant, scaled down) lands the exact bytes."""
    import functools

    if not forkwrite.prepare():
        pytest.skip("io_uring refused here")
    chunks: list[int] = []
    monkeypatch.setattr(commit, "fault_hook", lambda phase, step: chunks.append(1) if phase == "data_chunk" else None)
    data = random.Random(4).randbytes((9 << 15) + 4096 + 5)
    aligned = functools.partial(forkwrite.queued_direct, depth=3, chunk=32 << 10)
    commit.write_file_direct(str(tmp_path / "f"), _arena(data), aligned)
    assert (tmp_path / "f").read_bytes() == data
    assert len(chunks) == 10  # 9 chunks of 32 KiB and one of 4 KiB
