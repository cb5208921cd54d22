"""Tiny Llama models and the unchanged user loop shared by the offload tests."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 4096  # big_vocab_llama's vocabulary: its logits outweigh its blocks


def tiny_llama(layers: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg)


def big_vocab_llama(seed: int = 0) -> nn.Module:
    """Blocks of 37 KiB, a 4 MiB embedding + head, logits of 64 x 4096."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg)


def token_batches(n: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (2, 32), generator=gen) for _ in range(n)]


def train_losses(model, opt, steps, *, accum=1, clip=None, scheduler=None, plain_clip=False, device="cpu"):
    """The user's loop, unchanged between plain and offloaded training."""
    losses = []
    for k, batch in enumerate(token_batches(steps * accum)):
        ids = batch.to(device)
        out = model(input_ids=ids, labels=ids)
        (out.loss / accum).backward()
        losses.append(out.loss.item())
        if (k + 1) % accum == 0:
            if plain_clip and clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            if scheduler is not None:
                scheduler.step()
    return losses
