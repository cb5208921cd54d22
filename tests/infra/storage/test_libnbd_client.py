"""libnbd (the library behind nbdcopy/nbdinfo) driving the tier: many requests in flight, verified."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from carina.testing.storage import TierThread, import_libnbd

nbd = import_libnbd()
pytestmark = pytest.mark.skipif(nbd is None, reason="libnbd Python bindings (python3-libnbd) not installed")


def _wait_all(h, cookies: list[int]) -> None:
    while cookies:
        h.poll(-1)
        cookies[:] = [c for c in cookies if not h.aio_command_completed(c)]


@pytest.mark.parametrize("engine", ["process", "thread", "inline"])
def test_random_aio_reads_and_writes_verify_against_a_shadow_copy(
    start_tier: Callable[..., TierThread], engine: str
) -> None:
    size = 4 << 20
    tier = start_tier(engine=engine, size=size, block_size=16 << 10, slots=4)
    rng = random.Random(11)
    shadow = bytearray(size)
    h = nbd.NBD()
    h.connect_uri(tier.url)
    assert h.get_size() == size and h.can_multi_conn() and h.can_trim() and h.can_zero()
    for _ in range(6):
        # up to 24 non-overlapping writes in flight at once (more than the 4 slots)
        cursor, cookies = 0, []
        while cursor < size and len(cookies) < 24:
            off = cursor + rng.randrange(0, 60000)
            n = min(rng.choice([1, 777, 4096, 16384, 50000, 200000]), size - off)
            if n <= 0:
                break
            data = rng.randbytes(n // 2) + bytes(n - n // 2)  # half random, half zeros
            shadow[off : off + n] = data
            cookies.append(h.aio_pwrite(data, off))
            cursor = off + n
        _wait_all(h, cookies)
        reads = []
        for _ in range(24):
            off = rng.randrange(0, size - 1)
            n = min(rng.choice([512, 4096, 65536, 300000]), size - off)
            buf = nbd.Buffer(n)
            reads.append((off, n, buf, h.aio_pread(buf, off)))
        _wait_all(h, [r[3] for r in reads])
        for off, n, buf, _ in reads:
            assert buf.to_bytearray() == shadow[off : off + n], (off, n)
    h.flush()
    h.zero(65536, 8192)
    shadow[8192 : 8192 + 65536] = bytes(65536)
    assert h.pread(size, 0) == bytes(shadow)
    h.shutdown()
    assert tier.server.stats.errors == 0
