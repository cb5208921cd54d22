"""The default job of ``carina train --disagg``: a tiny Llama on synthetic tokens.

Module-level functions so that spawned worker processes can import them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lm_loss", "synthetic_batch", "tiny_llama"]


def tiny_llama(seed: int = 0, layers: int = 2) -> Any:
    """A small Llama (2 layers by default) built from its config, random init, seeded (identical in every process)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=64,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg)


def synthetic_batch(step: int, rank: int, workers: int, *, rows: int = 2, seq: int = 16) -> Any:
    """Worker ``rank``'s slice of step ``step``'s global batch (rows·workers sequences)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    batch = torch.randint(0, 256, (rows * workers, seq), generator=gen)
    return batch[rank * rows : (rank + 1) * rows]


def lm_loss(model: Any, batch: Any) -> Any:
    """Causal-LM loss of ``batch``."""
    return model(input_ids=batch, labels=batch).loss
