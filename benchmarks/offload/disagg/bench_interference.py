"""Interference with matmuls: gradients leaving through copy engines (DisDP) vs NCCL kernels.

Measures bf16 matmul throughput on one GPU (1) alone, (2) while a side stream copies gradient
bytes device-to-host into page-locked memory in a loop (what the PS path does: copy engines, no
SMs), and (3) while another process runs NCCL all-reduces of the same size on the same GPU
(world size 1: the collective's kernels run and take SMs, but no bytes cross to another GPU;
the multi-GPU comparison is a separate run). Writes benchmarks/results/<machine>/disagg_interference.json.

Usage: python benchmarks/offload/disagg/bench_interference.py [--seconds 5] [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.multiprocessing as mp

from carina.core.bench import Figure, make_record, write_record


def matmul_tflops(seconds: float, n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e12


def copy_engine_load(stop: torch.Tensor, nbytes: int) -> tuple[float, int]:
    """Stream D2H copies on a side stream until ``stop`` is set; return GB/s and bytes moved."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()
    moved, start = 0, time.perf_counter()
    with torch.cuda.stream(stream):
        while not bool(stop.item()):
            dst.copy_(src, non_blocking=True)
            stream.synchronize()
            moved += nbytes
    return moved / (time.perf_counter() - start) / 1e9, moved


def _nccl_worker(nbytes: int, ready: mp.Event, stop: mp.Event, port: int) -> None:  # type: ignore[name-defined]
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    ready.set()
    while not stop.is_set():
        for _ in range(10):
            dist.all_reduce(t)
        torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    nbytes = args.mib << 20
    alone = matmul_tflops(args.seconds)
    import threading

    stop = torch.zeros(1, dtype=torch.int32)
    box: dict[str, tuple[float, int]] = {}
    thread = threading.Thread(target=lambda: box.setdefault("copy", copy_engine_load(stop, nbytes)))
    thread.start()
    time.sleep(0.5)
    with_copies = matmul_tflops(args.seconds)
    stop[0] = 1
    thread.join()
    ctx = mp.get_context("spawn")
    ready, halt = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_nccl_worker, args=(nbytes, ready, halt, 29710))
    proc.start()
    ready.wait(120)
    with_nccl = matmul_tflops(args.seconds)
    halt.set()
    proc.join()
    figures = [
        Figure(
            name="matmul_alone", value=alone, unit="TFLOP/s", ceiling=989.0, ceiling_source="H100 SXM bf16 dense peak"
        ),
        Figure(
            name="matmul_with_d2h_copies",
            value=with_copies,
            unit="TFLOP/s",
            ceiling=alone,
            ceiling_source="matmul alone, same run",
            peers={"matmul_with_nccl_allreduce": with_nccl},
        ),
        Figure(name="d2h_copy_bandwidth_during_matmul", value=box["copy"][0], unit="GB/s"),
    ]
    metrics = {
        "slowdown_with_copies": 1 - with_copies / alone,
        "slowdown_with_nccl": 1 - with_nccl / alone,
        "bytes_per_message": nbytes,
        "nccl_world_size": 1,
        "note": "NCCL ran with world size 1 on the same GPU: its kernels take SMs, no bytes leave the GPU",
    }
    record = make_record(
        name="disagg_interference",
        figures=figures,
        config=vars(args),
        metrics=metrics,
        command=" ".join(["python", *sys.argv]),
    )
    print(write_record(record))


if __name__ == "__main__":
    main()
