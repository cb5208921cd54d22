"""The ``kvikio`` backend: reads and writes through NVIDIA KvikIO (GDS, or its POSIX compat mode).

Used only when named (``IOConfig(backend="kvikio")``): for host memory the
``uring`` backend is faster. Each engine descriptor is reopened by KvikIO
through ``/proc/self/fd/N`` (one ``CuFile`` per open file, closed with the
backend); ``workers`` threads each run one ``pread``/``pwrite`` at a time and
wait on KvikIO's future. Gathers go row by row. Without ``kvikio`` installed
the backend reports why and is never started.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import queue
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from carina.io._future import Op, OpKind
from carina.io.backends.base import IOBackend

__all__ = ["KvikioBackend"]

INSTALL_HINT = "kvikio is not installed: pip install kvikio-cu13 (or kvikio-cu12)"


class KvikioBackend(IOBackend):
    """Thread pool over ``kvikio.CuFile.pread``/``pwrite``."""

    name: ClassVar[str] = "kvikio"
    capabilities: ClassVar[frozenset[str]] = frozenset({"vectored", "async", "real_io", "gpu_direct"})

    def __init__(self, *, queue_depth: int = 64, workers: int = 0) -> None:
        super().__init__(queue_depth=queue_depth, workers=workers)
        import kvikio

        self._kvikio = kvikio
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
                f = self._kvikio.CuFile(f"/proc/self/fd/{fd}", "r" if mode == os.O_RDONLY else "r+")
                self._files[key] = f
        return f

    def _perform(self, op: Op) -> int | OSError:
        try:
            f = self._file(op.fd)
            call = f.pread if op.kind is OpKind.READ else f.pwrite
            pos = op.offset
            for view in op.views:
                n = int(call(np.frombuffer(view, dtype=np.uint8), view.nbytes, pos).get())
                pos += n
                if n < view.nbytes:
                    break
            return pos - op.offset
        except OSError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - KvikIO raises RuntimeError for failed IO
            return OSError(errno.EIO, f"kvikio: {exc}")
