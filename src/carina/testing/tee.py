"""Fakes for confidential-computing hardware that cannot exist on a test machine.

* :class:`FakeNvml` answers the NVML confidential-computing calls of nvidia-ml-py for a
  chosen state (``on``, ``devtools``, ``off``, ``unsupported``, ``old-driver``,
  ``no-driver``, ``no-gpu``); reports built from it carry ``emulated = True``.
* :func:`make_tree` writes the ``/dev`` and ``/proc`` entries of a TDX guest, an SEV-SNP
  guest, an SNP-capable host or a plain machine under a temporary root.
* :func:`fake_smi` returns an ``nvidia-smi`` stand-in that prints ``conf-compute`` output.

Nothing here measures anything; every result touched by these fakes is emulated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["STATES", "FakeNvml", "fake_smi", "make_tree"]

STATES = ("on", "devtools", "off", "unsupported", "old-driver", "no-driver", "no-gpu")


class FakeNVMLError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


class FakeNvml:
    """A module-like object with the NVML calls :mod:`carina.security.tee.detect` makes."""

    EMULATED = True
    NVMLError = FakeNVMLError

    def __init__(self, state: str = "on", *, devices: int = 1, ready: bool = True) -> None:
        if state not in STATES:
            raise ValueError(f"unknown fake state {state!r} (known: {STATES})")
        self.state = state
        self.devices = 0 if state == "no-gpu" else devices
        self.ready = ready
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.state == "no-driver":
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlSystemGetConfComputeCapabilities(self) -> Any:
        if self.state == "old-driver":
            raise FakeNVMLError("Not Supported")
        capable = self.state != "unsupported"
        return SimpleNamespace(cpuCaps=2 if capable else 0, gpusCaps=1 if capable else 0)

    def nvmlSystemGetConfComputeState(self) -> Any:
        if self.state == "old-driver":
            raise FakeNVMLError("Not Supported")
        on = self.state in ("on", "devtools")
        return SimpleNamespace(
            environment=2 if on else 0, ccFeature=1 if on else 0, devToolsMode=int(self.state == "devtools")
        )

    def nvmlSystemGetConfComputeGpusReadyState(self) -> int:
        return int(self.ready and self.state in ("on", "devtools"))


def make_tree(root: Path, kind: str) -> Path:
    """Write a fake ``/dev`` + ``/proc`` (+ configfs-tsm) tree of ``kind`` under ``root``.

    Kinds: ``tdx`` (guest, with configfs-tsm), ``tdx-old`` (``/dev/tdx-guest``, flag only
    via device), ``sev-snp`` (guest), ``snp-host`` (capable host, no guest), ``none``.
    """
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "proc").mkdir(parents=True, exist_ok=True)
    flags = ["fpu", "vme", "sse2", "aes", "avx2"]
    if kind == "tdx":
        (root / "dev" / "tdx_guest").touch()
        (root / "sys" / "kernel" / "config" / "tsm" / "report").mkdir(parents=True)
        flags += ["hypervisor", "tdx_guest"]
    elif kind == "tdx-old":
        (root / "dev" / "tdx-guest").touch()
        flags += ["hypervisor"]
    elif kind == "sev-snp":
        (root / "dev" / "sev-guest").touch()
        flags += ["hypervisor", "sev", "sev_es", "sev_snp"]
    elif kind == "snp-host":
        flags += ["sev", "sev_es", "sev_snp"]
    elif kind != "none":
        raise ValueError(f"unknown tree kind {kind!r}")
    (root / "proc" / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {' '.join(flags)}\n\n")
    return root


def fake_smi(status: str | None, ready: str = "ready") -> Callable[[list[str]], str]:
    """An ``nvidia-smi`` runner printing ``CC status: <status>``; ``None`` means not installed."""

    def run(args: list[str]) -> str:
        if status is None:
            raise FileNotFoundError("nvidia-smi")
        if args[-1] == "-grs":
            return f"Confidential Compute GPUs Ready state: {ready}\n"
        return f"CC status: {status}\n"

    return run
