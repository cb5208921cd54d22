from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from carina.testing.storage import RawNbdClient, TierProcess, qemu_io

pytestmark = pytest.mark.skipif(
    not (shutil.which("qemu-io") and shutil.which("nbdcopy")), reason="needs qemu-io and nbdcopy"
)

SIZE, BLOCK, CLIENTS, BLOCKS = 8 << 20, 16 << 10, 6, 48


def _patch_writes(client: int, base: int) -> list[str]:
    """Client ``client`` patches its own 2000-byte slice of each of BLOCKS shared blocks (partial-block writes)."""
    return [f"write -P {base + client} {(k * BLOCK) + client * 2048} 2000" for k in range(BLOCKS)]


def _expect(image: bytearray, base: int) -> None:
    for c in range(CLIENTS):
        for k in range(BLOCKS):
            at = k * BLOCK + c * 2048
            image[at : at + 2000] = bytes([base + c]) * 2000


def _concurrent_clients(url: str, base: int, extra: list[list[str]]) -> None:
    jobs = [_patch_writes(c, base) for c in range(CLIENTS)] + extra
    procs = []
    for cmds in jobs:
        args = ["qemu-io", "-f", "raw"]
        for cmd in cmds:
            args += ["-c", cmd]
        procs.append(subprocess.Popen([*args, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "error" not in out.lower() and "fail" not in out.lower(), out[-1000:]


def _digest_of_export(url: str, tmp: Path) -> str:
    copy = tmp / "copy.raw"
    copy.unlink(missing_ok=True)
    subprocess.run(["nbdcopy", url, str(copy)], check=True, timeout=120)  # multi-conn: several front ends serve it
    return hashlib.sha256(copy.read_bytes()).hexdigest()


def test_front_end_processes_share_one_store_with_real_clients(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ["--store", str(store), "--size", str(SIZE), "--block-size", str(BLOCK), "--codec", "zstd"]
    image = bytearray(SIZE)
    # 1: three front ends, six clients patching the same blocks at disjoint offsets, one writing whole blocks
    with TierProcess([*args, "--engine", "thread", "--frontends", "3"]) as tier:
        assert len(tier.events[0]["pids"]) == 3
        whole = [f"write -P 0x7e {4 << 20} {1 << 20}", "flush"]
        _concurrent_clients(tier.url, 0x31, [whole])
        _expect(image, 0x31)
        image[4 << 20 : 5 << 20] = b"\x7e" * (1 << 20)
        assert _digest_of_export(tier.url, tmp_path) == hashlib.sha256(image).hexdigest()
        tier.stop()
    stopped = tier.events[-1]
    assert stopped["event"] == "stopped" and len(stopped["frontends"]) == 3
    assert sum(f["accepted"] for f in stopped["frontends"]) >= CLIENTS + 2
    assert sum(1 for f in stopped["frontends"] if f["accepted"]) >= 2  # the connections were spread
    assert all(f["errors"] == 0 and f["protocol_errors"] == 0 for f in stopped["frontends"])
    # 2: two front ends (process engine) overwrite the patches, then the server is SIGKILLed (no checkpoint)
    tier = TierProcess([*args, "--engine", "process", "--workers", "1", "--frontends", "2"])
    try:
        _concurrent_clients(tier.url, 0x51, [])
    finally:
        tier.kill()
    _expect(image, 0x51)
    # 3: one front end replays the shared log: every acknowledged write is there
    with TierProcess([*args, "--engine", "inline"]) as tier:
        assert _digest_of_export(tier.url, tmp_path) == hashlib.sha256(image).hexdigest()


def test_front_ends_take_turns_accepting_connections(tmp_path: Path) -> None:
    args = ["--store", str(tmp_path / "store"), "--size", str(SIZE), "--block-size", str(BLOCK), "--engine", "inline"]
    with TierProcess([*args, "--frontends", "2"]) as tier:
        clients = []
        for k in range(4):  # each connection is through its handshake before the next one opens
            client = RawNbdClient(tier.port)
            client.go()
            assert client.write(k * BLOCK, bytes([0x41 + k]) * BLOCK) == 0
            clients.append(client)
        for k, client in enumerate(clients):  # every front end sees what the others wrote (one shared store)
            assert client.read(((k + 1) % 4) * BLOCK, BLOCK) == bytes([0x41 + (k + 1) % 4]) * BLOCK
            client.disconnect()
        tier.stop()
    assert sorted(f["accepted"] for f in tier.events[-1]["frontends"]) == [2, 2]  # balanced, not hashed


def test_front_ends_prepare_their_gpu_engine_before_accepting(tmp_path: Path) -> None:
    """Each front end warms its engine up (graphs, CRC tables on a GPU) before "ready", not in the first requests.

    Session 8 found the front ends skipping it: every GPU fill behind 4 front ends paid 0.85-1.1 s of warm-up.
    The torch engine runs here on the CPU (the same code as on a GPU, minus the graphs).
    """
    pytest.importorskip("torch")
    args = ["--store", str(tmp_path / "store"), "--size", str(SIZE), "--block-size", str(BLOCK), "--codec", "zvc",
            "--engine", "torch", "--device", "cpu", "--workers", "1", "--frontends", "2"]  # fmt: skip
    with TierProcess(args) as tier:
        qemu_io(tier.url, f"write -P 0x5a 0 {4 * BLOCK}", f"read -P 0x5a 0 {4 * BLOCK}", "flush")
        tier.stop()
    ends = tier.events[-1]["frontends"]
    assert len(ends) == 2
    assert all(f["engine_prepared_block"] == BLOCK and f["engine_prepare_s"] >= 0 for f in ends), ends
    assert sum(f["engine_jobs"] for f in ends) >= 8  # the 4-block write and read went through the torch engine
