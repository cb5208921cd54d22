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


def test_gathers_run_as_linked_chains_and_a_broken_chain_fails_only_its_gather(tmp_path: Path) -> None:
    import numpy as np

    from carina.core.errors import ShortRead
    from carina.io import IOConfig, IOEngine, aligned_buffer

    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "c.bin"
    data.tofile(path)
    with IOEngine(IOConfig(backend="uring", queue_depth=3)) as eng:
        h = eng.open(path, "r")
        rows = np.random.default_rng(4).integers(0, 256, 1001) * 4096  # 3 chains of 16, then the leftovers
        dest = aligned_buffer(len(rows) * 4096)
        assert eng.gather(h, rows, 4096, dest).result(30) == len(rows) * 4096
        assert dest.tobytes() == b"".join(data[r : r + 4096].tobytes() for r in rows.tolist())
        bad = rows[:48].copy()
        bad[22] = (1 << 20) - 4096 // 2  # mid-chain (chain 1, 8th row): a short read breaks the chain's links
        with pytest.raises(ShortRead) as info:
            eng.gather(h, bad, 2048 * 2, aligned_buffer(48 * 4096)).result(30)
        assert info.value.context["offset"] == bad[22]
        again = aligned_buffer(4096 * 48)  # the ring is whole: every slot came back
        assert eng.gather(h, rows[:48], 4096, again).result(30) == 48 * 4096
        assert eng.backend._room == eng.backend._capacity == 3
    assert again.tobytes() == dest.tobytes()[: 48 * 4096]


def test_chain_layout_links_every_row_but_the_last_of_each_chain() -> None:
    import numpy as np

    from carina.io.backends._ring import OP_READ, Ring
    from carina.io.backends.uring import _TAIL, _chained

    users = np.arange(6, dtype=np.uint64)
    entries = Ring.entries(OP_READ, 5, users * 4096, users, np.full(6, 4096), users)
    block = _chained(entries, 2, 3).copy().view(np.uint8).reshape(6, 64)
    assert (block[:, 0] == OP_READ).all()
    assert block[:, 1].tolist() == [4, 4, 0, 4, 4, 0]  # IOSQE_IO_LINK, not on a chain's last entry
    user = block[:, 32:40].copy().view(np.uint64).ravel()
    assert (user & np.uint64(0xFFFF)).tolist() == [0, 2, 4, 1, 3, 5]  # chain j: rows j, j + 2, j + 4
    assert [bool(u & np.uint64(_TAIL)) for u in user] == [False, False, True, False, False, True]
