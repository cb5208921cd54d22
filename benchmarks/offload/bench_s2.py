"""The S2 benchmark (7B-shape Llama, 24 GiB GPU cap, 8k and 32k tokens/step), one phase per process.

``h100_s2.sh`` runs the phases under ``timeout`` and the ``report`` phase turns what they left
in ``--work`` into records (carina.core.bench) in ``--out``. Phases:

* ``ideal``: PCIe and CPU AdamW rates, and plain PyTorch with everything on the GPU (fp32
  weights, bf16 autocast, fused AdamW, no checkpointing) at 4 and 8 layers of the shape; the
  ideal step at any depth is fitted as ``a + b * layers`` per micro-batch plus the measured
  optimizer time per parameter (layer truncation: the full model does not fit with fp32
  AdamW states).
* ``carina``: carina.offload under the GPU cap (``set_per_process_memory_fraction``).
* ``fsdp2``: FSDP2 ``fully_shard`` + ``CPUOffloadPolicy`` (world size 1, HF checkpointing,
  fused CPU AdamW) under the same cap.
* ``notax``: the 3B shape with no budget: plain PyTorch vs carina, same micro-batches. carina is
  told the micro-batch (``micro_batch_tokens``) and plans the resident mode when everything fits
  (``carina.offload.resident``: the model and its optimizer on the GPU, nothing offloaded).
* ``spill``: carina with a host budget ``--spill-blocks`` blocks' optimizer state short of
  what the plan needs, so that state spills to the NVMe tier in ``--nvme-path``; the tier's
  write and read rates are measured first, through the same carina.io path, and given to the
  planner (``disk_gbps``) and the roofline.

Models are initialised on the GPU (seeded, float32; CPU init of billions of parameters takes
minutes) and moved to the host before carina or FSDP2 take them.

    python benchmarks/offload/bench_s2.py ideal --work /tmp/s2
    python benchmarks/offload/bench_s2.py carina --work /tmp/s2 --tokens 8192
    python benchmarks/offload/bench_s2.py report --work /tmp/s2 --out $OUT/offload
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from carina.offload.models import model_config, param_count

OPTIM = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
GiB = 1 << 30


class HostWatch:
    """Samples the machine's used RAM (MemTotal - MemAvailable) and this process's RSS every 0.25 s."""

    def __init__(self) -> None:
        self.base = self.meminfo()
        self.peak = self.base
        self.rss_peak = self.rss()
        self.marked: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def meminfo() -> int:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return info["MemTotal"] - info["MemAvailable"]

    @staticmethod
    def rss() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self.meminfo())
            self.rss_peak = max(self.rss_peak, self.rss())

    def mark(self) -> None:
        """Report the peaks so far and restart them (e.g. before the timed steps)."""
        self.marked = {"machine_used_peak_setup": self.peak, "process_rss_peak_setup": self.rss_peak}
        self.peak, self.rss_peak = self.meminfo(), self.rss()

    def report(self) -> dict[str, int]:
        self._stop.set()
        return {
            "machine_used_before": self.base,
            **self.marked,
            "machine_used_peak": max(self.peak, self.meminfo()),
            "process_rss_peak_sampled": max(self.rss_peak, self.rss()),
            "process_rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }


def shape(args: argparse.Namespace, layers: int | None = None) -> Any:
    cfg = model_config(args.model, num_hidden_layers=layers or args.layers)
    cfg.use_cache = False
    return cfg


def init_model(cfg: Any, dev: torch.device, host: bool) -> Any:
    """Seeded float32 random init on ``dev``, moved to the host when ``host``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    if host and dev.type != "cpu":
        model = model.to("cpu")
        torch.cuda.empty_cache()
    return model.train()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def data(cfg: Any, rows: int, seq: int, dev: torch.device):
    gen = torch.Generator().manual_seed(1)
    while True:
        yield torch.randint(0, cfg.vocab_size, (rows, seq), generator=gen).to(dev)


def device_of(args: argparse.Namespace) -> torch.device:
    if args.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 0)


def cap(dev: torch.device, gib: float | None) -> None:
    if dev.type == "cuda" and gib:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GiB / total), dev)


def loop(step: Any, n: int, dev: torch.device) -> list[float]:
    times = []
    for _ in range(n):
        sync(dev)
        t0 = time.perf_counter()
        step()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def save(args: argparse.Namespace, name: str, out: dict[str, Any]) -> None:
    path = Path(args.work) / f"{name}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"[{name}]", json.dumps({k: v for k, v in out.items() if k in ("step_s", "tokens_per_s", "error")}))


# -- phases --------------------------------------------------------------------------------
def phase_ideal(args: argparse.Namespace) -> None:
    dev = device_of(args)
    out: dict[str, Any] = {"rates": rates(dev, args.adam_probe)}
    rows = args.micro
    for layers in args.truncate:
        cfg = shape(args, layers)
        model = init_model(cfg, dev, host=False)
        opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=dev.type == "cuda")
        batches = data(cfg, rows, args.seq, dev)

        def fb(model: Any = model, batches: Any = batches) -> None:
            ids = next(batches)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()

        loop(fb, 2, dev)
        fb_s = loop(fb, 3, dev)
        opt.step()
        opt_s = loop(opt.step, 3, dev)
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
        out[str(layers)] = {"params": param_count(cfg), "fb_s": fb_s, "opt_s": opt_s, "peak_gpu": peak}
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
    save(args, "ideal", out)


def rates(dev: torch.device, adam_probe: int) -> dict[str, float]:
    """Pinned H2D/D2H GB/s and fused CPU AdamW params/s (the roofline's inputs)."""
    out: dict[str, float] = {"cpu_threads": torch.get_num_threads()}
    p = torch.zeros(adam_probe, requires_grad=True)
    p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW([p], **OPTIM, fused=True)
    opt.step()
    out["cpu_adamw_params_per_s"] = 3 * adam_probe / sum(loop(opt.step, 3, torch.device("cpu")))
    del p, opt
    if dev.type == "cuda":
        host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        for name, (dst, src) in {"h2d_gbps": (gpu, host), "d2h_gbps": (host, gpu)}.items():
            dst.copy_(src, non_blocking=True)
            out[name] = 5 * (1 << 30) / sum(loop(lambda d=dst, s=src: d.copy_(s, non_blocking=True), 5, dev)) / 1e9
    return out


def phase_carina(args: argparse.Namespace) -> None:
    import carina.offload as co

    dev = device_of(args)
    watch = HostWatch()
    cfg = shape(args)
    t0 = time.perf_counter()
    model = init_model(cfg, dev, host=True)
    init_s = time.perf_counter() - t0
    accum = max(1, args.tokens // (args.micro * args.seq))
    opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=True)
    budget = int(0.9 * args.cap * GiB) if args.cap else None
    ocfg = co.Config(
        device=str(dev),
        device_budget=budget,
        host_budget=int(args.host_budget * 1e9) if args.host_budget else None,
        compute_dtype="bfloat16" if dev.type == "cuda" else args.cpu_dtype,
        grad_accumulation=accum,
        cpu_optimizer_threads=args.optim_threads,
        grad_fold=args.grad_fold,
        param_cast=args.param_cast,
        step_barrier=args.step_barrier,
        step_timing=True,  # the step's split into compute, waits and the optimizer (carina.offload.timing)
        resident=args.resident,
        micro_batch_tokens=args.micro * args.seq,
        head_chunk_tokens=args.head_chunk_tokens,
        **getattr(args, "nvme", {}),
    )
    t0 = time.perf_counter()
    model, opt = co.wrap(model, ocfg, optimizer=opt)
    wrap_s = time.perf_counter() - t0
    cap(dev, args.cap)
    handle = co.handle_of(model)
    batches = data(cfg, args.micro, args.seq, dev)
    losses: list[float] = []

    def step() -> None:
        for _ in range(accum):
            ids = next(batches)
            if args.head_chunk_tokens:  # the head and loss in chunks (carina.offload.chunkloss)
                loss = co.chunked_lm_loss(model, ids, chunk_tokens=args.head_chunk_tokens)
            else:
                loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))

    profile_s = loop(step, ocfg.profile_steps, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    handle.store.reset_peaks()
    watch.mark()  # from here: the planned steps
    loop(step, 1, dev)
    moved0 = dict(handle.stats().moved)
    times = loop(step, args.steps, dev)
    handle.synchronize()  # the last step's trailing block updates (step() may return before them)
    st = handle.stats()
    from carina.offload.timing import summarize

    splits = handle.step_times()[-args.steps :]
    out = {
        "tokens": args.tokens,
        "accum": accum,
        "step_s": statistics.median(times),
        "times": times,
        "tokens_per_s": args.tokens / statistics.median(times),
        "profile_s": profile_s,
        "init_s": init_s,
        "wrap_s": wrap_s,
        "losses": losses,
        "head_chunk_tokens": args.head_chunk_tokens,  # 0: the plain loss, model(..., labels=...).loss
        "params": param_count(cfg),
        "layers": cfg.num_hidden_layers,
        "peak_gpu_allocated": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
        "peak_gpu_reserved": torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else 0,
        "ledger_peak": st.peak,
        "pinned_slab_bytes": handle.runtime.pinned_bytes,
        "moved_per_step": {k: (v - moved0.get(k, 0)) / args.steps for k, v in st.moved.items()},
        "plan": handle.plan.summary() if handle.plan else None,
        "hardware": vars(opt.hardware) if opt.hardware else None,
        "config": ocfg.to_dict(),
        "host": watch.report(),
        "step_split": summarize(splits),
        "step_splits": splits,
    }
    offloaded = handle.plan is not None and handle.plan.mode.value == "offload"  # (resident: no CPU optimizer)
    if args.prefix != "spill_" and offloaded:  # (re-stepping spilled blocks would add their disk traffic twice)
        out["optim_rates"] = optim_rates(handle, splits)
    out.update(getattr(args, "extra", {}))
    handle.close()
    handle.store.close()  # removes the NVMe tier's file
    save(args, f"{args.prefix}carina_{args.tokens}", out)


def optim_rates(handle: Any, splits: list[dict[str, float]]) -> dict[str, float]:
    """The CPU optimizer's update rate in the timed steps vs the same updates alone, same process and params.

    After the timed steps every block is updated once more (same masters, last gradients, state)
    on the worker thread (its own thread count) and once on a fresh thread with all of PyTorch's
    intra-op threads, nothing else running; the step timer's host totals give the rates.
    """
    from carina.offload.worker import optimizer_worker

    rt, opt = handle.runtime, handle.optimizer
    upd = sum(s.get("optim_update_s", 0.0) for s in splits)
    params = sum(s.get("optim_params", 0.0) for s in splits)
    out = {"worker_threads": rt.optim_threads, "intra_op_threads": torch.get_num_threads()}
    out["in_training_gparams"] = params / upd / 1e9 if upd else 0.0
    rt.timer.take_host()
    full = optimizer_worker(torch.get_num_threads())
    for name, ex in (("alone_worker_gparams", rt.worker), ("alone_all_threads_gparams", full)):
        t0 = time.perf_counter()
        for g in rt.blocks:
            ex.submit(opt.step_group, g).result()
        host = rt.timer.take_host()
        out[name] = host.get("optim_params", 0.0) / max(host.get("optim_update_s", 0.0), 1e-9) / 1e9
        out[name.replace("gparams", "wall_s")] = time.perf_counter() - t0
        out[name.replace("gparams", "cast_s")] = host.get("optim_cast_s", 0.0)
    full.shutdown()
    return out


def phase_fsdp2(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    dev = device_of(args)
    if dev.type != "cuda":
        save(args, f"fsdp2_{args.tokens}", {"error": "CPUOffloadPolicy offloads from a CUDA device"})
        return
    watch = HostWatch()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl", rank=0, world_size=1)
    cfg = shape(args)
    model = init_model(cfg, dev, host=True)
    model.gradient_checkpointing_enable()
    cap(dev, args.cap)
    kwargs = {
        "mesh": init_device_mesh("cuda", (1,)),
        "offload_policy": CPUOffloadPolicy(pin_memory=True),
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    }
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=True)
    batches = data(cfg, args.tokens // args.seq, args.seq, dev)

    def step() -> None:
        ids = next(batches)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    loop(step, 1, dev)
    times = loop(step, args.steps, dev)
    out = {
        "step_s": statistics.median(times),
        "times": times,
        "tokens_per_s": args.tokens / statistics.median(times),
        "peak_gpu_reserved": torch.cuda.max_memory_reserved(dev),
        "host": watch.report(),
        "settings": "fully_shard per decoder layer + root, CPUOffloadPolicy(pin_memory=True), bf16 params / "
        "fp32 reduce, HF gradient checkpointing, torch.optim.AdamW(fused=True) on the CPU, one micro-batch",
    }
    save(args, f"fsdp2_{args.tokens}", out)
    dist.destroy_process_group()


def _plain(args: argparse.Namespace, cfg: Any, dev: torch.device, accum: int) -> dict[str, Any]:
    """Plain PyTorch, everything on the device, the same micro-batches (the model is freed on return)."""
    model = init_model(cfg, dev, host=False)
    opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=dev.type == "cuda")
    batches = data(cfg, args.micro, args.seq, dev)

    def step() -> None:
        for _ in range(accum):
            ids = next(batches)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()

    try:
        loop(step, 2, dev)
        times = loop(step, args.steps, dev)
    except torch.OutOfMemoryError as exc:
        return {"error": "out of memory: " + str(exc).splitlines()[0][:200]}
    median = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    return {"step_s": median, "times": times, "tokens_per_s": args.tokens / median, "peak_gpu": peak}


def phase_notax(args: argparse.Namespace) -> None:
    """3B, no budget: plain PyTorch (everything on the GPU) vs carina, same micro-batches."""
    dev = device_of(args)
    accum = max(1, args.tokens // (args.micro * args.seq))
    plain = _plain(args, shape(args), dev, accum)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    save(args, f"notax_plain_{args.tokens}", plain)
    args.cap, args.prefix, args.resident = None, "notax_", "auto"
    phase_carina(args)


def disk_rates(directory: str, nbytes: int = 1 << 30, pieces: int = 8, rounds: int = 2) -> dict[str, float]:
    """Write, read and mixed GB/s of the NVMe tier in ``directory`` (carina.memory over carina.io).

    ``pieces`` tensors in flight at once, as the spill keeps them (one tensor at a time measured
    0.66 GB/s on the H200 in session 5 while the spill itself moved 2.1 GB/s), best of ``rounds``.
    ``mixed_gbps`` is what the spill does: ``nbytes`` written while the ``nbytes`` written before are
    read back, both counted (session 8's 7B spill moved its 94 GB at the read rate, not at the 1 GiB
    write rate: this tells a shared device from an unsustained write rate).
    """
    from carina.memory.nvme import NvmeTier

    tier = NvmeTier(directory, 3 * nbytes)
    write = read = mixed = 0.0
    try:
        srcs = [torch.full((nbytes // pieces // 4,), float(k)) for k in range(pieces)]
        outs = [torch.empty_like(x) for x in srcs]
        for _ in range(rounds):
            t0 = time.perf_counter()
            written = [tier.write(x) for x in srcs]
            for _, fut in written:
                fut.result()
            write = max(write, nbytes / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            for fut in [tier.read(ext, out) for (ext, _), out in zip(written, outs, strict=True)]:
                fut.result()
            read = max(read, nbytes / (time.perf_counter() - t0) / 1e9)
            assert all(torch.equal(x, y) for x, y in zip(srcs, outs, strict=True)), "NVMe tier read back other bytes"
            t0 = time.perf_counter()
            again, reads = [], []
            for (ext, _), src, out in zip(written, srcs, outs, strict=True):  # interleaved, as the spill issues them
                reads.append(tier.read(ext, out))
                again.append(tier.write(src))
            for fut in [*reads, *(f for _, f in again)]:
                fut.result()
            mixed = max(mixed, 2 * nbytes / (time.perf_counter() - t0) / 1e9)
            assert all(torch.equal(x, y) for x, y in zip(srcs, outs, strict=True)), "NVMe tier read back other bytes"
            for ext, _ in [*written, *again]:
                tier.free(ext)
    finally:
        tier.close()
    return {"write_gbps": write, "read_gbps": read, "mixed_gbps": mixed, "bytes": nbytes, "pieces": pieces,
            "rounds": rounds, "path": directory}  # fmt: skip


def phase_spill(args: argparse.Namespace) -> None:
    """carina with optimizer state of ``--spill-blocks`` blocks short of host RAM: it spills to NVMe."""
    import carina.offload as co
    from carina.offload.api import static_profile
    from carina.offload.simulator import BlockPlan, host_bytes

    Path(args.nvme_path).mkdir(parents=True, exist_ok=True)
    disk = disk_rates(args.nvme_path, args.disk_probe)
    cfg = shape(args)
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        meta = LlamaForCausalLM(cfg)
    base = co.Config(compute_dtype="bfloat16", grad_accumulation=max(1, args.tokens // (args.micro * args.seq)))
    prof = static_profile(meta, base)
    need, _ = host_bytes(prof, tuple(BlockPlan(cast_on_device=True) for _ in prof.blocks))
    block_state = prof.blocks[0].numel * prof.state_bytes_per_param
    host_budget = need - args.spill_blocks * block_state + block_state // 4
    args.host_budget = host_budget / 1e9
    args.nvme = {
        "nvme_path": Path(args.nvme_path),
        # room to write a block's new state before its old extent is freed, within the disk's free space
        "nvme_budget": min(
            2 * (args.spill_blocks + 1) * block_state, shutil.disk_usage(args.nvme_path).free - (2 << 30)
        ),
        "disk_gbps": min(disk["write_gbps"], disk["read_gbps"]),
    }
    args.prefix = "spill_"
    args.extra = {"disk": disk, "host_need_unspilled": need, "spill_blocks_asked": args.spill_blocks}
    phase_carina(args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["ideal", "carina", "fsdp2", "notax", "spill", "report"])
    ap.add_argument("--work", required=True, help="folder for the phases' JSON")
    ap.add_argument("--out", default="", help="report: folder for the records")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--truncate", default="4,8", help="ideal: layer counts measured")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cap", type=float, default=24.0, help="GPU cap in GiB (carina plans 90%% of it)")
    ap.add_argument("--host-budget", type=float, default=110.0, help="carina's host budget in GB (0: none)")
    ap.add_argument("--adam-probe", type=int, default=1 << 28, help="params in the CPU AdamW rate probe")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tag", default="7b16l", help="report: record name part")
    ap.add_argument("--prefix", default="", help="name prefix of the phase's JSON")
    ap.add_argument("--optim-threads", type=int, default=0, help="carina's CPU optimizer threads (0: auto)")
    ap.add_argument("--report-tokens", default="8192,32768", help="report: carina configurations")
    ap.add_argument("--grad-fold", default="auto", help="carina's grad_fold (auto, host, device)")
    ap.add_argument("--param-cast", default="auto", help="carina's param_cast (auto, host, device)")
    ap.add_argument("--step-barrier", action="store_true", help="carina's step_barrier (default here: off)")
    ap.add_argument("--resident", default="auto", help="carina's resident mode (auto, on, off; notax: auto)")
    ap.add_argument(
        "--head-chunk-tokens",
        type=int,
        default=0,
        help="carina: the loss through carina.offload.chunked_lm_loss in chunks of N tokens (0: plain)",
    )
    ap.add_argument("--cpu-dtype", default="float32", help="carina's compute dtype with --device cpu")
    ap.add_argument("--spill-blocks", type=int, default=2, help="spill: blocks' optimizer state short of host RAM")
    ap.add_argument("--nvme-path", default="/tmp/carina_nvme", help="spill: the NVMe tier's directory")
    ap.add_argument("--environment-from", default="", help="report: a device record whose environment to keep")
    ap.add_argument("--ideal-from", default="", help="report: an ideal.json from an earlier run (named as such)")
    ap.add_argument("--ideal-source", default="", help="report: how --ideal-from's run is named in the records")
    ap.add_argument("--spill-tag", default="7b4l", help="report: record name part of the spill row")
    ap.add_argument("--disk-probe", type=int, default=1 << 30, help="spill: bytes of the disk rate probe")
    args = ap.parse_args()
    args.truncate = [int(x) for x in args.truncate.split(",")]
    args.report_tokens = [int(x) for x in args.report_tokens.split(",") if x]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.phase == "report":
        from report_s2 import report

        report(args)
        return
    phases = {"ideal": phase_ideal, "carina": phase_carina, "fsdp2": phase_fsdp2, "notax": phase_notax}
    phases["spill"] = phase_spill
    phases[args.phase](args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
