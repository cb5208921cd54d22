"""CUDA path: side-stream staging into pinned arenas, forked/spawned writers, restore onto the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from carina.ckpt import Checkpointer, Config, WriterKind

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)], torch.nn.BatchNorm1d(1024)).cuda()


def test_device_snapshot_back_to_back_saves_are_each_the_pre_step_state(tmp_path: Path) -> None:
    """The spare device buffer is reused by the next save only after its bytes left for the host."""
    model = _net(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(256, 1024, device="cuda")
    expected = []
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.THREAD, keep_last=0, device_snapshot="on")) as ckpt:
        for step in (1, 2, 3):
            model(x).square().mean().backward()
            opt.step()
            expected.append({k: v.clone() for k, v in model.state_dict().items()})
            ckpt.save(step, {"model": model, "optim": opt})  # no wait between saves
        model(x).square().mean().backward()
        opt.step()
        assert ckpt._stager._dev is not None  # the device snapshot was taken
        ckpt.wait()
        for step, want in zip((1, 2, 3), expected, strict=True):
            fresh = _net(step + 10)
            assert ckpt.restore({"model": fresh, "optim": torch.optim.AdamW(fresh.parameters())}, step=step) == step
            for k, v in want.items():
                assert torch.equal(fresh.state_dict()[k], v), (step, k)


@pytest.mark.parametrize("device_snapshot", ["on", "off"])
@pytest.mark.parametrize("writer", ["fork", "process", "thread"])
def test_cuda_snapshot_is_the_pre_step_state(tmp_path: Path, writer: str, device_snapshot: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)], torch.nn.BatchNorm1d(1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(256, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = Config(dir=str(tmp_path), writer=WriterKind(writer), device_snapshot=device_snapshot)
    with Checkpointer(cfg) as ckpt:
        ckpt.save(1, {"model": model, "optim": opt})
        assert (ckpt._stager._dev is not None) == (device_snapshot == "on")
        model(x).square().mean().backward()  # updates BatchNorm buffers right after the snapshot
        opt.step()  # the pre-step hook waits for staging: the snapshot keeps the pre-step values
        assert ckpt._stager._bufs[0][1].pinned  # type: ignore[index]
        ckpt.wait()
        torch.manual_seed(1)
        fresh = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)], torch.nn.BatchNorm1d(1024)).cuda()
        fopt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        assert ckpt.restore({"model": fresh, "optim": fopt}) == 1
    for k, v in expected.items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh[0].weight.is_cuda


@pytest.mark.parametrize("writer", ["fork", "thread"])
def test_managed_memory_state_round_trips(tmp_path: Path, writer: str) -> None:
    from carina.ckpt.managed import is_managed, managed_empty
    from carina.core.errors import CapacityError

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8)).cuda()
    weight = managed_empty((1024, 1024), torch.float32)
    weight.copy_(model[0].weight.data)
    model[0].weight.data = weight  # 4 MiB of the trained state in unified memory
    assert is_managed(model[0].weight) and not is_managed(model[1].weight)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(writer))) as ckpt:
        ckpt.save(1, {"model": model, "optim": opt})
        model(x).square().mean().backward()
        opt.step()  # writes the managed weight once staging has copied it
        ckpt.wait()
        assert not torch.equal(model[0].weight, expected["0.weight"])
        assert ckpt.restore({"model": model, "optim": opt}) == 1
    for k, v in expected.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model[0].weight.data_ptr() == weight.data_ptr() and is_managed(model[0].weight)  # restored in place
    free = torch.cuda.mem_get_info()[0]
    with pytest.raises(CapacityError):
        managed_empty((free // 4 + (1 << 28),), torch.float32)  # refused before asking the driver
