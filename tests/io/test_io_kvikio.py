"""The kvikio backend: conformance where kvikio is installed, a clear refusal where it is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from carina.core.errors import BackendUnavailable
from carina.io import IOConfig, IOEngine, choose_backend
from carina.io.backends.kvikio import INSTALL_HINT, KvikioBackend
from carina.io.cli import probe_report
from carina.testing.io import IOBackendTests

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
