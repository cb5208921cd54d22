from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from carina.core.errors import ConfigError
from carina.infra.storage.enginebench import payload_dataset
from carina.infra.storage.qemuload import QemuLoadConfig, run_qemu_load

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")


def test_qemu_img_load_fills_verifies_and_measures_every_system(tmp_path: Path) -> None:
    image = tmp_path / "data.raw"
    image.write_bytes(payload_dataset(2 << 20, 64 << 10))
    cfg = QemuLoadConfig(systems=["torch", "inline", "forward"], blocks=[64 << 10], workers=1, device="cpu",
                         seconds=0.05)  # fmt: skip
    seen: list[int] = []
    rows = run_qemu_load(cfg, image, work=tmp_path, on_block=lambda r: seen.append(len(r)))
    by = {r["system"]: r for r in rows}
    assert seen == [3] and set(by) == {"torch", "inline", "forward"}
    assert all(r["fill_verified"] == 1.0 for r in rows)  # every export read back bit-exact through qemu-img
    assert by["forward"]["fill_ratio"] == 1.0 and by["inline"]["fill_ratio"] > 1.5  # zlib shrinks text; raw does not
    assert all(r["read_mb_s"] > 0 and r["write_const_mb_s"] > 0 and r["read_cpu_s_per_gb"] >= 0 for r in rows)
    # the GPU engine's host time per batch by step, from its final report; the CPU tiers time no steps
    assert by["torch"]["step_upload_cpu_us"] >= 0 and by["torch"]["step_device_wall_us"] >= 0
    assert not any(k.startswith("step_") for k in by["inline"])


def test_several_clients_fill_slices_of_front_end_servers_pinned_to_cores(tmp_path: Path) -> None:
    image = tmp_path / "data.raw"
    image.write_bytes(payload_dataset(2 << 20, 64 << 10))
    cfg = QemuLoadConfig(systems=["inline-fe2", "inline"], blocks=[64 << 10], workers=1, device="cpu", seconds=0.05,
                         clients=2, server_cpus="0", client_cpus="0")  # fmt: skip
    rows = run_qemu_load(cfg, image, work=tmp_path)
    # two qemu-img converts, each its own half: the compare of the whole export proves both halves landed
    assert [r["system"] for r in rows] == ["inline-fe2", "inline"] and all(r["fill_verified"] == 1.0 for r in rows)
    assert rows[0]["fill_ratio"] == rows[1]["fill_ratio"] > 1.5  # the same blocks stored the same way
    assert all(r["read_mb_s"] > 0 and r["write_const_mb_s"] > 0 for r in rows)


def test_qemu_load_config_rejects_unknown_systems_and_odd_blocks() -> None:
    with pytest.raises(ConfigError, match="systems"):
        QemuLoadConfig(systems=["nbdkit"])
    with pytest.raises(ConfigError, match="clients"):
        QemuLoadConfig(systems=["inline-fe2"], clients=3)
    with pytest.raises(ConfigError, match="blocks"):
        QemuLoadConfig(blocks=[3000])
