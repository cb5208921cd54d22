"""Reference, null and mock backends, in-memory stores and conformance suites.

Production code never imports this package; tests and benchmarks do. Fakes of
hardware that cannot exist on a test machine (a CC-mode GPU, several GPUs, an
FPGA) live here and label every result they touch as emulated or simulated.

The pattern, shown once in :mod:`carina.testing.conformance`: an interface in
``carina`` ships a conformance suite here that each backend's tests subclass,
plus a reference implementation that passes it.
"""

from __future__ import annotations

from pathlib import Path

from carina.core import flags

__all__ = ["SHARED_DIR", "shared_data"]

SHARED_DIR = flags.define(
    "CARINA_SHARED_DIR", str, "", "where the project's shared/ folder is (default: ../shared beside the repo)"
)


def shared_data(name: str) -> Path:
    """Path of ``shared/data/<name>``, the third-party data tests may read (never copy).

    Raises:
        FileNotFoundError: The shared folder or the data set is absent.
    """
    root = Path(SHARED_DIR.get()) if SHARED_DIR.get() else Path(__file__).resolve().parents[3] / ".." / "shared"
    path = (root / "data" / name).resolve()
    if not path.exists():
        raise FileNotFoundError(f"shared data {name!r} not found at {path} (set CARINA_SHARED_DIR)")
    return path
