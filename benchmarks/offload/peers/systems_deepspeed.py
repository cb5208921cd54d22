"""DeepSpeed ZeRO-3 with CPU offload (ZeRO-Offload) and with NVMe (ZeRO-Infinity), one process.

Set up as DeepSpeed's documentation recommends (the ZeRO-3 offload and ZeRO-Infinity tutorials and the
config reference, with the Hugging Face integration's hidden-size rules for the bucket sizes):
``offload_param`` and ``offload_optimizer`` to pinned CPU memory (or NVMe), the optimizer given as
``AdamW`` so that DeepSpeed picks its own DeepSpeedCPUAdam for the offloaded states, ``bf16`` on, HF
per-layer activation checkpointing, no gradient clipping (as every system here), world size 1 with the
torch.distributed environment set in this process. The aio block size and queue depth are DeepSpeed's
defaults (its ``ds_nvme_tune`` sweep needs more time than a lane has); all of it is in the record.

The model is built on the CPU from the shared seed, the same weights as every other system, and
``deepspeed.initialize`` partitions it. ``deepspeed.zero.Init`` would initialise each weight on the
GPU with another random stream: the H100 session-1 row started at loss 10.546 where every other
system started at 10.797, which no loss check could compare.
"""

from __future__ import annotations

import os
from typing import Any

from workload import OPTIM, RunResult, RunSpec, build_model, cap_gpu, llama_config, resolve_device, split, timed_loop

_MATRICES_PER_LAYER = 7  # a Llama decoder layer: q, k, v, o, gate, up, down (the norms stay on the GPU)


def _offload_targets(spec: RunSpec, nvme: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``offload_param`` and ``offload_optimizer``: pinned CPU memory, or NVMe with buffers sized to the model."""
    if not nvme:
        return {"device": "cpu", "pin_memory": True}, {"device": "cpu", "pin_memory": True}
    common = {"device": "nvme", "nvme_path": spec.nvme_path, "pin_memory": True}
    # The config reference: ``buffer_size`` must hold the largest parameter (the tutorial's 1e8 elements is
    # under the 32000 x 4096 embedding: DeepSpeed asserts "More elements ... than buffer size", H100 s13).
    cfg = llama_config(spec)
    largest = max(cfg.vocab_size, cfg.intermediate_size) * cfg.hidden_size
    # ``buffer_count``: the tutorial's 5 ran out on the H100 in s14 ("Not enough buffers 0 for swapping 1",
    # DeepSpeed issue #3062): its prefetcher may take every free buffer (``partitioned_param_coordinator``
    # stops at the free count or at twice the numel in flight), so a layer's fetch outside the trace finds
    # none. Two decoder layers' matrices (7 each) plus the embedding and the head keep one layer's fetch
    # and the next one's prefetch in buffers at once (16 x 131M bf16 = 4.2 GB pinned at the 7B shape).
    param = common | {
        "buffer_count": 2 * _MATRICES_PER_LAYER + 2,
        "buffer_size": max(int(1e8), largest),
        "max_in_cpu": int(1e9),
    }
    optim = common | {"buffer_count": 4, "pipeline_read": False, "pipeline_write": False, "fast_init": False}
    return param, optim


def ds_config(spec: RunSpec, *, nvme: bool) -> dict[str, Any]:
    """The DeepSpeed config of ``spec`` (ZeRO-3; CPU offload, or NVMe when ``nvme``)."""
    hidden = llama_config(spec).hidden_size
    param, optim = _offload_targets(spec, nvme)
    return {
        # the step's sequences as ``micro_batches`` micro-batches: DeepSpeed's own gradient accumulation
        "train_micro_batch_size_per_gpu": split(spec)["sequences_per_micro_batch"],
        "gradient_accumulation_steps": spec.micro_batches,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",  # with offload_optimizer on the CPU DeepSpeed runs it as DeepSpeedCPUAdam
            "params": {
                "lr": OPTIM["lr"],
                "betas": list(OPTIM["betas"]),
                "eps": OPTIM["eps"],
                "weight_decay": OPTIM["weight_decay"],
            },
        },
        "zero_optimization": {
            "stage": 3,
            "offload_param": param,
            "offload_optimizer": optim,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": int(1e9),
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
            "stage3_max_live_parameters": int(1e9),
            "stage3_max_reuse_distance": int(1e9),
        },
        # DeepSpeed's aio defaults (deepspeed/runtime/swap_tensor/constants.py), used by NVMe offload.
        "aio": {
            "block_size": 1 << 20,
            "queue_depth": 8,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
            "use_gds": False,
        },
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _preflight_reason(nvme: bool) -> str | None:
    """Why DeepSpeed's ops cannot run here, from the lane's preflight record (None: they can, or unknown)."""
    from ds_preflight import load

    pre = load(os.environ.get("PEERS_DS_PREFLIGHT"))
    if pre is None:
        return None
    for op in ("cpu_adam", "async_io") if nvme else ("cpu_adam",):
        res = pre["ops"].get(op, {})
        if not res.get("ok"):
            return f"DeepSpeed {op} op unusable on this machine (preflight): {res.get('reason', 'no result')}"
    return None


def _init_dist(device: str) -> None:
    """World size 1: the torch.distributed environment DeepSpeed's launcher would set, then its init."""
    import deepspeed

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo", auto_mpi_discovery=False)


def run_deepspeed(spec: RunSpec, *, nvme: bool) -> RunResult:
    """Train ``spec`` with DeepSpeed ZeRO-3 offload (``nvme``: ZeRO-Infinity)."""
    if nvme and not spec.nvme_path:
        return RunResult(spec=spec, status="unavailable", reason="no nvme_path for ZeRO-Infinity")
    reason = _preflight_reason(nvme)
    if reason:
        return RunResult(spec=spec, status="unavailable", reason=reason)
    import deepspeed

    device = resolve_device(spec.device)
    cap_gpu(spec, device)
    _init_dist(device)
    config = ds_config(spec, nvme=nvme)
    model = build_model(spec, device="cpu", checkpointing=True)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())

    def step(micro: tuple[Any, ...]) -> float:  # DeepSpeed's loop: backward and step() every micro-batch
        total = 0.0
        for cpu_tokens in micro:
            tokens = cpu_tokens.to(engine.device)
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)  # scales by 1 / gradient_accumulation_steps
            engine.step()  # the optimizer steps at the accumulation boundary only
            total += float(loss.detach())
        return total / len(micro)

    result = timed_loop(spec, step, device)
    inner = getattr(optimizer, "optimizer", optimizer)
    result.settings = {
        "deepspeed_config": config,
        "optimizer_class": f"{type(inner).__module__}.{type(inner).__name__}",
        "zero_optimizer_class": type(optimizer).__name__,
        "model_construction": "on the CPU from the shared seed, partitioned by deepspeed.initialize",
        "activation_checkpointing": "HF gradient_checkpointing_enable()",
        "distributed": "world size 1, deepspeed.init_distributed in this process",
        "accelerator": _accelerator_name(),
    }
    result.versions["deepspeed"] = deepspeed.__version__
    result.versions["pydantic"] = _pydantic_version()
    return result


def _pydantic_version() -> str:
    import pydantic

    return str(pydantic.VERSION)


def _accelerator_name() -> str:
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().device_name())
