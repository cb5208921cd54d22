"""Accuracy metrics of faulty detections against the fault-free model's own boxes.

No ground-truth labels exist offline (the DAC-SDC set is not public), so the
reference is the fault-free model's box: IoU_golden = 1 by definition and the
detection-accuracy loss is ``1 - mean IoU(faulty, fault-free)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Summary", "iou", "summarize", "wilson"]


def iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matching rows of two (N, >=4) box tensors (x1, y1, x2, y2); degenerate boxes give 0."""
    import torch

    a, b = a[:, :4].to(torch.float64), b[:, :4].to(torch.float64)
    a = torch.nan_to_num(a, nan=0.0, posinf=1e9, neginf=-1e9)
    b = torch.nan_to_num(b, nan=0.0, posinf=1e9, neginf=-1e9)
    iw = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp(min=0)
    ih = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp(min=0)
    inter = iw * ih
    area = lambda x: (x[:, 2] - x[:, 0]).clamp(min=0) * (x[:, 3] - x[:, 1]).clamp(min=0)  # noqa: E731
    union = area(a) + area(b) - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


@dataclass(frozen=True)
class Summary:
    """Loss and failure fraction over a set of (image, seed) samples, with 95 % intervals."""

    n: int
    loss: float
    loss_ci: tuple[float, float]
    frac_below_half: float
    frac_ci: tuple[float, float]
    frac_changed: float = 0.0


def summarize(ious: Sequence[float]) -> Summary:
    """Loss (1 - mean IoU, normal CI), P(IoU < 0.5) (Wilson CI), share of frames whose box changed (IoU < 1)."""
    n = len(ious)
    if n == 0:
        return Summary(0, 0.0, (0.0, 0.0), 0.0, (0.0, 1.0))
    mean = sum(ious) / n
    var = sum((x - mean) ** 2 for x in ious) / (n - 1) if n > 1 else 0.0
    half = 1.96 * math.sqrt(var / n)
    below = sum(x < 0.5 for x in ious)
    loss = 1.0 - mean
    ci = (max(0.0, loss - half), min(1.0, loss + half))
    return Summary(n, loss, ci, below / n, wilson(below, n), sum(x < 1.0 for x in ious) / n)
