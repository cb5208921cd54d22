"""IO test doubles and the conformance suite every carina.io backend passes.

* :class:`MockBackend` - a scripted backend: it performs real ``preadv`` /
  ``pwritev`` on the file, except where a script says an op fails with an
  errno or stops short, and it records the ops it saw (for coalescing tests).
* :class:`NullBackend` - re-exported from :mod:`carina.io.backends.null`.
* :class:`~carina.testing.kvikio.KvikioCompatStandIn` (in :mod:`carina.testing.kvikio`) - a stand-in
  for ``kvikio.CuFile`` in KvikIO's POSIX compat mode, for machines without the CUDA driver KvikIO needs.
* :class:`IOBackendTests` - subclass it in a test module and set ``backend``::

      class TestPosix(IOBackendTests):
          backend = "posix"
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carina.core.errors import AlignmentError, DeviceFull, IOEngineError, ShortRead
from carina.io import IOConfig, IOEngine, aligned_buffer
from carina.io._future import Op, OpKind
from carina.io.backends.base import IOBackend
from carina.io.backends.null import NullBackend

__all__ = ["IOBackendTests", "MockBackend", "NullBackend", "Script", "fail_after"]

#: A script entry: called with the op, returns ``None`` (do it for real), an
#: ``int`` (pretend that many bytes moved, doing them for real) or an ``OSError``.
Script = Callable[[Op], "int | OSError | None"]


class MockBackend(IOBackend):
    """Real IO on a background thread, with scripted faults and a log of ops.

    Args:
        script: Consulted for every op in order; see :data:`Script`.
        hold: When set, ops wait until :meth:`release` is called (to test
            backpressure, drain and cancellation deterministically).
    """

    name: ClassVar[str] = "mock"
    capabilities: ClassVar[frozenset[str]] = frozenset({"vectored", "async", "real_io"})

    def __init__(
        self, *, script: Script | None = None, hold: bool = False, queue_depth: int = 64, workers: int = 1
    ) -> None:
        super().__init__(queue_depth=queue_depth, workers=workers)
        self.script = script
        self.log: list[tuple[OpKind, int, int, int]] = []  # kind, offset, nbytes, views
        self._gate = threading.Event()
        if not hold:
            self._gate.set()
        self._pending: list[Op] = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="carina-io-mock", daemon=True)
        self._stop = False
        self._thread.start()

    def release(self) -> None:
        """Let held ops run."""
        self._gate.set()

    def _submit(self, ops: Sequence[Op]) -> None:
        with self._cv:
            self._pending.extend(ops)
            self._cv.notify()

    def _close(self) -> None:
        self._gate.set()
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending or self._stop)
                if not self._pending:
                    return
                op = self._pending.pop(0)
            self._gate.wait()
            self.log.append((op.kind, op.offset, op.nbytes, len(op.views)))
            op.finish(self._perform(op))

    def _perform(self, op: Op) -> int | OSError:
        scripted = self.script(op) if self.script else None
        if isinstance(scripted, OSError):
            return scripted
        views = op.views if scripted is None else _truncate(op.views, scripted)
        try:
            if op.kind is OpKind.READ:
                return os.preadv(op.fd, views, op.offset)
            return os.pwritev(op.fd, views, op.offset)
        except OSError as exc:
            return exc


def _truncate(views: list[memoryview], nbytes: int) -> list[memoryview]:
    out = []
    for v in views:
        if nbytes <= 0:
            break
        out.append(v[:nbytes])
        nbytes -= v.nbytes
    return out


def fail_after(nbytes: int, error: int) -> Script:
    """A script: the first op moves at most ``nbytes``; every later one fails with ``error``."""
    calls: list[Any] = []

    def script(op: Op) -> int | OSError | None:
        calls.append(op)
        if len(calls) == 1:
            return min(nbytes, op.nbytes)
        return OSError(error, os.strerror(error))

    return script


_SIZE = 1 << 18
_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


def _pattern(nbytes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class IOBackendTests:
    """What every IO backend must do; subclass and set :attr:`backend` (and :attr:`direct`)."""

    backend: ClassVar[str] = "posix"
    direct: ClassVar[str] = "auto"

    def make(self, **overrides: Any) -> IOEngine:
        """An engine of this backend with the suite's settings."""
        return IOEngine(IOConfig(backend=self.backend, direct=self.direct, **overrides))  # type: ignore[arg-type]

    @pytest.fixture
    def engine(self) -> Iterator[IOEngine]:
        with self.make() as eng:
            yield eng

    @pytest.fixture
    def data_file(self, tmp_path: Path) -> tuple[Path, np.ndarray]:
        data = _pattern(_SIZE)
        path = tmp_path / "data.bin"
        data.tofile(path)
        return path, data

    # -- round trips ------------------------------------------------------------
    @_SETTINGS
    @given(reqs=st.lists(st.tuples(st.integers(0, _SIZE - 1), st.integers(0, 70_000)), min_size=1, max_size=12))
    def test_random_reads_are_bit_exact(self, engine: IOEngine, data_file: Any, reqs: list[tuple[int, int]]) -> None:
        path, data = data_file
        h = engine.open(path, "r")
        jobs = [(h, off, bytearray(min(n, _SIZE - off))) for off, n in reqs]
        for fut in engine.read_batch(jobs):
            fut.result(timeout=30)
        for _, off, buf in jobs:
            assert bytes(buf) == data[off : off + len(buf)].tobytes()
        engine.close_file(h)

    @_SETTINGS
    @given(
        writes=st.lists(
            st.tuples(st.integers(0, 100_000), st.integers(1, 20_000), st.integers(0, 255)), min_size=1, max_size=8
        )
    )
    def test_random_writes_read_back_exact(self, engine: IOEngine, writes: list[tuple[int, int, int]]) -> None:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
            h = engine.open(Path(d) / "w.bin", "w")
            model = bytearray()
            for off, n, seed in writes:
                chunk = _pattern(n, seed)
                assert engine.write(h, off, chunk).result(timeout=30) == n
                model.extend(b"\0" * max(0, off + n - len(model)))
                model[off : off + n] = chunk.tobytes()
            assert h.size == len(model)
            back = aligned_buffer(len(model))
            assert engine.read(h, 0, back).result(timeout=30) == len(model)
            assert back.tobytes() == bytes(model)
            engine.close_file(h)

    @_SETTINGS
    @given(
        rows=st.lists(st.integers(0, _SIZE // 512 - 8), min_size=0, max_size=100),
        width=st.sampled_from([512, 700, 4096, 8192]),
        shift=st.sampled_from([0, 1, 4096]),
    )
    def test_gather_rows_are_bit_exact(
        self, engine: IOEngine, data_file: Any, rows: list[int], width: int, shift: int
    ) -> None:
        path, data = data_file
        h = engine.open(path, "r")
        offsets = np.array(rows, dtype=np.int64) * 512 + shift
        offsets = offsets[offsets + width <= _SIZE]
        dest = aligned_buffer(len(offsets) * width)
        assert engine.gather(h, offsets, width, dest).result(timeout=30) == len(offsets) * width
        expect = b"".join(data[o : o + width].tobytes() for o in offsets.tolist())
        assert dest.tobytes() == expect
        engine.close_file(h)

    def test_gather_variable_lengths_and_short_rows(self, engine: IOEngine, data_file: Any) -> None:
        path, data = data_file
        h = engine.open(path, "r")
        offsets, lengths = np.array([0, 4096, 4096 + 300, 9000]), np.array([4096, 300, 5000, 1])
        dest = bytearray(int(lengths.sum()))
        assert engine.gather(h, offsets, lengths, dest).result(30) == len(dest)
        expect = b"".join(data[o : o + n].tobytes() for o, n in zip(offsets, lengths, strict=True))
        assert bytes(dest) == expect
        with pytest.raises(ShortRead) as info:
            engine.gather(h, np.array([0, _SIZE - 10]), 100, bytearray(200)).result(30)
        assert info.value.context["offset"] == _SIZE - 10

    def test_every_buffer_kind(self, engine: IOEngine, data_file: Any) -> None:
        torch = pytest.importorskip("torch")
        path, data = data_file
        h = engine.open(path, "r")
        bufs = [
            bytearray(4096),
            memoryview(bytearray(8192)),
            np.empty(1024, np.float32),
            aligned_buffer(8192),
            torch.empty(2048, dtype=torch.bfloat16),
        ]
        offsets = [1, 4096, 12288, 0, 5000]
        futs = [engine.read(h, off, b) for off, b in zip(offsets, bufs, strict=True)]
        assert [f.wait(30) for f in futs] == [4096, 8192, 4096, 8192, 4096]
        for off, b in zip(offsets, bufs, strict=True):
            raw = b.view(torch.uint8).numpy() if isinstance(b, torch.Tensor) else np.frombuffer(b, np.uint8)
            assert raw.tobytes() == data[off : off + raw.nbytes].tobytes()

    # -- batching ----------------------------------------------------------------
    def test_batch_merges_exactly_the_adjacent_requests(self, engine: IOEngine, data_file: Any) -> None:
        path, data = data_file
        h = engine.open(path, "r")
        spans = [(8192, 4096), (0, 4096), (4096, 4096), (20480, 4096), (0, 4096)]
        bufs = [aligned_buffer(n) for _, n in spans]
        before = dict(engine.stats)
        futs = engine.read_batch([(h, off, b) for (off, _), b in zip(spans, bufs, strict=True)])
        assert [f.result(30) for f in futs] == [4096] * 5
        assert engine.stats["merged"] - before["merged"] == 2  # 0+4096+8192 is one run; 20480 alone
        assert engine.stats["ops"] - before["ops"] == 2
        for (off, n), b in zip(spans, bufs, strict=True):
            assert b.tobytes() == data[off : off + n].tobytes()

    def test_queue_depth_bounds_operations_in_flight(self, data_file: Any) -> None:
        path, data = data_file
        with self.make(queue_depth=2) as eng:
            h = eng.open(path, "r")
            bufs = [aligned_buffer(4096) for _ in range(40)]
            futs = [eng.read(h, ((i * 7) % 64) * 4096, b) for i, b in enumerate(bufs)]
            eng.drain()
            assert all(f.done() for f in futs)
            assert eng.stats["peak_inflight"] <= 2
            assert all(b.tobytes() == data[((i * 7) % 64) * 4096 :][:4096].tobytes() for i, b in enumerate(bufs))

    def test_callbacks_may_submit_more_work(self, data_file: Any) -> None:
        path, data = data_file
        with self.make(queue_depth=1) as eng:
            h = eng.open(path, "r")
            second = bytearray(100)
            chained: list[Any] = []
            eng.read(h, 0, bytearray(10)).add_done_callback(lambda _: chained.append(eng.read(h, 50, second)))
            eng.drain()
            assert chained and chained[0].result(30) == 100
            assert bytes(second) == data[50:150].tobytes()

    def test_adjacent_writes_become_one_write(self, engine: IOEngine, tmp_path: Path) -> None:
        h = engine.open(tmp_path / "a.bin", "w")
        chunks = [_pattern(4096, seed) for seed in range(4)]
        before = engine.stats["ops"]
        futs = engine.write_batch([(h, 4096 * i, c) for i, c in zip((2, 0, 3, 1), chunks, strict=True)])
        assert [f.result(30) for f in futs] == [4096] * 4
        assert engine.stats["ops"] - before == 1
        engine.fsync(h)
        order = [chunks[1], chunks[3], chunks[0], chunks[2]]
        assert (tmp_path / "a.bin").read_bytes() == b"".join(c.tobytes() for c in order)

    # -- faults ------------------------------------------------------------------
    def test_short_read_names_the_request(self, engine: IOEngine, data_file: Any) -> None:
        path, _ = data_file
        h = engine.open(path, "r")
        ok, short = engine.read_batch([(h, 0, bytearray(10)), (h, _SIZE - 100, bytearray(300))])
        assert ok.result(30) == 10
        with pytest.raises(ShortRead) as info:
            short.result(30)
        assert info.value.context["offset"] == _SIZE - 100
        assert (info.value.context["expected"], info.value.context["got"]) == (300, 100)

    def test_device_full(self, engine: IOEngine) -> None:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        h = engine.open("/dev/full", "rw")
        with pytest.raises(DeviceFull) as info:
            engine.write(h, 0, b"x" * 4096).result(30)
        assert info.value.context["path"] == "/dev/full"

    def test_direct_on_refuses_misaligned_writes(self, tmp_path: Path) -> None:
        try:
            eng = IOEngine(IOConfig(backend=self.backend, direct="on"))  # type: ignore[arg-type]
            h = eng.open(tmp_path / "d.bin", "w")
        except IOEngineError as exc:
            pytest.skip(f"O_DIRECT unavailable here: {exc}")
        with eng:
            with pytest.raises(AlignmentError) as info:
                eng.write(h, 100, b"y" * 4096).result(30)
            assert info.value.context["offset"] == 100
            assert eng.write(h, 0, _pattern(8192)).result(30) == 8192  # aligned, any buffer: bounced
            eng.fsync(h)
        assert (tmp_path / "d.bin").read_bytes() == _pattern(8192).tobytes()

    def test_writes_to_a_read_only_file_are_refused(self, engine: IOEngine, data_file: Any) -> None:
        h = engine.open(data_file[0], "r")
        with pytest.raises(IOEngineError, match="read-only"):
            engine.write(h, 0, b"z")

    # -- lifecycle ---------------------------------------------------------------
    def test_close_leaks_no_thread_or_descriptor(self, data_file: Any) -> None:
        fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
        eng = self.make()
        h = eng.open(data_file[0], "r")
        futs = [eng.read(h, i * 4096, aligned_buffer(4096)) for i in range(16)]
        eng.close()
        assert all(f.done() for f in futs)
        assert (len(os.listdir("/proc/self/fd")), threading.active_count()) == (fds, threads)
        with pytest.raises(IOEngineError, match="closed"):
            eng.read(h, 0, bytearray(1))
        with pytest.raises(IOEngineError, match="closed"):
            eng.open(data_file[0], "r")
        eng.close()  # idempotent

    def test_fsync_then_reopen_sees_the_bytes(self, engine: IOEngine, tmp_path: Path) -> None:
        h = engine.open(tmp_path / "s.bin", "w", size=8192)
        assert h.size == 8192
        futs = engine.write_batch([(h, 0, b"a" * 4096), (h, 4096, b"b" * 4096)])
        assert [f.result(30) for f in futs] == [4096, 4096]
        engine.fsync(h)
        engine.close_file(h)
        assert (tmp_path / "s.bin").read_bytes() == b"a" * 4096 + b"b" * 4096
        assert errno.ENOSPC  # keep the import honest for subclasses that script faults
