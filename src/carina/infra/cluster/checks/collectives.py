"""The collectives check: NCCL (GPUs) or gloo (CPU) sweeps on the local node."""

from __future__ import annotations

from carina.infra.cluster.checks.base import Check, CheckContext, CheckResult, Status, Threshold

__all__ = ["Collectives"]


class Collectives(Check):
    """All-reduce, all-gather, reduce-scatter and all-to-all over sizes: results right, busbw high enough."""

    name = "collectives"
    needs = ("torch",)
    rationale = "a wrong sum is silent corruption; a low busbw is a bad NVLink/PCIe path that slows every step"

    def _run(self, ctx: CheckContext) -> CheckResult:
        from carina.core.errors import ValidationFailed
        from carina.infra.cluster.collectives import run_local_sweep, sweep

        device = ctx.resolve_device()
        top = 30 if device.startswith("cuda") else 26  # gloo on loopback: stop at 64 MiB
        sizes = [1 << 16, 1 << 20] if ctx.quick else [1 << p for p in range(10, top + 1, 4)]
        try:
            if ctx.world is not None:
                rows = sweep(sizes, device=device)
            elif device.startswith("cuda"):
                import torch

                if torch.cuda.device_count() < 2:
                    return CheckResult(self.name, Status.SKIP, "needs 2+ GPUs or a process group")
                rows = run_local_sweep(torch.cuda.device_count(), backend="nccl", sizes=sizes)
            else:
                rows = run_local_sweep(2, backend="gloo", sizes=sizes, iters=3)
        except ValidationFailed as exc:
            return CheckResult(self.name, Status.FAIL, str(exc))
        metrics = {f"{r['op']}_{r['bytes']}_busbw_gbps": r["busbw_gbps"] for r in rows}
        peak = {op: max(r["busbw_gbps"] for r in rows if r["op"] == op) for op in {r["op"] for r in rows}}
        metrics.update({f"{op}_peak_busbw_gbps": v for op, v in peak.items()})
        worst, notes = Status.PASS, []
        for op, value in peak.items():
            spec = ctx.specs.get(f"{op}_busbw_gbps")
            if spec:
                status = Threshold().grade(value, float(spec))
                worst = status if status.rank > worst.rank else worst
                if status is not Status.PASS:
                    notes.append(f"{op} busbw {value:.2f} GB/s vs {spec}")
        summary = ", ".join(f"{op} {v:.2f}" for op, v in sorted(peak.items()))
        return CheckResult(self.name, worst, "; ".join(notes) or f"peak busbw GB/s: {summary}", metrics)
