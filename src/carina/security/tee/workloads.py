"""Inference workloads: BERT encoders and Llama/Granite-style decoders, random weights.

Models are built from transformers configs (no downloads) and run with every host-device
transfer timed separately: inputs in (H2D), compute, outputs out (D2H). Decoders report
time to first token (prefill) and inter-token latency, with the sampled token going to the
host and back each step as a serving loop does. In ``emulated`` mode every transfer goes
through :class:`~carina.security.tee.emulate.EmulatedCCLink`; compute is measured natively
(CC leaves on-GPU compute unchanged). ``pipelined`` rows model overlapping the next step's
input transfer with compute from the measured phases: ``max(h2d, compute) + d2h``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from carina.core.config import Config, require
from carina.security.tee.emulate import CCLinkConfig, EmulatedCCLink, device_copy
from carina.security.tee.micro import pick_device

__all__ = ["MODELS", "WorkloadConfig", "build_model", "run_paired", "run_workloads"]

_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
_DEC_TINY = {**_TINY, "num_key_value_heads": 2, "vocab_size": 1000}
_DEC_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8}
_DEC_1B |= {"intermediate_size": 8192, "vocab_size": 32000}
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-tiny": ("bert", {**_TINY, "vocab_size": 1000}),
    "bert-base": (
        "bert",
        {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    ),
    "bert-large": (
        "bert",
        {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    ),
    "llama-tiny": ("llama", _DEC_TINY),
    "granite-tiny": ("granite", _DEC_TINY),
    "llama-small": (
        "llama",
        {**_DEC_TINY, "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "intermediate_size": 1536},
    ),
    "llama-1b": ("llama", _DEC_1B),
    "granite-1b": ("granite", _DEC_1B),
}


@dataclass(kw_only=True)
class WorkloadConfig(Config):
    """Which workloads to run and how.

    Attributes:
        models: Names from :data:`MODELS`.
        batches: Batch sizes.
        seq_lens: Encoder sequence lengths / decoder prompt lengths.
        new_tokens: Tokens generated per decoder request.
        device: ``auto``, ``cpu`` or ``cuda``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        mode: ``native`` or ``emulated``.
        repeat: Measured steps per encoder figure (after one warm-up).
        link: Emulated link parameters.
        seed: Weight and input seed.
    """

    models: list[str] = field(default_factory=lambda: ["bert-tiny", "llama-tiny"])
    batches: list[int] = field(default_factory=lambda: [1, 4])
    seq_lens: list[int] = field(default_factory=lambda: [32])
    new_tokens: int = 8
    device: str = "auto"
    dtype: str = "float32"
    mode: str = "native"
    repeat: int = 3
    link: CCLinkConfig = field(default_factory=CCLinkConfig)
    seed: int = 0

    def validate(self) -> None:
        """Check the fields."""
        for m in self.models:
            require(m in MODELS, f"unknown model (known: {sorted(MODELS)})", key="models")
        require(self.mode in ("native", "emulated"), "must be native or emulated", key="mode")
        require(self.dtype in ("float32", "bfloat16", "float16"), "unsupported dtype", key="dtype")
        require(self.new_tokens > 0 and self.repeat > 0, "must be positive", key="new_tokens")
        require(
            all(b > 0 for b in self.batches) and all(s > 0 for s in self.seq_lens), "must be positive", key="batches"
        )


def build_model(name: str, device: str, dtype: str, seed: int = 0) -> Any:
    """A randomly initialised model of architecture ``name`` on ``device``."""
    import torch
    import transformers as tf

    family, sizes = MODELS[name]
    torch.manual_seed(seed)
    cfg_cls = {"bert": tf.BertConfig, "llama": tf.LlamaConfig, "granite": tf.GraniteConfig}[family]
    model_cls = {"bert": tf.BertModel, "llama": tf.LlamaForCausalLM, "granite": tf.GraniteForCausalLM}[family]
    config = cfg_cls(**sizes)
    with torch.device(device):
        model = model_cls(config).to(getattr(torch, dtype))
    return model.eval()


class _Mover:
    """Timed transfers: native copies or the emulated CC link."""

    def __init__(self, device: Any, link: EmulatedCCLink | None) -> None:
        self.device, self.link = device, link
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def h2d(self, host: Any) -> tuple[Any, float]:
        import torch

        dst = torch.empty_like(host, device=self.device)
        if self.link is not None:
            return dst, self.link.h2d(host, dst)
        self.sync()
        t0 = time.perf_counter()
        device_copy(dst, host)
        self.sync()
        return dst, time.perf_counter() - t0

    def d2h(self, dev: Any) -> tuple[Any, float]:
        import torch

        dst = torch.empty_like(dev, device="cpu")
        if self.link is not None:
            return dst, self.link.d2h(dev, dst)
        self.sync()
        t0 = time.perf_counter()
        device_copy(dst, dev)
        self.sync()
        return dst, time.perf_counter() - t0

    def compute(self, fn: Any) -> tuple[Any, float]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - t0


def run_workloads(cfg: WorkloadConfig) -> list[dict[str, Any]]:
    """Run every (model, batch, length) combination in ``cfg.mode``; one row per figure set."""
    return run_paired(cfg, modes=(cfg.mode,))[cfg.mode]


def run_paired(cfg: WorkloadConfig, modes: tuple[str, ...] = ("native", "emulated")) -> dict[str, list[dict[str, Any]]]:
    """Run each combination in every mode back to back on the same model instance.

    Every combination first runs once in each mode untimed, so neither mode pays for
    the other's warm-up (lazy CUDA init, allocator growth, kernel selection).
    """
    import torch

    dev = torch.device(pick_device(cfg.device))
    movers = {m: _Mover(dev, EmulatedCCLink(str(dev), cfg.link) if m == "emulated" else None) for m in modes}
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for name in cfg.models:
        model = build_model(name, str(dev), cfg.dtype, cfg.seed)
        family = MODELS[name][0]
        for batch in cfg.batches:
            for seq in cfg.seq_lens:
                ids = torch.randint(
                    0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(cfg.seed)
                )
                base = {"model": name, "kind": "encoder" if family == "bert" else "decoder", "batch": batch, "seq": seq}
                for timed in (False, True):
                    for mode, mover in movers.items():
                        with torch.inference_mode():
                            row = (
                                _encoder(model, ids, mover, cfg.repeat)
                                if family == "bert"
                                else _decoder(model, ids, mover, cfg.new_tokens)
                            )
                        if not timed:
                            continue
                        emulated = mode == "emulated"
                        rows[mode].append(
                            {
                                **base,
                                **row,
                                "pipelined": False,
                                "basis": "emulated" if emulated else "measured",
                                "device": str(dev),
                            }
                        )
                        rows[mode].append(
                            {
                                **base,
                                **_pipelined(row),
                                "pipelined": True,
                                "basis": "emulated" if emulated else "modeled",
                                "device": str(dev),
                            }
                        )
        del model
    return rows


def _encoder(model: Any, ids: Any, mover: _Mover, repeat: int) -> dict[str, Any]:
    import torch

    phases = []
    for step in range(repeat + 1):
        d_ids, t_in = mover.h2d(ids)
        mask, t_mask = mover.h2d(torch.ones_like(ids))
        out, t_c = mover.compute(
            lambda d_ids=d_ids, mask=mask: model(input_ids=d_ids, attention_mask=mask).last_hidden_state[:, 0]
        )
        _, t_out = mover.d2h(out.float())
        if step:  # the first step warms up
            phases.append((t_in + t_mask, t_c, t_out))
    h2d, comp, d2h = (statistics.median(p[i] for p in phases) for i in range(3))
    latency = h2d + comp + d2h
    tokens = ids.numel()
    return {"h2d_s": h2d, "compute_s": comp, "d2h_s": d2h, "latency_s": latency, "tokens_per_s": tokens / latency}


def _decoder(model: Any, ids: Any, mover: _Mover, new_tokens: int) -> dict[str, Any]:
    d_ids, _ = mover.h2d(ids)  # warm-up: one prefill and one decode step
    warm, _ = mover.compute(lambda: model(input_ids=d_ids, use_cache=True))
    step = warm.logits[:, -1:].argmax(-1)
    mover.compute(lambda: model(input_ids=step, past_key_values=warm.past_key_values, use_cache=True))
    d_ids, t_in = mover.h2d(ids)
    out, t_c = mover.compute(lambda: model(input_ids=d_ids, use_cache=True))
    nxt, t_out = mover.d2h(out.logits[:, -1].argmax(-1, keepdim=True))
    past, h2d, comp, d2h = out.past_key_values, [t_in], [t_c], [t_out]
    ttft = t_in + t_c + t_out
    steps, generated = [], [int(nxt[0, 0])]
    for _ in range(new_tokens - 1):
        d_nxt, t_in = mover.h2d(nxt)
        out, t_c = mover.compute(
            lambda d_nxt=d_nxt, past=past: model(input_ids=d_nxt, past_key_values=past, use_cache=True)
        )
        nxt, t_out = mover.d2h(out.logits[:, -1].argmax(-1, keepdim=True))
        past = out.past_key_values
        generated.append(int(nxt[0, 0]))
        h2d.append(t_in)
        comp.append(t_c)
        d2h.append(t_out)
        steps.append(t_in + t_c + t_out)
    itl = statistics.mean(steps) if steps else 0.0
    total = ttft + sum(steps)
    return {
        "h2d_s": sum(h2d),
        "compute_s": sum(comp),
        "d2h_s": sum(d2h),
        "latency_s": total,
        "ttft_s": ttft,
        "itl_s": itl,
        "tokens_per_s": ids.shape[0] * new_tokens / total,
        "generated": generated,  # first sequence's tokens: native and emulated must agree
    }


def _pipelined(row: dict[str, Any]) -> dict[str, Any]:
    latency = max(row["h2d_s"], row["compute_s"]) + row["d2h_s"]
    out = {**row, "latency_s": latency, "tokens_per_s": row["tokens_per_s"] * row["latency_s"] / latency}
    if "ttft_s" in row:
        scale = latency / row["latency_s"]
        out["ttft_s"], out["itl_s"] = row["ttft_s"] * scale, row["itl_s"] * scale
    return out
