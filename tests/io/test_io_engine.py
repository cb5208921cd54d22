"""Engine behaviour that needs a scripted backend: faults, vectoring, misuse."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from carina.core.errors import ConfigError, DeviceFull, IOEngineError
from carina.io import Direct, IOConfig, IOEngine, aligned_buffer, choose_backend
from carina.io._future import OpKind
from carina.testing.io import MockBackend, NullBackend, fail_after


def _engine(**kw: object) -> tuple[IOEngine, MockBackend]:
    script = kw.pop("script", None)
    hold = bool(kw.pop("hold", False))
    backend = MockBackend(script=script, hold=hold)  # type: ignore[arg-type]
    return IOEngine(IOConfig(**kw), backend=backend), backend  # type: ignore[arg-type]


def test_enospc_mid_write_reports_only_what_was_written(tmp_path: Path) -> None:
    eng, _ = _engine(direct="off", script=fail_after(4096, errno.ENOSPC))
    with eng:
        h = eng.open(tmp_path / "f.bin", "w")
        chunks = [bytes([i + 1]) * 4096 for i in range(3)]
        futs = eng.write_batch([(h, i * 4096, c) for i, c in enumerate(chunks)])
        assert futs[0].result(10) == 4096
        for fut in futs[1:]:
            with pytest.raises(DeviceFull) as info:
                fut.result(10)
            assert info.value.context["path"] == str(tmp_path / "f.bin")
        assert h.size == 4096
    assert (tmp_path / "f.bin").read_bytes() == chunks[0]


def test_a_failed_request_fails_only_its_own_future(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 64)

    def script(op: object) -> OSError | None:
        return OSError(errno.EIO, "injected") if getattr(op, "offset", 0) == 8192 else None

    eng, _ = _engine(direct="off", script=script)
    with eng:
        h = eng.open(tmp_path / "f.bin", "r")
        bufs = [bytearray(100) for _ in range(3)]
        futs = [eng.read(h, off, b) for off, b in zip((0, 8192, 12000), bufs, strict=True)]
        assert futs[0].result(10) == 100 and futs[2].result(10) == 100
        with pytest.raises(IOEngineError) as info:
            futs[1].result(10)
        assert info.value.context["offset"] == 8192 and info.value.context["errno"] == errno.EIO
        assert bytes(bufs[2]) == (bytes(range(256)) * 64)[12000:12100]


def test_adjacent_requests_become_one_vectored_op(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(os.urandom(1 << 16))
    eng, backend = _engine(direct="off")
    with eng:
        h = eng.open(tmp_path / "f.bin", "r")
        bufs = [bytearray(n) for n in (10, 20, 30)]
        futs = eng.read_batch(
            [
                (h, 100, bufs[1].__class__(0)),
                (h, 100, bufs[0]),
                (h, 110, bufs[1]),
                (h, 130, bufs[2]),
                (h, 161, bytearray(5)),
            ]
        )
        assert [f.result(10) for f in futs] == [0, 10, 20, 30, 5]
    reads = [entry for entry in backend.log if entry[0] is OpKind.READ]
    assert sorted(reads) == [(OpKind.READ, 100, 60, 4), (OpKind.READ, 161, 5, 1)]


def test_gap_coalescing_reads_through_small_holes(tmp_path: Path) -> None:
    data = os.urandom(1 << 16)
    (tmp_path / "f.bin").write_bytes(data)
    eng, backend = _engine(direct="off", coalesce_gap=64)
    with eng:
        h = eng.open(tmp_path / "f.bin", "r")
        a, b, c = bytearray(10), bytearray(10), bytearray(10)
        futs = eng.read_batch([(h, 0, a), (h, 50, b), (h, 200, c)])
        assert [f.result(10) for f in futs] == [10, 10, 10]
    assert (bytes(a), bytes(b), bytes(c)) == (data[0:10], data[50:60], data[200:210])
    assert len(backend.log) == 2


def test_submitted_work_finishes_before_close_returns(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"q" * 8192)
    eng, backend = _engine(direct="off", hold=True)
    h = eng.open(tmp_path / "f.bin", "r")
    fut = eng.read(h, 0, bytearray(8192))
    assert not fut.cancel()  # on its way to the device: no longer cancellable
    assert not fut.done()
    backend.release()
    eng.close()
    assert fut.result(0) == 8192


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"backend": "gds"}, "backend"),
        ({"queue_depth": 0}, "queue_depth"),
        ({"alignment": 1000}, "alignment"),
        ({"direct": "maybe"}, "direct"),
        ({"coalesce_gap": 1 << 30}, "coalesce_gap"),
    ],
)
def test_bad_config_names_its_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        IOConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.context["key"] == key


def test_config_round_trips_through_toml() -> None:
    cfg = IOConfig(backend="posix", queue_depth=8, direct="off")  # type: ignore[arg-type]
    assert cfg.direct is Direct.OFF
    assert IOConfig.from_toml(cfg.to_toml()) == cfg
    with pytest.raises(ConfigError, match="unknown key"):
        IOConfig.from_dict({"queue_dept": 3})


def test_misuse_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 100)
    with IOEngine(IOConfig(backend="posix")) as eng:
        h = eng.open(tmp_path / "f.bin", "r")
        with pytest.raises(ConfigError, match="FileHandle"):
            eng.read("f.bin", 0, bytearray(1))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="offset"):
            eng.read(h, -1, bytearray(1))
        with pytest.raises(ConfigError, match="read-only"):
            eng.read(h, 0, b"immutable")
        with pytest.raises(ConfigError, match="contiguous"):
            eng.read(h, 0, np.zeros((4, 4))[:, 0])
        with pytest.raises(ConfigError, match="mode"):
            eng.open(tmp_path / "f.bin", "a")
        with pytest.raises(IOEngineError, match="cannot open"):
            eng.open(tmp_path / "missing.bin", "r")
        with pytest.raises(ConfigError, match="same range"):
            w = eng.open(tmp_path / "g.bin", "w")
            eng.write_batch([(w, 0, b"a"), (w, 0, b"a")])
        eng.close_file(h)
        with pytest.raises(IOEngineError, match="closed"):
            eng.read(h, 0, bytearray(1))


def test_null_backend_moves_nothing_but_completes() -> None:
    with IOEngine(IOConfig(direct="off"), backend=NullBackend()) as eng, open(os.devnull, "rb"):
        h = eng.open(os.devnull, "r")
        buf = aligned_buffer(4096)
        buf[:] = 7
        assert eng.read(h, 0, buf).result(1) == 4096
        assert (buf == 7).all()


def test_auto_explains_its_choice() -> None:
    selection = choose_backend("auto")
    assert selection.backend.name in ("uring", "posix")
    assert selection.explain().endswith(f"chose {selection.backend.name}")
    with IOEngine() as eng:
        assert eng.backend.name == selection.backend.name


def test_gather_misuse_and_failed_rows(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(os.urandom(1 << 16))

    def script(op: object) -> OSError | None:
        return OSError(errno.EIO, "injected") if getattr(op, "offset", 0) == 8192 else None

    eng, _ = _engine(direct="off", script=script)
    with eng:
        h = eng.open(tmp_path / "f.bin", "r")
        with pytest.raises(ConfigError, match="1-D"):
            eng.gather(h, np.zeros((2, 2), dtype=np.int64), 10, bytearray(40))
        with pytest.raises(ConfigError, match="nbytes"):
            eng.gather(h, np.array([0, 10]), np.array([1, 2, 3]), bytearray(40))
        with pytest.raises(ConfigError, match="dest holds"):
            eng.gather(h, np.array([0, 100]), 100, bytearray(150))
        with pytest.raises(ConfigError, match="offsets"):
            eng.gather(h, np.array([-4096]), 10, bytearray(10))
        with pytest.raises(IOEngineError) as info:
            eng.gather(h, np.array([0, 8192, 100]), 100, bytearray(300)).result(10)
        assert info.value.context["offset"] == 8192 and info.value.context["errno"] == errno.EIO
        ok = bytearray(200)
        assert eng.gather(h, np.array([300, 0]), 100, ok).result(10) == 200
    data = (tmp_path / "f.bin").read_bytes()
    assert bytes(ok) == data[300:400] + data[0:100]


def test_blocking_inside_a_callback_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"c" * 4096)
    eng, backend = _engine(direct="off", hold=True)
    errors: list[BaseException] = []

    def callback(_: object) -> None:
        later = eng.read(h, 0, bytearray(8))  # queued behind us on the one mock thread: not done
        for call in (eng.drain, later.result, eng.close):
            try:
                call()
            except IOEngineError as exc:
                errors.append(exc)

    with eng:
        h = eng.open(tmp_path / "f.bin", "r")
        eng.read(h, 0, bytearray(8)).add_done_callback(callback)
        backend.release()
        eng.drain()
    assert len(errors) == 3 and all("deadlock" in str(e) for e in errors)


def test_errors_name_their_own_request(tmp_path: Path) -> None:
    eng, _ = _engine(direct="off", script=fail_after(4096, errno.ENOSPC))
    with eng:
        h = eng.open(tmp_path / "f.bin", "w")
        futs = eng.write_batch([(h, 0, b"a" * 4096), (h, 4096, b"b" * 100), (h, 4196, b"c" * 50)])
        errors = [f.exception(10) for f in futs[1:]]
    assert [e.context["offset"] for e in errors] == [4096, 4196]  # type: ignore[union-attr]
    assert [e.context["request"] for e in errors] == [  # type: ignore[union-attr]
        f"write 100 B at 4096 of {tmp_path / 'f.bin'}",
        f"write 50 B at 4196 of {tmp_path / 'f.bin'}",
    ]
