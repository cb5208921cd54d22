"""carina and each peer, set up as its own documentation recommends, behind one signature.

``run(spec) -> RunResult``. A system that cannot run a configuration returns a result with
``status="unavailable"`` (not installed, needs a GPU) or ``"failed"`` (out of memory at this
budget, a crash) and the reason, never nothing.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from workload import (
    OPTIM,
    RunResult,
    RunSpec,
    build_model,
    cap_gpu,
    host_rss_now,
    n_params,
    resolve_device,
    split,
    timed_loop,
)


def _autocast(device: str) -> Any:
    import torch

    return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))


def _hf_step(model: Any, optimizer: Any, device: str) -> Callable[[tuple[Any, ...]], float]:
    """The user's loop with gradient accumulation: ``loss / n`` backward per micro-batch, one optimizer step.

    Returns the step's loss: the mean of its micro-batches' losses.
    """

    def step(micro: tuple[Any, ...]) -> float:
        total = 0.0
        for cpu_tokens in micro:
            tokens = cpu_tokens.to(device)
            with _autocast(device):
                loss = model(input_ids=tokens, labels=tokens).loss
            (loss / len(micro)).backward()
            total += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / len(micro)

    return step


def run_plain(spec: RunSpec, *, checkpointing: bool = False) -> RunResult:
    """Plain PyTorch: everything on the device (the unlimited-memory ideal when it fits)."""
    import torch

    device = resolve_device(spec.device)
    cap_gpu(spec, device)
    model = build_model(spec, device=device, checkpointing=checkpointing)
    opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=device.startswith("cuda"))
    result = timed_loop(spec, _hf_step(model, opt, device), device)
    result.settings = {"optimizer": "torch.optim.AdamW (fused on CUDA)", "compute": "bf16 autocast on CUDA"}
    if checkpointing:
        result.settings["activation_checkpointing"] = "HF gradient_checkpointing_enable()"
    return result


def run_plain_checkpointed(spec: RunSpec) -> RunResult:
    """Plain PyTorch with HF activation checkpointing: the loss reference where plain's activations do not fit.

    The same math (the forward is recomputed in backward), so the same losses within bf16 rounding;
    never the ideal (the recompute costs time).
    """
    return run_plain(spec, checkpointing=True)


def _carina_host_budget(spec: RunSpec, device: str) -> dict[str, int | None]:
    """``host_budget`` for a whole-process host limit, the way docs/offload.md says to pass one.

    The configuration's host budget bounds the process's peak RSS (the peers' rows are judged by it), and
    carina's ``host_budget`` covers only what carina holds: ``limit - baseline - margin``. Called before
    the model is built: the baseline is the process's RSS after a first CUDA matmul (the context and
    cuBLAS load then), the libraries and CUDA without the model, whose tensors ``wrap`` moves into
    carina's buffers (a model mapped from the weights cache is not resident yet, so subtracting its bytes
    afterwards, as ``process_baseline`` does, would undercount). The margin is for what the allocators
    keep (s13 H100: RSS passed its plan by 1.87 GB, 0.91 GB of it the process before CUDA;
    ``PEERS_CARINA_HOST_MARGIN_GIB``, default 1.5). On the CPU the model and its activations are host
    memory too, so the budget is passed as given (the ``ci-spill`` preset's tiny one).
    """
    import torch

    from carina.offload.hostmem import process_rss

    limit = int(spec.host_budget_gib * 2**30) if spec.host_budget_gib else None
    if limit is None or not device.startswith("cuda"):  # on the CPU the model itself is host memory: as given
        return {"host_budget": limit, "limit": limit, "process_baseline": None, "margin": None}
    a = torch.ones(256, 256, device=device, dtype=torch.bfloat16)
    (a @ a).sum().item()
    baseline = process_rss() or 0
    margin = int(float(os.environ.get("PEERS_CARINA_HOST_MARGIN_GIB", "1.5")) * 2**30)
    return {"host_budget": limit - baseline - margin, "limit": limit, "process_baseline": baseline, "margin": margin}


def run_carina(spec: RunSpec) -> RunResult:
    """carina.offload.wrap with the same budget."""
    import torch

    import carina.offload as co
    from carina.offload.timing import summarize

    device = resolve_device(spec.device)
    host = _carina_host_budget(spec, device)  # before the model exists: the process without it
    model = build_model(spec, device="cpu")
    # where host memory goes, phase by phase (the s13 spill row's peak RSS passed the host budget)
    rss = {"built": host_rss_now()}
    # carina plans within 90% of the cap (it keeps its own allocator headroom inside that).
    fraction = float(os.environ.get("PEERS_CARINA_PLAN_FRACTION", "0.9"))  # a diagnostic knob of this harness
    budget = int(fraction * spec.gpu_budget_gib * 2**30) if spec.gpu_budget_gib else None
    rss["baseline"] = host
    cfg = co.OffloadConfig(
        device=device,
        device_budget=budget,
        host_budget=host["host_budget"],
        nvme_path=spec.nvme_path,
        nvme_budget=_nvme_room(spec.nvme_path),
        grad_accumulation=spec.micro_batches,  # the user's loop below: loss / n backward per micro-batch
        # bf16 weights on the device (fp32 masters on the host), as FSDP2's bf16 param policy; fp32 on the CPU.
        compute_dtype=co.ComputeDtype.BFLOAT16 if device.startswith("cuda") else co.ComputeDtype.AUTO,
        step_timing=True,  # the phase split of each step (CUDA events; cheap), kept in the record
    )
    extra = os.environ.get("PEERS_CARINA_CONFIG", "")  # a diagnostic knob of this harness: JSON merged into cfg
    if extra:
        cfg = co.OffloadConfig.from_dict({**cfg.to_dict(), **json.loads(extra)})
    model, opt = co.wrap(model, cfg, optimizer=torch.optim.AdamW(model.parameters(), **OPTIM))
    rss["wrapped"] = host_rss_now()
    cap_gpu(spec, device)
    handle = co.handle_of(model)
    try:
        result = timed_loop(spec, _hf_step(model, opt, device), device)
        rss["trained"] = host_rss_now()
    except torch.OutOfMemoryError:  # say which plan (or the profiling step) ran out, then fail as usual
        plan = handle.plan
        print(
            "carina plan at failure:",
            json.dumps(plan.summary(), default=str) if plan else "profiling step",
            file=sys.stderr,
        )
        raise
    result.settings = {
        "config": cfg.to_dict(),
        "plan_budget": f"{fraction:.0%} of the cap",
        "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "plan": handle.plan.summary() if handle.plan is not None else None,
        # steps timed that were still carina's profiling steps (0 when warmup > profile_steps)
        "profiling_steps_timed": max(0, cfg.profile_steps - spec.warmup),
        "step_split": summarize(handle.step_times()[-spec.steps :]),
        "host_rss_phases": rss,
    }
    return result


def _init_single_process_group(device: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=0, world_size=1)


def run_fsdp2_cpu_offload(spec: RunSpec) -> RunResult:
    """FSDP2 fully_shard per decoder layer with CPUOffloadPolicy, world size 1, fused CPU AdamW."""
    import torch

    device = resolve_device(spec.device)
    if not device.startswith("cuda"):
        return RunResult(spec=spec, status="unavailable", reason="CPUOffloadPolicy offloads from a CUDA device")
    cap_gpu(spec, device)
    model = fsdp2_model(spec, device)
    opt = torch.optim.AdamW(model.parameters(), **OPTIM, fused=True)
    result = timed_loop(spec, _hf_step(model, opt, device), device)
    result.settings = {
        "activation_checkpointing": "HF gradient_checkpointing_enable()",
        "fully_shard": "per decoder layer + root",
        "offload": "CPUOffloadPolicy(pin_memory=True)",
        "mp": "bf16 params, fp32 reduce",
        "optimizer": "torch.optim.AdamW(fused=True) on CPU",
    }
    return result


def fsdp2_model(spec: RunSpec, device: str, *, offload: bool = True) -> Any:
    """The model of ``spec`` under ``fully_shard`` per decoder layer and the root, world size 1.

    ``offload`` (CUDA): CPUOffloadPolicy and bf16 parameters with fp32 reduction. Without it (a gloo
    CPU mesh, fp32) the same wrapping and loop run on a CPU, which is how the tests check FSDP2's
    accumulation against plain PyTorch.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    _init_single_process_group(device)
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (1,))
    model = build_model(spec, device="cpu", checkpointing=True)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def run_torchao_cpu_offload(spec: RunSpec, *, offload_gradients: bool = False) -> RunResult:
    """torchao's CPUOffloadOptimizer: weights on the GPU, AdamW states and step on the CPU."""
    import torch

    device = resolve_device(spec.device)
    if not device.startswith("cuda"):
        return RunResult(spec=spec, status="unavailable", reason="CPUOffloadOptimizer needs a CUDA device")
    from torchao.optim import CPUOffloadOptimizer

    cap_gpu(spec, device)
    model = build_model(spec, device=device, checkpointing=True)
    opt = CPUOffloadOptimizer(
        model.parameters(), torch.optim.AdamW, offload_gradients=offload_gradients, fused=True, **OPTIM
    )
    result = timed_loop(spec, _hf_step(model, opt, device), device)
    what = (
        "fp32 weights (gradients freed once copied to the CPU)" if offload_gradients else "fp32 weights and gradients"
    )
    result.settings = {
        "optimizer": "CPUOffloadOptimizer(torch.optim.AdamW, fused=True), torchao " + _version("torchao"),
        "offload_gradients": offload_gradients,
        "on_the_gpu": f"{what} ({_resident_note(spec)})",
        "activation_checkpointing": "HF gradient_checkpointing_enable()",
    }
    return result


def run_torchao_cpu_offload_grads(spec: RunSpec) -> RunResult:
    """torchao's CPUOffloadOptimizer with ``offload_gradients=True`` (its documented saving without accumulation)."""
    return run_torchao_cpu_offload(spec, offload_gradients=True)


def run_deepspeed_zero3_offload(spec: RunSpec) -> RunResult:
    """DeepSpeed ZeRO-3 with offload_param and offload_optimizer to CPU (ZeRO-Offload), DeepSpeedCPUAdam."""
    from systems_deepspeed import run_deepspeed

    return run_deepspeed(spec, nvme=False)


def run_deepspeed_zero_infinity(spec: RunSpec) -> RunResult:
    """DeepSpeed ZeRO-Infinity: parameters and optimizer states on NVMe."""
    from systems_deepspeed import run_deepspeed

    return run_deepspeed(spec, nvme=True)


SYSTEMS: dict[str, Callable[[RunSpec], RunResult]] = {
    "plain": run_plain,
    "plain_checkpointed": run_plain_checkpointed,
    "carina": run_carina,
    "deepspeed_zero3_offload": run_deepspeed_zero3_offload,
    "deepspeed_zero_infinity": run_deepspeed_zero_infinity,
    "fsdp2_cpu_offload": run_fsdp2_cpu_offload,
    "torchao_cpu_offload": run_torchao_cpu_offload,
    "torchao_cpu_offload_grads": run_torchao_cpu_offload_grads,
}


_ON_GPU = {  # bytes per parameter a system keeps on the GPU, and what they are
    "plain": (16, "fp32 weights, gradients and both AdamW states"),
    "plain_checkpointed": (16, "fp32 weights, gradients and both AdamW states"),
    "torchao_cpu_offload": (8, "fp32 weights and gradients"),
    "torchao_cpu_offload_grads": (4, "fp32 weights"),
}


def _resident_note(spec: RunSpec) -> str:
    """What a system that keeps fp32 state on the GPU needs there, against the cap."""
    per, what = _ON_GPU[spec.system]
    cap = f"the {spec.gpu_budget_gib:g} GiB cap" if spec.gpu_budget_gib else "no cap"
    n = n_params(spec)
    return f"{what} take {per} B x {n / 1e9:.2f}B parameters = {per * n / 2**30:.1f} GiB, against {cap}"


_HOST_NEED = {  # systems without an NVMe tier: bytes per parameter they keep in host memory, and what they are
    "deepspeed_zero3_offload": "fp32 master weights, fp32 gradients and both AdamW states in pinned CPU memory",
    "fsdp2_cpu_offload": "fp32 sharded weights, fp32 gradients and both AdamW states on the CPU",
    "torchao_cpu_offload": "pinned fp32 host copies of weights and gradients, and both AdamW states",
    "torchao_cpu_offload_grads": "pinned fp32 host copies of weights and gradients, and both AdamW states",
}

ACCUMULATION = {  # how each system accumulates gradients over a step's micro-batches (its documented way)
    "plain": "loss / n backward per micro-batch, one optimizer.step()",
    "carina": "Config(grad_accumulation=n); the user's loop: loss / n backward per micro-batch, one step()",
    "deepspeed_zero3_offload": "gradient_accumulation_steps=n in the config; engine.backward(loss) and "
    "engine.step() per micro-batch (DeepSpeed divides by n and steps the optimizer at the boundary)",
    "fsdp2_cpu_offload": "loss / n backward per micro-batch, one optimizer.step(); gradients reduced to the "
    "CPU every micro-batch (set_requires_gradient_sync(False) would keep every layer's unsharded fp32 "
    "gradients on the GPU)",
    "torchao_cpu_offload": "loss / n backward per micro-batch (the hook copies the summed gradient again), "
    "one optimizer.step()",
    "torchao_cpu_offload_grads": "none: offload_gradients frees GPU gradients, which accumulation needs",
}
ACCUMULATION["deepspeed_zero_infinity"] = ACCUMULATION["deepspeed_zero3_offload"]
ACCUMULATION["plain_checkpointed"] = ACCUMULATION["plain"]


def _host_budget_reason(spec: RunSpec) -> str | None:
    """Why a system without an NVMe tier cannot run under the configuration's host budget (None: it may)."""
    if spec.host_budget_gib is None or spec.system not in _HOST_NEED:
        return None
    need = 16 * n_params(spec)
    if need <= spec.host_budget_gib * 2**30:
        return None
    from carina.memory.tiers import format_bytes

    return (
        f"no NVMe tier: at least 16 B x {n_params(spec) / 1e9:.3g}B parameters = {format_bytes(need)} of host "
        f"memory ({_HOST_NEED[spec.system]}), over the {spec.host_budget_gib:g} GiB host budget"
    )


def static_reason(spec: RunSpec) -> str | None:
    """Why ``spec``'s system cannot run its configuration, known without running it (None: it may run).

    The harness writes these rows without starting a process; ``run`` gives the same reasons.
    """
    if spec.system == "torchao_cpu_offload_grads" and spec.micro_batches > 1:  # torchao's docstring says so
        return "offload_gradients is not compatible with gradient accumulation (torchao's CPUOffloadOptimizer docs)"
    return _host_budget_reason(spec)


def _nvme_room(path: str | None) -> int:
    """carina's NVMe budget: the disk's free space less 2 GiB, at most 200 GiB (0 without a path)."""
    import shutil

    if not path:
        return 0
    return max(0, min(200 << 30, shutil.disk_usage(path).free - (2 << 30)))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _oom_detail(message: str) -> str:
    """The allocator's own words plus where the memory was, so a failed row says why."""
    import torch

    first = message.splitlines()[0][:600]
    if not torch.cuda.is_available():
        return first
    stats = torch.cuda.memory_stats()
    gib = 2**30
    return (
        f"{first} [at failure: allocated {stats.get('allocated_bytes.all.current', 0) / gib:.2f} GiB, "
        f"reserved {stats.get('reserved_bytes.all.current', 0) / gib:.2f} GiB, "
        f"peak allocated {stats.get('allocated_bytes.all.peak', 0) / gib:.2f} GiB, "
        f"segments {stats.get('segment.all.current', 0)}]"
    )


def run(spec: RunSpec) -> RunResult:
    """Run ``spec``; turn a missing package or a crash into a result that says why."""
    import shutil

    import torch

    free_before = shutil.disk_usage(spec.nvme_path).free if spec.nvme_path else None
    try:
        reason = static_reason(spec)
        result = RunResult(spec=spec, status="unavailable", reason=reason) if reason else SYSTEMS[spec.system](spec)
    except ImportError as exc:
        result = RunResult(spec=spec, status="unavailable", reason=f"not installed: {exc.name or exc}")
    except torch.OutOfMemoryError as exc:
        traceback.print_exc()
        why = f"; {_resident_note(spec)}" if spec.system in _ON_GPU else ""
        result = RunResult(spec=spec, status="failed", reason="out of memory" + why + ": " + _oom_detail(str(exc)))
    except Exception as exc:
        last = traceback.format_exc().strip().splitlines()[-1]
        result = RunResult(spec=spec, status="failed", reason=f"{type(exc).__name__}: {last[:300]}")
    result.versions["torch"] = torch.__version__
    return _annotate(result, free_before)


def static_result(spec: RunSpec) -> RunResult | None:
    """``run(spec)``'s result where ``static_reason`` knows it without running (None: run it).

    For the harness, which writes these rows without starting a process.
    """
    import shutil

    reason = static_reason(spec)
    if reason is None:
        return None
    free_before = shutil.disk_usage(spec.nvme_path).free if spec.nvme_path else None
    result = RunResult(spec=spec, status="unavailable", reason=reason)
    result.versions["torch"] = _version("torch")
    return _annotate(result, free_before)


def _annotate(result: RunResult, free_before: int | None) -> RunResult:
    """What every result carries, whether it ran or not: versions, the split, the host budget, the disk."""
    spec = result.spec
    result.versions["transformers"] = _version("transformers")
    result.settings["gradient_accumulation"] = split(spec) | {"how": ACCUMULATION[spec.system]}
    if spec.host_budget_gib is not None:
        result.settings["host_budget_gib"] = spec.host_budget_gib
    if spec.nvme_path:
        result.settings["nvme"] = {"path": spec.nvme_path, "disk_free_bytes_before": free_before}
    return result
