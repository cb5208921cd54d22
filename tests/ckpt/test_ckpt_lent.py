"""Lent host state (carina.offload's masters and optimizer state): copied behind training, guarded on write."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import carina.offload as co
from carina.ckpt import Checkpointer, Config, WriterKind
from carina.ckpt import staging as staging_mod
from carina.ckpt.commit import committed_steps
from carina.ckpt.hostcopy import LazyCopies, span
from carina.testing.ckpt import BATCH, SEQ, VOCAB, GatedCopies, make_model


def test_guard_copies_a_pending_slot_before_the_write() -> None:
    gate = threading.Event()
    src = [torch.arange(1000, dtype=torch.float32) + k for k in range(3)]
    dst = [torch.zeros(1000) for _ in range(3)]
    lazy = GatedCopies(gate)(list(zip(dst, src, strict=True)))  # the background thread copies nothing yet
    lazy.before_write([span(src[1])])  # the owner is about to overwrite src[1]
    assert lazy.forced == 1 and torch.equal(dst[1], torch.arange(1000.0) + 1) and not lazy.done()
    assert dst[0].sum() == 0 and dst[2].sum() == 0  # only the slot about to change was copied
    src[1].fill_(-1.0)
    gate.set()
    lazy.wait()
    assert all(torch.equal(d, torch.arange(1000.0) + k) for k, d in enumerate(dst))  # every pre-write byte


def test_write_waits_for_a_slot_the_background_thread_is_copying() -> None:
    gate = threading.Event()
    src, dst = torch.arange(4096, dtype=torch.int64), torch.zeros(4096, dtype=torch.int64)
    lazy = GatedCopies(gate, hold_in_copy=True)([(dst, src)])
    assert lazy.holding.wait(30)  # the background thread holds the slot mid-copy

    def owner() -> None:
        lazy.before_write([span(src)])
        src.fill_(-7)  # the in-place write a guard protects

    writer = threading.Thread(target=owner)
    writer.start()
    writer.join(timeout=0.3)  # a guard that did not wait would have written -7 before the copy by now
    gate.set()
    writer.join(timeout=30)
    lazy.wait()
    assert lazy.forced == 0 and torch.equal(dst, torch.arange(4096)) and bool((src == -7).all())


def test_copy_errors_surface_at_wait() -> None:
    lazy = LazyCopies([(torch.zeros(3), torch.zeros(4))])  # mismatched shapes: copy_ raises in the thread
    with pytest.raises(Exception, match="snapshot copy failed"):
        lazy.wait()


_CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
)


def _wrapped(seed: int = 0, device: str = "cpu") -> tuple[Any, Any]:
    model = make_model("llama", seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return co.wrap(model, co.Config(device=device), optimizer=opt)


def _step(model: Any, opt: Any, step: int) -> float:
    device = next(model.parameters()).device
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step)).to(device)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.item())


def _snapshot(model: Any, opt: Any) -> tuple[dict[str, torch.Tensor], dict[tuple[int, str], torch.Tensor]]:
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = {(p, k): t.clone() for p, s in opt.state_dict()["state"].items() for k, t in s.items()}
    return params, state


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_offload_save_is_lazy_guarded_and_restores_bitwise(
    tmp_path: Path, writer: str, device: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    was = torch.are_deterministic_algorithms_enabled()  # a process-wide flag: put back for the next test
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(was))
    torch.use_deterministic_algorithms(device == "cpu")  # (cuBLAS would need CUBLAS_WORKSPACE_CONFIG)
    model, opt = _wrapped(device=device)
    for step in (1, 2, 3):
        _step(model, opt, step)
    expected = _snapshot(model, opt)
    gate = threading.Event()
    gated = GatedCopies(gate)
    monkeypatch.setattr(staging_mod, "LazyCopies", gated)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(writer))) as ckpt:
        try:
            handle = ckpt.save(3, {"model": model, "optim": opt})
            (lazy,) = gated.made
            assert not lazy.done() and ckpt.in_flight() and committed_steps(str(tmp_path)) == []  # nothing copied
            losses = [_step(model, opt, 4)]  # its updates overwrite masters and moments the thread has not copied
            assert lazy.forced > 0  # ... so the updates' guards copied them first (the thread still waits)
        finally:
            gate.set()  # (a failed assertion must not leave close() waiting for the gated copies)
        ckpt.wait()
        assert committed_steps(str(tmp_path)) == [3] and handle.nbytes > 0
    model2, opt2 = _wrapped(seed=1, device=device)
    _step(model2, opt2, 99)  # optimizer state exists, then is replaced by the restore
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        assert ckpt.restore({"model": model2, "optim": opt2}) == 3
    params, state = _snapshot(model2, opt2)
    assert params.keys() == expected[0].keys()
    assert all(torch.equal(params[k], expected[0][k]) for k in params)  # the state at save, not after step 4
    assert state.keys() == expected[1].keys() and all(torch.equal(t, expected[1][k]) for k, t in state.items())
    if device == "cpu":
        assert [_step(model2, opt2, 4)] == losses  # training on from the restore: bitwise the same loss


def test_offload_guard_is_removed_at_close(tmp_path: Path) -> None:
    model, opt = _wrapped()
    _step(model, opt, 1)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.THREAD)) as ckpt:
        ckpt.save(1, {"model": model, "optim": opt})
        assert opt.rt.write_guards == [ckpt._stager.guard_writes]
        ckpt.save(2, {"model": model, "optim": opt})
        assert len(opt.rt.write_guards) == 1  # registered once
    assert opt.rt.write_guards == [] and not opt.rt.lend_views
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, opt, 2)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # state_dict copies again


def test_process_writer_starts_when_the_lent_copies_end_unasked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy thread itself hands the snapshot to the process writer: no save(), wait() or step needed."""
    import time

    model, opt = _wrapped()
    _step(model, opt, 1)
    gate = threading.Event()
    monkeypatch.setattr(staging_mod, "LazyCopies", GatedCopies(gate))
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.PROCESS)) as ckpt:
        try:
            ckpt.save(1, {"model": model, "optim": opt})
            assert committed_steps(str(tmp_path)) == []
        finally:
            gate.set()
        for _ in range(3000):  # only the filesystem is polled: the checkpointer is not called
            if committed_steps(str(tmp_path)) == [1]:
                break
            time.sleep(0.01)
        assert committed_steps(str(tmp_path)) == [1]
