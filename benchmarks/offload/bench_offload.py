"""Offloaded training vs the unlimited-memory ideal and peers, measured in one run.

Runs, in one process on one device: the PCIe ceiling (pinned H2D/D2H), plain
PyTorch training with everything resident (the ideal: bf16 autocast, fp32
AdamW fused on the device), carina.offload under a device budget (bf16
compute, fp32 masters and AdamW on the CPU), and FSDP2 with CPUOffloadPolicy
(world size 1, per-layer activation checkpointing) under the same allocator
cap. Same model, same tokens per step. Writes one record per tokens/step.

    python benchmarks/offload/bench_offload.py --model llama-1b --budget 8GiB --tokens 8192,32768
    python benchmarks/offload/bench_offload.py --smoke        # CPU, tiny model, seconds
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
from typing import Any

import torch

from carina.core.bench import Figure, make_record, write_record
from carina.memory.tiers import parse_bytes
from carina.offload.models import build_model, model_config, param_count


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def pcie(dev: torch.device) -> dict[str, float]:
    if dev.type != "cuda":
        return {}
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(n, dtype=torch.uint8, device=dev)
    out = {}
    for name, (dst, src) in {"h2d": (gpu, host), "d2h": (host, gpu)}.items():
        dst.copy_(src, non_blocking=True)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        sync(dev)
        out[name + "_gbps"] = 5 * n / (time.perf_counter() - t0) / 1e9
    return out


def batches(vocab: int, micro: int, seq: int, dev: torch.device):
    gen = torch.Generator().manual_seed(1)
    while True:
        yield torch.randint(0, vocab, (micro, seq), generator=gen).to(dev)


def timed_steps(step, warm: int, steps: int, dev: torch.device) -> list[float]:
    times = []
    for k in range(warm + steps):
        sync(dev)
        t0 = time.perf_counter()
        step()
        sync(dev)
        if k >= warm:
            times.append(time.perf_counter() - t0)
    return times


def run_plain(args, shape, dev, tokens) -> dict[str, Any]:
    model = build_model(shape, seed=0).to(dev)
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    accum = tokens // (args.micro * args.seq)
    data = batches(shape.vocab_size, args.micro, args.seq, dev)
    losses = []

    def step():
        for _ in range(accum):
            ids = next(data)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = timed_steps(step, 2, args.steps, dev)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    return {"step_s": statistics.median(times), "times": times, "peak_gpu": peak, "losses": losses}


def run_carina(args, shape, dev, tokens) -> dict[str, Any]:
    import carina.offload as co

    accum = tokens // (args.micro * args.seq)
    model = build_model(shape, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.type == "cuda")  # fmt: skip
    cfg = co.Config(device=str(dev), device_budget=args.budget, compute_dtype="bfloat16" if dev.type == "cuda"
                    else "float32", grad_accumulation=accum)  # fmt: skip
    t0 = time.perf_counter()
    model, opt = co.wrap(model, cfg, optimizer=opt)
    wrap_s = time.perf_counter() - t0
    handle = co.handle_of(model)
    data = batches(shape.vocab_size, args.micro, args.seq, dev)
    losses = []

    def step():
        for _ in range(accum):
            ids = next(data)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))

    for _ in range(cfg.profile_steps):  # profiling steps, not timed
        step()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    handle.store.reset_peaks()
    moved0 = dict(handle.stats().moved)
    times = timed_steps(step, 1, args.steps, dev)
    st = handle.stats()
    out = {
        "step_s": statistics.median(times),
        "times": times,
        "wrap_s": wrap_s,
        "losses": losses,
        "peak_gpu": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
        "peak_gpu_reserved": torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else 0,
        "ledger_peak": st.peak,
        "moved_per_step": {k: (v - moved0.get(k, 0)) / (args.steps + 1) for k, v in st.moved.items()},
        "plan": handle.plan.summary() if handle.plan else None,
        "hardware": vars(opt.hardware) if opt.hardware else None,
    }
    handle.close()
    return out


def run_fsdp2(args, shape, dev, tokens) -> dict[str, Any]:
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("nccl", rank=0, world_size=1)
    model = build_model(shape, seed=0)
    model.gradient_checkpointing_enable()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=True))
    fully_shard(model, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    accum = tokens // (args.micro * args.seq)
    data = batches(shape.vocab_size, args.micro, args.seq, dev)

    def step():
        for _ in range(accum):
            ids = next(data)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()

    torch.cuda.reset_peak_memory_stats(dev)
    times = timed_steps(step, 1, max(2, args.steps // 2), dev)
    out = {"step_s": statistics.median(times), "times": times, "peak_gpu": torch.cuda.max_memory_allocated(dev)}
    return out


def guarded(name, fn, *a) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        out = fn(*a)
    except Exception as exc:  # a peer that fails is recorded, not fatal
        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    out["wall_s"] = time.perf_counter() - t0
    print(f"[{name}] { ({k: v for k, v in out.items() if k not in ('times', 'losses')}) }", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--budget", default="8GiB", help="carina device budget (plan and ledger)")
    ap.add_argument("--cap", default="", help="allocator cap for carina/FSDP2 (default budget + 25%%)")
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--peers", default="plain,fsdp2")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.budget, args.tokens, args.seq, args.micro, args.steps = "tiny", "2MiB", "256", 64, 2, 8
        args.peers = "plain"
    args.budget = parse_bytes(args.budget)
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    shape = model_config(args.model)
    n = param_count(shape)
    ceilings = pcie(dev)
    print("ceilings", ceilings, flush=True)
    cap = parse_bytes(args.cap) if args.cap else int(args.budget * 1.25)
    results: dict[int, dict[str, Any]] = {}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        res = results.setdefault(tokens, {})
        if "plain" in args.peers:
            if dev.type == "cuda":
                torch.cuda.set_per_process_memory_fraction(1.0, dev)
            res["plain"] = guarded("plain", run_plain, args, shape, dev, tokens)
        if dev.type == "cuda":
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), dev)
        res["carina"] = guarded("carina", run_carina, args, shape, dev, tokens)
        write(args, shape, n, dev, tokens, cap, ceilings, res)
    if "fsdp2" in args.peers and dev.type == "cuda":  # last: it initialises a process group
        tokens = min(results)
        results[tokens]["fsdp2"] = guarded("fsdp2", run_fsdp2, args, shape, dev, tokens)
        write(args, shape, n, dev, tokens, cap, ceilings, results[tokens])


def write(args, shape, n, dev, tokens, cap, ceilings, res) -> None:
    c = res["carina"]
    value = 0.0 if "error" in c else tokens / c["step_s"]
    ideal = tokens / res["plain"]["step_s"] if "step_s" in res.get("plain", {}) else None
    peers = {k: tokens / v["step_s"] for k, v in res.items() if k not in ("carina", "plain") and "step_s" in v}
    pred = (c.get("plan") or {}).get("predicted_s", {}).get("step")
    figs = [Figure(name="tokens_per_s", value=value, unit="tokens/s", ceiling=ideal,
                   ceiling_source="plain PyTorch, everything resident on the same device (unlimited-memory ideal)",
                   peers=peers)]  # fmt: skip
    if "step_s" in c:
        figs.append(Figure(name="tflops", value=6 * n * tokens / c["step_s"] / 1e12, unit="TFLOP/s"))
        if pred:
            figs.append(Figure(name="predicted_step_s", value=pred, unit="s", higher_is_better=False,
                               basis=__import__("carina.core.bench", fromlist=["Basis"]).Basis.MODELED))  # fmt: skip
    cfg = {"model": args.model, "params": n, "tokens_per_step": tokens, "seq": args.seq, "micro_batch": args.micro,
           "device_budget": args.budget, "allocator_cap": cap, "steps_timed": args.steps, "device": str(dev),
           "compute": "bf16 (carina: bf16 params; plain: autocast)" if dev.type == "cuda" else "fp32"}  # fmt: skip
    rec = make_record(
        name=f"offload_{args.model}_" + (f"{tokens // 1024}k" if tokens >= 1024 else f"{tokens}tok"),
        figures=figs,
        config=cfg,
        command=[sys.executable.rsplit("/", 1)[-1], *sys.argv],
        metrics={"pcie": ceilings, "runs": res, "fraction_of_ideal": value / ideal if ideal else None},
        notes="tokens/s = tokens per optimizer step / median step time after warm-up; carina excludes its "
        "profiling steps. Ideal = plain PyTorch with the whole model, AdamW and activations resident.",
    )
    print("wrote", write_record(rec), flush=True)


if __name__ == "__main__":
    main()
