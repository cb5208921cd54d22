"""The shared workload: Llama shapes built from configs (random init), synthetic tokens, a timed loop.

Every system (carina and each peer) trains the same model, on the same tokens, with the same
optimizer hyper-parameters (AdamW, lr 1e-4, betas 0.9/0.95, weight decay 0.1, no clipping),
and reports the same metrics.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, int]] = {
    # name: LlamaConfig fields. V=32000 (Llama-2 vocabulary) unless a preset sets RunSpec.vocab.
    "tiny": {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4},
    "small": {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4},
    "1b": {"hidden_size": 2048, "intermediate_size": 5504, "num_hidden_layers": 22, "num_attention_heads": 16},
    "3b": {"hidden_size": 3200, "intermediate_size": 8640, "num_hidden_layers": 26, "num_attention_heads": 32},
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32},
    "13b": {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40},
}
OPTIM: dict[str, Any] = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}


@dataclass
class RunSpec:
    """One (system, configuration) to run."""

    system: str
    shape: str = "tiny"
    layers: int | None = None  # override (layer truncation for the ideal)
    tokens_per_step: int = 256
    seq_len: int = 64
    gpu_budget_gib: float | None = None  # cap on the GPU's memory for this process
    steps: int = 6
    warmup: int = 2
    seed: int = 0
    device: str = "auto"
    nvme_path: str | None = None
    vocab: int = 32000
    micro_batches: int = 1  # gradient accumulation: backward passes per optimizer step (the step's rows split evenly)
    host_budget_gib: float | None = None  # host memory the configuration allows (the spill configuration)

    def __post_init__(self) -> None:
        from carina.core.errors import ConfigError

        rows = step_rows(self)
        if self.micro_batches < 1 or rows % self.micro_batches:
            raise ConfigError(
                f"micro_batches={self.micro_batches} must be >= 1 and divide the step's {rows} sequences "
                f"({self.tokens_per_step} tokens per step of {self.seq_len})",
                key="micro_batches",
            )


@dataclass
class RunResult:
    """What one run measured, or why it could not run."""

    spec: RunSpec
    status: str  # ok | failed | unavailable
    reason: str = ""
    tokens_per_s: float | None = None
    step_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_gpu_bytes: int | None = None
    peak_host_rss_bytes: int | None = None
    allocator: dict[str, int] = field(default_factory=dict)  # CUDA caching-allocator counters over the run
    settings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def step_rows(spec: RunSpec) -> int:
    """Sequences per optimizer step."""
    return max(1, spec.tokens_per_step // spec.seq_len)


def split(spec: RunSpec) -> dict[str, int]:
    """The step's micro-batch split, as every record's settings carry it."""
    rows = step_rows(spec)
    per = rows // spec.micro_batches
    return {
        "micro_batches": spec.micro_batches,
        "sequences_per_micro_batch": per,
        "tokens_per_micro_batch": per * spec.seq_len,
    }


def resolve_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def llama_config(spec: RunSpec) -> Any:
    from transformers import LlamaConfig

    fields: dict[str, Any] = dict(SHAPES[spec.shape])
    if spec.layers is not None:
        fields["num_hidden_layers"] = spec.layers
    return LlamaConfig(
        vocab_size=spec.vocab,
        max_position_embeddings=max(spec.seq_len, 128),
        use_cache=False,
        tie_word_embeddings=False,
        **fields,
    )


def n_params(spec: RunSpec) -> int:
    """Parameters of the Llama shape of ``spec`` (untied head)."""
    cfg = llama_config(spec)
    h, inter, layers, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    return layers * (4 * h * h + 3 * h * inter + 2 * h) + 2 * vocab * h + h


def build_model(spec: RunSpec, *, device: str = "cpu", checkpointing: bool = False) -> Any:
    """The Llama model of ``spec``: seeded random init on the CPU, fp32, then moved to ``device``.

    Every system's weights come from the CPU generator, whatever device it trains on (a model built
    under ``torch.device("cuda")`` draws from CUDA's generator: other weights, which no loss check
    could compare). With ``PEERS_WEIGHTS_DIR`` set, the first build saves every parameter and buffer
    there and later builds of the same shape load them (bitwise the same model, without the init).
    """
    import torch
    from transformers import LlamaForCausalLM

    cache = _weights_file(spec)
    if cache is not None and cache.exists():
        model = _load_model(spec, cache)
    else:
        torch.manual_seed(spec.seed)
        with torch.device("cpu"):
            model = LlamaForCausalLM(llama_config(spec))
        if cache is not None:
            _save_model(model, cache)
    if checkpointing:  # per-layer activation checkpointing, as the peers' docs recommend under a memory cap
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return model.to(device) if device != "cpu" else model


def _weights_file(spec: RunSpec) -> Path | None:
    """Where the weights of ``spec``'s model are cached (None: no cache). The name holds all that shapes them."""
    root = os.environ.get("PEERS_WEIGHTS_DIR")
    if not root:
        return None
    layers = spec.layers or SHAPES[spec.shape]["num_hidden_layers"]
    pos = max(spec.seq_len, 128)  # max_position_embeddings: the rotary buffers
    return Path(root) / f"{spec.shape}_{layers}l_v{spec.vocab}_pos{pos}_seed{spec.seed}"


def _save_model(model: Any, path: Path) -> None:
    """Every tensor as a raw file of its own and a manifest (name -> file, dtype, shape), written atomically."""
    import shutil

    import torch

    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    manifest = {}
    for i, (name, tensor) in enumerate(_tensors(model).items()):
        t = tensor.detach().contiguous()
        t.view(-1).view(torch.uint8).numpy().tofile(tmp / f"{i}.bin")  # the raw bytes, whatever the dtype
        manifest[name] = {"file": f"{i}.bin", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    try:
        tmp.rename(path)  # a reader never sees a half-written cache
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)


def _load_model(spec: RunSpec, path: Path) -> Any:
    """The model built without init (meta), every parameter and buffer mapped from ``path``.

    Each tensor is a copy-on-write mapping of its own file, given back when the tensor is freed, so the
    process's resident memory grows and shrinks as with the built model.
    """
    import math

    import torch
    from transformers import LlamaForCausalLM

    from carina.core.errors import ConfigError

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(spec))
    manifest = json.loads((path / "manifest.json").read_text())
    current = _tensors(model)
    if set(current) != set(manifest):
        odd = sorted(set(manifest) ^ set(current))[:5]
        raise ConfigError(f"{path} holds other tensors than the {spec.shape} model: {odd}", key="path")
    for name, entry in manifest.items():
        dtype, shape = getattr(torch, entry["dtype"]), entry["shape"]
        tensor = torch.from_file(str(path / entry["file"]), shared=False, size=math.prod(shape), dtype=dtype)
        tensor = tensor.view(shape)
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if attr in module._parameters:
            module._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=current[name].requires_grad)
        else:
            module._buffers[attr] = tensor
    return model


def _tensors(model: Any) -> dict[str, Any]:
    """Every parameter and buffer (non-persistent ones too: the rotary frequencies) by name."""
    return dict(model.named_parameters()) | dict(model.named_buffers())


def batches(spec: RunSpec) -> list[tuple[Any, ...]]:
    """Synthetic tokens, identical for every system (seeded on the CPU): per step, its micro-batches.

    Each step's rows are drawn as one tensor and split in order, so the tokens of a step do not
    depend on its split.
    """
    import torch

    gen = torch.Generator().manual_seed(spec.seed + 1)
    total = spec.warmup + spec.steps
    steps = [torch.randint(0, spec.vocab, (step_rows(spec), spec.seq_len), generator=gen) for _ in range(total)]
    return [tuple(tokens.chunk(spec.micro_batches)) for tokens in steps]


def peak_host_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def host_rss_now() -> dict[str, int | None]:
    """This process's resident bytes now (carina's ``process_rss``: VmRSS) and its peak so far (ru_maxrss)."""
    from carina.offload.hostmem import process_rss

    return {"rss_bytes": process_rss(), "peak_bytes": peak_host_rss()}


def timed_loop(spec: RunSpec, step: Any, device: str) -> RunResult:
    """Run warm-up then measured steps; ``step(micro_batches) -> loss float`` (the mean over its micro-batches)."""
    import torch

    losses, times = [], []
    for i, micro in enumerate(batches(spec)):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = float(step(micro))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        losses.append(loss)
        if i >= spec.warmup:
            times.append(elapsed)
    times_sorted = sorted(times)
    median = times_sorted[len(times_sorted) // 2]
    rows = step_rows(spec)
    peak_gpu = int(torch.cuda.max_memory_reserved()) if device.startswith("cuda") else None
    alloc: dict[str, int] = {}
    if device.startswith("cuda"):  # retries = the allocator freed its cache and tried again near the cap
        stats = torch.cuda.memory_stats()
        keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams")
        alloc = {k: int(stats.get(k, 0)) for k in keys}
    return RunResult(
        spec=spec,
        status="ok",
        tokens_per_s=rows * spec.seq_len / median,
        step_s=times,
        losses=losses,
        peak_gpu_bytes=peak_gpu,
        peak_host_rss_bytes=peak_host_rss(),
        allocator=alloc,
    )


def cap_gpu(spec: RunSpec, device: str) -> None:
    """Limit this process's share of the GPU to the spec's budget."""
    import torch

    if spec.gpu_budget_gib is None or not device.startswith("cuda"):
        return
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, spec.gpu_budget_gib * 2**30 / total))
