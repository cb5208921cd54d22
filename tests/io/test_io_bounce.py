"""Bounce buffers of misaligned O_DIRECT requests come from the engine's staging arena."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import carina.io._staging as staging
from carina.core.errors import ShortRead
from carina.io import IOConfig, IOEngine, aligned_buffer
from carina.io.backends.uring import UringBackend

DATA = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "d.bin"
    DATA.tofile(path)
    return path


def _no_fresh_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("a bounce buffer was allocated outside the arena")

    monkeypatch.setattr(staging, "aligned_buffer", refuse)


def test_concurrent_misaligned_reads_share_the_arena(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    offsets = rng.integers(0, (1 << 20) - 9000, 64)
    sizes = rng.integers(1, 9000, 64)
    with IOEngine(IOConfig(bounce_bytes=4 << 20, direct="on")) as eng:
        h = eng.open(_file(tmp_path), "r")
        arena = eng.staging_arena()
        _no_fresh_buffers(monkeypatch)
        bufs = [bytearray(int(n)) for n in sizes]
        futs = eng.read_batch([(h, int(o), b) for o, b in zip(offsets, bufs, strict=True)], coalesce=False)
        assert [f.result(30) for f in futs] == [int(n) for n in sizes]
        for o, n, b in zip(offsets, sizes, bufs, strict=True):
            assert bytes(b) == DATA[o : o + n].tobytes()
        assert arena.served >= 64 and arena.overflows == 0
        assert eng.stats["bounced"] >= 64
        eng.drain()
        assert arena.used == 0  # every block came back


def test_full_arena_falls_back_to_one_off_buffers(tmp_path: Path) -> None:
    with IOEngine(IOConfig(bounce_bytes=8192, direct="on")) as eng:
        h = eng.open(_file(tmp_path), "r")
        buf = bytearray(100_000)
        assert eng.read(h, 777, buf).result(30) == 100_000
        assert bytes(buf) == DATA[777:100_777].tobytes()
        arena = eng.staging_arena()
        assert arena.overflows == 1 and arena.used == 0


def test_misaligned_gather_and_write_return_their_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with IOEngine(IOConfig(bounce_bytes=1 << 20, direct="on")) as eng:
        h = eng.open(_file(tmp_path), "rw")
        arena = eng.staging_arena()
        _no_fresh_buffers(monkeypatch)
        rows = np.array([5, 900, 17, 3000]) * 100 + 3
        dest = aligned_buffer(len(rows) * 100)
        assert eng.gather(h, rows, 100, dest).result(30) == 400
        assert dest.tobytes() == b"".join(DATA[r : r + 100].tobytes() for r in rows)
        src = aligned_buffer(8192 + 1)[1:]  # aligned offset and length, misaligned address
        src[:] = 7
        assert eng.write(h, 4096, src).result(30) == 8192
        eng.fsync(h)
        assert arena.served >= 2 and arena.used == 0
    assert (np.fromfile(tmp_path / "d.bin", dtype=np.uint8)[4096 : 4096 + 8192] == 7).all()


def test_short_bounced_read_fails_and_frees_its_block(tmp_path: Path) -> None:
    with IOEngine(IOConfig(bounce_bytes=1 << 20, direct="on")) as eng:
        h = eng.open(_file(tmp_path), "r")
        with pytest.raises(ShortRead):
            eng.read(h, (1 << 20) - 10, bytearray(50)).result(30)
        assert eng.staging_arena().used == 0


@pytest.mark.skipif(bool(UringBackend.probe_reasons()), reason="io_uring unavailable here")
def test_uring_reads_bounces_as_fixed_buffers(tmp_path: Path) -> None:
    with IOEngine(IOConfig(backend="uring", bounce_bytes=1 << 20, direct="on")) as eng:
        h = eng.open(_file(tmp_path), "r")
        buf = bytearray(5000)
        eng.read(h, 4099, buf).result(30)
        assert bytes(buf) == DATA[4099:9099].tobytes()
        if eng.staging_arena().registered:
            assert eng.backend.fixed_ops >= 1  # type: ignore[attr-defined]


def test_bounce_arena_does_not_import_torch(tmp_path: Path) -> None:
    path = _file(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        from carina.io import IOConfig, IOEngine
        with IOEngine(IOConfig(direct="on")) as eng:
            h = eng.open({str(path)!r}, "r")
            buf = bytearray(10)
            eng.read(h, 3, buf).result(30)
            arena = eng.staging_arena()
            assert arena.served == 1 and arena.used == 0, (arena.served, arena.used)
        assert "torch" not in sys.modules
        print(bytes(buf).hex())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == DATA[3:13].tobytes().hex()
