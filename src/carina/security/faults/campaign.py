"""Campaigns: sweep operating points x windows x intensities x seeds over a set of images.

:func:`run_sweep` runs the batched engine (:mod:`carina.security.faults.engine`) on
``cfg.device``; :func:`run_reference` is the plain loop (one point and one seed per
forward, all images of a point in one batch) that the engine must equal bit for bit.
Both cache fault-free activations up to the first layer a window touches and skip
points whose every bit threshold is zero (a zero-probability model leaves outputs
bit-identical, a tested property). The configuration and result types live in
:mod:`~carina.security.faults.sweep` (re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from carina.security.faults.defenses import Detectors, overheads
from carina.security.faults.engine import run_batched
from carina.security.faults.inject import LayerFault, Window, plan_window, skynet_hooks, thresholds
from carina.security.faults.skynet import SkyNet, Stage, decode_boxes
from carina.security.faults.sweep import Dtype, Point, SweepConfig, SweepResult, score_point
from carina.security.faults.timing import OperatingPoint, TimingConfig, bit_error_probabilities

if TYPE_CHECKING:
    import torch

__all__ = ["Dtype", "Point", "SweepConfig", "SweepResult", "run_reference", "run_sweep", "score_point"]


def _faults(plan: list[tuple[int, float]], probs: list[float]) -> list[LayerFault]:
    return [LayerFault(layer, frac, tuple(probs)) for layer, frac in plan]


#: Run the campaign described by ``cfg`` on ``images`` (B, 3, 160, 320), batched, on ``cfg.device``:
#: the batched engine is the campaign runner (``on_point(point)`` once all points are done, ``on_pass(done,
#: total)`` after each forward pass); :func:`run_reference` is the plain per-point loop it is checked against.
run_sweep = run_batched


def run_reference(
    stages: list[Stage],
    images: torch.Tensor,
    cfg: SweepConfig,
    timing: TimingConfig | None = None,
    *,
    on_point: Callable[[Point], None] | None = None,
) -> SweepResult:
    """The same campaign as a plain loop on the CPU: every point, every seed, one forward each."""
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
                    pt = Point(v, f, wtext, k, [], skipped=not any(thresholds(probs)))
                    if pt.skipped:
                        pt.ious = [1.0] * (n * cfg.seeds)
                    else:
                        golden, states = reference()
                        start = plan[0][0]
                        _run_point(model, det, cfg, pt, _faults(plan, probs), start, states[start], golden)
                        forwards += cfg.seeds * n
                    points.append(pt)
                    if on_point:
                        on_point(pt)
    forwards += n if cache else 0
    passes = forwards // n
    return SweepResult(points, time.perf_counter() - t0, forwards, overheads(model), passes=passes)


def _run_point(
    model: SkyNet, det: Detectors, cfg: SweepConfig, pt: Point, faults: list[LayerFault],
    start: int, state: Any, golden: torch.Tensor,
) -> None:  # fmt: skip
    n = golden.shape[0]
    boxes, hits = [], []
    for seed in range(cfg.seeds):
        hooks = skynet_hooks(faults, seed=seed, image_ids=range(n), shared=cfg.shared_draws)
        model.hooks = det.wrap(hooks, n) if cfg.detectors else hooks
        try:
            out, _ = model.run(None, start=start, state=state)
        finally:
            model.hooks = {}
        boxes.append(decode_boxes(out))
        hits.append({k: [bool(v) for v in t.tolist()] for k, t in det.flags.items()})
    score_point(pt, boxes, hits if cfg.detectors else None, golden)
