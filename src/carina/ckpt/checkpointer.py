"""The Checkpointer: save at a step boundary, persist in the background, restore verified.

    ckpt = Checkpointer(CheckpointConfig(dir="ckpts", keep_last=2, writer="fork"))
    handle = ckpt.save(step, {"model": model, "optim": opt, "sched": sched, "data": {"pos": 17}})
    ...                                  # training goes on while the writer persists
    ckpt.wait()                          # durable and committed (errors surface here)
    step = ckpt.restore({"model": model, "optim": opt, "sched": sched, "data": extras})

Values with ``state_dict()``/``load_state_dict()`` are saved and restored
through them; other values (dicts, numbers, tensors) are saved as they are and
restored by replacing the dict entry. RNG states are always included and
restored last.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from carina.ckpt.commit import CommitJob, committed_steps
from carina.ckpt.config import CheckpointConfig
from carina.ckpt.ranks import dist_rank, shared_token
from carina.ckpt.rng import capture_rng, restore_rng
from carina.ckpt.staging import Stager, host_arena
from carina.ckpt.storage import CheckpointInfo, list_checkpoints
from carina.ckpt.tree import flatten
from carina.ckpt.writerpick import make_writer
from carina.ckpt.writers import WriterKind
from carina.core.errors import CheckpointError

__all__ = ["Checkpointer", "SaveHandle"]

_RNG_KEY = "__rng__"


@dataclass
class SaveHandle:
    """A save in flight: ``blocked_s`` is what the trainer waited for."""

    step: int
    blocked_s: float
    nbytes: int
    _owner: Checkpointer

    def wait(self) -> None:
        """Block until every queued save (this one included) is committed."""
        self._owner.wait()


class Checkpointer:
    """Saves training state asynchronously and restores the newest verified checkpoint.

    Args:
        config: Where and how to write.
    """

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        os.makedirs(config.dir, exist_ok=True)
        self.rank, self.world_size = dist_rank()
        factory = host_arena
        if config.writer is WriterKind.PROCESS:
            from carina.ckpt.shm import shm_arena

            factory = shm_arena
        self._stager = Stager(factory, device_snapshot=config.device_snapshot)
        if config.arena_bytes:
            self._stager.preallocate(config.arena_bytes)
        self._writer = make_writer(config.writer, nice=config.writer_nice)
        self._next_arena = 0
        self._hooked: set[int] = set()
        self._lenders: dict[int, Any] = {}  # id -> an object lending host state under our write guard
        self._remote: Any = None
        self._unpushed: list[tuple[int, str]] = []  # (step, attempt token) saved here, not yet uploaded
        if config.remote:
            from carina.ckpt.remote import RemoteStore
            from carina.ckpt.uploader import Uploader

            self._remote = RemoteStore(config.remote, config.remote_options)
            self._uploader = Uploader(
                self._remote, config.dir, config.keep_last, rank=self.rank, timeout_s=config.commit_timeout_s
            )

    # -- save ------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> SaveHandle:
        """Snapshot ``state`` at a step boundary and hand it to the writer.

        Blocks only to copy small state, wait for a free arena and start the
        tensor copies; an earlier failed write is raised here.

        Raises:
            CheckpointError: An earlier background write failed, or state cannot be saved.
        """
        t0 = time.perf_counter()
        self._writer.check()
        if self._remote is not None:
            self._uploader.check()
            self._push()
        arena = self._free_arena()
        with self._lending(state) as lent:
            captured = {k: _state_of(v) for k, v in state.items()}
        captured[_RNG_KEY] = capture_rng()
        chunks: dict[str, Any] = {}
        tree, tensors = flatten(captured, chunks=chunks)
        snap = self._stager.stage(tensors, arena, _guarded(state), lent)
        self._hook_optimizers(state)
        token = shared_token()
        job = CommitJob(
            root=os.path.abspath(self.config.dir),
            step=int(step),
            token=token,
            rank=self.rank,
            world_size=self.world_size,
            header=snap.layout.header,
            slots=snap.layout.slots,
            objects=tree,
            keep_last=self.config.keep_last,
            commit_timeout_s=self.config.commit_timeout_s,
            chunks={name: (c.global_shape, c.offset) for name, c in chunks.items()},
        )
        self._writer.submit(job, snap, self._stager.handle(arena))
        if self._remote is not None:
            self._unpushed.append((int(step), token))
        self._next_arena = (arena + 1) % self._stager.arenas
        return SaveHandle(int(step), time.perf_counter() - t0, snap.layout.size, self)

    def maybe_save(self, step: int, state: dict[str, Any]) -> SaveHandle | None:
        """:meth:`save` when ``every_steps`` divides ``step``."""
        every = self.config.every_steps
        return self.save(step, state) if every and step % every == 0 else None

    @contextlib.contextmanager
    def _lending(self, state: dict[str, Any]) -> Iterator[list[tuple[int, int]]]:
        """Let values that lend their host state (``lend_state(guard)``) give views instead of copies.

        Such a value (carina.offload's optimizer) calls the guard, :meth:`Stager.guard_writes`, before
        it writes any lent tensor in place, from then on; the staging copies those tensors behind
        training (:mod:`carina.ckpt.hostcopy`). Yields the lent ``[start, end)`` address ranges.
        """
        from carina.ckpt.hostcopy import extent

        guard = self._stager.guard_writes
        with contextlib.ExitStack() as stack:
            spans: list[tuple[int, int]] = []
            for value in state.values():
                if callable(getattr(value, "lend_state", None)):
                    self._lenders[id(value)] = value
                    spans.extend(extent(t) for t in stack.enter_context(value.lend_state(guard)))
            yield spans

    def _free_arena(self) -> int:
        arena = self._next_arena
        while arena in self._writer.busy():
            time.sleep(0.001)  # a slow writer: the next snapshot may not overwrite its arena
        return arena

    def _hook_optimizers(self, state: dict[str, Any]) -> None:
        import torch

        for value in state.values():
            if isinstance(value, torch.optim.Optimizer) and id(value) not in self._hooked:
                value.register_step_pre_hook(lambda *_: self._before_step())
                self._hooked.add(id(value))

    def _before_step(self) -> None:
        """Optimizer pre-step: parameters may change only after staging has copied them."""
        self._stager.wait_released()
        self._writer.busy()  # lets a fork/process writer start on the now complete arena
        self._push()  # a save committed since: its upload starts now, not at the next save

    def in_flight(self) -> bool:
        """Whether a save is still being staged or written (never blocks; starts ready writers)."""
        return bool(self._writer.busy())

    def durable_at(self, step: int) -> float | None:
        """When the save of ``step`` became durable here (``time.monotonic()``), None if not (yet) known.

        That is before its job is done: retention of older checkpoints follows it (a recent step only).
        """
        return self._writer.durable_at(step)

    def write_timeline(self, step: int) -> dict[str, Any] | None:
        """How the save of ``step`` was written, over time (:mod:`carina.ckpt.timeline`); None for ``fork``."""
        return self._writer.timeline(step)

    def wait(self) -> None:
        """Block until every save is committed.

        With ``remote`` set, it then waits for their uploads as well.

        Raises:
            CheckpointError: A background write or an upload failed.
        """
        self._writer.wait()
        if self._remote is not None:
            self._push(final=True)
            self._uploader.drain()

    def _push(self, final: bool = False) -> None:
        """Hand saves committed locally to the background uploader, oldest first.

        Without ``final``, stop at the first save not committed yet. With it (this
        rank's writer is done), a rank other than 0 waits for rank 0's local commit
        (``commit_timeout_s``), and a save that can no longer commit is dropped (its
        writer's error was raised on the rank whose write failed).

        Raises:
            CheckpointError: ``final`` and rank 0 did not commit a save in time.
        """
        if self._remote is None:
            return
        from carina.ckpt.storage import attempt_state

        deadline = time.monotonic() + self.config.commit_timeout_s
        while self._unpushed:
            step, token = self._unpushed[0]
            state = attempt_state(self.config.dir, step, token)
            while final and state is None and self.rank != 0:
                if time.monotonic() > deadline:
                    self._unpushed.pop(0)
                    raise CheckpointError(
                        f"step {step} was not committed within {self.config.commit_timeout_s:g} s (rank 0 commits)",
                        path=self.config.dir,
                    )
                time.sleep(0.005)
                state = attempt_state(self.config.dir, step, token)
            if not final and state is not True:
                return
            self._unpushed.pop(0)
            if state:
                self._uploader.submit(step, token)

    def close(self) -> None:
        """Finish pending saves and uploads, stop the writer and release the arenas."""
        try:
            self._writer.close()
            for lender in self._lenders.values():
                lender.remove_write_guard(self._stager.guard_writes)
            self._lenders.clear()
            if self._remote is not None:
                try:
                    self._push(final=True)
                finally:
                    self._uploader.close()
        finally:
            self._stager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- restore ---------------------------------------------------------------
    def restore(self, state: MutableMapping[str, Any], step: int | None = None) -> int:
        """Load the newest verified checkpoint (or ``step``) into ``state``; return its step.

        Every checksum is checked before anything is loaded; a corrupt newest
        checkpoint is skipped with a warning (unless ``step`` names it). The
        checkpoint may come from another world size: DTensor pieces (FSDP2,
        tensor parallel) are reassembled into the placements the target state
        has now; rank-local state comes from rank ``rank mod saved world size``.

        Raises:
            CheckpointError: Nothing to restore, or the state does not match.
            CorruptCheckpoint: ``step`` was named and fails verification.
        """
        self._stager.wait()  # lent state may be loaded into only once the snapshot holds its bytes
        manifest, saved = self._agreed(state, step)
        missing = [k for k in state if k not in saved]
        if missing:
            raise CheckpointError(f"checkpoint lacks state {missing[0]!r}", key=missing[0])
        for key, value in state.items():
            if hasattr(value, "load_state_dict"):
                value.load_state_dict(saved[key])
            else:
                state[key] = _detach_copies(saved[key])
        restore_rng(saved[_RNG_KEY])
        return manifest.step

    def _agreed(self, state: MutableMapping[str, Any], step: int | None) -> tuple[Any, Any]:
        """Select and verify on every rank; with several ranks, all must have chosen the same step.

        Runs in the trainer's thread (restore is called on every rank), so one
        ``all_gather_object`` is allowed here; nothing is loaded before it.

        Raises:
            CheckpointError: This rank found nothing, or the ranks selected different steps.
        """
        error: CheckpointError | None = None
        try:
            manifest, saved = self._load(state, step)
        except CheckpointError as exc:
            error = exc
        except OSError as exc:  # the store failed: every rank must still reach the gather below
            error = CheckpointError(f"cannot read checkpoints: {exc}", path=self.config.remote or self.config.dir)
        if self.world_size > 1:
            import torch.distributed as dist

            chosen: list[Any] = [None] * self.world_size
            dist.all_gather_object(chosen, None if error is not None else manifest.step)
            if error is None and (None in chosen or len(set(chosen)) > 1):
                error = CheckpointError(
                    f"ranks selected different checkpoints (steps by rank, None: none): {chosen}; nothing was loaded",
                    path=self.config.dir,
                )
        if error is not None:
            raise error
        return manifest, saved

    def _load(self, state: MutableMapping[str, Any], step: int | None) -> tuple[Any, Any]:
        """This rank's verified tree: from ``dir``, or from ``remote`` when that holds a newer checkpoint.

        One process fetches the remote checkpoint into ``dir`` (committed there),
        then restores locally; each of several ranks reads the shards it needs
        straight from the store, checksums verified, and writes nothing locally.
        """
        from carina.ckpt.restore import load_for_rank

        root = self.config.dir
        if self._remote is not None and self._remote_is_newer(step):
            try:
                if self.world_size == 1:
                    self._remote.fetch(root, step)
                else:
                    return load_for_rank(self._remote, state, self.rank, step)
            except CheckpointError:
                if step is not None or not committed_steps(root):
                    raise
        return load_for_rank(root, state, self.rank, step)

    def _remote_is_newer(self, step: int | None) -> bool:
        """Whether the remote must serve ``step`` (missing in ``dir``) or holds a newer checkpoint than ``dir``."""
        from carina.ckpt.storage import newest_local

        if step is not None:
            return step not in committed_steps(self.config.dir)
        remote = self._remote.committed_steps()
        newest = newest_local(self.config.dir)
        return bool(remote) and (newest is None or remote[-1] > newest)

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first."""
        return list_checkpoints(self.config.dir)

    def lent_copies(self) -> tuple[int, int]:
        """The newest save's lent host copies: (slots copied behind training, slots a write guard copied first)."""
        snap = self._stager.pending
        lazy = None if snap is None else snap.lazy
        return (0, 0) if lazy is None else (lazy.slots, lazy.forced)

    @property
    def host_bytes(self) -> int:
        """Host memory held by the staging arenas."""
        return self._stager.host_bytes()


def _guarded(state: dict[str, Any]) -> frozenset[int]:
    """Addresses of CUDA tensors only an optimizer step writes: parameters and optimizer state."""
    import torch

    ptrs: set[int] = set()
    for value in state.values():
        if isinstance(value, torch.nn.Module):
            ptrs.update(_local(p).data_ptr() for p in value.parameters() if p.is_cuda)
        elif isinstance(value, torch.optim.Optimizer):
            for per_param in value.state.values():
                ptrs.update(_local(t).data_ptr() for t in per_param.values() if torch.is_tensor(t) and t.is_cuda)
    return frozenset(ptrs)


def _local(tensor: Any) -> Any:
    """A DTensor's local piece (what is staged); any other tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _state_of(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value


def _detach_copies(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _detach_copies(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_detach_copies(v) for v in value]
    return value
