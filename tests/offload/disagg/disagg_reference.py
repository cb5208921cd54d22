"""The single-process reference the disaggregated runs must equal bit for bit."""

from __future__ import annotations

from carina.offload.disagg import DisaggConfig
from carina.offload.disagg.demo import lm_loss, synthetic_batch, tiny_llama
from carina.offload.disagg.server import make_optimizer


def reference(workers: int, steps: int, cfg: DisaggConfig, *, layers: int = 2):
    """One process, plain PyTorch: each step's global batch as ``workers`` micro-batches accumulated in order."""
    model = tiny_llama(layers=layers)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    losses = []
    for k in range(steps):
        total = 0.0
        for r in range(workers):
            loss = lm_loss(model, synthetic_batch(k, r, workers)) / workers
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
