"""carina.ckpt on an object store: a real S3 endpoint (moto's server) on loopback, and memory://."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_state import assert_bitwise, make_state, s3_options, tensors_of, two_rank_jobs

import carina
from carina.ckpt import Checkpointer, Config, WriterKind
from carina.ckpt.commit import committed_steps
from carina.ckpt.remote import RemoteStore, is_url
from carina.core.errors import CheckpointError, ConfigError, CorruptCheckpoint


def _store(url: str, endpoint: str) -> RemoteStore:
    return RemoteStore(url, s3_options(endpoint))


def _local_checkpoints(root: Path, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Commit one local checkpoint per step (state changes between them); return each one's tensors."""
    state = make_state(0)
    saved = {}
    with Checkpointer(Config(dir=str(root), keep_last=0, writer=WriterKind.SYNC)) as ckpt:
        for step in steps:
            state["optim"].step()
            saved[step] = tensors_of(state)
            ckpt.save(step, state)
    return saved


def _restored(root: Path, **config: Any) -> tuple[int, dict[str, torch.Tensor]]:
    fresh = make_state(7)
    with Checkpointer(Config(dir=str(root), **config)) as ckpt:
        step = ckpt.restore(fresh)
    return step, tensors_of(fresh)


def _objects(store: RemoteStore, step: int) -> list[str]:
    store.fs.invalidate_cache()
    path = f"{store.root}/step_{step:010d}"
    return sorted(p.rsplit("/", 1)[-1] for p in store.fs.ls(path, detail=False)) if store.fs.exists(path) else []


def test_s3_save_restore_bitwise(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    state = make_state(0)
    expected = tensors_of(state)
    config = {"remote": bucket_url, "remote_options": s3_options(s3_endpoint)}
    with Checkpointer(Config(dir=str(tmp_path / "a"), writer=WriterKind.THREAD, **config)) as ckpt:
        ckpt.save(5, state)
        ckpt.wait()  # committed locally, then uploaded
    store = _store(bucket_url, s3_endpoint)
    assert store.committed_steps() == [5] and store.latest_hint() == 5
    shard = store.read_manifest(5).shards[0]
    remote_bytes = store.fs.cat_file(f"{store.root}/step_0000000005/{shard.file}")
    assert remote_bytes == (tmp_path / "a" / "step_0000000005" / "rank00000.safetensors").read_bytes()
    # A new machine: empty local directory, everything comes from S3.
    step, got = _restored(tmp_path / "b", **config)
    assert step == 5
    assert_bitwise(got, expected)
    assert committed_steps(str(tmp_path / "b")) == [5]


class _FailsBeforeManifest(RemoteStore):
    def _after_data(self, step: int) -> None:
        raise OSError(f"connection lost after the shards of step {step}")


def test_upload_failing_before_manifest_never_selected(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    saved = _local_checkpoints(tmp_path / "local", [1, 2, 3, 4])
    store = _store(bucket_url, s3_endpoint)
    for step in (1, 2):
        store.upload(str(tmp_path / "local"), step)
    broken = _FailsBeforeManifest(bucket_url, s3_options(s3_endpoint))
    with pytest.raises(CheckpointError, match="upload of step 3 failed"):
        broken.upload(str(tmp_path / "local"), 3)
    assert len(_objects(store, 3)) == 1 and "manifest.json" not in _objects(store, 3)  # the shard is there
    assert store.committed_steps() == [1, 2] and [c.step for c in store.list()] == [1, 2]
    step, got = _restored(tmp_path / "fresh", remote=bucket_url, remote_options=s3_options(s3_endpoint))
    assert step == 2
    assert_bitwise(got, saved[2])
    store.upload(str(tmp_path / "local"), 4)  # the next upload deletes the debris
    assert _objects(store, 3) == [] and store.committed_steps() == [1, 2, 4]


_KILL_SCRIPT = """
import os, signal, sys
from carina.ckpt.remote import RemoteStore

class Dies(RemoteStore):
    def _after_data(self, step):
        sys.stdout.write("data uploaded\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

url, endpoint, local = sys.argv[1:]
Dies(url, {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}).upload(local, 2)
"""


def test_upload_killed_before_manifest_never_selected(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    saved = _local_checkpoints(tmp_path / "local", [1, 2])
    store = _store(bucket_url, s3_endpoint)
    store.upload(str(tmp_path / "local"), 1)
    src = str(Path(carina.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, bucket_url, s3_endpoint, str(tmp_path / "local")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL and "data uploaded" in proc.stdout, proc.stderr
    assert len(_objects(store, 2)) == 1 and store.committed_steps() == [1]
    target = tmp_path / "fresh"
    assert store.fetch(str(target)) == 1
    step, got = _restored(target)
    assert step == 1
    assert_bitwise(got, saved[1])


def _flip_object_byte(store: RemoteStore, step: int, offset_in_data: int) -> str:
    shard = store.read_manifest(step).shards[0]
    path = f"{store.root}/step_{step:010d}/{shard.file}"
    data = bytearray(store.fs.cat_file(path))
    data[shard.data_start + offset_in_data] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
    return shard.tensors[0].name


def test_corrupt_object_detected_and_skipped(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    saved = _local_checkpoints(tmp_path / "local", [1, 2])
    store = _store(bucket_url, s3_endpoint)
    for step in (1, 2):
        store.upload(str(tmp_path / "local"), step)
    name = _flip_object_byte(store, 2, 0)  # the first byte of the first tensor of the newest checkpoint
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch") as info:
        store.fetch(str(tmp_path / "named"), step=2)
    assert info.value.context["key"] == name
    assert committed_steps(str(tmp_path / "named")) == []  # nothing written before verification
    config = {"remote": bucket_url, "remote_options": s3_options(s3_endpoint)}
    with pytest.warns(RuntimeWarning, match=f"skipping corrupt remote checkpoint.*{name}"):
        step, got = _restored(tmp_path / "fresh", **config)
    assert step == 1
    assert_bitwise(got, saved[1])


def test_truncated_object_detected(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    _local_checkpoints(tmp_path / "local", [1])
    store = _store(bucket_url, s3_endpoint)
    store.upload(str(tmp_path / "local"), 1)
    shard = store.read_manifest(1).shards[0]
    path = f"{store.root}/step_0000000001/{shard.file}"
    store.fs.pipe_file(path, store.fs.cat_file(path)[:-1])
    short = f"is {shard.size - 1} bytes, manifest says {shard.size}"
    with pytest.raises(CheckpointError, match="verified remote checkpoint"), pytest.warns(RuntimeWarning, match=short):
        store.fetch(str(tmp_path / "fresh"))


def test_prune_and_reupload(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    saved = _local_checkpoints(tmp_path / "local", [1, 2, 3, 4])
    store = _store(bucket_url, s3_endpoint)
    for step in (1, 2, 3, 4):
        store.upload(str(tmp_path / "local"), step, keep_last=2)
    assert store.committed_steps() == [3, 4]
    assert _objects(store, 1) == [] and _objects(store, 2) == []
    first = store.read_manifest(4).shards[0].file
    store.upload(str(tmp_path / "local"), 4, keep_last=2)  # step 4 again: a new attempt token
    second = store.read_manifest(4).shards[0].file
    assert first != second and _objects(store, 4) == sorted(["manifest.json", second])
    assert store.prune(1) == [3] and store.committed_steps() == [4] and _objects(store, 3) == []
    assert store.fetch(str(tmp_path / "fresh")) == 4
    step, got = _restored(tmp_path / "fresh")
    assert step == 4
    assert_bitwise(got, saved[4])


def test_checkpointer_keeps_last_remotely(tmp_path: Path, bucket_url: str, s3_endpoint: str) -> None:
    state = make_state(0)
    options = s3_options(s3_endpoint)
    config = Config(dir=str(tmp_path), keep_last=2, writer=WriterKind.THREAD, remote=bucket_url, remote_options=options)
    with Checkpointer(config) as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, state)
            ckpt.wait()
    assert _store(bucket_url, s3_endpoint).committed_steps() == [20, 30]


def test_memory_url_and_config(tmp_path: Path) -> None:
    assert is_url("s3://b/p") and is_url("memory://x") and not is_url("/tmp/x") and not is_url("ckpts")
    with pytest.raises(ConfigError, match="remote"):
        Config(dir="x", remote="not-a-url")
    with pytest.raises(ConfigError, match="remote"):
        RemoteStore("/local/path")
    url = f"memory://carina-test-{secrets.token_hex(4)}"
    saved = _local_checkpoints(tmp_path / "local", [3])
    store = RemoteStore(url)
    store.upload(str(tmp_path / "local"), 3)
    assert [c.step for c in store.list()] == [3]
    step, got = _restored(tmp_path / "fresh", remote=url)
    assert step == 3
    assert_bitwise(got, saved[3])


def test_cli_on_s3(tmp_path: Path, bucket_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from carina.ckpt.cli import app

    _local_checkpoints(tmp_path / "local", [1, 2, 3])
    store = _store(bucket_url, s3_endpoint)
    for step in (1, 2, 3):
        store.upload(str(tmp_path / "local"), step)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # what the CLI reads, like any AWS client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    runner = CliRunner()
    rows = json.loads(runner.invoke(app, ["ls", bucket_url, "--json"]).output)
    assert [(r["step"], r["latest"]) for r in rows] == [(1, False), (2, False), (3, True)]
    name = _flip_object_byte(store, 2, 5)
    res = runner.invoke(app, ["verify", bucket_url, "--json"])
    assert res.exit_code == 1, res.output
    verdicts = {r["step"]: r for r in json.loads(res.output)}
    assert verdicts[1]["ok"] and verdicts[3]["ok"] and not verdicts[2]["ok"] and name in verdicts[2]["error"]
    out = json.loads(runner.invoke(app, ["inspect", bucket_url, "--json"]).output)
    assert out["step"] == 3 and any(t["name"] == "model/0.weight" for t in out["tensors"])
    res = runner.invoke(app, ["prune", bucket_url, "--keep", "1", "--json"])
    assert json.loads(res.output)["removed"] == ["step_0000000001", "step_0000000002"]
    assert store.committed_steps() == [3]


def test_uploads_run_in_the_background(tmp_path: Path, bucket_url: str, s3_endpoint: str, writer: str) -> None:
    state = make_state(0)
    options = s3_options(s3_endpoint)
    remote = {"remote": bucket_url, "remote_options": options}
    config = Config(dir=str(tmp_path), keep_last=0, every_steps=2, writer=WriterKind(writer), **remote)
    with Checkpointer(config) as ckpt:
        for step in range(1, 9):
            state["optim"].step()
            ckpt.maybe_save(step, state)  # no wait(): uploads are queued as saves commit
    # close() drained the uploader: every save is on the bucket, each bitwise like its local copy
    store = _store(bucket_url, s3_endpoint)
    assert store.committed_steps() == [2, 4, 6, 8]
    for step in (2, 8):
        shard = store.read_manifest(step).shards[0]
        local = (tmp_path / f"step_{step:010d}" / "rank00000.safetensors").read_bytes()
        assert store.fs.cat_file(f"{store.root}/step_{step:010d}/{shard.file}") == local


def test_failed_upload_surfaces(tmp_path: Path, s3_endpoint: str) -> None:
    missing = f"s3://no-such-bucket-{secrets.token_hex(4)}/run"
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), remote=missing, remote_options=s3_options(s3_endpoint))) as ckpt:
        ckpt.save(1, state)
        with pytest.raises(CheckpointError, match="upload of step 1 failed"):
            ckpt.wait()
        ckpt.wait()  # raised once; the local checkpoint is committed regardless
    assert committed_steps(str(tmp_path)) == [1]


def _two_rank_checkpoint(root: Path, step: int, token: str) -> list[bytes]:
    """A local 2-rank checkpoint committed by the writers' own code (rank 1's part, then rank 0's commit)."""
    from carina.ckpt.commit import run_job

    jobs = two_rank_jobs(str(root), step, token)
    for job, image in reversed(jobs):
        run_job(job, image)
    return [bytes(image[len(job.header) :]) for job, image in jobs]


def test_rank_zero_writes_the_manifest_only_after_every_shard(tmp_path: Path) -> None:
    from carina.ckpt.storage import attempt_state, select_shards

    data = _two_rank_checkpoint(tmp_path, 7, "ab12")
    root = str(tmp_path)
    assert attempt_state(root, 7, "ab12") is True and attempt_state(root, 7, "cd34") is False
    store = RemoteStore(f"memory://carina-test-{secrets.token_hex(4)}")
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not upload their shards within 0.2 s"):
        store.upload(root, 7, token="ab12", rank=0, timeout_s=0.2)
    assert store.upload(root, 7, token="ab12", rank=0, wanted=lambda: False) is False  # superseded locally
    assert store.committed_steps() == [] and _objects(store, 7) == ["rank00000.ab12.safetensors"]
    assert store.upload(root, 7, token="ab12", rank=1) and store.committed_steps() == []  # no manifest from rank 1
    assert store.upload(root, 7, token="ab12", rank=0) and store.committed_steps() == [7]
    manifest, shards = select_shards(store, lambda _m: {0, 1})
    assert manifest.attempt == "ab12" and manifest.objects == {"0": {"rank": 0}, "1": {"rank": 1}}
    assert [shards[r]["w"].numpy().tobytes() for r in (0, 1)] == data
