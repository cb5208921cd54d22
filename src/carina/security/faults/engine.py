"""Batched campaign engine: a whole sweep as rows of a few large forwards, on CPU or CUDA.

Each row of a forward is one (operating point, seed, image); rows of different points
and seeds share a batch because flips are drawn per row from a counter-based hash
(:func:`~carina.security.faults.inject.apply_flip_rows`). Work saved, none of which
changes a result (``tests/security/faults/test_faults_engine.py`` checks the engine
bit-for-bit against :func:`~carina.security.faults.campaign.run_reference`, the plain
per-point loop):

* points whose bit thresholds are all zero are not run (zero faults are bit-identical);
* points with the same thresholds in the same window run once (a V x f grid has many);
* points whose every bit is certain (threshold 0 or 2**32) draw nothing, so one seed
  stands for all;
* fault-free activations are cached up to the window's first layer;
* rows are ordered heaviest faults first, so a pass's rows tend to be flagged together and
  the detectors skip the stages after every row is flagged (a flag is an OR over stages).

In fixed-point mode every sum is exact (see :func:`~carina.security.faults.skynet.conv`),
so a row's output is the same bits whatever the batch and device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carina.security.faults import kernels
from carina.security.faults.defenses import Detectors, overheads
from carina.security.faults.inject import ONE, Window, apply_flip_rows, plan_window, thresholds
from carina.security.faults.skynet import Numeric, SkyNet, Stage, decode_boxes
from carina.security.faults.sweep import Point, SweepConfig, SweepResult, score_point
from carina.security.faults.timing import OperatingPoint, TimingConfig, bit_error_probabilities

if TYPE_CHECKING:
    import torch

__all__ = ["count_rows", "run_batched"]


@dataclass(frozen=True)
class _Job:
    window: str
    thr: tuple[int, ...]
    seed: int


def _group(cfg: SweepConfig, timing: TimingConfig, plans: dict[str, Any]) -> tuple[list[Point], dict[Any, list[Point]]]:
    """All points, and the non-skipped ones grouped by (window, thresholds)."""
    points: list[Point] = []
    groups: dict[tuple[str, tuple[int, ...]], list[Point]] = {}
    for w, plan in plans.items():
        if not plan:
            continue
        for v in cfg.voltages:
            for f in cfg.freqs_mhz:
                for k in cfg.intensities:
                    thr = thresholds(bit_error_probabilities(timing, OperatingPoint(v, f), intensity=k))
                    pt = Point(v, f, w, k, [], skipped=not any(thr))
                    points.append(pt)
                    if not pt.skipped:
                        groups.setdefault((w, thr), []).append(pt)
    return points, groups


def _seeds(thr: Sequence[int], seeds: int) -> range:
    """Seeds that need a run: one when no bit is random."""
    return range(1) if all(t in (0, ONE) for t in thr) else range(seeds)


def count_rows(cfg: SweepConfig, macs: Sequence[int], images: int, timing: TimingConfig | None = None) -> int:
    """Rows (point x seed x image) :func:`run_batched` would run for ``cfg`` on ``images`` images, without running."""
    timing = timing or TimingConfig()
    plans = {w: plan_window(Window.parse(w), macs, timing.frame_ms) for w in cfg.windows}
    _, groups = _group(cfg, timing, plans)
    return sum(len(_seeds(thr, cfg.seeds)) for _, thr in groups) * images


def run_batched(
    stages: list[Stage],
    images: torch.Tensor,
    cfg: SweepConfig,
    timing: TimingConfig | None = None,
    *,
    on_point: Callable[[Point], None] | None = None,
    on_pass: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run the campaign of ``cfg`` on ``images`` (B, 3, 160, 320) on ``cfg.device``, ``cfg.batch`` rows a pass.

    ``on_pass(done, total)`` is called after each forward pass (progress).
    """
    import torch

    timing = timing or TimingConfig()
    t0 = time.perf_counter()
    dev = torch.device(cfg.device)
    if dev.type == "cpu":
        kernels.keep_freed_memory()
    model = SkyNet(stages, numeric=cfg.numeric, dtype=getattr(torch, cfg.dtype.value)).to(dev)
    x = images.to(dev)
    n = x.shape[0]
    plans = {w: plan_window(Window.parse(w), model.macs, timing.frame_ms) for w in cfg.windows}
    points, groups = _group(cfg, timing, plans)
    jobs = [_Job(w, thr, s) for (w, thr) in groups for s in _seeds(thr, cfg.seeds)]
    # Heaviest faults first: their passes get every row flagged early, so the detectors stop checking.
    jobs.sort(key=lambda j: -sum(j.thr))
    det = Detectors(model)
    boxes: dict[tuple[int, int], torch.Tensor] = {}
    flags: dict[tuple[int, int], dict[str, bool]] = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would round the exact fixed-point sums
    try:
        passes, golden = _run_all(model, det, cfg, jobs, plans, x, boxes, flags, on_pass)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    for (w, thr), pts in groups.items():
        idx = {jobs[j].seed: j for j in range(len(jobs)) if jobs[j].window == w and jobs[j].thr == thr}
        per_seed = [idx.get(s, idx[0]) for s in range(cfg.seeds)]
        got = [torch.stack([boxes[(j, i)] for i in range(n)]) for j in per_seed]
        names = ("range", "abft") if cfg.detectors else ()
        hits = [{k: [flags[(j, i)][k] for i in range(n)] for k in names} for j in per_seed] if names else None
        for pt in pts:
            score_point(pt, got, hits, golden)
    for pt in points:
        if pt.skipped:
            pt.ious = [1.0] * (n * cfg.seeds)
        if on_point:
            on_point(pt)
    forwards = len(jobs) * n + (n if jobs else 0)
    return SweepResult(points, time.perf_counter() - t0, forwards, overheads(model), passes=passes, device=str(dev))


def _run_all(
    model: SkyNet, det: Detectors, cfg: SweepConfig, jobs: list[_Job], plans: dict[str, list[tuple[int, float]]],
    x: torch.Tensor, boxes: dict[tuple[int, int], torch.Tensor], flags: dict[tuple[int, int], dict[str, bool]],
    on_pass: Callable[[int, int], None] | None,
) -> tuple[int, torch.Tensor]:  # fmt: skip
    """The fault-free run (golden boxes, cached states, detector ranges), then every job's rows."""
    import torch

    if not jobs:
        return 0, torch.zeros(0)
    n, passes = x.shape[0], 0
    starts = tuple({plans[j.window][0][0] for j in jobs})
    model.hooks = det.recorder() if cfg.detectors else {}  # profile ranges on the fault-free run
    try:
        out, states = model.run(x, keep=starts)
    finally:
        model.hooks = {}
    total = sum(-(-len([j for j in jobs if j.window == w]) * n // cfg.batch) for w in plans)
    for w, plan in plans.items():
        rows = [(j, i) for j, job in enumerate(jobs) if job.window == w for i in range(n)]
        for lo in range(0, len(rows), cfg.batch):
            _run_chunk(model, det, cfg, jobs, plan, states[plan[0][0]], rows[lo : lo + cfg.batch], boxes, flags)
            passes += 1
            if on_pass:
                on_pass(passes, total)
    return passes, decode_boxes(out)


def _run_chunk(
    model: SkyNet, det: Detectors, cfg: SweepConfig, jobs: list[_Job], plan: list[tuple[int, float]],
    state: dict[str, torch.Tensor], chunk: list[tuple[int, int]],
    boxes: dict[tuple[int, int], torch.Tensor], flags: dict[tuple[int, int], dict[str, bool]],
) -> None:  # fmt: skip
    """One forward over ``chunk`` rows (job index, image index); stores boxes and detector flags per row."""
    import torch

    pick = torch.tensor([i for _, i in chunk], device=state["x"].device)
    sub = {k: v.index_select(0, pick) for k, v in state.items()}
    thr = [jobs[j].thr for j, _ in chunk]
    rows = [(jobs[j].seed, i) for j, i in chunk]
    frac = dict(plan)
    fixed = cfg.numeric is Numeric.FIXED  # accumulators are rounded before the hooks

    def hook(i: int, acc: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
        return apply_flip_rows(acc, i, frac[i], thr, rows, shared=cfg.shared_draws, inplace=True, quantized=fixed)

    hooks = {layer: hook for layer in frac}
    model.hooks = det.wrap(hooks, len(chunk)) if cfg.detectors else hooks
    try:
        out, _ = model.run(None, start=plan[0][0], state=sub)
    finally:
        model.hooks = {}
    got = decode_boxes(out)
    fl = {k: v.cpu().tolist() for k, v in det.flags.items()} if cfg.detectors else {}
    for r, key in enumerate(chunk):
        boxes[key] = got[r]
        flags[key] = {k: bool(v[r]) for k, v in fl.items()}
