from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from carina.core.errors import ConfigError
from carina.infra.storage.config import StoreConfig, TierConfig, parse_size
from carina.infra.storage.stats import LatencyHistogram, TierStats


@pytest.mark.parametrize(("text", "n"), [("4096", 4096), ("64K", 65536), ("1M", 1 << 20), ("2GiB", 2 << 30), (7, 7)])
def test_parse_size(text: str | int, n: int) -> None:
    assert parse_size(text) == n


def test_parse_size_rejects_junk() -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size("12 apples")


def test_config_round_trips_and_rejects_bad_geometry(tmp_path: Path) -> None:
    cfg = TierConfig(store=StoreConfig(path=tmp_path, size=1 << 20, block_size=4096, codec="zstd"))
    assert TierConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="multiple of block_size"):
        StoreConfig(size=10000, block_size=4096)
    with pytest.raises(ConfigError, match="power of two"):
        StoreConfig(block_size=3000)
    with pytest.raises(ConfigError, match="unknown key"):
        TierConfig.from_dict({"store": {"path": "x", "compression": "lz4"}})


def test_latency_percentiles_are_within_a_bucket() -> None:
    h = LatencyHistogram()
    for us in range(1, 1001):  # 1 us .. 1 ms uniformly
        h.add(us * 1e-6)
    assert h.percentile(0.5) == pytest.approx(500e-6, rel=0.07)
    assert h.percentile(0.99) == pytest.approx(990e-6, rel=0.07)
    assert h.percentile(0.5) >= 500e-6  # reported as the bucket's upper edge


def test_snapshot_rates() -> None:
    s = TierStats()
    s.record("write", 4096, 0.001)
    s.record("read", 8192, 0.002)
    s.record("read", 0, 0.0, ok=False)
    snap = s.snapshot()
    assert snap["ops"] == {"write": 1, "read": 2} and snap["errors"] == 1
    assert snap["bytes_read"] == 8192 and snap["bytes_written"] == 4096
    assert s.snapshot()["iops"] == 0.0  # rates are per window


def test_range_lock_excludes_overlaps_between_single_blocks_and_ranges() -> None:
    from carina.infra.storage.tier import RangeLock

    async def main() -> list[str]:
        lock, order = RangeLock(), []

        async def hold(name: str, lo: int, hi: int, delay: float) -> None:
            async with lock.hold(lo, hi):
                order.append(f"+{name}")
                await asyncio.sleep(delay)
                order.append(f"-{name}")

        await asyncio.gather(
            hold("a", 5, 6, 0.02),  # one block
            hold("b", 0, 1 << 30, 0.0),  # a huge range over it: waits for a, without walking 2**30 blocks
            hold("c", 7, 8, 0.0),  # a disjoint block: runs at once
            hold("d", 5, 6, 0.0),  # the same block as a: waits
        )
        return order

    order = asyncio.run(main())
    assert order.index("+c") < order.index("-a")  # disjoint: not excluded
    assert order.index("-a") < order.index("+b") and order.index("-a") < order.index("+d")
    assert order.index("-c") < order.index("+b")  # b covers c's block too
