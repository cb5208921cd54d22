"""What a node check is, how it is graded, and the registry that names them all.

A check measures one thing on a node and grades it. Thresholds are relative to
the device's specification (``FAIL`` below 25% of peak, ``WARN`` below 80%, as
IBM's autopilot does for PCIe) and, across a fleet, to the fleet median
(a robust z-score finds nodes that are slow without being broken)::

    grade = Threshold(warn=0.8, fail=0.25).grade(value=40.1, spec=54.0)   # Status.WARN
"""

from __future__ import annotations

import abc
import enum
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from carina.core.config import Config, require
from carina.core.registry import Registry

__all__ = ["CHECKS", "Check", "CheckContext", "CheckResult", "Status", "Threshold", "fleet_outliers"]


class Status(enum.Enum):
    """Outcome of a check, ordered from best to worst."""

    PASS = "PASS"
    SKIP = "SKIP"  # what the check needs is not on this node
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def rank(self) -> int:
        """Severity: PASS/SKIP 0, WARN 1, FAIL 2."""
        return {"PASS": 0, "SKIP": 0, "WARN": 1, "FAIL": 2}[self.value]


@dataclass(kw_only=True)
class Threshold(Config):
    """Grades a figure against its spec value: below ``fail``·spec FAILs, below ``warn``·spec WARNs.

    For figures where lower is better (latency, error counts) set ``higher_is_better=False``:
    above spec/``fail`` FAILs, above spec/``warn`` WARNs.
    """

    warn: float = 0.8
    fail: float = 0.25
    higher_is_better: bool = True

    def validate(self) -> None:
        """Fractions must satisfy 0 < fail <= warn <= 1."""
        require(0 < self.fail <= self.warn <= 1, "need 0 < fail <= warn <= 1", key="fail")

    def grade(self, value: float, spec: float) -> Status:
        """PASS, WARN or FAIL of ``value`` against ``spec``."""
        if spec <= 0:
            return Status.PASS
        ratio = value / spec if self.higher_is_better else (spec / value if value > 0 else float("inf"))
        if ratio < self.fail:
            return Status.FAIL
        if ratio < self.warn:
            return Status.WARN
        return Status.PASS


@dataclass
class CheckResult:
    """What one check found on one node.

    Attributes:
        name: The check's registry name.
        status: PASS, WARN, FAIL or SKIP.
        message: One line for a person.
        metrics: Figures measured (name -> value), units in the names (``h2d_gbps``).
        spec: The spec value each graded figure was compared with.
        seconds: How long the check ran.
    """

    name: str
    status: Status
    message: str
    metrics: dict[str, float] = field(default_factory=dict)
    spec: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class CheckContext:
    """What a check may use: the device, options, and injectable probes (for tests)."""

    device: str = "auto"  # "auto" picks cuda when present, else cpu
    quick: bool = False  # smaller sizes, for CI and smoke runs
    paths: Sequence[str] = (".",)
    nvml: Any = None  # an NVML-like object; None means the real pynvml
    world: Any = None  # a torch.distributed process group, for collectives
    specs: Mapping[str, float] = field(default_factory=dict)  # overrides of spec values

    def resolve_device(self) -> str:
        """``cuda`` when asked for or auto with a GPU; else ``cpu``."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


class Check(abc.ABC):
    """A node check. Subclasses set the class attributes and implement :meth:`_run`.

    Attributes:
        name: Registry name (``pcie_bw``).
        needs: What must be on the node (``cuda``, ``nvml``, ``torch``, ``multi_gpu``).
        rationale: One line on why the threshold is what it is.
        exclusive: Must not run beside other exclusive checks (it saturates a device).
    """

    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()
    rationale: ClassVar[str] = ""
    exclusive: ClassVar[bool] = True

    def run(self, ctx: CheckContext) -> CheckResult:
        """Run the check, turning a missing requirement into SKIP."""
        missing = self.missing(ctx)
        if missing:
            return CheckResult(self.name, Status.SKIP, f"needs {', '.join(missing)}")
        return self._run(ctx)

    def missing(self, ctx: CheckContext) -> list[str]:
        """Requirements in :attr:`needs` that this node lacks."""
        return [need for need in self.needs if not _HAVE[need](ctx)]

    @abc.abstractmethod
    def _run(self, ctx: CheckContext) -> CheckResult: ...


def _have_cuda(ctx: CheckContext) -> bool:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return ctx.resolve_device() == "cuda" and torch.cuda.is_available()


def _have_nvml(ctx: CheckContext) -> bool:
    if ctx.nvml is not None:
        return True
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:  # noqa: BLE001 - any NVML failure means "no NVML here"
        return False


def _have_multi_gpu(ctx: CheckContext) -> bool:
    if not _have_cuda(ctx):
        return False
    import torch

    return torch.cuda.device_count() > 1


_HAVE: dict[str, Callable[[CheckContext], bool]] = {
    "cuda": _have_cuda,
    "nvml": _have_nvml,
    "multi_gpu": _have_multi_gpu,
    "torch": lambda ctx: __import__("importlib").util.find_spec("torch") is not None,
    "world": lambda ctx: ctx.world is not None,
}

#: Every check, by name, lazily imported.
CHECKS = Registry("cluster.check")
for _name, _target in {
    "gpu_presence": "carina.infra.cluster.checks.nvml:GpuPresence",
    "ecc": "carina.infra.cluster.checks.nvml:EccErrors",
    "remapped_rows": "carina.infra.cluster.checks.nvml:RemappedRows",
    "xid": "carina.infra.cluster.checks.nvml:XidErrors",
    "clocks": "carina.infra.cluster.checks.nvml:ClocksThrottle",
    "pcie_bw": "carina.infra.cluster.checks.compute:PcieBandwidth",
    "hbm_bw": "carina.infra.cluster.checks.compute:HbmBandwidth",
    "matmul": "carina.infra.cluster.checks.compute:MatmulRate",
    "hpl": "carina.infra.cluster.checks.compute:HplSolve",
    "host_mem_bw": "carina.infra.cluster.checks.host:HostMemoryBandwidth",
    "disk_bw": "carina.infra.cluster.checks.host:DiskBandwidth",
    "collectives": "carina.infra.cluster.checks.collectives:Collectives",
    "vm_topology": "carina.infra.cluster.checks.topology:VmTopology",
}.items():
    CHECKS.register(_name, _target, extra="infra")


def fleet_outliers(values: Mapping[str, float], *, z: float = 3.5, higher_is_better: bool = True) -> list[str]:
    """Nodes whose figure is worse than the fleet median by more than ``z`` robust z-scores.

    Uses the median absolute deviation (scaled by 1.4826), floored at 1% of the median so a
    fleet of identical figures still flags a node that departs from them; with fewer than
    three nodes nobody is an outlier.
    """
    if len(values) < 3:
        return []
    median = statistics.median(values.values())
    mad = max(statistics.median(abs(v - median) for v in values.values()) * 1.4826, 0.01 * abs(median))
    if mad == 0:
        return []
    sign = -1.0 if higher_is_better else 1.0
    return sorted(n for n, v in values.items() if sign * (v - median) / mad > z)
