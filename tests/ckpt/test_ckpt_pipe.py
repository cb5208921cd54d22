"""The process writer writes lent state while it is still being copied: up to the watermark, never past it."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import carina.offload as co
from carina.ckpt import Checkpointer, Config, WriterKind, writers
from carina.ckpt import commit as commit_mod
from carina.ckpt import staging as staging_mod
from carina.ckpt.commit import committed_steps
from carina.ckpt.hostcopy import LazyCopies, span
from carina.ckpt.progress import Progress
from carina.core.errors import CheckpointError
from carina.testing.ckpt import BATCH, SEQ, VOCAB, GatedCopies, make_model


def _wrapped(seed: int = 0) -> tuple[Any, Any]:
    model = make_model("llama", seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return co.wrap(model, co.Config(device="cpu"), optimizer=opt)


def _step(model: Any, opt: Any, step: int) -> float:
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.item())


def _tensors(model: Any, opt: Any) -> dict[Any, torch.Tensor]:
    out: dict[Any, torch.Tensor] = {k: v.clone() for k, v in model.state_dict().items()}
    out.update({(p, k): t.clone() for p, s in opt.state_dict()["state"].items() for k, t in s.items()})
    return out


def _until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # polls a condition, never asserts on time
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _restored(root: Path) -> tuple[int, Any, Any]:
    model, opt = _wrapped(seed=1)
    _step(model, opt, 99)  # optimizer state exists, then is replaced by the restore
    with Checkpointer(Config(dir=str(root), writer=WriterKind.SYNC)) as ckpt:
        step = ckpt.restore({"model": model, "optim": opt})
    return step, model, opt


@pytest.fixture
def deterministic(request: pytest.FixtureRequest) -> None:
    was = torch.are_deterministic_algorithms_enabled()
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(was))
    torch.use_deterministic_algorithms(True)


def _two_saves(ckpt: Checkpointer, model: Any, opt: Any) -> None:
    """Steps 1 and 2 saved through both arenas: the next save lands in an arena holding step 1's bytes."""
    for step in (1, 2):
        _step(model, opt, step)
        ckpt.save(step, {"model": model, "optim": opt})
        ckpt.wait()
    _step(model, opt, 3)


def test_process_writer_overlaps_lent_copies_and_restores_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deterministic: None
) -> None:
    model, opt = _wrapped()
    gate = threading.Event()
    gated = GatedCopies(gate)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.PROCESS, keep_last=0)) as ckpt:
        _two_saves(ckpt, model, opt)
        expected = _tensors(model, opt)
        monkeypatch.setattr(staging_mod, "LazyCopies", gated)
        try:
            ckpt.save(3, {"model": model, "optim": opt})
            (lazy,) = gated.made
            snap = ckpt._stager.pending
            assert snap is not None and snap.arena == 0 and lazy.slots > 2 and not lazy.done()
            lazy.before_write([span(lazy._pairs[0][1])])  # a guard copies the first lent slot, the thread none
            progress = ckpt._writer.progress
            _until(lambda: progress.passed(0) > snap.lent_offsets[0], "the writer passed the first lent slot")
            assert not lazy.done() and lazy.forced == 1  # ... while every other lent slot is still to be copied
            assert progress.passed(0) <= snap.lent_offsets[1]  # and never beyond the next one not copied
            assert committed_steps(str(tmp_path)) == [1, 2]
            losses = [_step(model, opt, 4)]  # its guards copy the rest before they overwrite it
        finally:
            gate.set()
        ckpt.wait()
        assert committed_steps(str(tmp_path)) == [1, 2, 3]
        timeline = ckpt.write_timeline(3)
    size = os.path.getsize(tmp_path / commit_mod.step_dir_name(3) / "rank00000.safetensors")
    assert timeline is not None and "copies_done" not in timeline["phases"]  # it streamed, never waited for all
    frontier = [v for _, v in timeline["streams"]["frontier"]]
    assert frontier[0] < size == frontier[-1] == timeline["streams"]["written"][-1][1]  # wrote behind the copies
    step, model2, opt2 = _restored(tmp_path)  # every checksum verified first
    got = _tensors(model2, opt2)
    assert step == 3 and got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)  # step 3's bytes, not step 1's (the arena's) or 4's
    assert [_step(model2, opt2, 4)] == losses


def _failing_last(gate: threading.Event) -> Any:
    """LazyCopies whose thread copies all but the last slot, waits for ``gate``, then fails that one."""

    class _Failing(LazyCopies):
        made: ClassVar[list[Any]] = []

        def __init__(self, pairs: Any) -> None:
            type(self).made.append(self)
            super().__init__(pairs)

        def _run(self) -> None:
            for i in range(self.slots - 1):
                if self._claim(i):
                    self._copy(i)
            gate.wait()
            super()._run()

        def _copy(self, i: int) -> None:
            if i == self.slots - 1:
                dst, _ = self._pairs[i]
                self._pairs[i] = (dst, torch.zeros(dst.numel() + 1))  # copy_ raises: shapes differ
            super()._copy(i)

    return _Failing


def _save_after_failure(ckpt: Checkpointer, model: Any, opt: Any) -> dict[Any, torch.Tensor]:
    """Step 4 trained and saved after a failed save: the writer goes on. Returns step 4's tensors."""
    _step(model, opt, 4)
    expected = _tensors(model, opt)
    ckpt.save(4, {"model": model, "optim": opt})
    ckpt.wait()
    assert committed_steps(str(ckpt.config.dir)) == [1, 2, 4]
    return expected


def _restores_step_4(root: Path, expected: dict[Any, torch.Tensor]) -> None:
    step, model2, opt2 = _restored(root)
    got = _tensors(model2, opt2)
    assert step == 4 and all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_failed_lent_copy_never_commits_and_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _wrapped()
    gate = threading.Event()
    failing = _failing_last(gate)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.PROCESS, keep_last=0)) as ckpt:
        _two_saves(ckpt, model, opt)
        monkeypatch.setattr(staging_mod, "LazyCopies", failing)
        try:
            ckpt.save(3, {"model": model, "optim": opt})
            (lazy,) = failing.made
            snap = ckpt._stager.pending
            assert snap is not None
            _until(lambda: ckpt._writer.progress.passed(snap.arena) > snap.lent_offsets[0], "the writer started")
            assert not lazy.done()
        finally:
            gate.set()
        with pytest.raises(CheckpointError, match="snapshot copy failed"):
            ckpt.wait()
        assert committed_steps(str(tmp_path)) == [1, 2]  # step 3 never committed
        monkeypatch.setattr(staging_mod, "LazyCopies", LazyCopies)
        expected = _save_after_failure(ckpt, model, opt)
    _restores_step_4(tmp_path, expected)


def test_watermark_gate_waits_raises_and_ignores_older_saves() -> None:
    progress = Progress(mp.get_context("spawn"))
    progress.reset(1, seq=7, frontier=100)
    gate = progress.gate(1, 7, os.getppid())
    assert gate(100) == 100 and progress.passed(1) == 100
    progress.publish(1, seq=6, frontier=10_000, failed=True)  # an older save's copy thread: ignored
    progress.publish(1, seq=7, frontier=50, failed=False)  # out of order: the frontier never goes back
    assert gate(80) == 100
    done = threading.Event()
    threading.Thread(target=lambda: (gate(500), done.set()), daemon=True).start()
    assert not done.wait(0.2)  # (the waiter can only be early if the gate is wrong)
    progress.publish(1, seq=7, frontier=600, failed=False)
    assert done.wait(30) and progress.passed(1) == 500
    progress.publish(1, seq=7, frontier=600, failed=True)
    with pytest.raises(CheckpointError, match="copy failed"):
        gate(601)
    progress.reset(1, seq=8, frontier=0)
    with pytest.raises(CheckpointError, match="serves save 8"):
        gate(1)


def test_engine_writer_writes_only_below_the_watermark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from carina.io import IOConfig, IOEngine

    monkeypatch.setattr(commit_mod, "CHUNK", 64 << 10)
    monkeypatch.setattr(writers, "PIECE", 16 << 10)
    data = os.urandom((9 << 16) + 777)
    frontiers = iter([5000, 20 << 10, 130 << 10, 131 << 10, len(data)])
    state = {"frontier": 0}

    def ready(n: int) -> int:
        while state["frontier"] < n:
            state["frontier"] = next(frontiers)
        return state["frontier"]

    with IOEngine(IOConfig(queue_depth=2)) as engine:
        real, pieces = engine.write, []

        def recording(handle: Any, offset: int, buf: Any) -> Any:
            pieces.append((offset, offset + len(buf), state["frontier"]))
            return real(handle, offset, buf)

        monkeypatch.setattr(engine, "write", recording)
        writers.engine_writer(engine, ready)(str(tmp_path / "f"), memoryview(data))()
    assert (tmp_path / "f").read_bytes() == data
    assert all(end <= frontier for _, end, frontier in pieces)  # never a byte past the watermark
    assert all(end % 4096 == 0 for _, end, _ in pieces[:-1]) and pieces[-1][1] == len(data)
    assert [p[0] for p in pieces[1:]] == [p[1] for p in pieces[:-1]] and pieces[0][0] == 0
    assert pieces[0][1] == 20 << 10  # the first piece waited for PIECE bytes, then took all that were final


def test_streaming_starts_when_a_late_device_copy_ends_unasked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the device-to-host copies end after save(): the next lent slot copied hands the job over."""
    from carina.ckpt.staging import Stager
    from carina.testing.ckpt import FakeCopyEvent

    model, opt = _wrapped()
    _step(model, opt, 1)
    gate = threading.Event()
    gated = GatedCopies(gate)
    stage, events = Stager.stage, []

    def late_stage(self: Stager, *args: Any, **kwargs: Any) -> Any:
        snap = stage(self, *args, **kwargs)
        snap.event = FakeCopyEvent()
        events.append(snap.event)
        return snap

    monkeypatch.setattr(Stager, "stage", late_stage)
    monkeypatch.setattr(staging_mod, "LazyCopies", gated)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.PROCESS)) as ckpt:
        try:
            ckpt.save(1, {"model": model, "optim": opt})
            (lazy,) = gated.made
            snap = ckpt._stager.pending
            assert snap is not None and ckpt.in_flight() and ckpt._writer._pending  # not sent: the copy runs
            events[0].finish()  # the D2H copies end; nobody calls the checkpointer
            lazy.before_write([span(lazy._pairs[0][1])])  # a guard copies the first lent slot
            progress = ckpt._writer.progress
            _until(lambda: progress.passed(snap.arena) > snap.lent_offsets[0], "the writer passed the first lent slot")
            assert not lazy.done()
        finally:
            gate.set()
        ckpt.wait()
        assert committed_steps(str(tmp_path)) == [1]


@pytest.mark.parametrize("writer", [WriterKind.FORK, WriterKind.THREAD, WriterKind.SYNC])
def test_a_failed_lent_copy_never_commits_with_any_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: WriterKind
) -> None:
    model, opt = _wrapped()
    gate = threading.Event()
    gate.set()  # the copy thread fails its last slot at once
    with Checkpointer(Config(dir=str(tmp_path), writer=writer, keep_last=0)) as ckpt:
        _two_saves(ckpt, model, opt)
        monkeypatch.setattr(staging_mod, "LazyCopies", _failing_last(gate))
        with pytest.raises(CheckpointError, match="snapshot copy failed"):
            ckpt.save(3, {"model": model, "optim": opt})
            ckpt.wait()
        assert committed_steps(str(tmp_path)) == [1, 2]  # step 3's stale slot was never committed
        monkeypatch.setattr(staging_mod, "LazyCopies", LazyCopies)
        expected = _save_after_failure(ckpt, model, opt)
    _restores_step_4(tmp_path, expected)
