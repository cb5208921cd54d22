"""Crash consistency: a SIGKILLed server restarts with every acknowledged write intact."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from carina.testing.storage import TierProcess, mixed_image, qemu_io

ARGS = ["--size", "4M", "--block-size", "16K", "--slots", "4", "--stats-interval", "0.2"]


def test_killed_server_keeps_acknowledged_writes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    src = tmp_path / "in.raw"
    src.write_bytes(mixed_image(4 << 20, seed=7))
    with TierProcess(["--store", str(store), *ARGS, "--engine", "process", "--codec", "zstd"]) as tier:
        subprocess.run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", str(src), tier.url], check=True)
        qemu_io(tier.url, "write -P 0x3c 100000 70000")  # acknowledged, never flushed by us
        tier.kill()
    expected = bytearray(src.read_bytes())
    expected[100000:170000] = b"\x3c" * 70000
    assert not (store / "map.bin").exists()  # nothing was checkpointed: recovery is pure log replay
    with TierProcess(["--store", str(store), *ARGS, "--engine", "inline", "--codec", "lz4"]) as tier:
        out = tmp_path / "out.raw"
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "raw", tier.url, str(out)], check=True)
        assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(expected).digest()
        err = tier.stop()
    assert (store / "map.bin").exists(), err  # a clean stop checkpoints the map


def test_corrupted_block_reads_as_eio_not_garbage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with TierProcess(["--store", str(store), *ARGS, "--engine", "inline"]) as tier:
        qemu_io(tier.url, "write -P 0x11 0 16K", "write -P 0x22 16K 16K", "flush")
    from carina.infra.storage.store import BlockStore

    s = BlockStore(store, size=4 << 20, block_size=16 << 10)
    loc, clen = s.entry(0).loc, s.entry(0).clen
    s.close()
    with open(store / "data.log", "r+b") as f:  # rot one stored byte of block 0
        f.seek(loc + clen // 2)
        byte = f.read(1)
        f.seek(loc + clen // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    with TierProcess(["--store", str(store), *ARGS, "--engine", "inline"]) as tier:
        with pytest.raises(AssertionError, match="Input/output error"):
            qemu_io(tier.url, "read 0 4096")
        qemu_io(tier.url, "read -P 0x22 16K 16K")  # its neighbour is fine
        err = tier.stop()
    assert "failed verification: checksum mismatch" in err
