"""A fake NVML for testing carina.infra.cluster's health checks without GPUs.

Each :class:`FakeGpu` holds one state NVML can report (ECC counts, remapped
rows, XIDs, throttle bits). Results obtained through it are emulated, not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FakeGpu", "FakeNvml"]


@dataclass
class FakeGpu:
    """The NVML-visible state of one emulated GPU."""

    name: str = "NVIDIA H100 80GB HBM3 (fake)"
    memory_bytes: int = 80 * 2**30
    ecc: tuple[int, int] = (0, 0)
    remapped: tuple[int, int, bool, bool] = (0, 0, False, False)
    xids: list[int] = field(default_factory=list)
    clocks: tuple[int, int, int] = (1980, 1980, 0)


class FakeNvml:
    """Answers the calls of :class:`carina.infra.cluster.checks.nvml.NvmlReader` from :class:`FakeGpu` s."""

    emulated = True

    def __init__(self, gpus: list[FakeGpu] | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu() for _ in range(8)]

    def device_count(self) -> int:
        return len(self.gpus)

    def name(self, i: int) -> str:
        return self.gpus[i].name

    def memory_total(self, i: int) -> int:
        return self.gpus[i].memory_bytes

    def ecc_errors(self, i: int) -> tuple[int, int]:
        return self.gpus[i].ecc

    def remapped_rows(self, i: int) -> tuple[int, int, bool, bool]:
        return self.gpus[i].remapped

    def xid_events(self, i: int, timeout_ms: int) -> list[int]:
        return list(self.gpus[i].xids)

    def clocks(self, i: int) -> tuple[int, int, int]:
        return self.gpus[i].clocks
