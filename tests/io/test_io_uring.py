"""The uring backend passes the IO conformance suite where the kernel allows io_uring."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.io.backends.uring import UringBackend
from carina.testing.io import IOBackendTests

pytestmark = pytest.mark.skipif(bool(UringBackend.probe_reasons()), reason="io_uring unavailable here")


class TestUring(IOBackendTests):
    backend = "uring"


class TestUringBuffered(IOBackendTests):
    backend = "uring"
    direct = "off"


def test_staging_arena_is_a_registered_buffer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from carina.io import IOConfig, IOEngine

    src = torch.arange(4096, dtype=torch.int32)  # 16 KiB: aligned, so neither side is bounced
    with IOEngine(IOConfig(backend="uring", bounce_bytes=1 << 20)) as eng:
        h = eng.open(tmp_path / "r.bin", "w")
        assert eng.write_staged(h, 0, src).result(10) == 16384
        dst = torch.empty_like(src)
        assert eng.read_staged(h, 0, dst).result(10) == 16384
        assert eng._staging.registered
        assert eng.backend.fixed_ops == 2
    assert torch.equal(dst, src)
