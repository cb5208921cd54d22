from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from ckpt_state import assert_bitwise, make_state, tensors_of, two_rank_jobs
from safetensors import safe_open

from carina.ckpt import Checkpointer, Config, WriterKind, verify
from carina.ckpt.commit import committed_steps
from carina.ckpt.storage import read_manifest
from carina.core.errors import CheckpointError, ConfigError, CorruptCheckpoint, DeviceFull


def test_config_validates() -> None:
    with pytest.raises(ConfigError, match="keep_last"):
        Config(dir="x", keep_last=-1)
    assert Config.from_dict({"dir": "x", "writer": "thread"}).writer is WriterKind.THREAD
    with pytest.raises(ConfigError, match="device_snapshot"):
        Config(dir="x", device_snapshot="always")


def test_device_snapshot_auto_takes_at_most_a_quarter_of_free_memory() -> None:
    from carina.ckpt.staging import device_snapshot_fits

    assert device_snapshot_fits(16 << 30, 64 << 30) and device_snapshot_fits(0, 0)
    assert not device_snapshot_fits((16 << 30) + 1, 64 << 30)


def test_save_restore_bitwise(tmp_path: Path, writer: str) -> None:
    state = make_state(0)
    expected = tensors_of(state)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(writer))) as ckpt:
        handle = ckpt.save(5, state)
        after_save = torch.rand(4)  # the RNG stream right after the snapshot
        state["optim"].step()  # changes parameters after the snapshot: must not leak in
        handle.wait()
        fresh = make_state(1)
        fresh["extras"] = None
        assert ckpt.restore(fresh) == 5
    assert_bitwise(tensors_of(fresh), expected)
    assert torch.equal(torch.rand(4), after_save)
    assert fresh["sched"].state_dict() == state["sched"].state_dict()
    extras = fresh["extras"]
    assert extras["pos"] == 17 and extras["names"] == ("a", "b") and extras["by_id"] == {3: 1.5}
    assert extras["half"].dtype == torch.bfloat16 and torch.equal(extras["half"], torch.ones(3, dtype=torch.bfloat16))


def test_preallocated_arenas(tmp_path: Path) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.THREAD, arena_bytes=1 << 20)) as ckpt:
        held = ckpt.host_bytes
        assert held >= 2 << 20
        ckpt.save(1, state)
        ckpt.save(2, state)
        assert ckpt.host_bytes == held  # the state fits: no reallocation
        big = {**state, "blob": torch.zeros(1 << 19)}  # 2 MiB: arenas grow
        ckpt.save(3, big)
        ckpt.wait()
        assert ckpt.host_bytes > held
        fresh = {**make_state(1), "blob": None}
        assert ckpt.restore(fresh) == 3 and torch.equal(fresh["blob"], big["blob"])


def test_file_is_safetensors(tmp_path: Path) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        ckpt.save(1, state)
    shard = tmp_path / "step_0000000001" / "rank00000.safetensors"
    with safe_open(str(shard), "pt") as f:
        for name, value in state["model"].state_dict().items():
            assert torch.equal(f.get_tensor(f"model/{name}"), value)


def test_retention_and_order(tmp_path: Path) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.FORK, keep_last=2)) as ckpt:
        for step in range(1, 6):  # back-to-back saves: A/B arenas, one writer at a time
            ckpt.save(step, state)
            state["optim"].step()
        ckpt.wait()
        assert [c.step for c in ckpt.list()] == [4, 5]
    assert (tmp_path / "latest").read_text() == "step_0000000005"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def _flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x40]))


def test_corrupt_byte_detected_and_skipped(tmp_path: Path) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.THREAD, keep_last=0)) as ckpt:
        ckpt.save(1, state)
        old = tensors_of(state)
        state["optim"].step()
        ckpt.save(2, state)
        ckpt.wait()
        shard = tmp_path / "step_0000000002" / "rank00000.safetensors"
        _flip_byte(shard, shard.stat().st_size - 3)  # inside the last tensor
        with pytest.raises(CorruptCheckpoint, match="checksum mismatch in tensor") as info:
            verify(str(tmp_path / "step_0000000002"))
        assert info.value.context["offset"] > 4096 and info.value.context["key"]
        with pytest.raises(CorruptCheckpoint):
            ckpt.restore(make_state(3), step=2)
        fresh = make_state(3)
        with pytest.warns(RuntimeWarning, match="skipping corrupt checkpoint"):
            assert ckpt.restore(fresh) == 1
    assert_bitwise(tensors_of(fresh), old)


@pytest.mark.parametrize("damage", ["truncate", "header", "manifest"])
def test_damaged_checkpoint_never_selected(tmp_path: Path, damage: str) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC, keep_last=0)) as ckpt:
        ckpt.save(1, state)
        ckpt.save(2, state)
        step2 = tmp_path / "step_0000000002"
        shard = step2 / "rank00000.safetensors"
        if damage == "truncate":
            os.truncate(shard, shard.stat().st_size - 1)
        elif damage == "header":
            _flip_byte(shard, 20)
        else:
            (step2 / "manifest.json").write_text('{"format": "carina.ckpt", "version": 1')
        with pytest.raises(CorruptCheckpoint):
            verify(str(step2))
        with pytest.warns(RuntimeWarning):
            assert ckpt.restore(make_state(1)) == 1


def test_failed_write_surfaces(tmp_path: Path, writer: str) -> None:
    root = tmp_path / "ck"
    state = make_state(0)
    ckpt = Checkpointer(Config(dir=str(root), writer=WriterKind(writer)))
    shutil.rmtree(root)
    root.write_text("not a directory")  # every write below the root now fails
    with pytest.raises(CheckpointError):
        ckpt.save(1, state)
        ckpt.wait()
    ckpt.close()


def test_restore_without_checkpoint(tmp_path: Path) -> None:
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        with pytest.raises(CheckpointError, match="no committed"):
            ckpt.restore(make_state(0))
        with pytest.raises(CheckpointError, match="step 3"):
            ckpt.restore(make_state(0), step=3)


def test_restore_missing_key(tmp_path: Path) -> None:
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        ckpt.save(1, {"model": make_state(0)["model"]})
        with pytest.raises(CheckpointError, match="lacks state 'optim'"):
            ckpt.restore(make_state(0))


@pytest.fixture
def small_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "small"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode
    if rc != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_fails_cleanly(small_fs: Path) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(small_fs), writer=WriterKind.FORK, keep_last=0)) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        big = {"model": state["model"], "blob": torch.zeros(1 << 16)}  # 256 KiB: cannot fit
        with pytest.raises(DeviceFull):
            ckpt.save(2, {**state, **big})
            ckpt.wait()
        assert committed_steps(str(small_fs)) == [1]
        assert [p for p in os.listdir(small_fs) if p.endswith(".tmp")] == []
        verify(str(small_fs / "step_0000000001"))
        assert ckpt.restore(make_state(2)) == 1


def test_missing_rank_fails_commit(tmp_path: Path) -> None:
    from carina.ckpt.commit import CommitJob, run_job
    from carina.ckpt.layout import plan_layout

    layout = plan_layout([("w", "F32", (4,))])
    image = memoryview(layout.header + bytes(16))
    job = CommitJob(root=str(tmp_path), step=7, token="ab12", rank=0, world_size=2, header=layout.header,
                    slots=layout.slots, objects={}, keep_last=0, commit_timeout_s=0.2)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not finish"):
        run_job(job, image)
    assert committed_steps(str(tmp_path)) == []
    # Other ranks may still write into the attempt's directory: it stays as debris
    # that restore ignores and the next commit prunes.
    assert [p.endswith(".tmp") for p in os.listdir(tmp_path)] == [True]


def test_rank_committed_before_it_fsyncs_its_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 may rename the attempt's directory the moment rank 1's part exists; rank 1 must not fail then."""
    from carina.ckpt import commit

    (job0, image0), (job1, image1) = two_rank_jobs(str(tmp_path), 7, "ab12")
    part1 = os.path.join(job1.tmp_dir, "part1.json")
    done = []

    def rank0_commits_now(phase: str, step: int) -> None:
        if phase == "part_named" and os.path.exists(part1) and not done:
            done.append(True)  # rank 1's part is written and named, its name not yet fsynced: rank 0 commits
            commit.run_job(job0, image0)

    monkeypatch.setattr(commit, "fault_hook", rank0_commits_now)
    commit.run_job(job1, image1)
    assert done and committed_steps(str(tmp_path)) == [7]
    assert read_manifest(str(tmp_path / "step_0000000007")).objects == {"0": {"rank": 0}, "1": {"rank": 1}}


def test_process_writer_refuses_small_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    from carina.ckpt import shm
    from carina.core.errors import CapacityError

    class Tiny:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(shm.os, "statvfs", lambda _: Tiny())
    with pytest.raises(CapacityError, match="/dev/shm"):
        shm.SharedArena(1 << 20)


def test_default_arena_is_exact_and_shared_with_a_forked_writer(tmp_path: Path) -> None:
    from carina.ckpt.shm import MappedArena
    from carina.ckpt.staging import _grow

    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.FORK, arena_bytes=3_000_000)) as ckpt:
        image, handle = ckpt._stager._bufs[0]  # type: ignore[misc]
        assert isinstance(handle, MappedArena)
        assert image.numel() == _grow(3_000_000) == 3_190_784  # what was asked (not rounded to 4 MiB)
    arena = MappedArena(10_000)
    arena.tensor.fill_(7)
    view = memoryview(arena.tensor.numpy())
    pid = os.fork()
    if pid == 0:  # a write in the child shows in the parent: the pages are shared, never copied on write
        view[:4] = b"\x01\x02\x03\x04"
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert arena.tensor[:5].tolist() == [1, 2, 3, 4, 7] and arena.tensor.numel() == 10_000
    del view
    arena.close()
    arena.close()
    assert arena.tensor is None


def test_writer_starts_once_a_late_copy_finishes(tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the staging copy is still running at save(): the writer must start later, unasked."""
    import time

    from carina.ckpt.staging import Stager
    from carina.testing.ckpt import FakeCopyEvent

    if writer == "sync":
        pytest.skip("the sync writer writes inside save()")
    events: list[FakeCopyEvent] = []
    stage = Stager.stage

    def late_stage(self: Stager, *args: object, **kwargs: object) -> object:
        snap = stage(self, *args, **kwargs)  # type: ignore[arg-type]
        snap.event = FakeCopyEvent()
        events.append(snap.event)
        return snap

    monkeypatch.setattr(Stager, "stage", late_stage)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(writer))) as ckpt:
        ckpt.save(3, make_state(0))
        assert ckpt.in_flight() and committed_steps(str(tmp_path)) == []  # nothing written before the copy ends
        events[0].finish()  # the D2H copy completes; training goes on polling, never calling wait()
        for _ in range(3000):
            if not ckpt.in_flight():
                break
            time.sleep(0.01)
        assert committed_steps(str(tmp_path)) == [3]


def test_durable_at_is_the_commit_not_the_retention(tmp_path: Path, writer: str) -> None:
    """Each writer reports when a step became durable: after save() began, before retention finished."""
    import time

    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(writer), keep_last=1)) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        before = time.monotonic()
        ckpt.save(2, state)
        ckpt.wait()
        after = time.monotonic()
        when = [ckpt.durable_at(1), ckpt.durable_at(2)]
        assert ckpt.durable_at(3) is None
        assert committed_steps(str(tmp_path)) == [2]  # wait() includes the retention that deleted step 1
    assert when[0] is not None and when[1] is not None
    assert when[0] < before <= when[1] <= after


@pytest.mark.parametrize("kind", ["thread", "fork", "process"])
def test_the_writer_runs_niced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The writer adds writer_nice to its own niceness; the trainer keeps its own."""
    import threading

    from carina.ckpt import commit

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    seen = tmp_path / "nice"

    def hook(phase: str, step: int) -> None:  # in the writer thread, or the fork child
        if phase == "begin":
            seen.write_text(str(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    monkeypatch.setattr(commit, "fault_hook", hook)
    with Checkpointer(Config(dir=str(tmp_path / "c"), writer=WriterKind(kind), writer_nice=5)) as ckpt:
        ckpt.save(1, make_state(0))
        ckpt.wait()
        if kind == "process":  # spawned: the hook does not follow it there
            seen.write_text(str(os.getpriority(os.PRIO_PROCESS, ckpt._writer._proc.pid)))  # type: ignore[attr-defined]
    assert int(seen.read_text()) == min(19, mine + 5)
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    with pytest.raises(ConfigError, match="writer_nice"):
        Config(dir=str(tmp_path), writer_nice=20)


def test_rank_0_never_sees_a_part_that_exists_but_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part appears under its name only whole: at every write of rank 1's part, none is visible yet."""
    from carina.ckpt import commit

    (_job0, _image0), (job1, image1) = two_rank_jobs(str(tmp_path), 7, "ab12")
    part1 = os.path.join(job1.tmp_dir, "part1.json")
    seen: list[tuple[str, bool, int]] = []

    def watch(phase: str, step: int) -> None:
        if os.path.exists(part1):
            seen.append((phase, True, os.path.getsize(part1)))

    monkeypatch.setattr(commit, "fault_hook", watch)
    commit.run_job(job1, image1)
    assert seen and seen[0][0] == "part_named"  # first visible after its rename, never while being written
    assert all(size > 0 for _, _, size in seen)


def test_arena_views_are_kept_and_rebuilt_when_the_arena_grows(tmp_path: Path) -> None:
    """The stager keeps each arena's slot views across saves; a grown arena gets new ones; every save restores."""
    lin = torch.nn.Linear(6, 4)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC, keep_last=0)) as ckpt:
        stager = ckpt._stager
        saved = {}
        for step in (1, 2, 3):  # arenas 0, 1, 0
            with torch.no_grad():
                lin.weight.add_(step)
            ckpt.save(step, {"model": lin})
            saved[step] = {k: v.clone() for k, v in lin.state_dict().items()}
            if step == 1:
                first = stager._views[0][2]
        assert stager._views[0][2] is first  # arena 0's views made once, used by saves 1 and 3
        big = torch.nn.Linear(64, 64)  # outgrows the arenas: arena 1 is reallocated, its views rebuilt
        ckpt.save(4, {"model": big})
        saved[4] = {k: v.clone() for k, v in big.state_dict().items()}
        for step, want in saved.items():
            target = torch.nn.Linear(64, 64) if step == 4 else torch.nn.Linear(6, 4)
            assert ckpt.restore({"model": target}, step=step) == step
            for k, v in target.state_dict().items():
                assert torch.equal(v, want[k]), (step, k)
