"""Run node checks with timeouts and safe parallelism; label the node PASS / WARN / EVICT.

Checks marked ``exclusive`` saturate a device (PCIe, HBM, matmul, collectives) and run
one after another; the others (NVML reads, topology) run side by side. A check that
outlives its timeout is reported as FAIL and the run goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from carina.core.config import Config, require
from carina.core.errors import ConfigError
from carina.infra.cluster.checks.base import CHECKS, Check, CheckContext, CheckResult, Status

__all__ = ["NodeLabel", "NodeReport", "RunConfig", "run_checks"]


class NodeLabel(enum.Enum):
    """What the scheduler should do with the node (autopilot's gpuhealth label)."""

    PASS = "PASS"
    WARN = "WARN"
    EVICT = "EVICT"


@dataclass(kw_only=True)
class RunConfig(Config):
    """Which checks to run and how.

    Attributes:
        checks: Registry names; empty means all.
        timeout_s: Per-check limit.
        parallel: Run non-exclusive checks side by side.
        quick: Smaller problem sizes (CI, smoke runs).
        device: ``auto``, ``cuda`` or ``cpu``.
        paths: Storage paths for the disk check.
    """

    checks: list[str] = field(default_factory=list)
    timeout_s: float = 120.0
    parallel: bool = True
    quick: bool = False
    device: str = "auto"
    paths: list[str] = field(default_factory=lambda: ["."])

    def validate(self) -> None:
        """Positive timeout, a known device, known checks."""
        require(self.timeout_s > 0, "timeout_s must be positive", key="timeout_s")
        require(self.device in ("auto", "cuda", "cpu"), "device is auto, cuda or cpu", key="device")
        unknown = [c for c in self.checks if c not in CHECKS.names()]
        require(
            not unknown,
            f"unknown check {unknown[0] if unknown else ''!r} (known: {', '.join(CHECKS.names())})",
            key="checks",
        )


@dataclass
class NodeReport:
    """Results of one node's checks and the label they earn."""

    node: str
    label: NodeLabel
    results: list[CheckResult]
    seconds: float


def label_for(results: Sequence[CheckResult]) -> NodeLabel:
    """EVICT on any FAIL, WARN on any WARN, else PASS."""
    worst = max((r.status.rank for r in results), default=0)
    return {0: NodeLabel.PASS, 1: NodeLabel.WARN, 2: NodeLabel.EVICT}[worst]


def _timed(check: Check, ctx: CheckContext) -> CheckResult:
    start = time.perf_counter()
    try:
        result = check.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a crashing check is a failed check, reported, never raised
        result = CheckResult(check.name, Status.FAIL, f"check crashed: {type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - start
    return result


def run_checks(
    config: RunConfig,
    *,
    context: CheckContext | None = None,
    checks: Sequence[Check] | None = None,
    on_result: Callable[[CheckResult], Any] | None = None,
) -> NodeReport:
    """Run the configured checks on this node.

    Args:
        config: Which checks and how.
        context: Injected probes (a fake NVML, a process group, spec overrides).
        checks: Check instances to run instead of the registry's (tests).
        on_result: Called with each result as it arrives (progress bars).
    """
    ctx = context or CheckContext()
    ctx.device, ctx.quick, ctx.paths = config.device, config.quick, tuple(config.paths)
    if checks is None:
        names = config.checks or CHECKS.names()
        checks = [CHECKS.load(n)() for n in names]
    if not checks:
        raise ConfigError("no checks to run", key="checks")
    start = time.perf_counter()
    results: dict[str, CheckResult] = {}
    shared = [c for c in checks if not c.exclusive]
    # Not a `with` block: leaving it would wait for a check that hung past its timeout.
    pool = cf.ThreadPoolExecutor(max_workers=max(1, len(shared)) if config.parallel else 1)
    try:
        futures = {pool.submit(_timed, c, ctx): c for c in shared}
        for check in (c for c in checks if c.exclusive):
            results[check.name] = _with_timeout(pool_single(check, ctx), check, config.timeout_s, on_result)
        for fut, check in futures.items():
            results[check.name] = _with_timeout(fut, check, config.timeout_s, on_result)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    ordered = [results[c.name] for c in checks]
    return NodeReport(platform.node(), label_for(ordered), ordered, time.perf_counter() - start)


def pool_single(check: Check, ctx: CheckContext) -> cf.Future[CheckResult]:
    """Run one exclusive check on its own thread, so its timeout can be enforced."""
    pool = cf.ThreadPoolExecutor(max_workers=1)
    fut = pool.submit(_timed, check, ctx)
    pool.shutdown(wait=False)
    return fut


def _with_timeout(
    fut: cf.Future[CheckResult], check: Check, timeout: float, on_result: Callable[[CheckResult], Any] | None
) -> CheckResult:
    try:
        result = fut.result(timeout=timeout)
    except cf.TimeoutError:
        result = CheckResult(check.name, Status.FAIL, f"timed out after {timeout:g} s", seconds=timeout)
    if on_result is not None:
        on_result(result)
    return result
