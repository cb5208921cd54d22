"""The checkpointer's typed config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from carina.ckpt.writers import WriterKind
from carina.core.config import Config, require

__all__ = ["CheckpointConfig"]


@dataclass(kw_only=True)
class CheckpointConfig(Config):
    """How and where checkpoints are written.

    Attributes:
        dir: Directory holding one ``step_N`` directory per checkpoint and ``latest``.
        keep_last: Committed checkpoints kept (older ones are deleted only after a
            newer one is durable); 0 keeps all.
        writer: ``thread`` (default: a stall within 25% of the lowest, ``process``'s, in the CPU record
            ckpt_stall_cpu, with no spawned process or /dev/shm; the GPU record's best_writer decides),
            ``fork`` (CRUM-style child), ``process`` (persistent spawned writer) or ``sync``.
        every_steps: :meth:`Checkpointer.maybe_save` saves when ``step % every_steps == 0``
            (0: only explicit saves).
        commit_timeout_s: How long rank 0 waits for the other ranks' shards (local parts, and
            with ``remote`` their shard objects); other ranks wait as long for rank 0's local commit.
        arena_bytes: Allocate (and pin) both staging arenas of this size up front, so
            the first saves do not pay for it; 0 sizes them at the first save. They
            grow when the state outgrows them.
        device_snapshot: ``auto`` (default), ``on`` or ``off``: on CUDA, copy parameters and
            optimizer state into a spare device buffer first, so the next optimizer step waits
            only for that device-to-device copy while the copy to host runs behind the next
            steps; ``auto`` does so when the buffer takes at most a quarter of the free device
            memory, and every mode falls back to direct copies when it cannot be allocated.
        remote: An fsspec URL (``s3://bucket/prefix``, ``memory://x``, ...) that
            committed checkpoints are uploaded to at :meth:`Checkpointer.wait` and
            ``close``, and restored from when it holds a newer one than ``dir``
            ("" : local only). Needs ``carina[ckpt]``. With several ranks each uploads its own
            shard and rank 0 the manifest, once every shard object is in the store.
        remote_options: fsspec storage options (for S3: ``endpoint_url``, ``key``, ``secret``).
        writer_nice: Niceness the writer adds to itself (0..19; the ``fork`` child and its
            grandchild, the ``process`` writer, the ``thread`` writer's thread on Linux): its
            checksums and IO submissions yield a busy CPU to training. 0 leaves it as is.
    """

    dir: str
    keep_last: int = 2
    writer: WriterKind = WriterKind.THREAD
    every_steps: int = 0
    commit_timeout_s: float = 600.0
    arena_bytes: int = 0
    device_snapshot: str = "auto"
    remote: str = ""
    remote_options: dict[str, Any] = field(default_factory=dict)
    writer_nice: int = 10

    def validate(self) -> None:
        """Check ranges."""
        require(bool(self.dir), "dir must name a directory", key="dir")
        require(self.keep_last >= 0, "keep_last must be >= 0", key="keep_last")
        require(self.every_steps >= 0, "every_steps must be >= 0", key="every_steps")
        require(self.arena_bytes >= 0, "arena_bytes must be >= 0", key="arena_bytes")
        require(self.device_snapshot in ("auto", "on", "off"), "device_snapshot must be auto, on or off",
                key="device_snapshot")  # fmt: skip
        require(not self.remote or "://" in self.remote, "remote must be an fsspec URL", key="remote")
        require(0 <= self.writer_nice <= 19, "writer_nice must be in 0..19", key="writer_nice")
        require(self.commit_timeout_s > 0, "commit_timeout_s must be positive", key="commit_timeout_s")
