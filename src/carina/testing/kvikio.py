"""A stand-in for ``kvikio.CuFile`` in KvikIO's POSIX compat mode (a test double, named as such where used).

KvikIO needs the CUDA driver even in compat mode, so CPU machines cannot run the real thing; this
stand-in fails the way KvikIO 26.10's compat mode fails, and the kvikio backend's conformance tests
run through it on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["KvikioCompatStandIn", "KvikioDefaultsStandIn", "write_kvikio_package"]


class KvikioCompatStandIn:
    """A stand-in for ``kvikio.CuFile`` in POSIX compat mode (KvikIO needs the CUDA driver, absent on CPU machines).

    Real ``pread``/``pwrite`` on its own buffered descriptor of ``path``, failing
    the way KvikIO 26.10's compat mode fails (its ``detail/posix_io.hpp``): all or
    nothing, so a read that passes the end of the file raises "POSIX error on
    pread: EOF"; a failed call raises ``RuntimeError`` with the errno only as its
    ``strerror`` text. Tests that use it say so in their names.
    """

    def __init__(self, path: str, flags: str = "r") -> None:
        self._fd = os.open(path, {"r": os.O_RDONLY, "r+": os.O_RDWR}[flags] | os.O_CLOEXEC)

    def pread(self, buf: Any, size: int, file_offset: int = 0) -> Any:
        """Read ``size`` bytes into ``buf`` (a future whose ``get()`` is the count)."""
        return _Ready(self._io(os.preadv, "pread", buf, size, file_offset))

    def pwrite(self, buf: Any, size: int, file_offset: int = 0) -> Any:
        """Write ``size`` bytes of ``buf``."""
        return _Ready(self._io(os.pwritev, "pwrite", buf, size, file_offset))

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self._fd)

    def _io(self, call: Callable[..., int], name: str, buf: Any, size: int, offset: int) -> int:
        view, done = memoryview(buf).cast("B")[:size], 0
        while done < size:
            try:
                n = call(self._fd, [view[done:]], offset + done)
            except OSError as exc:
                raise RuntimeError(f"KvikIO failure: POSIX error on {name}: {os.strerror(exc.errno or 5)}") from None
            if n == 0:
                raise RuntimeError(f"KvikIO failure: POSIX error on {name}: EOF")
            done += n
        return done


class _Ready:
    def __init__(self, value: int) -> None:
        self._value = value

    def get(self) -> int:
        return self._value


class KvikioDefaultsStandIn:
    """A stand-in for ``kvikio.defaults`` (``get``/``set``), starting from KvikIO 26.10's documented defaults.

    ``runtime_settings.rst``: opportunistic Direct I/O off for reads, on for
    writes; one thread in the pool. Unknown keys raise ``KeyError`` as KvikIO's do.
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {"auto_direct_io_read": False, "auto_direct_io_write": True, "num_threads": 1}
        self.calls: list[tuple[str, Any]] = []

    def get(self, key: str) -> Any:
        """The setting's value."""
        return self.values[key]

    def set(self, key: str, value: Any) -> None:
        """Change a setting (every call is kept in :attr:`calls`)."""
        if key not in self.values:
            raise KeyError(key)
        self.calls.append((key, value))
        self.values[key] = value


_PACKAGE_INIT = "from carina.testing.kvikio import KvikioCompatStandIn as CuFile  # noqa: F401\n"
_PACKAGE_DEFAULTS = (
    "from carina.testing.kvikio import KvikioDefaultsStandIn\n\n"
    "STAND_IN = KvikioDefaultsStandIn()\nget = STAND_IN.get\nset = STAND_IN.set\n"
)


def write_kvikio_package(directory: str | Path) -> Path:
    """Write a stand-in ``kvikio`` package under ``directory`` (put it first on ``sys.path``); return ``directory``.

    Shaped like the real one where the backend depends on it: ``import kvikio``
    gives ``CuFile`` (:class:`KvikioCompatStandIn`), and ``defaults`` is a
    submodule that ``import kvikio`` does not load.
    """
    root = Path(directory)
    (root / "kvikio").mkdir(parents=True, exist_ok=True)
    (root / "kvikio" / "__init__.py").write_text(_PACKAGE_INIT)
    (root / "kvikio" / "defaults.py").write_text(_PACKAGE_DEFAULTS)
    return root
