"""Checkpoints in an object store: S3 through s3fs, or any fsspec URL.

A remote checkpoint mirrors a local committed one. Object stores have no
rename, so the commit is ordering alone::

    <root>/step_N/rank00000.<token>.safetensors   every shard, then
    <root>/step_N/manifest.json                   last: this object commits step N
    <root>/latest                                 a hint, after the manifest

Shard objects carry the attempt token in their names, so re-uploading a step
never overwrites the bytes an existing manifest points at. A step whose
manifest object is absent (an upload killed or failed before its last PUT) is
never listed or selected, and the next upload or :meth:`RemoteStore.prune`
deletes it. Pruning deletes a checkpoint's manifest before its shards.
:meth:`RemoteStore.fetch` downloads the newest checkpoint whose every checksum
verifies (older ones are tried with a warning) and commits it into a local
directory the way a writer does, so :class:`~carina.ckpt.Checkpointer` restores it.

Needs ``fsspec`` (and ``s3fs`` for ``s3://``): ``pip install carina[ckpt]``.
"""

from __future__ import annotations

import builtins
import os
import re
import secrets
import shutil
import warnings
from dataclasses import replace
from typing import Any

from carina.ckpt.commit import LATEST, committed_steps, fsync_dir, step_dir_name, write_file
from carina.ckpt.manifest import MANIFEST_NAME, Manifest, parse_manifest
from carina.ckpt.storage import CheckpointInfo, check_shard_bytes, latest_hint, read_manifest
from carina.core.errors import CheckpointError, ConfigError, CorruptCheckpoint

__all__ = ["RemoteStore", "Uploader", "is_url", "newest_local"]

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
    def upload(self, local_root: str, step: int, keep_last: int = 0) -> None:
        """Upload local committed checkpoint ``step``: shards first, the manifest last; then prune.

        Raises:
            CheckpointError: The local checkpoint is missing, or the store failed
                (nothing is committed then: the manifest was not written).
        """
        local = os.path.join(local_root, step_dir_name(step))
        manifest = read_manifest(local)
        token = secrets.token_hex(6)
        remote_dir = self._path(step_dir_name(step))
        shards = []
        try:
            for shard in manifest.shards:
                name = f"{shard.file.removesuffix('.safetensors')}.{token}.safetensors"
                self.fs.put_file(os.path.join(local, shard.file), f"{remote_dir}/{name}")
                shards.append(replace(shard, file=name))
            self._after_data(step)
            text = replace(manifest, shards=tuple(shards)).to_json().encode()
            self.fs.pipe_file(f"{remote_dir}/{MANIFEST_NAME}", text)
            self.fs.pipe_file(self._path(LATEST), step_dir_name(step).encode())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"upload of step {step} failed: {exc}", path=self._url(remote_dir)) from exc
        self.prune(keep_last)

    def _after_data(self, step: int) -> None:
        """Test seam: called after the shard objects are uploaded, before the manifest."""

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
        steps = self.committed_steps()
        if step is not None:
            if step not in steps:
                raise CheckpointError(f"no committed remote checkpoint for step {step}", path=self.url)
            candidates = [step]
        else:
            candidates = sorted(steps, reverse=True)
            hint = self.latest_hint()
            if hint in candidates:
                candidates.remove(hint)
                candidates.insert(0, hint)
        for cand in candidates:
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

    def _download_verified(self, step: int) -> tuple[Manifest, dict[str, bytes]]:
        manifest = self.read_manifest(step)
        blobs: dict[str, bytes] = {}
        shards = []
        for shard in manifest.shards:
            path = self._path(step_dir_name(step), shard.file)
            try:
                data = self.fs.cat_file(path)
            except (FileNotFoundError, OSError) as exc:
                raise CorruptCheckpoint(f"cannot read shard: {exc}", path=self._url(path)) from exc
            if len(data) != shard.size:
                raise CorruptCheckpoint(f"shard is {len(data)} bytes, manifest says {shard.size}", path=self._url(path))
            check_shard_bytes(data, shard, self._url(path))
            local_name = f"rank{shard.rank:05d}.safetensors"
            blobs[local_name] = data
            shards.append(replace(shard, file=local_name))
        return replace(manifest, shards=tuple(shards)), blobs


class Uploader:
    """Uploads committed local checkpoints in a background thread; a failure surfaces at :meth:`check`.

    Args:
        store: Where to upload.
        root: The local checkpoint directory.
        keep_last: Remote retention after each upload (0 keeps all).
    """

    def __init__(self, store: RemoteStore, root: str, keep_last: int) -> None:
        import queue
        import threading

        self.store, self.root, self.keep_last = store, root, keep_last
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="carina-ckpt-upload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (step := self._queue.get()) is not None:
            try:
                if self._error is None and step in committed_steps(self.root):  # pruned locally: superseded
                    self.store.upload(self.root, step, self.keep_last)
            except BaseException as exc:  # noqa: BLE001 - kept and raised at the next check()
                if step in committed_steps(self.root):  # else pruned locally mid-upload: superseded
                    self._error = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def submit(self, step: int) -> None:
        """Queue the committed local checkpoint ``step``."""
        self._queue.put(step)

    def check(self) -> None:
        """Raise the first failed upload (once).

        Raises:
            CheckpointError: An upload failed.
        """
        error, self._error = self._error, None
        if isinstance(error, CheckpointError):
            raise error
        if error is not None:
            raise CheckpointError(f"checkpoint upload failed: {error!r}", path=self.store.url) from error

    def drain(self) -> None:
        """Wait until every queued upload is done, then :meth:`check`."""
        self._queue.join()
        self.check()

    def close(self) -> None:
        """Drain and stop the thread."""
        try:
            self.drain()
        finally:
            self._queue.put(None)
            self._thread.join()


def _commit_local(root: str, manifest: Manifest, blobs: dict[str, bytes]) -> None:
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


def newest_local(root: str) -> int | None:
    """The step a local restore would try first (``latest``, else the newest committed)."""
    hint = latest_hint(root)
    if hint is not None:
        return hint
    steps = committed_steps(root)
    return steps[-1] if steps else None
