"""Real NBD clients (qemu-img, qemu-io, nbdcopy, nbdinfo) against a real tier on loopback."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from carina.testing.storage import TierThread, mixed_image, qemu_io


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("engine", "codec", "loop", "size"),
    [
        ("process", "lz4", "uvloop", 8 << 20),
        ("inline", "zstd", "asyncio", 8 << 20),
        ("torch", "zvc", "asyncio", 1 << 20),
    ],
)
def test_qemu_img_convert_in_and_out_bit_exact(
    start_tier: Callable[..., TierThread], tmp_path: Path, engine: str, codec: str, loop: str, size: int
) -> None:
    src = tmp_path / "in.raw"
    src.write_bytes(mixed_image(size, seed=1))
    tier = start_tier(engine=engine, codec=codec, loop=loop, size=size)
    subprocess.run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", str(src), tier.url], check=True)
    out = tmp_path / "out.raw"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "raw", tier.url, str(out)], check=True)
    assert _sha(out) == _sha(src)
    stats = tier.server.tier.store.stats()
    if codec != "zvc":
        assert stats.ratio > 1.5, stats  # the mixed image compresses; zero runs are holes
    assert stats.stored_bytes < src.stat().st_size


def test_nbdcopy_round_trip_and_nbdinfo(start_tier: Callable[..., TierThread], tmp_path: Path) -> None:
    src = tmp_path / "in.raw"
    src.write_bytes(mixed_image(4 << 20, seed=2))
    tier = start_tier(engine="process", size=4 << 20, block_size=4096)
    subprocess.run(["nbdcopy", str(src), tier.url], check=True)
    out = tmp_path / "out.raw"
    subprocess.run(["nbdcopy", tier.url, str(out)], check=True)
    assert _sha(out) == _sha(src)
    info = json.loads(
        subprocess.run(["nbdinfo", "--json", tier.url], capture_output=True, text=True, check=True).stdout
    )
    exp = info["exports"][0]
    assert exp["export-size"] == 4 << 20 and exp["can_trim"] and exp["can_flush"] and exp["can_multi_conn"]
    assert exp["block_size_preferred"] == 4096
    listed = subprocess.run(
        ["nbdinfo", "--list", "--json", tier.url.rsplit("/", 1)[0]], capture_output=True, text=True, check=True
    )
    assert [e["export-name"] for e in json.loads(listed.stdout)["exports"]] == ["carina"]


def test_qemu_io_random_unaligned_writes_verify(start_tier: Callable[..., TierThread]) -> None:
    """Unaligned writes force read-modify-write of partial blocks; every pattern must read back."""
    tier = start_tier(engine="process", size=4 << 20, block_size=16 << 10)
    rng = random.Random(3)
    spans: list[tuple[int, int, int]] = []
    cursor = 0
    for i in range(24):
        off = cursor + rng.randrange(0, 20000)
        n = rng.choice([1, 511, 4096, 16384, 40000, 300000])
        spans.append((off, n, 0x10 + i))
        cursor = off + n
    cmds = [f"write -P {pat} {off} {n}" for off, n, pat in spans]
    cmds += [f"read -P {pat} {off} {n}" for off, n, pat in spans]
    gaps = [(a[0] + a[1], b[0] - a[0] - a[1]) for a, b in itertools.pairwise(spans) if b[0] > a[0] + a[1]]
    cmds += [f"read -P 0 {off} {n}" for off, n in gaps]  # never-written bytes stay zero around the patches
    qemu_io(tier.url, *cmds)


def test_write_zeroes_discard_and_fua(start_tier: Callable[..., TierThread]) -> None:
    tier = start_tier(engine="inline", size=2 << 20, block_size=4096)
    qemu_io(tier.url, "write -P 0x5a 0 1M", "write -z 1000 200000", "write -P 0x6b -f 300000 5000", "discard 512K 256K")
    qemu_io(
        tier.url,
        "read -P 0x5a 0 1000",
        "read -P 0 1000 200000",
        "read -P 0x5a 201000 99000",
        "read -P 0x6b 300000 5000",
        "read -P 0 524288 262144",
        "read -P 0x5a 786432 262144",
    )


def test_concurrent_clients_on_disjoint_regions(start_tier: Callable[..., TierThread]) -> None:
    tier = start_tier(engine="process", size=8 << 20, block_size=4096, slots=4)
    procs = [
        subprocess.Popen(
            [
                "qemu-io",
                "-f",
                "raw",
                "-c",
                f"aio_write -P {0x21 + k} {k << 20} 1M",
                "-c",
                "aio_flush",
                "-c",
                f"write -P {0x41 + k} {(k << 20) + 4096} 8192",
                tier.url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in range(6)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    for k in range(6):
        base = k << 20
        qemu_io(
            tier.url,
            f"read -P {0x21 + k} {base} 4096",
            f"read -P {0x41 + k} {base + 4096} 8192",
            f"read -P {0x21 + k} {base + 12288} {(1 << 20) - 12288}",
        )
    assert tier.server.stats.ops["write"] >= 12
