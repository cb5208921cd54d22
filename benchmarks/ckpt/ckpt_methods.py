"""The checkpointing methods the ckpt benchmarks compare, behind one interface.

``start(step)`` saves (blocking for what the method blocks for), ``done()`` says
whether the last save is durable (never blocks), ``durable_at()`` gives the wall
time its commit marker appeared (None: when ``done()`` saw it), ``saved(step)``
where that step's save lies, ``close()`` finishes. The peers delete their older
saves inside ``start()`` (``prune_in_start``, as every record up to session 10 ran
them, so that deletion counts in their blocking time); with ``prune_in_start = False``
a driver calls ``retire()`` once a save is durable, outside its timings, as carina's
writers delete theirs after the commit. ``carina-<writer>`` is a
:class:`carina.ckpt.Checkpointer`; the peers are ``torch.save`` (+fsync, rename),
``dcp.save``, ``dcp.async_save`` (thread mode) and ``dcp.async_process`` (process
mode), each with its default stager.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


class TorchSave:
    name = "torch.save"
    prune_in_start = True

    def __init__(self, root: Path, model: Any, opt: Any) -> None:
        self.root, self.model, self.opt = root, model, opt

    def retire(self) -> None:
        """Delete every save but the newest (``*.pt``, ``dcp_*``), outside any timing."""
        saves = [*self.root.glob("*.pt"), *self.root.glob("dcp_*")]
        for old in sorted(saves, key=lambda p: int(p.name.removeprefix("dcp_").removesuffix(".pt")))[:-1]:
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()

    def start(self, step: int) -> None:
        tmp, final = self.root / f"{step}.pt.tmp", self.root / f"{step}.pt"
        with open(tmp, "wb") as fh:
            torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        fd = os.open(self.root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        for old in self.root.glob("*.pt") if self.prune_in_start else ():
            if old != final:
                old.unlink()

    def done(self) -> bool:
        return True

    def durable_at(self) -> float | None:
        """Wall-clock time the last save became durable, from its commit marker (None: when done() saw it)."""
        return None

    def saved(self, step: int) -> Path:
        """Where the save of ``step`` lies (a file or a folder)."""
        return self.root / f"{step}.pt"

    def close(self) -> None:
        return None


class DcpSave(TorchSave):
    name = "dcp.save"

    def _args(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint import FileSystemWriter

        path = self.root / f"dcp_{step}"
        self.last = path
        for old in self.root.glob("dcp_*") if self.prune_in_start else ():
            shutil.rmtree(old)
        sd = {"model": self.model.state_dict(), "optim": self.opt.state_dict()}
        return sd, {"checkpoint_id": str(path), "storage_writer": FileSystemWriter(str(path), sync_files=True)}

    def start(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        sd, kw = self._args(step)
        dcp.save(sd, **kw)

    def saved(self, step: int) -> Path:
        return self.root / f"dcp_{step}"


class DcpAsync(DcpSave):
    """``dcp.async_save`` in thread mode (the default), default stager."""

    name = "dcp.async_save"
    fut: Any = None
    mode: Any = None  # extra dcp.async_save arguments

    def start(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        if self.fut is not None:
            self.fut.result()  # one save in flight, as torchtitan does: the wait is part of the stall
        sd, kw = self._args(step)
        fut = dcp.async_save(sd, **kw, **(self.mode or {}))
        self.fut = getattr(fut, "upload_completion", fut)

    def done(self) -> bool:
        if self.fut is not None and self.fut.done():
            self.fut.result()  # surface errors
            return True
        return self.fut is None

    def durable_at(self) -> float | None:
        return (self.last / ".metadata").stat().st_mtime  # DCP's commit marker, renamed into place last

    def close(self) -> None:
        if self.fut is not None:
            self.fut.result()


class DcpAsyncProcess(DcpAsync):
    """``dcp.async_save`` in process mode: a spawned daemon writes (default stager).

    The daemon needs a process group: a gloo group of world size 1 is made here if none exists, so
    this peer runs last (a group changes how later methods in the process save).
    """

    name = "dcp.async_process"

    def __init__(self, root: Path, model: Any, opt: Any) -> None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        super().__init__(root, model, opt)
        if not dist.is_initialized():
            store = dist.FileStore(os.path.join(tempfile.gettempdir(), f"carina-bench-pg-{os.getpid()}"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.mode = {"async_checkpointer_type": AsyncCheckpointerType.PROCESS}


class Carina:
    def __init__(self, root: Path, model: Any, opt: Any, writer: str) -> None:
        from carina.ckpt import Checkpointer, Config, WriterKind

        self.name = f"carina-{writer}"
        # Pin both staging arenas before training (params + two Adam moments, fp32), not inside the first save.
        state_bytes = 3 * sum(p.numel() * 4 for p in model.parameters()) + (64 << 20)
        self.ckpt = Checkpointer(Config(dir=str(root), writer=WriterKind(writer), keep_last=1, arena_bytes=state_bytes))
        self.state = {"model": model, "optim": opt}

    def start(self, step: int) -> None:
        self.ckpt.save(step, self.state)

    def done(self) -> bool:
        return not self.ckpt.in_flight()

    def durable_at(self) -> float:
        return (Path(self.ckpt.config.dir) / "latest").stat().st_mtime  # replaced last in the commit

    def retire(self) -> None:
        return None  # the writer deleted older saves after its commit

    def saved(self, step: int) -> Path:
        from carina.ckpt.commit import step_dir_name

        return Path(self.ckpt.config.dir) / step_dir_name(step)

    def close(self) -> None:
        self.ckpt.close()


def saved_bytes(path: Path) -> int:
    """Bytes of the files of one save (a file, or every file under a folder), as they lie on disk."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def make_method(name: str, root: Path, model: Any, opt: Any) -> Any:
    """A method by name: ``carina-<writer>`` or a peer."""
    if name.startswith("carina-"):
        return Carina(root, model, opt, name.removeprefix("carina-"))
    peers = {
        "torch.save": TorchSave,
        "dcp.save": DcpSave,
        "dcp.async_save": DcpAsync,
        "dcp.async_process": DcpAsyncProcess,
    }
    return peers[name](root, model, opt)
