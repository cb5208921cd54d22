"""NVML health checks: presence and memory, ECC, retired/remapped memory, XID errors, clocks.

They read NVML through a small adapter (:class:`NvmlReader`) so tests can hand in
:class:`carina.testing.nvml.FakeNvml`, which models each error state.
"""

from __future__ import annotations

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


class EccErrors(Check):
    """No uncorrected ECC errors since the driver loaded; corrected ones only warn."""

    name = "ecc"
    needs = ("nvml",)
    rationale = "an uncorrectable ECC error corrupts data; a GPU that had one must be drained"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        nvml = _reader(ctx)
        metrics: dict[str, float] = {}
        status, notes = Status.PASS, []
        for i in range(nvml.device_count()):
            corr, unc = nvml.ecc_errors(i)
            metrics[f"gpu{i}_ecc_corrected"], metrics[f"gpu{i}_ecc_uncorrected"] = corr, unc
            if unc:
                status = Status.FAIL
                notes.append(f"GPU {i}: {unc} uncorrected")
            elif corr and status is Status.PASS:
                status = Status.WARN
                notes.append(f"GPU {i}: {corr} corrected")
        return CheckResult(self.name, status, "; ".join(notes) or "no ECC errors", metrics)


class RemappedRows(Check):
    """No pending or failed row remapping (autopilot's ``remapped``)."""

    name = "remapped_rows"
    needs = ("nvml",)
    rationale = "a pending remap needs a GPU reset; a remap failure means the GPU must be replaced"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        nvml = _reader(ctx)
        metrics: dict[str, float] = {}
        status, notes = Status.PASS, []
        for i in range(nvml.device_count()):
            corr, unc, pending, failure = nvml.remapped_rows(i)
            metrics.update(
                {
                    f"gpu{i}_remapped_uncorrectable": unc,
                    f"gpu{i}_remap_pending": int(pending),
                    f"gpu{i}_remapped_correctable": corr,
                    f"gpu{i}_remap_failure": int(failure),
                }
            )
            if pending or failure:
                status = Status.FAIL
                notes.append(f"GPU {i}: {'remap failure' if failure else 'remap pending (reset needed)'}")
        return CheckResult(self.name, status, "; ".join(notes) or "no pending remaps", metrics)


class XidErrors(Check):
    """No critical XID events while the check listens."""

    name = "xid"
    needs = ("nvml",)
    rationale = "XIDs 48/63/64/74/79/94/95 mean memory, NVLink or bus failures; any critical XID drains the node"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        nvml = _reader(ctx)
        metrics: dict[str, float] = {}
        notes = []
        for i in range(nvml.device_count()):
            codes = nvml.xid_events(i, 100 if ctx.quick else 1000)
            metrics[f"gpu{i}_xid_count"] = len(codes)
            if codes:
                notes.append(f"GPU {i}: XID {', '.join(map(str, sorted(set(codes))))}")
        return CheckResult(
            self.name, Status.FAIL if notes else Status.PASS, "; ".join(notes) or "no XID events", metrics
        )


class ClocksThrottle(Check):
    """No hardware slowdown, hardware thermal or power-brake throttling (autopilot's ``gpupower``)."""

    name = "clocks"
    needs = ("nvml",)
    rationale = "hardware slowdown halves a GPU's speed and stalls every rank that waits for it"
    exclusive = False

    def _run(self, ctx: CheckContext) -> CheckResult:
        nvml = _reader(ctx)
        metrics: dict[str, float] = {}
        status, notes = Status.PASS, []
        for i in range(nvml.device_count()):
            sm, max_sm, reasons = nvml.clocks(i)
            metrics.update({f"gpu{i}_sm_mhz": sm, f"gpu{i}_max_sm_mhz": max_sm, f"gpu{i}_throttle_bits": reasons})
            bad = [label for bit, label in _BAD_THROTTLE.items() if reasons & bit]
            if bad:
                status = Status.FAIL
                notes.append(f"GPU {i}: {', '.join(bad)}")
            elif reasons & SW_THERMAL and status is Status.PASS:
                status = Status.WARN
                notes.append(f"GPU {i}: sw_thermal")
        return CheckResult(self.name, status, "; ".join(notes) or "clocks unthrottled", metrics)
