"""A campaign's configuration and results, shared by the reference loop and the batched engine.

:mod:`~carina.security.faults.campaign` (the plain loop and :func:`run_sweep`) and
:mod:`~carina.security.faults.engine` (the batched engine) both import these, so neither
module imports the other in a circle.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from carina.core.config import Config, require
from carina.security.faults.inject import Window
from carina.security.faults.metrics import iou, summarize
from carina.security.faults.skynet import Numeric

if TYPE_CHECKING:
    import torch

__all__ = ["Dtype", "Point", "SweepConfig", "SweepResult", "score_point"]


class Dtype(enum.Enum):
    """Tensor dtype of the emulation (float64 is exact for the fixed-point sums)."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"


@dataclass(kw_only=True)
class SweepConfig(Config):
    """What a campaign covers.

    Attributes:
        voltages: Core voltages (V).
        freqs_mhz: Accelerator clocks (MHz).
        windows: ``global`` and/or ``local:<ms>@<start_ms>``.
        intensities: Exposure multipliers (1 = nominal, 2 = double intensity).
        seeds: Fault seeds per point (0..seeds-1).
        numeric: ``fixed`` (accelerator types) or ``float``.
        dtype: Emulation dtype.
        vulnerable_loss: A pair is vulnerable when its loss reaches this.
        detectors: Run the range/ABFT/temporal detectors.
        shared_draws: One draw per output for all its bits (correlated carry-chain
            failures) rather than one per bit; the per-bit rates are the same.
        device: Torch device of the batched engine (``cpu``, ``cuda``, ``cuda:1``).
        batch: Rows (point x seed x image) per forward of the batched engine.
    """

    voltages: list[float]
    freqs_mhz: list[float]
    windows: list[str] = field(default_factory=lambda: ["global"])
    intensities: list[float] = field(default_factory=lambda: [1.0])
    seeds: int = 2
    numeric: Numeric = Numeric.FIXED
    dtype: Dtype = Dtype.FLOAT32
    vulnerable_loss: float = 0.5
    detectors: bool = True
    shared_draws: bool = True
    device: str = "cpu"
    batch: int = 24

    def validate(self) -> None:
        """Non-empty grids, positive counts, parsable windows."""
        require(bool(self.voltages) and bool(self.freqs_mhz), "empty V or f grid", key="voltages")
        require(all(v > 0 for v in self.voltages), "voltages must be positive", key="voltages")
        require(all(f > 0 for f in self.freqs_mhz), "frequencies must be positive", key="freqs_mhz")
        require(self.seeds >= 1, "seeds must be >= 1", key="seeds")
        require(all(k >= 0 for k in self.intensities), "intensities must be >= 0", key="intensities")
        require(0 < self.vulnerable_loss <= 1, "vulnerable_loss in (0, 1]", key="vulnerable_loss")
        require(self.batch >= 1, "batch must be >= 1", key="batch")
        require(self.device.split(":")[0] in ("cpu", "cuda"), "device must be cpu or cuda[:N]", key="device")
        for w in self.windows:
            Window.parse(w)


@dataclass
class Point:
    """Results at one (V, f, window, intensity)."""

    voltage: float
    freq_mhz: float
    window: str
    intensity: float
    ious: list[float]
    skipped: bool
    detected: dict[str, float] = field(default_factory=dict)
    flagged_ok: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Summary for JSON."""
        s = summarize(self.ious)
        return {
            "voltage": self.voltage, "freq_mhz": self.freq_mhz, "window": self.window,
            "intensity": self.intensity, "skipped": self.skipped, **asdict(s),
            "detected": self.detected, "flagged_ok": self.flagged_ok,
        }  # fmt: skip


@dataclass
class SweepResult:
    """All points plus run metadata; label: simulated."""

    points: list[Point]
    seconds: float
    forwards: int
    overheads: dict[str, float]
    passes: int = 0
    device: str = "cpu"
    basis: str = "simulated"

    def vulnerable(self, threshold: float) -> list[Point]:
        """Points whose loss reaches ``threshold``."""
        return [p for p in self.points if summarize(p.ious).loss >= threshold]


def score_point(
    pt: Point, boxes: list[torch.Tensor], hits: list[dict[str, list[bool]]] | None, golden: torch.Tensor
) -> None:
    """Fill ``pt`` from per-seed boxes (n, 5) and per-seed detector flags (seed-major order).

    The temporal check compares each seed's box with the previous seed's (the fault-free
    box before seed 0), as consecutive frames of a static scene.
    """
    prev = golden
    flagged: dict[str, list[bool]] = {}
    for s, b in enumerate(boxes):
        pt.ious += iou(b, golden).tolist()
        if hits is not None:
            for name, fl in hits[s].items():
                flagged.setdefault(name, []).extend(fl)
            flagged.setdefault("temporal", []).extend(x < 0.5 for x in iou(b, prev).tolist())
        prev = b
    bad = [x < 0.5 for x in pt.ious]
    for name, flags in flagged.items():
        caught = [f for f, b in zip(flags, bad, strict=True) if b]
        clean = [f for f, b in zip(flags, bad, strict=True) if not b]
        pt.detected[name] = sum(caught) / len(caught) if caught else float("nan")
        pt.flagged_ok[name] = sum(clean) / len(clean) if clean else float("nan")
