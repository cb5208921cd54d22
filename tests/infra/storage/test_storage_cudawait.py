"""How GPU engines' launch threads wait: the config, the driver call's failure paths, the systems that ask."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.core.errors import BackendUnavailable, ConfigError
from carina.infra.storage.codecs import Codec
from carina.infra.storage.config import EngineConfig, EngineKind
from carina.infra.storage.cudawait import CudaWait, set_cuda_wait
from carina.infra.storage.engines import build_engine
from carina.infra.storage.qemuload import QemuLoadConfig, _start


def test_block_is_refused_for_cpu_engines_and_round_trips_for_gpu_engines() -> None:
    with pytest.raises(ConfigError, match="cuda_wait=block is for the torch and nvcomp engines"):
        EngineConfig(kind=EngineKind.PROCESS, cuda_wait=CudaWait.BLOCK)
    cfg = EngineConfig(kind=EngineKind.TORCH, cuda_wait=CudaWait.BLOCK)
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["cuda_wait"] == "block"


def test_spin_and_non_cuda_devices_touch_no_driver() -> None:
    missing = "/nonexistent/libcuda.so.1"
    assert set_cuda_wait("cuda:0", CudaWait.SPIN, library=missing) == "spin: CUDA's default schedule"
    assert set_cuda_wait("cpu", CudaWait.BLOCK, library=missing).startswith("block asked, but cpu is not a CUDA")


def test_block_on_cuda_without_a_driver_fails_loudly() -> None:
    with pytest.raises(BackendUnavailable, match="cuda_wait=block needs the CUDA driver") as e:
        set_cuda_wait("cuda:1", CudaWait.BLOCK, library="/nonexistent/libcuda.so.1")
    assert e.value.context == {"device": "cuda:1"}


def test_a_cpu_torch_engine_with_block_runs_and_says_nothing_was_set() -> None:
    cfg = EngineConfig(kind=EngineKind.TORCH, device="cpu", workers=1, cuda_wait=CudaWait.BLOCK)
    engine = build_engine(cfg, arena_bytes=1 << 20, codec=Codec.ZVC)
    try:
        assert engine.cuda_wait_note == "block asked, but cpu is not a CUDA device: nothing to set"
    finally:
        engine.close()


def test_bsync_systems_serve_with_block_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class Popen:  # records the command; nothing is started
        def __init__(self, cmd: list[str], **_: object) -> None:
            seen.append(cmd)

    monkeypatch.setattr("carina.infra.storage.qemuload.subprocess.Popen", Popen)
    cfg = QemuLoadConfig(systems=["torch-bsync-fe4", "torch-fe4", "nvcomp-bsync"], gpu_workers=1, workers=8)
    for system in cfg.systems:
        _start(cfg, system, 4096, 1 << 20, tmp_path)
    waits = [cmd[cmd.index("--cuda-wait") + 1] for cmd in seen]
    engines = [cmd[cmd.index("--engine") + 1] for cmd in seen]
    assert waits == ["block", "spin", "block"] and engines == ["torch", "torch", "nvcomp"]
    assert [cmd[cmd.index("--frontends") + 1] for cmd in seen] == ["4", "4", "1"]
    assert all(cmd[cmd.index("--workers") + 1] == "1" for cmd in seen)  # the GPU systems' launch threads
