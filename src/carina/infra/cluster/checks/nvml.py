"""NVML health checks: presence and memory, ECC, retired/remapped memory, XID errors, clocks.

They read NVML through a small adapter (:class:`NvmlReader`) so tests can hand in
:class:`carina.testing.nvml.FakeNvml`, which models each error state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from carina.infra.cluster.checks.base import Check, CheckContext, CheckResult, Status

__all__ = ["ClocksThrottle", "EccErrors", "GpuPresence", "NvmlReader", "RemappedRows", "XidErrors"]

# Throttle reasons that mean hardware trouble (nvmlClocksThrottleReason* bits).
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
_BAD_THROTTLE = {HW_SLOWDOWN: "hw_slowdown", HW_THERMAL: "hw_thermal", HW_POWER_BRAKE: "hw_power_brake"}


class NvmlReader:
    """The NVML calls the checks make, on top of pynvml (nvidia-ml-py)."""

    def __init__(self) -> None:
        import pynvml

        self._n = pynvml
        pynvml.nvmlInit()

    def _h(self, i: int) -> Any:
        return self._n.nvmlDeviceGetHandleByIndex(i)

    def device_count(self) -> int:
        """Number of GPUs NVML sees."""
        return int(self._n.nvmlDeviceGetCount())

    def name(self, i: int) -> str:
        """Product name of GPU ``i``."""
        name = self._n.nvmlDeviceGetName(self._h(i))
        return name.decode() if isinstance(name, bytes) else str(name)

    def memory_total(self, i: int) -> int:
        """Total memory of GPU ``i`` in bytes."""
        return int(self._n.nvmlDeviceGetMemoryInfo(self._h(i)).total)

    def ecc_errors(self, i: int) -> tuple[int, int]:
        """``(corrected, uncorrected)`` volatile ECC error counts (0, 0 when ECC is off)."""
        n = self._n
        try:
            corr = n.nvmlDeviceGetTotalEccErrors(self._h(i), n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
            unc = n.nvmlDeviceGetTotalEccErrors(self._h(i), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        except n.NVMLError_NotSupported:
            return 0, 0
        return int(corr), int(unc)

    def remapped_rows(self, i: int) -> tuple[int, int, bool, bool]:
        """``(corrected, uncorrected, pending, failure)`` row remapping state (A100 and later)."""
        try:
            corr, unc, pending, failure = self._n.nvmlDeviceGetRemappedRows(self._h(i))
        except self._n.NVMLError_NotSupported:
            return 0, 0, False, False
        return int(corr), int(unc), bool(pending), bool(failure)

    def xid_events(self, i: int, timeout_ms: int) -> list[int]:
        """XID error codes NVML reports for GPU ``i`` within ``timeout_ms``."""
        n = self._n
        events = n.nvmlEventSetCreate()
        try:
            n.nvmlDeviceRegisterEvents(self._h(i), n.nvmlEventTypeXidCriticalError, events)
        except n.NVMLError_NotSupported:
            n.nvmlEventSetFree(events)
            return []
        codes = []
        try:
            while True:
                data = n.nvmlEventSetWait(events, timeout_ms)
                codes.append(int(data.eventData))
                timeout_ms = 0
        except n.NVMLError_Timeout:
            pass
        finally:
            n.nvmlEventSetFree(events)
        return codes

    def clocks(self, i: int) -> tuple[int, int, int]:
        """``(sm_mhz, max_sm_mhz, throttle_reason_bits)``."""
        n, h = self._n, self._h(i)
        sm = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        max_sm = n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)
        reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return int(sm), int(max_sm), int(reasons)


def _reader(ctx: CheckContext) -> Any:
    return ctx.nvml if ctx.nvml is not None else NvmlReader()


class GpuPresence(Check):
    """Every GPU is visible and has the memory its model should have."""

    name = "gpu_presence"
    needs = ("nvml",)
    rationale = "a GPU missing or with less memory than its model means a failed device or a bad passthrough"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        from carina.infra.cluster.checks.specs import spec_for

        nvml = _reader(ctx)
        count = nvml.device_count()
        expected = int(ctx.specs.get("gpu_count", count))
        metrics: dict[str, float] = {"gpu_count": count}
        problems = [] if count == expected else [f"{count} GPUs visible, {expected} expected"]
        for i in range(count):
            gib = nvml.memory_total(i) / 2**30
            metrics[f"gpu{i}_memory_gib"] = round(gib, 2)
            spec = spec_for(nvml.name(i))
            if spec and gib < 0.9 * spec.memory_gib:
                problems.append(f"GPU {i} has {gib:.1f} GiB, {spec.model} should have {spec.memory_gib}")
        status = Status.FAIL if problems else Status.PASS
        return CheckResult(
            self.name, status, "; ".join(problems) or f"{count} GPUs present", metrics, {"gpu_count": expected}
        )


#: A per-GPU verdict: status, a note (empty when fine) and the figures read.
Verdict = tuple[Status, str, dict[str, float]]


def _per_gpu(name: str, ctx: CheckContext, judge: Callable[[Any, int], Verdict], fine: str) -> CheckResult:
    """Judge every GPU; the worst status wins, each GPU's note and figures are kept (``gpu<i>_<figure>``)."""
    nvml = _reader(ctx)
    worst, notes, metrics = Status.PASS, [], {}
    for i in range(nvml.device_count()):
        status, note, figures = judge(nvml, i)
        metrics.update({f"gpu{i}_{k}": float(v) for k, v in figures.items()})
        worst = status if status.rank > worst.rank else worst
        if note:
            notes.append(f"GPU {i}: {note}")
    return CheckResult(name, worst, "; ".join(notes) or fine, metrics)


def _ecc(nvml: Any, i: int) -> Verdict:
    corr, unc = nvml.ecc_errors(i)
    figures = {"ecc_corrected": corr, "ecc_uncorrected": unc}
    if unc:
        return Status.FAIL, f"{unc} uncorrected", figures
    return (Status.WARN, f"{corr} corrected", figures) if corr else (Status.PASS, "", figures)


def _remaps(nvml: Any, i: int) -> Verdict:
    corr, unc, pending, failure = nvml.remapped_rows(i)
    figures = {
        "remapped_correctable": corr,
        "remapped_uncorrectable": unc,
        "remap_pending": int(pending),
        "remap_failure": int(failure),
    }
    if failure:
        return Status.FAIL, "remap failure", figures
    return (Status.FAIL, "remap pending (reset needed)", figures) if pending else (Status.PASS, "", figures)


def _xids(timeout_ms: int) -> Callable[[Any, int], Verdict]:
    def judge(nvml: Any, i: int) -> Verdict:
        codes = nvml.xid_events(i, timeout_ms)
        note = f"XID {', '.join(map(str, sorted(set(codes))))}" if codes else ""
        return (Status.FAIL if codes else Status.PASS), note, {"xid_count": len(codes)}

    return judge


def _clocks(nvml: Any, i: int) -> Verdict:
    sm, max_sm, reasons = nvml.clocks(i)
    figures = {"sm_mhz": sm, "max_sm_mhz": max_sm, "throttle_bits": reasons}
    bad = [label for bit, label in _BAD_THROTTLE.items() if reasons & bit]
    if bad:
        return Status.FAIL, ", ".join(bad), figures
    return (Status.WARN, "sw_thermal", figures) if reasons & SW_THERMAL else (Status.PASS, "", figures)


class EccErrors(Check):
    """No uncorrected ECC errors since the driver loaded; corrected ones only warn."""

    name = "ecc"
    needs = ("nvml",)
    rationale = "an uncorrectable ECC error corrupts data; a GPU that had one must be drained"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        return _per_gpu(self.name, ctx, _ecc, "no ECC errors")


class RemappedRows(Check):
    """No pending or failed row remapping (autopilot's ``remapped``)."""

    name = "remapped_rows"
    needs = ("nvml",)
    rationale = "a pending remap needs a GPU reset; a remap failure means the GPU must be replaced"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        return _per_gpu(self.name, ctx, _remaps, "no pending remaps")


class XidErrors(Check):
    """No critical XID events while the check listens."""

    name = "xid"
    needs = ("nvml",)
    rationale = "XIDs 48/63/64/74/79/94/95 mean memory, NVLink or bus failures; any critical XID drains the node"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        return _per_gpu(self.name, ctx, _xids(100 if ctx.quick else 1000), "no XID events")


class ClocksThrottle(Check):
    """No hardware slowdown, hardware thermal or power-brake throttling (autopilot's ``gpupower``)."""

    name = "clocks"
    needs = ("nvml",)
    rationale = "hardware slowdown halves a GPU's speed and stalls every rank that waits for it"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        return _per_gpu(self.name, ctx, _clocks, "clocks unthrottled")
