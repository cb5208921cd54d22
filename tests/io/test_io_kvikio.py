"""The kvikio backend: conformance where kvikio is installed, a clear refusal where it is not."""

from __future__ import annotations

import errno
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from carina.core.errors import BackendUnavailable
from carina.io import IOConfig, IOEngine, choose_backend
from carina.io.backends.kvikio import INSTALL_HINT, KvikioBackend, kvikio_errno
from carina.io.cli import probe_report
from carina.testing.io import IOBackendTests
from carina.testing.kvikio import KvikioCompatStandIn

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
