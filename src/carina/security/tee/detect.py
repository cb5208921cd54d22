"""Detect CPU TEEs and GPU confidential-computing mode; say whether attestation could run.

* CPU: a TDX guest exposes ``/dev/tdx_guest`` (older kernels ``/dev/tdx-guest``) and the
  ``tdx_guest`` CPU flag; an SEV-SNP guest exposes ``/dev/sev-guest``. CPU flags alone
  (``sev_snp``) also appear on hosts, so they count only with the ``hypervisor`` flag.
  ``/sys/kernel/config/tsm/report`` (configfs-tsm) means the kernel can produce quotes.
* GPU: NVML's ``nvmlSystemGetConfComputeState`` (environment, ccFeature, devToolsMode),
  ``...Capabilities`` (cpuCaps, gpusCaps) and ``...GpusReadyState`` through nvidia-ml-py;
  ``nvidia-smi conf-compute -f`` / ``-grs`` when NVML cannot answer.
* Attestation is reported as *possible* or *unavailable* with the reason; carina never
  runs or fakes it (even NVIDIA's local verifier needs RIM and OCSP services online).

Every probe takes its inputs (filesystem root, NVML module, command runner) as
arguments so tests can feed fake trees and a fake NVML (:mod:`carina.testing.tee`).
"""

from __future__ import annotations

import enum
import importlib.util
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CpuTee", "GpuCcMode", "TeeReport", "detect", "detect_cpu_tee", "detect_gpu_cc"]


class CpuTee(enum.Enum):
    """Which CPU TEE this machine runs inside, if any."""

    TDX = "tdx"
    SEV_SNP = "sev-snp"
    NONE = "none"


class GpuCcMode(enum.Enum):
    """The GPU confidential-computing mode."""

    ON = "on"
    DEVTOOLS = "devtools"  # CC on with debugging/profiling allowed: not for production data
    OFF = "off"  # CC-capable GPU, mode off
    UNSUPPORTED = "unsupported"  # GPU or driver without CC
    NO_GPU = "no-gpu"


@dataclass(kw_only=True)
class TeeReport:
    """What :func:`detect` found; ``emulated`` is True only for fakes."""

    cpu_tee: CpuTee
    cpu_evidence: list[str]
    gpu_cc: GpuCcMode
    gpu_source: str
    gpu_details: dict[str, Any] = field(default_factory=dict)
    attestation: dict[str, dict[str, str]] = field(default_factory=dict)
    emulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "cpu_tee": self.cpu_tee.value,
            "cpu_evidence": self.cpu_evidence,
            "gpu_cc": self.gpu_cc.value,
            "gpu_source": self.gpu_source,
            "gpu_details": self.gpu_details,
            "attestation": self.attestation,
            "emulated": self.emulated,
        }


def _cpu_flags(root: Path) -> set[str]:
    try:
        text = (root / "proc" / "cpuinfo").read_text()
    except OSError:
        return set()
    match = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(match.group(1).split()) if match else set()


def detect_cpu_tee(root: Path = Path("/")) -> tuple[CpuTee, list[str]]:
    """The CPU TEE (guest side) and the evidence that says so."""
    evidence = []
    for dev in ("tdx_guest", "tdx-guest"):
        if (root / "dev" / dev).exists():
            evidence.append(f"/dev/{dev}")
    flags = _cpu_flags(root)
    if "tdx_guest" in flags:
        evidence.append("cpu flag tdx_guest")
    if evidence:
        return CpuTee.TDX, evidence
    if (root / "dev" / "sev-guest").exists():
        evidence.append("/dev/sev-guest")
    if "sev_snp" in flags and "hypervisor" in flags:
        evidence.append("cpu flags sev_snp + hypervisor")
    if evidence:
        return CpuTee.SEV_SNP, evidence
    if "sev_snp" in flags:
        return CpuTee.NONE, ["cpu flag sev_snp without hypervisor: an SNP-capable host, not a guest"]
    return CpuTee.NONE, []


def detect_gpu_cc(
    nvml: Any = None, run: Callable[[list[str]], str] | None = None
) -> tuple[GpuCcMode, str, dict[str, Any]]:
    """GPU CC mode, where the answer came from (``nvml``, ``nvidia-smi``, ``none``), and raw fields."""
    mod = nvml if nvml is not None else _import_nvml()
    if mod is not None:
        answer = _from_nvml(mod)
        if answer is not None:
            return answer
    return _from_smi(run or _run_smi)


def _import_nvml() -> Any:
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    return pynvml


def _from_nvml(nvml: Any) -> tuple[GpuCcMode, str, dict[str, Any]] | None:
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver/library: let nvidia-smi try
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return GpuCcMode.NO_GPU, "nvml", {"devices": 0}
        try:
            caps = nvml.nvmlSystemGetConfComputeCapabilities()
            state = nvml.nvmlSystemGetConfComputeState()
        except nvml.NVMLError as exc:  # an old driver or a GPU without CC
            return GpuCcMode.UNSUPPORTED, "nvml", {"devices": count, "error": str(exc)}
        details: dict[str, Any] = {
            "devices": count,
            "environment": int(state.environment),
            "cc_feature": int(state.ccFeature),
            "devtools_mode": int(state.devToolsMode),
            "cpu_caps": int(caps.cpuCaps),
            "gpus_caps": int(caps.gpusCaps),
        }
        try:
            details["ready"] = int(nvml.nvmlSystemGetConfComputeGpusReadyState())
        except nvml.NVMLError as exc:
            details["ready_error"] = str(exc)
        return _mode(details), "nvml", details
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that may be half-initialised
            pass


def _mode(d: dict[str, Any]) -> GpuCcMode:
    if d["gpus_caps"] == 0:  # NVML_CC_SYSTEM_GPUS_CC_NOT_CAPABLE
        return GpuCcMode.UNSUPPORTED
    if d["cc_feature"] != 1:  # NVML_CC_SYSTEM_FEATURE_ENABLED
        return GpuCcMode.OFF
    return GpuCcMode.DEVTOOLS if d["devtools_mode"] == 1 else GpuCcMode.ON


def _run_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=False)
    return done.stdout + done.stderr


def _from_smi(run: Callable[[list[str]], str]) -> tuple[GpuCcMode, str, dict[str, Any]]:
    try:
        text = run(["conf-compute", "-f"])
    except (FileNotFoundError, subprocess.SubprocessError, OSError):
        return GpuCcMode.NO_GPU, "none", {}
    match = re.search(r"CC status:\s*(\w+)", text, re.I)
    if match is None:
        return GpuCcMode.UNSUPPORTED, "nvidia-smi", {"output": text.strip()[:200]}
    status = match.group(1).upper()
    details: dict[str, Any] = {"cc_status": status}
    try:
        ready = re.search(r"ready state:\s*(\S+)", run(["conf-compute", "-grs"]), re.I)
        if ready:
            details["ready"] = ready.group(1).lower()
    except (subprocess.SubprocessError, OSError):
        pass
    mode = {"ON": GpuCcMode.ON, "DEVTOOLS": GpuCcMode.DEVTOOLS, "OFF": GpuCcMode.OFF}.get(status, GpuCcMode.UNSUPPORTED)
    return mode, "nvidia-smi", details


def _attestation(cpu: CpuTee, gpu: GpuCcMode, root: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    if cpu is CpuTee.NONE:
        out["cpu"] = {"status": "unavailable", "reason": "not inside a TDX or SEV-SNP guest"}
    elif (root / "sys" / "kernel" / "config" / "tsm" / "report").exists():
        out["cpu"] = {"status": "possible", "reason": "configfs-tsm can produce a quote (not requested)"}
    else:
        out["cpu"] = {"status": "possible", "reason": f"{cpu.value} guest device present; no configfs-tsm"}
    if gpu is not GpuCcMode.ON:
        reason = (
            "devtools mode reports are not for production" if gpu is GpuCcMode.DEVTOOLS else f"GPU CC is {gpu.value}"
        )
        out["gpu"] = {"status": "unavailable", "reason": reason}
    elif importlib.util.find_spec("nv_attestation_sdk") is None:
        out["gpu"] = {"status": "unavailable", "reason": "nv-attestation-sdk not installed (separate venv)"}
    else:
        out["gpu"] = {
            "status": "possible",
            "reason": "nv-attestation-sdk present; needs NVIDIA RIM/OCSP services online",
        }
    return out


def detect(root: Path = Path("/"), nvml: Any = None, run: Callable[[list[str]], str] | None = None) -> TeeReport:
    """Everything this module can tell about the machine's TEEs."""
    cpu, evidence = detect_cpu_tee(root)
    gpu, source, details = detect_gpu_cc(nvml, run)
    return TeeReport(
        cpu_tee=cpu,
        cpu_evidence=evidence,
        gpu_cc=gpu,
        gpu_source=source,
        gpu_details=details,
        attestation=_attestation(cpu, gpu, root),
        emulated=bool(getattr(nvml, "EMULATED", False)),
    )
