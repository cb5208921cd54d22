"""Why carina's CPU optimizer ran slower "inside the training process" than alone, on this machine.

One process, one model, the same parameters throughout (relative figures only: the CPU machine
is shared). A Llama is wrapped with ``device="cpu"`` under a device budget that streams every
block, bf16 compute (so gradients arrive in bf16 staging and updated masters are copied back to
bf16, as with a CUDA device), the fused CPU AdamW and ``step_timing=True``. Measured:

* ``in_training``: the update rate of the fused kernel during the timed steps (the step timer's
  ``optim_update_s`` over the parameters updated), overlapped with backward (Ratel's active
  gradient offloading), for the worker's default intra-op threads and for one fewer;
* ``alone_blocks``: the same ``step_group`` calls on the same masters, gradients and state on
  the worker thread after training, with nothing else running;
* ``alone_one_tensor``: one fused step over a single tensor with all the blocks' parameters
  (how the S2 roofline measures "CPU AdamW alone");
* ``probe_1m``: carina's startup probe before this change (one 1M-element tensor, 3 steps),
  the rate the S2 plan used as "in-process", and ``probe_block``: the probe now (the largest
  block's size, capped, on the worker thread);
* ``busy_thread``: the fused kernel on one block-sized tensor with the default team and with
  one thread fewer, alone and beside one busy thread that mostly runs outside the GIL (a stand-in
  for the thread that runs carina's hooks and launches GPU work during backward).

    PYTHONPATH=$PWD/src nice .venv/bin/python benchmarks/offload/bench_cpu_optimizer.py
    python benchmarks/offload/bench_cpu_optimizer.py --kernels-only --model llama2-7b --out $OUT/offload

``--kernels-only`` runs only the last part (no training) on the block shape of a named model, e.g. a
7B block (202M parameters, 3.2 GB of probe tensors) on the GPU machine's host, where the cores are
not shared with other jobs; ``h100_s2.sh`` runs it as its ``cpu_optim`` phase.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from carina.core.bench import Figure, make_record, write_record
from carina.offload.worker import optimizer_worker

OPTIM: dict[str, Any] = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}


def build(args: argparse.Namespace, threads: int) -> tuple[Any, Any, Any]:
    """A seeded Llama wrapped for CPU training with step timing; returns (model, optimizer, handle)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import carina.offload as co

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        use_cache=False,
    )
    model = LlamaForCausalLM(cfg).train()
    ocfg = co.Config(
        device="cpu",
        device_budget=int(args.device_mib * 2**20),  # less than the model: blocks stream
        compute_dtype=args.dtype,
        cpu_optimizer="fused",
        cpu_optimizer_threads=threads,
        activations="plan",
        step_timing=True,
    )
    model, opt = co.wrap(model, ocfg, optimizer=torch.optim.AdamW(model.parameters(), **OPTIM))
    return model, opt, co.handle_of(model)


def train(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Profile, then time ``args.steps`` steps; then the same updates alone on the worker thread."""
    model, opt, handle = build(args, threads)
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, args.vocab, (args.rows, args.seq), generator=gen) for _ in range(4)]
    for k in range(opt.cfg.profile_steps + 1 + args.steps):
        x = ids[k % len(ids)]
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    rt = handle.runtime
    timed = handle.step_times()[-args.steps :]
    upd = sum(s["optim_update_s"] for s in timed)
    params = sum(s["optim_params"] for s in timed)
    blocks = [g for g in rt.blocks]
    assert rt.timer is not None
    rt.timer.take_host()
    alone = []
    for _ in range(args.steps):
        for g in blocks:  # the same masters, gradients (the last ones) and state: extra updates, after the run
            rt.worker.submit(opt.step_group, g).result()
        alone.append(rt.timer.take_host())
    a_upd = sum(s["optim_update_s"] for s in alone)
    a_params = sum(s["optim_params"] for s in alone)
    out = {
        "worker_threads": rt.optim_threads,
        "in_training_gparams": params / upd / 1e9,
        "alone_blocks_gparams": a_params / a_upd / 1e9,
        "in_training_cast_s_per_step": statistics.median(s["optim_cast_s"] for s in timed),
        "alone_cast_s_per_step": statistics.median(s["optim_cast_s"] for s in alone),
        "in_training_fold_s_per_step": statistics.median(s["optim_fold_s"] for s in timed),
        "in_training_update_s_per_step": upd / len(timed),
        "alone_update_s_per_step": a_upd / len(alone),
        "planned_optim_gparams": opt.hardware.optim / 1e9 if opt.hardware else None,
        "block_params": blocks[0].numel,
        "block_sizes": [p.numel() for p in blocks[0].params],
        "blocks": len(blocks),
        "step_split": timed,
        "plan": handle.plan.counts() if handle.plan else None,
    }
    handle.close()
    return out


def kernel_rates(sizes: list[int], threads: list[int], rounds: int, reps: int) -> dict[str, float]:
    """Params/s of fused AdamW over one block's parameters: as carina lays them out (one tensor per
    parameter, views into a flat buffer) and as one flat tensor, for each intra-op team size, quiet
    and beside one busy thread. Conditions alternate round by round; the median over rounds is kept.
    """
    total = sum(sizes)
    flat = torch.zeros(total)
    flat_grad = torch.full((total,), 1e-3)
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    layouts = {
        "pieces": [(flat[o : o + n], flat_grad[o : o + n]) for o, n in zip(offsets, sizes, strict=True)],
        "flat": [(flat, flat_grad)],
    }
    opts = {}
    for name, tensors in layouts.items():
        params = [torch.nn.Parameter(t) for t, _ in tensors]
        for q, (_, g) in zip(params, tensors, strict=True):
            q.grad = g
        opts[name] = torch.optim.AdamW(params, **OPTIM, fused=True)
        opts[name].step()
    workers = {t: optimizer_worker(t) for t in threads}

    def timed(opt: torch.optim.Optimizer) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    seen: dict[str, list[float]] = {}
    for _ in range(rounds):
        for busy in (False, True):
            stop = threading.Event()
            spinner = threading.Thread(target=_busy, args=(stop,), daemon=True)
            if busy:
                spinner.start()
            for t, ex in workers.items():
                for name, opt in opts.items():
                    key = f"{'busy' if busy else 'quiet'}_{name}_threads_{t}"
                    seen.setdefault(key, []).append(total / ex.submit(timed, opt).result() / 1e9)
            stop.set()
            if busy:
                spinner.join()
    for ex in workers.values():
        ex.shutdown()
    return {k: statistics.median(v) for k, v in seen.items()}


def _busy(stop: threading.Event) -> None:
    """Keep one core busy mostly outside the GIL (small torch ops, below the parallel grain: one thread)."""
    x = torch.zeros(1 << 14)
    while not stop.is_set():
        x.add_(1.0)


def probe_rates(numel: int, block: int) -> dict[str, float]:
    from carina.offload.profiler import _optimizer_rate

    user = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], **OPTIM, fused=True)
    one = _optimizer_rate(user, numel)
    return {
        "probe_1m_gparams": statistics.median(_optimizer_rate(user, 1 << 20) for _ in range(5)) / 1e9,
        "probe_block_gparams": _optimizer_rate(user, block) / 1e9,
        "alone_one_tensor_gparams": one / 1e9,
    }


def block_sizes(name: str) -> list[int]:
    """Parameter sizes of one decoder block of a named Llama shape (q, k, v, o, gate, up, down, 2 norms)."""
    from carina.offload.models import model_config

    cfg = model_config(name)
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    return [h * h, h * kv, h * kv, h * h, h * i, h * i, h * i, h, h]


def kernels_only(args: argparse.Namespace) -> None:
    """The kernel figures alone, on ``args.model``'s block shape (see the module docstring)."""
    n = torch.get_num_threads()
    m = max(1, n - 1)
    sizes = block_sizes(args.model)
    rates = kernel_rates(sizes, sorted({n, m}, reverse=True), args.rounds, args.reps)
    print(rates)
    rec = make_record(
        name=f"offload_cpu_optimizer_kernels_{args.model}",
        figures=_kernel_figures(rates, n, m),
        config={"model": args.model, "block_sizes": sizes, "rounds": args.rounds, "reps": args.reps,
                "intra_op_threads": n, "optimizer": "AdamW(fused=True)", **OPTIM},
        metrics={"kernel_rates": rates},
        notes="Fused CPU AdamW over one decoder block's parameters, per-parameter tensors (views into one "
        "flat buffer, as carina lays out its masters) or one flat tensor; intra-op teams of all threads and "
        "of one fewer; quiet or beside one thread kept busy with small single-threaded torch ops (as the "
        "thread that runs carina's hooks and launches GPU work during backward). Conditions alternate "
        "round by round; medians over rounds.",
    )  # fmt: skip
    print("wrote", write_record(rec, directory=Path(args.out) if args.out else None))


def _kernel_figures(busy: dict[str, float], n: int, m: int) -> list[Figure]:
    return [
        Figure(
            name="optim_rate_beside_busy_thread",
            value=busy[f"busy_pieces_threads_{m}"],
            unit="Gparam/s",
            ceiling=busy[f"quiet_pieces_threads_{n}"],
            ceiling_source=f"the same block update (fused AdamW over its per-parameter tensors) with {n} threads, "
            "no busy thread",
            peers={
                f"beside a busy thread, {n} threads (the worker before)": busy[f"busy_pieces_threads_{n}"],
                f"quiet, {m} threads": busy[f"quiet_pieces_threads_{m}"],
            },
        ),
        Figure(
            name="optim_rate_per_parameter_tensors",
            value=busy[f"quiet_pieces_threads_{n}"],
            unit="Gparam/s",
            ceiling=busy[f"quiet_flat_threads_{n}"],
            ceiling_source=f"the same parameters as one flat tensor, {n} threads, quiet",
            peers={
                f"beside a busy thread, per-parameter tensors, {n} threads": busy[f"busy_pieces_threads_{n}"],
                f"beside a busy thread, one flat tensor, {n} threads": busy[f"busy_flat_threads_{n}"],
            },
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device-mib", type=float, default=64.0, help="carina's device budget (MiB)")
    ap.add_argument("--kernels-only", action="store_true", help="only the kernel figures, on --model's block")
    ap.add_argument("--model", default="llama2-7b", help="--kernels-only: the block shape")
    ap.add_argument("--out", default="", help="folder for the record (default: benchmarks/results/<machine>)")
    args = ap.parse_args()
    if args.kernels_only:
        kernels_only(args)
        return
    n = torch.get_num_threads()
    m = max(1, n - 1)
    runs = {f"threads_{t}": train(args, t) for t in sorted({n, m}, reverse=True)}
    main_run = runs[f"threads_{n}"]
    block, total = main_run["block_params"], main_run["block_params"] * main_run["blocks"]
    probes = probe_rates(total, block)
    busy = kernel_rates(main_run["block_sizes"], sorted({n, m}, reverse=True), args.rounds, args.reps)
    for key, run in runs.items():
        print(key, {k: v for k, v in run.items() if k not in ("step_split",)})
    print(probes, busy)
    fewer = runs[f"threads_{m}"]
    figs = [
        Figure(
            name="optim_rate_in_training",
            value=main_run["in_training_gparams"],
            unit="Gparam/s",
            ceiling=main_run["alone_blocks_gparams"],
            ceiling_source="the same step_group calls on the same masters, gradients and state, on the worker "
            "thread after training, nothing else running (same process)",
            peers={
                f"in training, worker {fewer['worker_threads']} thread(s)": fewer["in_training_gparams"],
                "alone, one tensor of all block parameters": probes["alone_one_tensor_gparams"],
                "startup probe before (1M elements)": probes["probe_1m_gparams"],
                "startup probe now (block-sized)": probes["probe_block_gparams"],
            },
        ),
        *_kernel_figures(busy, n, m),
    ]
    rec = make_record(
        name="offload_cpu_optimizer_rate",
        figures=figs,
        config={**vars(args), "intra_op_threads": n, "optimizer": "AdamW(fused=True)", **OPTIM},
        command="PYTHONPATH=$PWD/src nice .venv/bin/python benchmarks/offload/bench_cpu_optimizer.py",
        metrics={"runs": runs, "probes": probes, "busy_thread": busy},
        notes="Shared 2-core CPU machine: compare figures within this record only. Rates are fused CPU AdamW "
        "parameter updates per second. On a CPU device the blocks' forward and backward run on the same cores "
        "as the optimizer worker, so 'in training' there includes contention a CUDA device does not have; "
        "the kernel figures (metrics.busy_thread) isolate the team-size and tensor-layout effects.",
    )
    print("wrote", write_record(rec, directory=Path(args.out) if args.out else None))


if __name__ == "__main__":
    main()
