"""Checkpoints in an object store: S3 through s3fs, or any fsspec URL.

A remote checkpoint mirrors a local committed one. Object stores have no
rename, so the commit is ordering alone::

    <root>/step_N/rank00000.<token>.safetensors   every rank's shard, then
    <root>/step_N/manifest.json                   last: this object commits step N
    <root>/latest                                 a hint, after the manifest

Shard objects carry the save's attempt token in their names, so re-uploading a
step never overwrites the bytes an existing manifest points at. Several ranks
upload their own shards (:meth:`RemoteStore.upload` with ``rank``); rank 0
then polls the store until every other rank's shard object exists with the
size the local manifest names, and only then writes the manifest. A step whose
manifest object is absent (an upload killed or failed before its last PUT, a
rank that never uploaded) is never listed or selected, and the next upload or
:meth:`RemoteStore.prune` deletes it. Pruning deletes a checkpoint's manifest
before its shards. A :class:`RemoteStore` is a :class:`~carina.ckpt.storage.Source`:
restore reads (and verifies) the shards a rank needs straight from it;
:meth:`RemoteStore.fetch` downloads the newest checkpoint whose every checksum
verifies (older ones are tried with a warning) and commits it into a local
directory the way a writer does.

Needs ``fsspec`` (and ``s3fs`` for ``s3://``): ``pip install carina[ckpt]``.
"""

from __future__ import annotations

import builtins
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from carina.ckpt.commit import LATEST, fsync_dir, step_dir_name, write_file
from carina.ckpt.manifest import MANIFEST_NAME, Manifest, ShardEntry, parse_manifest
from carina.ckpt.storage import CheckpointInfo, candidates, read_manifest, read_verified
from carina.core.errors import CheckpointError, ConfigError, CorruptCheckpoint

__all__ = ["RemoteStore", "is_url"]

_STEP_RE = re.compile(r"^step_(\d{10})$")


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``scheme://...``) rather than a local directory."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path))


class RemoteStore:
    """Committed checkpoints under an fsspec URL.

    Args:
        url: ``s3://bucket/prefix``, ``memory://ckpts``, ``file:///path``, ...
        storage_options: Passed to the fsspec filesystem (for s3fs e.g.
            ``endpoint_url``, ``key``, ``secret``).

    Raises:
        ConfigError: ``url`` is not a URL, or its filesystem is not installed.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if not is_url(url):
            raise ConfigError("remote checkpoint location must be an fsspec URL", key="remote", value=url)
        try:
            import fsspec
        except ImportError as exc:
            raise ConfigError("remote checkpoints need fsspec: pip install carina[ckpt]", key="remote") from exc
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {url}: {exc}", key="remote", value=url) from exc
        self.url = url
        self.where = url
        self.root = root.rstrip("/")

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _refresh(self) -> None:
        self.fs.invalidate_cache()  # s3fs caches listings; other processes may have written

    # -- listing -------------------------------------------------------------
    def _step_dirs(self) -> list[int]:
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_STEP_RE.match, names) if m)

    def committed_steps(self) -> list[int]:
        """Steps whose manifest object exists, ascending."""
        self._refresh()
        found = self.fs.glob(self._path("step_*", MANIFEST_NAME))
        steps = []
        for path in found:
            m = _STEP_RE.match(path.rstrip("/").split("/")[-2])
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def read_manifest(self, step: int) -> Manifest:
        """Parse step ``step``'s manifest object.

        Raises:
            CorruptCheckpoint: Missing or malformed.
        """
        path = self._path(step_dir_name(step), MANIFEST_NAME)
        try:
            text = self.fs.cat_file(path)
        except (FileNotFoundError, OSError) as exc:
            raise CorruptCheckpoint(f"cannot read manifest: {exc}", path=self._url(path)) from exc
        return parse_manifest(text, path=self._url(path))

    def list(self) -> list[CheckpointInfo]:
        """Committed remote checkpoints, oldest first (a malformed manifest is listed with its error)."""
        out = []
        for step in self.committed_steps():
            where = self._url(self._path(step_dir_name(step)))
            try:
                m = self.read_manifest(step)
            except CorruptCheckpoint as exc:
                out.append(CheckpointInfo(step, where, 0, 0, 0, error=str(exc)))
                continue
            out.append(CheckpointInfo(step, where, m.nbytes, m.world_size, sum(len(s.tensors) for s in m.shards)))
        return out

    def latest_hint(self) -> int | None:
        """The step the ``latest`` object names, if any."""
        try:
            name = self.fs.cat_file(self._path(LATEST)).decode().strip()
        except (FileNotFoundError, OSError, UnicodeDecodeError):
            return None
        return int(name[5:]) if _STEP_RE.match(name) else None

    def _url(self, path: str) -> str:
        return f"{self.url.split('://', 1)[0]}://{path.lstrip('/')}" if "://" not in path else path

    # -- upload --------------------------------------------------------------
    def upload(
        self,
        local_root: str,
        step: int,
        keep_last: int = 0,
        *,
        token: str = "",
        rank: int | None = None,
        timeout_s: float = 600.0,
        wanted: Callable[[], bool] | None = None,
    ) -> bool:
        """Upload local committed checkpoint ``step``: shards first, the manifest last; then prune.

        With ``rank`` None this process uploads every shard. With ``rank`` set (one
        rank of a multi-rank save; every rank sees the local directory), only that
        rank's shard; rank 0 then polls the store until every other rank's shard
        object exists with the size the manifest names (for ``timeout_s``), and only
        then writes the manifest and ``latest`` and prunes. ``token`` names the shard
        objects (every rank of one save passes the same; default: a fresh one).
        ``wanted`` is asked while rank 0 waits: False (the local checkpoint was
        pruned or replaced meanwhile) abandons the upload without writing the manifest.

        Returns:
            False when ``wanted`` abandoned it, else True.

        Raises:
            CheckpointError: The local checkpoint is missing, the store failed, or
                other ranks' shards did not appear in time (nothing is committed
                then: the manifest was not written).
        """
        local = os.path.join(local_root, step_dir_name(step))
        manifest = read_manifest(local)
        token = token or secrets.token_hex(6)
        remote_dir = self._path(step_dir_name(step))
        named = tuple(replace(s, file=_object_name(s.file, token)) for s in manifest.shards)
        try:
            self._before_data(step)
            for shard, obj in zip(manifest.shards, named, strict=True):
                if rank is None or shard.rank == rank:
                    self.fs.put_file(os.path.join(local, shard.file), f"{remote_dir}/{obj.file}")
            self._after_data(step)
            if rank not in (None, 0):
                return True
            others = [s for s in named if rank is not None and s.rank != rank]
            if not self._await_shards(remote_dir, others, timeout_s, wanted):
                return False
            self.fs.pipe_file(f"{remote_dir}/{MANIFEST_NAME}", replace(manifest, shards=named).to_json().encode())
            self.fs.pipe_file(self._path(LATEST), step_dir_name(step).encode())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"upload of step {step} failed: {exc}", path=self._url(remote_dir)) from exc
        self.prune(keep_last)
        return True

    def _before_data(self, step: int) -> None:
        """Test seam: called before this process's shard objects are uploaded."""

    def _after_data(self, step: int) -> None:
        """Test seam: called after this process's shard objects are uploaded, before the manifest."""

    def _await_shards(
        self, remote_dir: str, shards: builtins.list[ShardEntry], timeout_s: float, wanted: Callable[[], bool] | None
    ) -> bool:
        """Poll until every shard object in ``shards`` exists with its size; False if ``wanted`` says stop.

        Polling the store (not a collective) keeps the background uploaders of
        different ranks independent: none of them calls into torch.distributed.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while shards:
            self._refresh()
            sizes = self._sizes(remote_dir)  # one listing a round, however many ranks
            shards = [s for s in shards if sizes.get(s.file) != s.size]
            if not shards:
                break
            if wanted is not None and not wanted():
                return False
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"ranks {[s.rank for s in shards]} did not upload their shards within {timeout_s:g} s "
                    "(missing or of the wrong size); the manifest is not written",
                    path=self._url(remote_dir),
                )
            time.sleep(delay)
            delay = min(2 * delay, 1.0)  # back off: each round is a LIST request
        return True

    def _sizes(self, remote_dir: str) -> dict[str, int]:
        """Object name -> size under ``remote_dir`` (empty if it does not exist yet)."""
        try:
            entries = self.fs.ls(remote_dir, detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries}

    # -- prune ---------------------------------------------------------------
    def prune(self, keep_last: int) -> builtins.list[int]:
        """Delete committed steps beyond the newest ``keep_last`` (0 keeps all) and older debris.

        A checkpoint's manifest goes first, so a crash mid-prune leaves debris, never
        a manifest naming missing shards. Returns the committed steps deleted.
        """
        steps = self.committed_steps()
        if not steps:
            return []
        newest = steps[-1]
        gone = steps[:-keep_last] if keep_last > 0 else []
        for step in gone:
            self.fs.rm_file(self._path(step_dir_name(step), MANIFEST_NAME))
        for step in self._step_dirs():
            if step in gone or (step <= newest and step not in steps):
                self.fs.rm(self._path(step_dir_name(step)), recursive=True)
            elif step in steps:
                try:
                    self._drop_stale_shards(step)
                except CorruptCheckpoint:
                    pass  # a malformed manifest names nothing to keep: leave its objects for inspection
        self._refresh()
        return gone

    def _drop_stale_shards(self, step: int) -> None:
        """Shard objects of earlier attempts at ``step`` that its manifest does not name."""
        keep = {s.file for s in self.read_manifest(step).shards} | {MANIFEST_NAME}
        for path in self.fs.ls(self._path(step_dir_name(step)), detail=False):
            if path.rstrip("/").rsplit("/", 1)[-1] not in keep:
                self.fs.rm(path, recursive=True)

    # -- fetch ---------------------------------------------------------------
    def fetch(self, local_root: str, step: int | None = None) -> int:
        """Download the newest verified remote checkpoint (or ``step``) into ``local_root``.

        Every shard's size, header crc32 and tensor crc32s are checked before
        anything is written locally; a corrupt checkpoint is skipped with a
        warning (unless ``step`` names it). The local copy is committed like a
        writer commits (temp dir, fsync, rename, ``latest``).

        Raises:
            CheckpointError: No committed remote checkpoint, or ``step`` is missing.
            CorruptCheckpoint: ``step`` was named and fails verification.
        """
        if step is not None:
            if step not in self.committed_steps():
                raise CheckpointError(f"no committed remote checkpoint for step {step}", path=self.url)
            order = [step]
        else:
            order = candidates(self)
        for cand in order:
            try:
                manifest, blobs = self._download_verified(cand)
            except CorruptCheckpoint as exc:
                if step is not None:
                    raise
                warnings.warn(f"skipping corrupt remote checkpoint: {exc}", RuntimeWarning, stacklevel=2)
                continue
            _commit_local(local_root, manifest, blobs)
            return cand
        raise CheckpointError("no committed, verified remote checkpoint found", path=self.url)

    def verify(self, step: int) -> Manifest:
        """Read every shard object of ``step`` and check its size and checksums (nothing is written).

        Raises:
            CorruptCheckpoint: The first problem found, naming the object, offset and tensor.
        """
        return self._download_verified(step)[0]

    def shard_bytes(self, step: int, shard: ShardEntry) -> tuple[bytearray, str]:
        """One shard object, read whole, its size checked (a :class:`~carina.ckpt.storage.Source` method).

        Raises:
            CorruptCheckpoint: Unreadable, or not the size the manifest names.
        """
        path = self._path(step_dir_name(step), shard.file)
        try:
            data = bytearray(self.fs.cat_file(path))
        except (FileNotFoundError, OSError) as exc:
            raise CorruptCheckpoint(f"cannot read shard: {exc}", path=self._url(path)) from exc
        if len(data) != shard.size:
            raise CorruptCheckpoint(f"shard is {len(data)} bytes, manifest says {shard.size}", path=self._url(path))
        return data, self._url(path)

    def _download_verified(self, step: int) -> tuple[Manifest, dict[str, bytearray]]:
        manifest = self.read_manifest(step)
        blobs: dict[str, bytearray] = {}
        shards = []
        for entry in manifest.shards:
            shard, data = read_verified(self, step, manifest, entry.rank)
            local_name = f"rank{shard.rank:05d}.safetensors"
            blobs[local_name] = data
            shards.append(replace(shard, file=local_name))
        return replace(manifest, shards=tuple(shards)), blobs


def _object_name(file: str, token: str) -> str:
    """``rank00001.safetensors`` -> ``rank00001.<token>.safetensors``."""
    return f"{file.removesuffix('.safetensors')}.{token}.safetensors"


def _commit_local(root: str, manifest: Manifest, blobs: dict[str, bytearray]) -> None:
    """Write a verified checkpoint into ``root`` and commit it (manifest last, rename, ``latest``)."""
    name = step_dir_name(manifest.step)
    final = os.path.join(root, name)
    os.makedirs(root, exist_ok=True)
    token = secrets.token_hex(6)
    tmp = os.path.join(root, f"{name}.{token}.tmp")
    os.makedirs(tmp)
    for file, data in blobs.items():
        write_file(os.path.join(tmp, file), memoryview(data))
    write_file(os.path.join(tmp, MANIFEST_NAME), memoryview(manifest.to_json().encode()))
    fsync_dir(tmp)
    old = None
    if os.path.exists(final):  # the remote copy was verified; it replaces what is here
        old = f"{final}.{token}.old"
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(root)
    latest_tmp = os.path.join(root, f"{LATEST}.tmp")
    write_file(latest_tmp, memoryview(name.encode()))
    os.rename(latest_tmp, os.path.join(root, LATEST))
    fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
