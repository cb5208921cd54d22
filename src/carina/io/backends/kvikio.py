"""The ``kvikio`` backend: reads and writes through NVIDIA KvikIO (GDS, or its POSIX compat mode).

Used only when named (``IOConfig(backend="kvikio")``): for host memory the
``uring`` backend is faster. Each engine descriptor is reopened by KvikIO
through ``/proc/self/fd/N`` (one ``CuFile`` per open file, closed with the
backend); ``workers`` threads each run one ``pread``/``pwrite`` at a time and
wait on KvikIO's future. Gathers go row by row. Without ``kvikio`` installed
the backend reports why and is never started.

KvikIO differs from POSIX in three ways the engine's contract hides (all three
showed on the H200 in session 5: four conformance failures and 1 MiB reads at
2.8x fio's rate, out of the page cache):

* a read that passes the end of the file fails as a whole ("POSIX error on
  pread: EOF"): reads are clamped to the file's size first, so they come back
  short as ``pread`` does and the engine raises ``ShortRead``;
* errors are ``RuntimeError`` s with the errno only in the message: the
  message's ``strerror`` text is mapped back to the errno (``ENOSPC`` ->
  ``DeviceFull``);
* a reopened descriptor loses ``O_DIRECT`` and KvikIO reads host memory with
  buffered ``pread`` unless its opportunistic Direct I/O is on (off by default
  for reads). The backend turns ``auto_direct_io_read``/``write`` on through the
  ``kvikio.defaults`` submodule, which ``import kvikio`` does not load (session
  5 reached for ``kvikio.defaults`` as an attribute, failed with a logged
  warning, and read through the page cache: faster than fio's ``O_DIRECT``
  ceiling in ``io_kvikio_h200``, session 6). KvikIO
  then opens a second, ``O_DIRECT`` descriptor per file and reads each
  page-aligned part of a request whose size is at least a page through it
  (an unaligned buffer goes through its own page-aligned bounce buffer); an
  unaligned prefix and a tail shorter than a page stay buffered. The engine
  hands it aligned requests whenever its handle is direct.

KvikIO runs every ``pread`` on its own thread pool, one thread unless
``KVIKIO_NTHREADS`` says otherwise, so the ``workers`` threads' requests would
reach the disk one at a time: the backend sizes that pool to ``workers``.
Every setting is left alone when its ``KVIKIO_*`` variable is set, and all are
process-wide. :attr:`KvikioBackend.direct_io` says what KvikIO ended up with
and why any read may still use the page cache.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import queue
import re
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from carina.io._future import Op, OpKind
from carina.io.backends.base import IOBackend

__all__ = ["KvikioBackend", "configure_kvikio", "kvikio_errno"]

log = logging.getLogger("carina.io")

INSTALL_HINT = "kvikio is not installed: pip install kvikio-cu13 (or kvikio-cu12)"


class KvikioBackend(IOBackend):
    """Thread pool over ``kvikio.CuFile.pread``/``pwrite``.

    Attributes:
        direct_io: What :func:`configure_kvikio` left KvikIO with (``settings``,
            ``from_environment``) and ``page_cache``: every reason found why
            reads may still go through the page cache (empty when none).
    """

    name: ClassVar[str] = "kvikio"
    capabilities: ClassVar[frozenset[str]] = frozenset({"vectored", "async", "real_io", "gpu_direct"})

    def __init__(self, *, queue_depth: int = 64, workers: int = 0, cufile: Callable[..., Any] | None = None) -> None:
        """``cufile`` replaces ``kvikio.CuFile`` (tests on machines without the CUDA driver pass a stand-in)."""
        super().__init__(queue_depth=queue_depth, workers=workers)
        self.direct_io: dict[str, Any] = {"settings": {}, "page_cache": []}
        if cufile is None:
            import kvikio
            import kvikio.defaults  # a submodule: ``import kvikio`` alone does not load it

            self.direct_io = configure_kvikio(kvikio.defaults, threads=self.workers)
            cufile = kvikio.CuFile
        self._cufile = cufile
        self._files: dict[tuple[int, int, int, int], Any] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"carina-io-kvikio-{i}", daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()

    @classmethod
    def probe_reasons(cls) -> list[str]:
        """KvikIO must be importable (it then picks GDS or its POSIX compat mode itself)."""
        try:
            import kvikio  # noqa: F401
        except ImportError:
            return [INSTALL_HINT]
        except Exception as exc:  # noqa: BLE001 - e.g. libkvikio or CUDA libraries missing underneath
            return [f"kvikio cannot be imported: {exc!r}"]
        try:  # KvikIO loads the CUDA driver for every transfer, host memory included
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return ["kvikio needs the CUDA driver (libcuda.so.1), even in compat mode"]
        return []

    def _submit(self, ops: Sequence[Op]) -> None:
        for op in ops:
            self._queue.put(op)

    def _close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _work(self) -> None:
        while (op := self._queue.get()) is not None:
            op.finish(self._perform(op))

    def _file(self, fd: int) -> Any:
        st = os.fstat(fd)
        mode = os.O_ACCMODE & fcntl.fcntl(fd, fcntl.F_GETFL)
        key = (fd, st.st_dev, st.st_ino, mode)
        with self._lock:
            f = self._files.get(key)
            if f is None:
                f = self._cufile(f"/proc/self/fd/{fd}", "r" if mode == os.O_RDONLY else "r+")
                self._files[key] = f
                self._check_direct(f, fd)
        return f

    def _check_direct(self, f: Any, fd: int) -> None:
        """Note a file KvikIO holds no ``O_DIRECT`` descriptor for (its reads use the page cache)."""
        supported = getattr(f, "is_direct_io_supported", None)
        if supported is None or supported():
            return
        where = os.readlink(f"/proc/self/fd/{fd}")
        why = f"KvikIO holds no O_DIRECT descriptor for {where}: its IO uses the page cache"
        self.direct_io["page_cache"].append(why)
        log.warning("carina.io: %s", why)

    def _perform(self, op: Op) -> int | OSError:
        try:
            f = self._file(op.fd)
            reading = op.kind is OpKind.READ
            call = f.pread if reading else f.pwrite
            end = _regular_size(op.fd) if reading else None  # KvikIO fails a read past the end: stop there
            pos = op.offset
            for view in op.views:
                want = view.nbytes if end is None else max(0, min(view.nbytes, end - pos))
                n = int(call(np.frombuffer(view, dtype=np.uint8), want, pos).get()) if want else 0
                pos += n
                if n < view.nbytes:
                    break
            return pos - op.offset
        except OSError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - KvikIO raises RuntimeError for failed IO, errno in the text
            return OSError(kvikio_errno(str(exc)), f"kvikio: {exc}")


_STRERROR = sorted(((os.strerror(code), code) for code in errno.errorcode), key=lambda t: -len(t[0]))
_POSIX_ERROR = re.compile(r"POSIX error on p(?:read|write)\w*: (.+)", re.DOTALL)


def kvikio_errno(message: str) -> int:
    """The errno of a KvikIO failure message ("... POSIX error on pwrite: No space left on device"); EIO if none."""
    match = _POSIX_ERROR.search(message)
    if match:
        text = match.group(1).strip()
        for words, code in _STRERROR:  # longest first: no text is taken for a shorter one it starts with
            if text.startswith(words):
                return code
    return errno.EIO


def _regular_size(fd: int) -> int | None:
    """The size of a regular file (reads stop there); None for devices and pipes."""
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


_ENV = {
    "auto_direct_io_read": "KVIKIO_AUTO_DIRECT_IO_READ",
    "auto_direct_io_write": "KVIKIO_AUTO_DIRECT_IO_WRITE",
    "num_threads": "KVIKIO_NTHREADS",
}


def configure_kvikio(defaults: Any, *, threads: int, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Turn KvikIO's opportunistic Direct I/O on and give its pool ``threads`` threads (at least).

    Args:
        defaults: The ``kvikio.defaults`` module (``get(key)``, ``set(key, value)``).
        threads: Threads KvikIO's pool should have (the backend's ``workers``).
        environ: A setting whose ``KVIKIO_*`` variable is set here is left alone.

    Returns:
        ``settings`` (KvikIO's values as read back), ``from_environment`` (the
        variables that decided) and ``page_cache`` (why reads may use the page cache).
    """
    wanted: dict[str, Any] = {"auto_direct_io_read": True, "auto_direct_io_write": True, "num_threads": threads}
    out: dict[str, Any] = {"settings": {}, "from_environment": [], "page_cache": []}
    for key, value in wanted.items():
        if _ENV[key] in environ:
            out["from_environment"].append(_ENV[key])
        try:
            if _ENV[key] not in environ:
                defaults.set(key, max(value, defaults.get(key)) if key == "num_threads" else value)
            out["settings"][key] = defaults.get(key)
        except Exception as exc:  # noqa: BLE001 - an older KvikIO without the setting
            out["settings"][key] = None
            out["page_cache"].append(f"this KvikIO has no {key} setting ({exc})")
    if out["settings"]["auto_direct_io_read"] is False:
        why = "KvikIO's Direct I/O for reads is off"
        out["page_cache"].append(f"{why} ({_ENV['auto_direct_io_read']}): its reads use the page cache")
    for why in out["page_cache"]:
        log.warning("carina.io: %s", why)
    return out
