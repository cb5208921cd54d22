"""The CPU AdamW update from a float32 gradient against one from a bf16 gradient upcast chunk by chunk.

``narrow_grads`` sends a block's gradient in bf16 and the flat update upcasts it chunk by chunk into a
float32 buffer before PyTorch's fused AdamW reads it (``carina.offload.flatstep``): PyTorch's fused CPU
kernel takes no gradient of another dtype than the parameter's. On the H200 in session 9 that update
ran at 2.88 Gparam/s against 4.95 for the float32 one. This measures the same two paths on this
machine, the upcast at several chunk sizes (16 MiB is carina's; 1 MiB and below stay in a core's L2),
each rate the best of ``--reps`` interleaved rounds after one untimed pass, and writes
``benchmarks/results/cpu/offload_narrow_update_cpu.json``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_narrow_update.py
"""

from __future__ import annotations

import argparse
import time

import torch

from carina.core.bench import Figure, make_record, write_record

KW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.01, "eps": 1e-8, "amsgrad": False, "maximize": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1 << 26, help="elements updated per pass")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--chunks", default="4194304,1048576,262144,65536", help="upcast chunk sizes, in elements")
    args = ap.parse_args()
    n = args.params
    p, m, v = torch.randn(n), torch.zeros(n), torch.zeros(n)
    g32 = torch.randn(n) * 1e-3
    g16 = g32.bfloat16()
    step = torch.tensor(1.0)

    def wide() -> None:
        torch._fused_adamw_([p], [g32], [m], [v], [], [step.clone()], **KW)

    def narrow(chunk: int) -> None:
        buf = torch.empty(chunk)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            b = buf[: e - s]
            b.copy_(g16[s:e])
            torch._fused_adamw_([p[s:e]], [b], [m[s:e]], [v[s:e]], [], [step.clone()], **KW)

    chunks = [int(c) for c in args.chunks.split(",")]
    paths = {"float32": wide, **{f"bf16_upcast_chunk_{c}": (lambda c=c: narrow(c)) for c in chunks}}
    best = dict.fromkeys(paths, float("inf"))
    for fn in paths.values():  # one untimed pass each
        fn()
    for _ in range(args.reps):  # rounds interleave the paths: drift on a shared machine hits them all
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    rates = {name: n / t / 1e9 for name, t in best.items()}
    for k, r in rates.items():
        print(f"{k:28} {r:.3f} Gparam/s")
    best_narrow = max((k for k in rates if k != "float32"), key=rates.__getitem__)
    fig = Figure(
        name="narrow_update_gparams",
        value=rates[best_narrow],
        unit="Gparam/s",
        peers={"float32 gradient (one fused call)": rates["float32"]},
    )
    rec = make_record(
        name="offload_narrow_update_cpu",
        figures=[fig],
        config={"params": n, "reps": args.reps, "chunks": chunks, "threads": torch.get_num_threads()},
        metrics={"gparams": rates, "best_narrow": best_narrow},
        notes="torch._fused_adamw_ on the CPU over float32 parameters and state; the narrow path upcasts "
        "each chunk of a bf16 gradient into a float32 buffer (copy_) and steps that chunk. The figure is "
        "the best chunk size; its peer the float32 gradient read directly.",
    )
    print("wrote", write_record(rec))


if __name__ == "__main__":
    main()
