"""Campaigns: sweep operating points x windows x intensities x seeds over a set of images.

Work is saved three ways, none of which changes a result: fault-free activations
are cached up to the first layer a window touches (the run starts there); an
operating point whose every bit probability is zero (after ``negligible``) is
not run (a zero-probability model leaves outputs bit-identical, a tested
property); and all images of a point run as one batch.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from carina.core.config import Config, require
from carina.security.faults.defenses import Detectors, overheads
from carina.security.faults.inject import LayerFault, Window, plan_window, skynet_hooks
from carina.security.faults.metrics import iou, summarize
from carina.security.faults.skynet import Numeric, SkyNet, Stage, decode_boxes
from carina.security.faults.timing import OperatingPoint, TimingConfig, bit_error_probabilities

if TYPE_CHECKING:
    import torch

__all__ = ["Point", "SweepConfig", "SweepResult", "run_sweep"]


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

    def validate(self) -> None:
        """Non-empty grids, positive counts, parsable windows."""
        require(bool(self.voltages) and bool(self.freqs_mhz), "empty V or f grid", key="voltages")
        require(all(v > 0 for v in self.voltages), "voltages must be positive", key="voltages")
        require(all(f > 0 for f in self.freqs_mhz), "frequencies must be positive", key="freqs_mhz")
        require(self.seeds >= 1, "seeds must be >= 1", key="seeds")
        require(all(k >= 0 for k in self.intensities), "intensities must be >= 0", key="intensities")
        require(0 < self.vulnerable_loss <= 1, "vulnerable_loss in (0, 1]", key="vulnerable_loss")
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
    basis: str = "simulated"

    def vulnerable(self, threshold: float) -> list[Point]:
        """Points whose loss reaches ``threshold``."""
        return [p for p in self.points if summarize(p.ious).loss >= threshold]


def _faults(plan: list[tuple[int, float]], probs: list[float]) -> list[LayerFault]:
    return [LayerFault(layer, frac, tuple(probs)) for layer, frac in plan]


def _detect(flags: dict[str, Any], ious: list[float], prev: list[float]) -> dict[str, list[bool]]:
    out = {name: [bool(v) for v in t] for name, t in flags.items()}
    out["temporal"] = [p < 0.5 for p in prev]
    return out


def run_sweep(
    stages: list[Stage],
    images: torch.Tensor,
    cfg: SweepConfig,
    timing: TimingConfig | None = None,
    *,
    on_point: Callable[[Point], None] | None = None,
) -> SweepResult:
    """Run the campaign described by ``cfg`` on ``images`` (B, 3, 160, 320)."""
    import torch

    timing = timing or TimingConfig()
    t0 = time.perf_counter()
    model = SkyNet(stages, numeric=cfg.numeric, dtype=getattr(torch, cfg.dtype.value))
    n = images.shape[0]
    plans = {w: plan_window(Window.parse(w), model.macs, timing.frame_ms) for w in cfg.windows}
    cache: dict[str, Any] = {}

    def reference() -> tuple[Any, dict[int, Any]]:
        # Fault-free boxes and cached activations, computed only when a point needs them.
        if not cache:
            out, states = model.run(images, keep=tuple({p[0][0] for p in plans.values() if p}))
            cache.update(golden=decode_boxes(out), states=states)
            if cfg.detectors:
                det.profile(images)
        return cache["golden"], cache["states"]

    det = Detectors(model)
    points, forwards = [], 0
    for wtext, plan in plans.items():
        if not plan:
            continue
        for v in cfg.voltages:
            for f in cfg.freqs_mhz:
                for k in cfg.intensities:
                    probs = bit_error_probabilities(timing, OperatingPoint(v, f), intensity=k)
                    pt = Point(v, f, wtext, k, [], skipped=not any(probs))
                    if pt.skipped:
                        pt.ious = [1.0] * (n * cfg.seeds)
                    else:
                        golden, states = reference()
                        start = plan[0][0]
                        _run_point(model, det, cfg, pt, _faults(plan, probs), start, states[start], golden)
                        forwards += cfg.seeds
                    points.append(pt)
                    if on_point:
                        on_point(pt)
    forwards += 1 if cache else 0
    return SweepResult(points, time.perf_counter() - t0, forwards, overheads(model))


def _run_point(
    model: SkyNet, det: Detectors, cfg: SweepConfig, pt: Point, faults: list[LayerFault],
    start: int, state: Any, golden: torch.Tensor,
) -> None:  # fmt: skip
    n = golden.shape[0]
    prev = golden
    hits: dict[str, list[bool]] = {}
    for seed in range(cfg.seeds):
        hooks = skynet_hooks(faults, seed=seed, image_ids=range(n))
        model.hooks = det.wrap(hooks, n) if cfg.detectors else hooks
        try:
            out, _ = model.run(None, start=start, state=state)
        finally:
            model.hooks = {}
        boxes = decode_boxes(out)
        ious = iou(boxes, golden).tolist()
        pt.ious += ious
        if cfg.detectors:
            for name, flags in _detect(det.flags, ious, iou(boxes, prev).tolist()).items():
                hits.setdefault(name, []).extend(flags)
        prev = boxes
    bad = [x < 0.5 for x in pt.ious]
    for name, flags in hits.items():
        caught = [f for f, b in zip(flags, bad, strict=True) if b]
        clean = [f for f, b in zip(flags, bad, strict=True) if not b]
        pt.detected[name] = sum(caught) / len(caught) if caught else float("nan")
        pt.flagged_ok[name] = sum(clean) / len(clean) if clean else float("nan")
