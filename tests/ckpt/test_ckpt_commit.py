"""carina.ckpt.commit.write_file_direct: the forked writer's O_DIRECT path, byte for byte."""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest

from carina.ckpt import commit, writers


def _direct_ok(where: Path) -> bool:
    try:
        fd = os.open(where / "probe", os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        return False
    os.close(fd)
    return hasattr(os, "O_DIRECT")


def _arena(data: bytes) -> memoryview:
    """A page-aligned buffer like a staging arena (an anonymous mapping) holding ``data``."""
    mm = mmap.mmap(-1, max(len(data), 1) + 8192)
    mm[: len(data)] = data
    return memoryview(mm)[: len(data)]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The flags of every os.open the writer makes."""
    flags: list[int] = []
    real = os.open

    def spy(path: str, fl: int, *a: int) -> int:
        flags.append(fl)
        return real(path, fl, *a)

    monkeypatch.setattr(commit.os, "open", spy)
    return flags


@pytest.mark.parametrize("size", [0, 100, 4096, 3 * 4096 + 17, 5 * 4096])
def test_direct_write_is_byte_exact(tmp_path: Path, opened: list[int], size: int) -> None:
    data = random.Random(size).randbytes(size)
    direct = _direct_ok(tmp_path)
    opened.clear()
    commit.write_file_direct(str(tmp_path / "f"), _arena(data))
    assert (tmp_path / "f").read_bytes() == data
    used = any(fl & getattr(os, "O_DIRECT", 0) for fl in opened)
    assert used == (direct and size >= 4096)


def test_unaligned_or_read_only_buffers_go_through_the_page_cache(tmp_path: Path, opened: list[int]) -> None:
    data = random.Random(7).randbytes(3 * 4096 + 5)
    buf = bytearray(len(data) + 1)
    buf[1:] = data
    commit.write_file_direct(str(tmp_path / "a"), memoryview(buf)[1:])  # off by one byte
    commit.write_file_direct(str(tmp_path / "b"), memoryview(data))  # read-only
    assert (tmp_path / "a").read_bytes() == data
    assert (tmp_path / "b").read_bytes() == data
    assert not any(fl & getattr(os, "O_DIRECT", 0) for fl in opened)


def test_every_direct_chunk_is_a_fault_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _direct_ok(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT")
    phases: list[str] = []
    monkeypatch.setattr(commit, "CHUNK", 8192)
    monkeypatch.setattr(commit, "fault_hook", lambda phase, step: phases.append(phase))
    data = random.Random(3).randbytes(5 * 4096 + 100)
    commit.write_file_direct(str(tmp_path / "f"), _arena(data))
    assert phases == ["data_chunk"] * 3  # 8192 + 8192 + 4096 direct, the 100-byte tail buffered
    assert (tmp_path / "f").read_bytes() == data


def test_a_filesystem_refusing_direct_io_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refuse(path: str, fl: int, *a: int) -> int:
        if fl & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real(path, fl, *a)

    monkeypatch.setattr(commit.os, "open", refuse)
    data = random.Random(5).randbytes(2 * 4096 + 9)
    commit.write_file_direct(str(tmp_path / "f"), _arena(data))
    assert (tmp_path / "f").read_bytes() == data


def test_engine_writer_feeds_more_chunks_than_the_queue_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of many more chunks than the engine's queue depth lands exactly; the caller ran meanwhile."""
    from carina.ckpt.checksum import crc32
    from carina.io import IOConfig, IOEngine

    monkeypatch.setattr(commit, "CHUNK", 64 << 10)
    data = random.Random(3).randbytes((37 << 16) + 555)  # 38 chunks through a queue of 2
    with IOEngine(IOConfig(queue_depth=2)) as engine:
        finish = writers.engine_writer(engine)(str(tmp_path / "f"), memoryview(data))
        crc = crc32(data)  # what run_job does while the feeder submits
        finish()
    assert (tmp_path / "f").read_bytes() == data and crc == crc32((tmp_path / "f").read_bytes())


def test_engine_writer_raises_a_failed_submission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the feeder thread is raised by finish() in the caller's thread."""
    from carina.io import IOConfig, IOEngine

    monkeypatch.setattr(commit, "CHUNK", 64 << 10)
    with IOEngine(IOConfig(queue_depth=2)) as engine:
        real, calls = engine.write, []

        def flaky(handle: Any, offset: int, buf: Any) -> Any:
            calls.append(offset)
            if len(calls) == 3:
                raise OSError(28, "No space left on device (test)")
            return real(handle, offset, buf)

        monkeypatch.setattr(engine, "write", flaky)
        finish = writers.engine_writer(engine)(str(tmp_path / "f"), memoryview(bytes(10 << 16)))
        with pytest.raises(OSError) as info:
            finish()
        assert info.value.errno == 28 and len(calls) == 3
