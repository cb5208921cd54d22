"""Causal-LM shapes carina trains from a name or a JSON config (random init, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from carina.core.errors import ConfigError

__all__ = ["PRESETS", "build_model", "model_config", "param_count"]

#: Named Llama shapes (vocab 32k for the large ones, as in the benchmark design).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256),
    "demo": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=16, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=1024),
    "llama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000),
    "llama-3b": dict(hidden_size=3200, intermediate_size=8640, num_hidden_layers=26, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000),
    "llama2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, vocab_size=32000),
}  # fmt: skip


def model_config(name: str, **overrides: Any) -> Any:
    """A ``transformers.LlamaConfig`` from a preset name or a JSON file of config keys.

    Raises:
        ConfigError: Unknown preset, unreadable or invalid JSON.
    """
    from transformers import LlamaConfig

    if name in PRESETS:
        keys = dict(PRESETS[name])
    else:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"unknown model {name!r} (presets: {', '.join(PRESETS)}, or a JSON file)", key="model")
        try:
            keys = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid model JSON: {exc.msg} (line {exc.lineno})", key="model") from exc
        if not isinstance(keys, dict):
            raise ConfigError("model JSON must be an object of config keys", key="model")
        keys.pop("architectures", None)
        keys.pop("model_type", None)
    keys.update(overrides)
    keys.setdefault("max_position_embeddings", 4096)
    keys.setdefault("tie_word_embeddings", False)
    try:
        return LlamaConfig(**keys)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid model config: {exc}", key="model") from exc


def build_model(config: Any, seed: int = 0, dtype: Any = None) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` built on the CPU with a fixed seed."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config.use_cache = False
    model = LlamaForCausalLM(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.train()


def param_count(config: Any) -> int:
    """Parameters of a Llama shape, computed without building it."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = h // config.num_attention_heads * config.num_key_value_heads
    block = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    emb = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return n * block + emb + h
