"""Specification and known-good figures of common GPUs, used as check thresholds.

``peak`` values are the vendor's data-sheet numbers (dense, no sparsity);
``good`` values are what a healthy node of that kind measures, where known
(the H100 figures were measured on an H100 80GB SXM node: pinned H2D/D2H
54.5/54.6 GB/s, bf16 GEMM 795 TFLOP/s). Checks grade against ``good`` when it
is known and against 80% of ``peak`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GPU_SPECS", "GpuSpec", "spec_for"]


@dataclass(frozen=True)
class GpuSpec:
    """Data-sheet peaks and known-good figures of one GPU model (GB/s, TFLOP/s)."""

    model: str
    memory_gib: float
    hbm_gbps: float
    pcie_gbps: float  # per direction, link peak
    tflops: dict[str, float]  # dtype -> dense peak
    good: dict[str, float] = field(default_factory=dict)  # figure -> known-good value

    def expected(self, figure: str, peak: float) -> float:
        """The value a healthy node should reach for ``figure``."""
        return self.good.get(figure, 0.8 * peak)


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H200", 141, 4800, 64, {"bf16": 989, "fp32": 67, "fp64": 67}, {"bf16_tflops": 790.0}),
    GpuSpec(
        "H100",
        80,
        3350,
        64,
        {"bf16": 989, "fp32": 67, "fp64": 67},
        {"h2d_gbps": 54.5, "d2h_gbps": 54.6, "bf16_tflops": 795.0},
    ),
    GpuSpec("A100", 80, 2039, 32, {"bf16": 312, "fp32": 19.5, "fp64": 19.5}),
    GpuSpec("L40S", 48, 864, 32, {"bf16": 362, "fp32": 91.6, "fp64": 1.4}),
    GpuSpec("A10", 24, 600, 32, {"bf16": 125, "fp32": 31.2, "fp64": 1.0}),
)


def spec_for(name: str) -> GpuSpec | None:
    """The spec whose model name appears in the device ``name``, if any."""
    upper = name.upper()
    for spec in GPU_SPECS:
        if spec.model in upper:
            return spec
    return None
