"""The kvikio backend: conformance where kvikio is installed, a clear refusal where it is not."""

from __future__ import annotations

import errno
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carina.core.errors import BackendUnavailable
from carina.io import IOConfig, IOEngine, aligned_buffer, choose_backend
from carina.io.backends.kvikio import INSTALL_HINT, KvikioBackend, configure_kvikio, kvikio_errno
from carina.io.cli import probe_report
from carina.testing.io import IOBackendTests
from carina.testing.kvikio import KvikioCompatStandIn, KvikioDefaultsStandIn, write_kvikio_package

HAVE_KVIKIO = not KvikioBackend.probe_reasons()


@pytest.mark.skipif(importlib.util.find_spec("kvikio") is not None, reason="kvikio is installed here")
def test_kvikio_backend_says_why_it_cannot_run_without_kvikio(tmp_path: Path) -> None:
    assert KvikioBackend.probe_reasons() == [INSTALL_HINT]
    with pytest.raises(BackendUnavailable, match="kvikio is not installed"):
        choose_backend("kvikio")
    with pytest.raises(BackendUnavailable, match="kvikio is not installed"):
        IOEngine(IOConfig(backend="kvikio"))
    assert choose_backend("auto").backend.name in ("uring", "posix")  # never picked by auto
    assert probe_report(tmp_path)["named_only"] == {"kvikio": [INSTALL_HINT]}  # `carina io probe` says why


@pytest.mark.skipif(not HAVE_KVIKIO, reason=f"kvikio unavailable: {KvikioBackend.probe_reasons()}")
class TestKvikio(IOBackendTests):
    backend = "kvikio"


class TestKvikioLogicOnAStandIn(IOBackendTests):
    """The backend's own code (clamped reads, errno from KvikIO's messages) against a compat-mode stand-in."""

    backend = "kvikio"

    def make(self, **overrides: Any) -> IOEngine:
        cfg = IOConfig(backend="auto", direct=self.direct, **overrides)  # type: ignore[arg-type]
        backend = KvikioBackend(queue_depth=cfg.queue_depth, workers=cfg.workers, cufile=KvikioCompatStandIn)
        return IOEngine(cfg, backend=backend)

    def test_direct_on_refuses_misaligned_writes(self, tmp_path: Path) -> None:
        pytest.skip("builds its engine from the config: covered by the real-kvikio class")


def test_kvikio_messages_map_back_to_their_errno() -> None:
    assert kvikio_errno("KvikIO failure at: posix_io.hpp:90: POSIX error on pwrite: No space left on device") == (
        errno.ENOSPC
    )
    assert kvikio_errno("POSIX error on pread: Bad file descriptor") == errno.EBADF
    assert kvikio_errno("POSIX error on pread: EOF") == errno.EIO  # no errno there
    assert kvikio_errno("cuFile error") == errno.EIO


KVIKIO_VARS = ("KVIKIO_AUTO_DIRECT_IO_READ", "KVIKIO_AUTO_DIRECT_IO_WRITE", "KVIKIO_NTHREADS")


@pytest.fixture
def stand_in_kvikio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A stand-in ``kvikio`` package first on sys.path (``defaults`` a submodule, as in KvikIO 26.10)."""
    saved = {name: mod for name, mod in sys.modules.items() if name == "kvikio" or name.startswith("kvikio.")}
    for name in saved:
        del sys.modules[name]
    for var in KVIKIO_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(write_kvikio_package(tmp_path / "pkg")))
    import kvikio

    yield kvikio
    for name in [n for n in sys.modules if n == "kvikio" or n.startswith("kvikio.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_backend_turns_direct_io_on_through_the_defaults_submodule_on_a_stand_in(
    stand_in_kvikio: Any, tmp_path: Path
) -> None:
    assert not hasattr(stand_in_kvikio, "defaults")  # `import kvikio` leaves the submodule unloaded
    backend = KvikioBackend(queue_depth=8, workers=6)
    try:
        settings = sys.modules["kvikio.defaults"].STAND_IN
        assert settings.values == {"auto_direct_io_read": True, "auto_direct_io_write": True, "num_threads": 6}
        assert backend.direct_io["settings"] == settings.values
        assert backend.direct_io["page_cache"] == [] and backend.direct_io["from_environment"] == []
        data = np.random.default_rng(2).integers(0, 256, 1 << 16, dtype=np.uint8)
        data.tofile(tmp_path / "d.bin")
        with IOEngine(IOConfig(queue_depth=8), backend=backend) as eng:  # the package's CuFile serves the reads
            buf = aligned_buffer(8192)
            assert eng.read(eng.open(tmp_path / "d.bin", "r"), 4096, buf).result() == 8192
        assert np.array_equal(buf, data[4096:12288])
    finally:
        backend.close()


def test_kvikio_settings_named_in_the_environment_are_left_alone_and_reported() -> None:
    defaults = KvikioDefaultsStandIn()
    defaults.values["num_threads"] = 16
    out = configure_kvikio(defaults, threads=4, environ={"KVIKIO_AUTO_DIRECT_IO_READ": "0"})
    assert defaults.calls == [("auto_direct_io_write", True), ("num_threads", 16)]  # never shrinks the pool
    assert out["from_environment"] == ["KVIKIO_AUTO_DIRECT_IO_READ"]
    assert out["settings"] == {"auto_direct_io_read": False, "auto_direct_io_write": True, "num_threads": 16}
    assert out["page_cache"] == [
        "KvikIO's Direct I/O for reads is off (KVIKIO_AUTO_DIRECT_IO_READ): its reads use the page cache"
    ]


def test_a_file_kvikio_holds_no_o_direct_descriptor_for_is_named_on_a_stand_in(tmp_path: Path) -> None:
    class NoDirectStandIn(KvikioCompatStandIn):
        def is_direct_io_supported(self) -> bool:
            return False

    (tmp_path / "d.bin").write_bytes(bytes(8192))
    backend = KvikioBackend(queue_depth=4, workers=2, cufile=NoDirectStandIn)
    with IOEngine(IOConfig(queue_depth=4), backend=backend) as eng:
        eng.read(eng.open(tmp_path / "d.bin", "r"), 0, aligned_buffer(4096)).result()
        [why] = backend.direct_io["page_cache"]
    assert why == f"KvikIO holds no O_DIRECT descriptor for {tmp_path / 'd.bin'}: its IO uses the page cache"


@pytest.mark.skipif(importlib.util.find_spec("kvikio") is None, reason="kvikio is not installed")
def test_real_kvikio_is_left_with_direct_io_on_and_a_thread_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in KVIKIO_VARS:  # KvikIO's settings, not the environment's, decide here
        monkeypatch.delenv(var, raising=False)
    import kvikio.defaults  # works without the CUDA driver: no file is opened

    backend = KvikioBackend(queue_depth=8, workers=5)
    try:
        assert kvikio.defaults.get("auto_direct_io_read") is True
        assert kvikio.defaults.get("auto_direct_io_write") is True
        assert kvikio.defaults.get("num_threads") >= 5
        assert backend.direct_io["page_cache"] == []
    finally:
        backend.close()
