"""The harness's configurations: model shape, GPU cap, tokens per step and their micro-batch split, systems.

Every system of a preset runs the same configuration: the same model, tokens, cap, and the same split
of each step into micro-batches (``micro_batches``: tokens per step -> micro-batches, default 1), each
system accumulating gradients the way its documentation does. ``host_budget_gib`` (the spill
configurations) is the host memory the configuration allows; ``nvme`` presets need ``--nvme-path``.
``known`` (system -> a record under benchmarks/results/ in which it failed at this configuration) makes
that row ``not run`` with the earlier record named (earlier.py); ``system_budget`` gives a system its
own GPU cap; ``calibrate: False`` skips the roofline's bandwidth and CPU AdamW measurement.
"""

from __future__ import annotations

from typing import Any

from workload import RunSpec

PEERS = ["carina", "deepspeed_zero3_offload", "fsdp2_cpu_offload", "torchao_cpu_offload"]
# the spill configuration: carina and ZeRO-Infinity (NVMe); the peers without an NVMe tier are rows with the reason
SPILL_SYSTEMS = [
    "carina",
    "deepspeed_zero_infinity",
    "deepspeed_zero3_offload",
    "fsdp2_cpu_offload",
    "torchao_cpu_offload",
]
# the 7B shape truncated to 16 layers (3.50B parameters) under a 24 GiB cap, as S2; the ideal (plain uncapped,
# every system's loss reference) first, so that a lane cut short still checks the systems that ran
_7B16L: dict[str, Any] = {
    "shape": "7b",
    "layers": 16,
    "budget": 24.0,
    "seq_len": 2048,
    "warmup": 3,
    "ideal_first": True,
}
PRESETS: dict[str, dict[str, Any]] = {
    "ci": {
        "shape": "tiny",
        "tokens": [256],
        "budget": None,
        "seq_len": 64,
        "steps": 4,
        "warmup": 1,
        "systems": ["plain", *PEERS],
    },
    "ci-accum": {  # ci with each step as 2 micro-batches of 2 sequences: every system's accumulation on the CPU
        "shape": "tiny",
        "tokens": [256],
        "micro_batches": {256: 2},
        "budget": None,
        "seq_len": 64,
        "steps": 4,
        "warmup": 1,
        "systems": ["plain", *PEERS, "torchao_cpu_offload_grads"],
    },
    "ci-spill": {  # a small model whose blocks hold most parameters, a host budget under its optimizer state
        "shape": "small",
        "vocab": 256,  # (with 32000 the embedding and head, which never spill, would outweigh the blocks)
        "tokens": [256],
        "budget": None,
        "host_budget_gib": 0.009,  # optimizer state (fp32 masters + both AdamW states): 12 B x 0.86M = 0.0096 GiB
        "nvme": True,
        "seq_len": 64,
        "steps": 2,
        "warmup": 3,
        "systems": ["plain", *SPILL_SYSTEMS],
    },
    "h100": {
        "shape": "7b",
        "tokens": [8192, 32768, 131072],
        "budget": 24.0,
        "seq_len": 2048,
        "steps": 5,
        "warmup": 3,  # carina's 2 profiling steps and one planned step are not timed
        "systems": PEERS,
    },
    "h100-1b": {
        "shape": "1b",
        "tokens": [8192],
        "budget": 8.0,
        "seq_len": 2048,
        "steps": 3,
        "warmup": 3,  # carina's 2 profiling steps and one planned step are not timed
        "systems": ["plain", *PEERS],
    },
    "h200-1b": {  # the lane's one-run comparison: every peer at 1.1B / 8 GiB / 8k, plain uncapped as reference
        "shape": "1b",
        "tokens": [8192],
        "budget": 8.0,
        "seq_len": 2048,
        "steps": 3,
        "warmup": 3,
        "ideal_first": True,  # the loss reference before the systems: a lane cut short still checks them
        "systems": [*PEERS, "torchao_cpu_offload_grads"],
    },
    "h200-7b16l": {  # the 7B shape truncated to 16 layers (3.50B parameters), as S2: 24 GiB / 8k
        **_7B16L,
        "tokens": [8192],
        "steps": 2,  # as at 32k, where every system's two timed steps were within 3% of each other
        # both torchao rows ran out of memory at this configuration in session 5: not run again
        "known": {
            "torchao_cpu_offload_grads": "h200/offload_peers_s4_7b16l_8192tok_24g_torchao_cpu_offload_grads.json",
            "torchao_cpu_offload": "h200/offload_peers_s4_7b16l_8192tok_24g_torchao_cpu_offload.json",
        },
        "systems": [
            "carina",
            "deepspeed_zero3_offload",
            "fsdp2_cpu_offload",
            "torchao_cpu_offload_grads",
            "torchao_cpu_offload",
        ],
    },
    "h200-7b16l-32k": {  # the headline configuration at 16 of the 7B shape's 32 layers: 24 GiB / 32k
        **_7B16L,
        "tokens": [32768],  # one micro-batch of 16 sequences for every system (what carina's plan takes at 32k)
        "steps": 2,
        # torchao last: at 8k it ran out of memory for fp32 weights (and gradients) alone, which 32k only adds to
        "systems": ["carina", "deepspeed_zero3_offload", "fsdp2_cpu_offload", "torchao_cpu_offload_grads"],
        "known": {
            "torchao_cpu_offload_grads": "h200/offload_peers_s6_7b16l_32768tok_24g_torchao_cpu_offload_grads.json"
        },
    },
    "h200-7b16l-128k": {  # the 128k tokens per step at 16 layers: 24 GiB, 8 micro-batches of 16k
        **_7B16L,
        "tokens": [131072],
        # what `carina offload plan --model llama2-7b --layers 16 --tokens-per-step 131072 --device-budget 20.5GB`
        # takes (1 or 2 micro-batches do not fit); the same split for every system
        "micro_batches": {131072: 8},
        "steps": 1,  # one timed step of 8 micro-batches (~8-15 s) after the 3 warm-up steps carina's plan needs
        # torchao with offload_gradients cannot accumulate (its docs): an instant row, last
        "systems": ["carina", "deepspeed_zero3_offload", "fsdp2_cpu_offload", "torchao_cpu_offload_grads"],
    },
    "h200-7b16l-spill": {  # the spill configuration at 16 layers: 24 GiB, 8k, host budget under the optimizer state
        **_7B16L,
        "tokens": [8192],
        # optimizer state (fp32 masters + both AdamW states) 12 B x 3.50B = 39.1 GiB; carina's plan needs ~52 GiB
        # unspilled, so most blocks' AdamW state goes to NVMe (the issue's 7B / 64 GB example scaled to 16 layers)
        "host_budget_gib": 36.0,
        "nvme": True,
        "steps": 1,  # a disk-bound step (tens of seconds) for carina and ZeRO-Infinity: one timed step each
        "systems": SPILL_SYSTEMS,
    },
    "h200-3b-check": {  # the correctness check: every system a few steps on the 3B model
        "shape": "3b",  # 3.43B parameters; plain PyTorch fits the H200 uncapped (16 B a parameter: 51 GiB)
        "tokens": [4096],
        "budget": 12.0,  # under the bf16 weights and activations: carina streams, the peers offload
        "system_budget": {"torchao_cpu_offload": None},  # its fp32 weights and gradients (26 GiB) stay on the GPU
        "seq_len": 2048,
        "steps": 2,
        "warmup": 3,  # 5 losses (4 updates) against plain's, carina's 2 profiling and 2 planned steps among them
        "ideal_first": True,  # plain uncapped first: the loss reference
        "calibrate": False,  # no roofline: a correctness check
        "systems": ["carina", "fsdp2_cpu_offload", "deepspeed_zero3_offload", "torchao_cpu_offload"],
    },
    "ci-check": {  # h200-3b-check's CPU proof on the tiny model
        "shape": "tiny",
        "tokens": [256],
        "budget": None,
        "system_budget": {"torchao_cpu_offload": None},
        "seq_len": 64,
        "steps": 2,
        "warmup": 3,
        "ideal_first": True,
        "calibrate": False,
        "systems": ["carina", "fsdp2_cpu_offload", "deepspeed_zero3_offload", "torchao_cpu_offload"],
    },
    "h100-3b-check": {
        "shape": "3b",
        "tokens": [8192],
        "budget": None,
        "seq_len": 2048,
        "steps": 5,
        "warmup": 2,
        "systems": ["plain", *PEERS],
    },
}


def base_spec(preset: dict[str, Any], tokens: int, nvme_path: str | None) -> RunSpec:
    """The configuration of ``preset`` at ``tokens`` per step (system "plain"; the harness sets each system)."""
    return RunSpec(
        system="plain",
        shape=preset["shape"],
        layers=preset.get("layers"),
        tokens_per_step=tokens,
        seq_len=preset["seq_len"],
        gpu_budget_gib=preset["budget"],
        steps=preset["steps"],
        warmup=preset["warmup"],
        nvme_path=nvme_path,
        vocab=preset.get("vocab", 32000),
        micro_batches=preset.get("micro_batches", {}).get(tokens, 1),
        host_budget_gib=preset.get("host_budget_gib"),
    )
