"""``carina doctor``: what this machine has for carina, and how to get what it lacks.

:func:`collect` runs real probes (see :mod:`carina.core.probes`) and returns a
:class:`Report`; the CLI prints it as a table or JSON. Every missing piece comes
with the command that installs it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core import flags
from carina.core.probes import PathProbe, ToolProbe, probe_io_uring, probe_path, probe_tool
from carina.core.registry import install_hint

__all__ = ["EXTRAS", "SYSTEM_TOOLS", "Missing", "Report", "collect"]

#: Import names that must be importable for each extra to count as installed.
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("torch", "transformers"),
    "gnn": ("torch", "torch_geometric", "scipy", "networkx"),
    "infra": ("fastapi", "uvicorn", "sqlalchemy", "qemu.qmp", "prometheus_client", "httpx"),
    "security": ("networkx", "yaml", "dissect.target", "cyclonedx", "cryptography", "h5py"),
    "gpu": ("pynvml",),
}

SYSTEM_TOOLS = (
    "qemu-system-x86_64",
    "qemu-img",
    "qemu-storage-daemon",
    "tgtd",
    "nbdkit",
    "nbdcopy",
    "fio",
    "mmdebstrap",
)


@dataclass
class Missing:
    """Something carina could use that this machine lacks, and its fix."""

    what: str
    fix: str


@dataclass
class Report:
    """Everything ``carina doctor`` found."""

    carina: str
    python: dict[str, str]
    system: dict[str, Any]
    torch: dict[str, Any]
    pinned_memory: dict[str, Any]
    io_uring: dict[str, Any]
    paths: list[PathProbe]
    tools: list[ToolProbe]
    extras: dict[str, dict[str, Any]]
    flags: dict[str, dict[str, Any]]
    missing: list[Missing] = field(default_factory=list)


def _python() -> dict[str, str]:
    return {
        "version": platform.python_version(),
        "executable": sys.executable,
        "implementation": platform.python_implementation(),
    }


def _system() -> dict[str, Any]:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "os": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": mem,
        "hostname": platform.node(),
        "root": hasattr(os, "geteuid") and os.geteuid() == 0,
    }


def _torch() -> dict[str, Any]:
    """Torch, CUDA and GPUs; imports torch only when it is installed."""
    if importlib.util.find_spec("torch") is None:
        return {"installed": False, "version": None, "cuda_available": False, "gpus": []}
    import torch

    info: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
        "driver": None,
    }
    if info["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_bytes": props.total_memory,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                }
            )
        info["driver"] = _driver_version()
    return info


def _driver_version() -> str | None:
    if importlib.util.find_spec("pynvml") is not None:
        try:
            import pynvml

            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:  # noqa: BLE001 - NVML failures are reported as unknown
            return None
    tool = probe_tool("nvidia-smi")
    return tool.version if tool.path else None


def _pinned(torch_info: dict[str, Any]) -> dict[str, Any]:
    if not torch_info["installed"]:
        return {"works": False, "reason": "torch is not installed"}
    if not torch_info["cuda_available"]:
        return {"works": False, "reason": "no CUDA device: page-locked host memory needs the CUDA driver"}
    import torch

    try:
        buf = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        return {"works": bool(buf.is_pinned()), "reason": "1 MiB pinned allocation succeeded"}
    except RuntimeError as exc:
        return {"works": False, "reason": str(exc).splitlines()[0]}


def _extras() -> dict[str, dict[str, Any]]:
    out = {}
    for extra, modules in EXTRAS.items():
        missing = [m for m in modules if not _importable(m)]
        out[extra] = {"installed": not missing, "missing": missing, "install": install_hint(extra)}
    return out


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _carina_version() -> str:
    try:
        return importlib.metadata.version("carina")
    except importlib.metadata.PackageNotFoundError:
        from carina import __version__

        return __version__


def _missing(report: Report) -> list[Missing]:
    out: list[Missing] = []
    if not report.torch["installed"]:
        out.append(Missing("torch", "pip install torch==2.13.0  (CPU) or a CUDA build from pytorch.org"))
    elif not report.torch["cuda_available"]:
        out.append(Missing("CUDA GPU", "none visible: GPU paths run on the CPU (device='cpu')"))
    if not report.io_uring["available"]:
        out.append(
            Missing(
                "io_uring",
                "carina.io falls back to its thread-pool backend; allow io_uring (sysctl kernel.io_uring_disabled=0)",
            )
        )
    out.extend(Missing(f"tool {t.name}", t.install) for t in report.tools if t.path is None)
    out.extend(
        Missing(f"extra [{name}] ({', '.join(e['missing'])})", e["install"])
        for name, e in report.extras.items()
        if not e["installed"]
    )
    out.extend(
        Missing(f"O_DIRECT on {p.path}", f"use a local ext4/xfs path ({p.o_direct_reason})")
        for p in report.paths
        if not p.o_direct
    )
    return out


def collect(paths: Iterable[str | Path] = (".",), *, tools: bool = True) -> Report:
    """Probe this machine.

    Args:
        paths: Storage paths to check (filesystem, free space, O_DIRECT).
        tools: Also look for system tools (skip for a faster, lighter report).

    Returns:
        The report, with :attr:`Report.missing` listing every fix.
    """
    torch_info = _torch()
    ok, why = probe_io_uring()
    report = Report(
        carina=_carina_version(),
        python=_python(),
        system=_system(),
        torch=torch_info,
        pinned_memory=_pinned(torch_info),
        io_uring={"available": ok, "reason": why},
        paths=[probe_path(Path(p)) for p in paths],
        tools=[probe_tool(t) for t in SYSTEM_TOOLS] if tools else [],
        extras=_extras(),
        flags={n: {"value": f.get(), "source": f.source(), "doc": f.doc} for n, f in flags.all_flags().items()},
    )
    report.missing = _missing(report)
    return report
