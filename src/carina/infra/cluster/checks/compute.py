"""Device performance checks: PCIe bandwidth, HBM bandwidth, matmul rate, an HPL-like LU solve.

All run on CUDA when present and on the CPU otherwise (the same code with
``device="cpu"``), so CI exercises them; CPU figures are graded only against
spec values given in the context.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from carina.infra.cluster.checks.base import Check, CheckContext, CheckResult, Status, Threshold
from carina.infra.cluster.checks.specs import GpuSpec, spec_for
from carina.infra.cluster.checks.timing import best_seconds

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["HplSolve", "HbmBandwidth", "MatmulRate", "PcieBandwidth", "hpl_flops", "hpl_residual"]

_AUTOPILOT = Threshold(warn=0.8, fail=0.25)


def _spec(ctx: CheckContext, device: str) -> GpuSpec | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return spec_for(torch.cuda.get_device_name(0))


def _grade(ctx: CheckContext, metrics: dict[str, float], expected: dict[str, float]) -> tuple[Status, str]:
    expected = {k: float(ctx.specs.get(k, v)) for k, v in expected.items() if ctx.specs.get(k, v)}
    for k in metrics:
        if k in ctx.specs and k not in expected:
            expected[k] = float(ctx.specs[k])
    worst, notes = Status.PASS, []
    for key, spec in expected.items():
        status = _AUTOPILOT.grade(metrics[key], spec)
        if status.rank > worst.rank:
            worst = status
        if status is not Status.PASS:
            notes.append(f"{key} {metrics[key]:.3g} is {metrics[key] / spec:.0%} of {spec:.3g}")
    return worst, "; ".join(notes)


class PcieBandwidth(Check):
    """Pinned host<->GPU copy bandwidth in each direction (autopilot's ``pciebw``)."""

    name = "pcie_bw"
    needs = ("cuda",)
    rationale = "below 25% of the link peak the link trained down or a switch is congested (autopilot FAIL)"

    def _run(self, ctx: CheckContext) -> CheckResult:
        import torch

        nbytes = (64 if ctx.quick else 512) << 20
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        h2d = best_seconds(lambda: dev.copy_(host, non_blocking=True), device="cuda")
        d2h = best_seconds(lambda: host.copy_(dev, non_blocking=True), device="cuda")
        metrics = {"h2d_gbps": nbytes / h2d / 1e9, "d2h_gbps": nbytes / d2h / 1e9}
        spec = _spec(ctx, "cuda")
        expected = {k: spec.expected(k, spec.pcie_gbps) for k in metrics} if spec else {}
        status, note = _grade(ctx, metrics, expected)
        return CheckResult(self.name, status, note or "PCIe bandwidth as expected", metrics, expected)


class HbmBandwidth(Check):
    """Device memory bandwidth of a large copy (bytes read + written); host memory on the CPU."""

    name = "hbm_bw"
    needs = ("torch",)
    rationale = "a GPU far below its HBM bandwidth has a memory or clock fault (autopilot gpumem)"

    def _run(self, ctx: CheckContext) -> CheckResult:
        import torch

        device = ctx.resolve_device()
        nbytes = (64 if ctx.quick or device == "cpu" else 2048) << 20
        src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        seconds = best_seconds(lambda: dst.copy_(src), device=device)
        metrics = {"hbm_gbps": 2 * nbytes / seconds / 1e9}
        spec = _spec(ctx, device)
        expected = {"hbm_gbps": spec.expected("hbm_gbps", spec.hbm_gbps)} if spec else {}
        status, note = _grade(ctx, metrics, expected)
        return CheckResult(self.name, status, note or f"{metrics['hbm_gbps']:.0f} GB/s on {device}", metrics, expected)


class MatmulRate(Check):
    """bf16, fp32 and fp64 matrix-multiply rate."""

    name = "matmul"
    needs = ("torch",)
    rationale = "a GPU well below its peak rate is throttled or faulty and slows every synchronous step"

    def _run(self, ctx: CheckContext) -> CheckResult:
        import torch

        device = ctx.resolve_device()
        big = device.startswith("cuda") and not ctx.quick
        metrics: dict[str, float] = {}
        for label, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32), ("fp64", torch.float64)):
            n = (8192 if label != "fp64" else 4096) if big else 256
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            seconds = best_seconds(partial(torch.matmul, a, b), device=device, repeats=5 if big else 3)
            metrics[f"{label}_tflops"] = 2 * n**3 / seconds / 1e12
        spec = _spec(ctx, device)
        expected = {f"{d}_tflops": spec.expected(f"{d}_tflops", p) for d, p in spec.tflops.items()} if spec else {}
        status, note = _grade(ctx, metrics, expected)
        summary = ", ".join(f"{k} {v:.3g}" for k, v in metrics.items())
        return CheckResult(self.name, status, note or summary, metrics, expected)


def hpl_flops(n: int) -> float:
    """HPL's operation count for an n×n solve: 2/3·n³ + 2·n²."""
    return 2.0 / 3.0 * n**3 + 2.0 * n**2


def hpl_residual(a: Tensor, x: Tensor, b: Tensor) -> float:
    """HPL's scaled residual ‖Ax−b‖∞ / (ε·(‖A‖∞‖x‖∞ + ‖b‖∞)·n); a correct solve is below 16."""
    import torch

    eps = torch.finfo(a.dtype).eps
    n = a.shape[0]
    r = torch.linalg.vector_norm(a @ x - b, ord=float("inf"))
    norm_a = torch.linalg.matrix_norm(a, ord=float("inf"))
    denom = eps * (
        norm_a * torch.linalg.vector_norm(x, ord=float("inf")) + torch.linalg.vector_norm(b, ord=float("inf"))
    )
    return float(r / (denom * n))


class HplSolve(Check):
    """An HPL-like FP64 LU solve: GFLOP/s and HPL's residual check."""

    name = "hpl"
    needs = ("torch",)
    rationale = "HPL's residual catches silent arithmetic errors; its rate is Vela's per-GPU yardstick"

    def _run(self, ctx: CheckContext) -> CheckResult:
        import torch

        device = ctx.resolve_device()
        n = 16384 if device.startswith("cuda") and not ctx.quick else 512
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = (torch.rand(n, n, generator=gen, dtype=torch.float64) - 0.5).to(device)
        b = (torch.rand(n, 1, generator=gen, dtype=torch.float64) - 0.5).to(device)
        holder: dict[str, Tensor] = {}

        def solve() -> None:
            holder["x"] = torch.linalg.solve(a, b)

        seconds = best_seconds(solve, device=device, repeats=3, warmup=1)
        residual = hpl_residual(a, holder["x"], b)
        metrics = {"hpl_gflops": hpl_flops(n) / seconds / 1e9, "hpl_residual": residual, "hpl_n": n}
        if not residual < 16:
            return CheckResult(self.name, Status.FAIL, f"residual {residual:.3g} >= 16: wrong results", metrics)
        expected = {"hpl_gflops": float(ctx.specs["hpl_gflops"])} if "hpl_gflops" in ctx.specs else {}
        status, note = _grade(ctx, {"hpl_gflops": metrics["hpl_gflops"]}, expected)
        return CheckResult(
            self.name,
            status,
            note or f"{metrics['hpl_gflops']:.1f} GFLOP/s, residual {residual:.2g}",
            metrics,
            expected,
        )
