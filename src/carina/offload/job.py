"""The training job behind ``carina train``: a causal LM, tokens, the wrapped loop, the numbers.

:func:`run` builds a Llama-shaped model from a preset or JSON (random init),
wraps it with :func:`carina.offload.wrap`, trains it on synthetic tokens or a
text file (bytes as tokens) and returns a :class:`TrainResult` with the loss
curve, tokens/s, memory per tier against its budget and bytes moved per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from carina.core.config import Config, require
from carina.core.errors import ConfigError
from carina.offload.config import OffloadConfig

__all__ = ["DEMO", "StepReport", "TrainConfig", "TrainResult", "run"]


@dataclass(kw_only=True)
class TrainConfig(Config):
    """One training run.

    Attributes:
        model: A preset name (``tiny``, ``demo``, ``llama2-7b``, ...) or a JSON file of LlamaConfig keys.
        steps: Optimizer steps.
        micro_batch: Sequences per micro-batch.
        seq_len: Tokens per sequence.
        lr: AdamW learning rate.
        seed: Seed of the initialisation and the synthetic tokens.
        data: A text file whose bytes are the tokens (None: synthetic counting sequences).
        loss_chunk_tokens: Tokens per chunk of the loss (:func:`carina.offload.chunked_lm_loss`): -1
            auto (``offload.head_chunk_tokens`` when set; else chunks of 4096 once a micro-batch's
            float32 logits reach 1 GiB, and the plain loss below that;
            :func:`carina.offload.chunkloss.loss_chunk_tokens`), 0 the plain ``model(...).loss``.
            The chunk used is passed on as ``offload.head_chunk_tokens``, so the plan sizes the
            head's workspace as the loss runs it.
        offload: The offload config (budgets, policies).
    """

    model: str = "demo"
    steps: int = 8
    micro_batch: int = 2
    seq_len: int = 64
    lr: float = 1e-3
    seed: int = 0
    data: Path | None = None
    loss_chunk_tokens: int = -1
    offload: OffloadConfig = field(default_factory=OffloadConfig)

    def validate(self) -> None:
        """Ranges."""
        require(self.steps >= 1, "steps must be >= 1", key="steps")
        require(self.micro_batch >= 1, "micro_batch must be >= 1", key="micro_batch")
        require(self.seq_len >= 2, "seq_len must be >= 2", key="seq_len")
        require(self.lr > 0, "lr must be > 0", key="lr")
        require(self.loss_chunk_tokens >= -1, "loss_chunk_tokens must be -1 (auto), 0 (plain) or > 0",
                key="loss_chunk_tokens")  # fmt: skip
        require(self.data is None or self.data.is_file(), f"no such data file: {self.data}", key="data")


#: The README's main-job demo: a 12M-parameter Llama (46 MiB of fp32 weights, 185 MiB with
#: AdamW state and gradients) trained within a 20 MiB device budget.
DEMO = TrainConfig(model="demo", steps=6, lr=3e-3, offload=OffloadConfig(device="auto", device_budget=20 << 20))


@dataclass
class StepReport:
    """One optimizer step as it finished."""

    step: int
    loss: float
    seconds: float
    tokens: int


@dataclass
class TrainResult:
    """What a run did: losses, speed, memory per tier, traffic, the plan."""

    params: int
    model_bytes: int
    losses: list[float]
    tokens_per_s: float
    step_s: float
    device: str
    memory: dict[str, dict[str, int | None]]
    moved_per_step: dict[str, float]
    plan: dict[str, Any] | None
    within_budget: bool
    loss_chunk_tokens: int = 0  # the loss's chunk (0: the plain loss)
    steps: list[StepReport] = field(default_factory=list)


def _tokens(cfg: TrainConfig, vocab: int) -> Iterator[Any]:
    import torch

    shape = (cfg.micro_batch, cfg.seq_len)
    if cfg.data is None:  # counting modulo 64 from a random start: learnable in a few steps
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        ramp = torch.arange(cfg.seq_len)
        cycle = min(64, vocab)
        while True:
            start = torch.randint(0, cycle, (shape[0], 1), generator=gen)
            yield (start + ramp) % cycle
    raw = torch.frombuffer(bytearray(cfg.data.read_bytes()), dtype=torch.uint8).long() % vocab
    per = shape[0] * shape[1]
    if raw.numel() < per:
        raise ConfigError(f"data file has {raw.numel()} tokens, a micro-batch needs {per}", key="data")
    pos = 0
    while True:
        if pos + per > raw.numel():
            pos = 0
        yield raw[pos : pos + per].view(shape)
        pos += per


def run(
    cfg: TrainConfig,
    on_step: Callable[[StepReport], None] | None = None,
    *,
    resume: Callable[[Any, Any], int] | None = None,
    after_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train as configured.

    Args:
        cfg: The job.
        on_step: Called with each optimizer step's report.
        resume: Called once with the wrapped model and optimizer before the first
            step; restores their state and returns how many steps were already done
            (the token stream skips what those steps consumed). The seam through
            which a caller on a higher floor (the CLI's checkpointing) resumes a run.
        after_step: Called with the number of completed steps after each step
            (after ``on_step``); where a caller saves checkpoints.

    Returns:
        The run's result; its losses cover the steps this call ran.
    """
    import torch

    from carina.offload.api import handle_of, wrap
    from carina.offload.chunkloss import chunked_lm_loss
    from carina.offload.models import build_model, model_config

    shape = model_config(cfg.model)
    model = build_model(shape, seed=cfg.seed)
    params = sum(p.numel() for p in model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    user_opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    offload = cfg.offload
    tokens = cfg.micro_batch * cfg.seq_len
    if not offload.micro_batch_tokens:  # the micro-batch is known here: resident mode can be planned
        offload = replace(offload, micro_batch_tokens=tokens)
    chunk = _loss_chunk(cfg, tokens, shape.vocab_size)
    offload = replace(offload, head_chunk_tokens=chunk)  # the planner sizes the head as the loss runs it
    model, opt = wrap(model, offload, optimizer=user_opt)
    handle = handle_of(model)
    device = handle.runtime.device
    data = _tokens(cfg, shape.vocab_size)
    accum = cfg.offload.grad_accumulation
    reports: list[StepReport] = []
    moved_after_profile: dict[str, int] = {}
    start = resume(model, opt) if resume is not None else 0
    for _ in range(start * accum):
        next(data)  # the token stream is deterministic: skip what the completed steps consumed
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(accum):
            ids = next(data).to(device)
            loss = chunked_lm_loss(model, ids, chunk_tokens=chunk) if chunk else model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
            total += float(loss.detach()) / accum
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rep = StepReport(step, total, time.perf_counter() - t0, accum * cfg.micro_batch * cfg.seq_len)
        reports.append(rep)
        if step == cfg.offload.profile_steps - 1:
            moved_after_profile = dict(handle.stats().moved)
        if on_step is not None:
            on_step(rep)
        if after_step is not None:
            after_step(step + 1)
    handle.runtime.drain()
    result = _result(cfg, handle, reports, params, model_bytes, moved_after_profile)
    result.loss_chunk_tokens = chunk
    return result


def _loss_chunk(cfg: TrainConfig, tokens: int, vocab: int) -> int:
    """Tokens per chunk of the loss (0: the plain loss).

    ``loss_chunk_tokens`` decides; left at auto (-1), a ``head_chunk_tokens`` set in the offload
    config is taken as the chunk, else auto decides by the logits' size.
    """
    from carina.offload.chunkloss import loss_chunk_tokens

    setting = cfg.loss_chunk_tokens
    if setting == -1 and cfg.offload.head_chunk_tokens:
        setting = cfg.offload.head_chunk_tokens
    return loss_chunk_tokens(setting, tokens, vocab)


def _result(
    cfg: TrainConfig, handle: Any, reports: list[StepReport], params: int, model_bytes: int, base: dict[str, int]
) -> TrainResult:
    stats = handle.stats()
    timed = reports[cfg.offload.profile_steps :] or reports
    seconds = sum(r.seconds for r in timed)
    n = max(1, len(reports) - cfg.offload.profile_steps)
    moved = {k: (v - base.get(k, 0)) / n for k, v in stats.moved.items()}
    within = all(b is None or stats.peak[t] <= b for t, b in stats.budget.items())
    return TrainResult(
        params=params,
        model_bytes=model_bytes,
        losses=[r.loss for r in reports],
        tokens_per_s=sum(r.tokens for r in timed) / max(seconds, 1e-9),
        step_s=seconds / len(timed),
        device=str(handle.runtime.device),
        memory={t: {"peak": stats.peak[t], "used": stats.used[t], "budget": stats.budget[t]} for t in stats.used},
        moved_per_step=moved,
        plan=handle.plan.summary() if handle.plan else None,
        within_budget=within,
        steps=reports,
    )
