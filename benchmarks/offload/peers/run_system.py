"""Run one system on one configuration in this process and write its result as JSON.

The harness starts one of these per (system, configuration), so a crash, an out-of-memory or
a leaked CUDA context of one system never touches another.

Usage: python run_system.py --spec '<RunSpec JSON>' --out result.json
       python run_system.py --calibrate --out calib.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import RunSpec


def calibrate() -> dict[str, float]:
    """Pinned H2D/D2H bandwidth (GB/s) and CPU AdamW throughput (params/s): the roofline's inputs."""
    import torch

    out: dict[str, float] = {}
    params = torch.zeros(50_000_000, requires_grad=True)
    params.grad = torch.zeros_like(params)
    opt = torch.optim.AdamW([params], lr=1e-4, fused=True)
    opt.step()
    start = time.perf_counter()
    for _ in range(3):
        opt.step()
    out["cpu_adamw_params_per_s"] = 3 * params.numel() / (time.perf_counter() - start)
    if torch.cuda.is_available():
        host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        for name, (dst, src) in {"h2d_gbps": (dev, host), "d2h_gbps": (host, dev)}.items():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(5):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            out[name] = 5 * (1 << 30) / (time.perf_counter() - start) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.calibrate:
        Path(args.out).write_text(json.dumps(calibrate()))
        return
    from systems import run

    result = run(RunSpec(**json.loads(args.spec)))
    Path(args.out).write_text(result.to_json())


if __name__ == "__main__":
    main()
