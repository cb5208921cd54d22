"""A causal-LM loss that never materialises the whole logits: the head and loss run chunk by chunk.

At the head of a causal LM the loss needs, for ``T`` tokens and a vocabulary of ``V``, the logits
(``T x V`` in the compute dtype), their float32 upcast, the saved float32 log-softmax and, in backward,
their float32 gradients: about four float32 copies of ``T x V``. At 32k tokens and ``V = 32000`` each
copy is 4.2 GB, more than any block's activations, and a device budget spent there is one the planner
cannot give to kept activations. :func:`chunked_lm_loss` runs the model to its final hidden states, then
for each chunk of ``chunk_tokens`` tokens the output layer and the shifted cross-entropy, under
:func:`torch.utils.checkpoint.checkpoint` so the chunk's logits are freed after its forward and rebuilt
in its backward: only one chunk's logits exist at a time. The price is the output layer's forward done
twice (``2 * T * hidden * V`` FLOPs more per step).

The user calls it in place of ``model(input_ids, labels=labels).loss``; the model's own forward runs
(with ``logits_to_keep=1``, so its logits are one position per sequence, unused), so carina.offload's
hooks on a wrapped model see the step as they would see a plain one.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from carina.core.errors import ConfigError, ModelFormatError

__all__ = [
    "AUTO_CHUNK_TOKENS",
    "AUTO_LOGITS_BYTES",
    "IGNORE_INDEX",
    "chunk_tokens_for",
    "chunked_lm_loss",
    "loss_chunk_tokens",
    "shifted_labels",
]

IGNORE_INDEX = -100  # transformers' ignore_index: such labels add nothing to the loss nor its count
AUTO_LOGITS_BYTES = 1 << 30  # auto: chunk once one float32 copy of a micro-batch's logits reaches 1 GiB
AUTO_CHUNK_TOKENS = 4096  # auto's chunk: 500 MiB of float32 logits at a 32000 vocabulary


def loss_chunk_tokens(setting: int, tokens: int, vocab: int) -> int:
    """Tokens per chunk of the loss for a setting (-1 auto, 0 plain, N), 0 meaning the plain loss.

    Auto chunks into :data:`AUTO_CHUNK_TOKENS` when ``tokens x vocab`` float32 logits (one of the
    loss's four copies) reach :data:`AUTO_LOGITS_BYTES`, and keeps the plain loss below that.
    """
    if setting < -1:
        raise ConfigError(f"loss chunk tokens must be -1 (auto), 0 (plain) or > 0, got {setting}",
                          key="loss_chunk_tokens")  # fmt: skip
    if setting >= 0:
        return setting
    return AUTO_CHUNK_TOKENS if 4 * tokens * vocab >= AUTO_LOGITS_BYTES and tokens > AUTO_CHUNK_TOKENS else 0


def chunk_tokens_for(model: nn.Module, chunk_tokens: int | None = None) -> int:
    """The chunk :func:`chunked_lm_loss` uses: ``chunk_tokens`` when given, else the model's planned one.

    For a model wrapped by :func:`carina.offload.wrap` with ``Config(head_chunk_tokens=N)``, N > 0, the
    chunk is N, so the loss and the planner's estimate of the head's workspace agree; otherwise
    :data:`AUTO_CHUNK_TOKENS`.

    Raises:
        ConfigError: ``chunk_tokens`` is given and not a positive int.
    """
    if chunk_tokens is None:
        from carina.offload.api import handle_of

        try:
            planned = handle_of(model).config.head_chunk_tokens
        except ConfigError:  # not wrapped
            planned = 0
        return planned or AUTO_CHUNK_TOKENS
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens <= 0:
        raise ConfigError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}", key="chunk_tokens")
    return chunk_tokens


def shifted_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The targets of a causal LM, flattened: token ``t`` predicts label ``t + 1``; each row's last none."""
    pad = torch.full_like(labels[..., :1], ignore_index)
    return torch.cat([labels[..., 1:], pad], dim=-1).reshape(-1)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(base model, output layer)`` of a transformers causal LM, or a ModelFormatError naming what lacks."""
    name = type(model).__name__
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Module):
        raise ModelFormatError(
            "chunked_lm_loss needs a causal LM with an output layer (get_output_embeddings() returned none)",
            model=name,
        )
    base = getattr(model, "base_model", None)
    if not isinstance(base, nn.Module) or base is model:
        raise ModelFormatError("chunked_lm_loss needs a causal LM with a base model (model.base_model)", model=name)
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        raise ModelFormatError(
            "chunked_lm_loss needs a forward that takes logits_to_keep (transformers causal LMs do)", model=name
        )
    return base, head


def _chunk_loss(
    head: nn.Module, hidden: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str = "sum"
) -> torch.Tensor:
    """The cross-entropy of one chunk's tokens (as transformers computes it: float32 logits), summed or mean."""
    logits = head(hidden).float()
    return nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)


def _final_hidden(model: nn.Module, base: nn.Module, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """Run the model's own forward and catch its base model's last hidden state."""
    caught: list[torch.Tensor] = []

    def catch(module: nn.Module, args: Any, out: Any) -> None:
        t = getattr(out, "last_hidden_state", None)
        caught.append(t if isinstance(t, torch.Tensor) else out[0])

    handle = base.register_forward_hook(catch)
    try:
        model(input_ids=input_ids, logits_to_keep=1, use_cache=False, **kwargs)
    finally:
        handle.remove()
    if len(caught) != 1:
        raise ModelFormatError(f"the base model ran {len(caught)} times in one forward, expected once",
                               model=type(model).__name__)  # fmt: skip
    return caught[0]


def chunked_lm_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    chunk_tokens: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    **kwargs: Any,
) -> torch.Tensor:
    """The causal-LM loss of ``model`` on ``input_ids``, with at most ``chunk_tokens`` tokens' logits alive.

    Equals ``model(input_ids, labels=labels).loss`` of transformers: labels shifted by one inside each
    sequence, the float32 cross-entropy of every token whose label is not ``ignore_index``, their mean
    over those tokens. It is computed as the sum of per-chunk sums divided by the count of valid tokens,
    so with more than one chunk the float additions run in another order than one ``cross_entropy`` mean:
    the loss and the gradients agree to float rounding (about 1e-6 relative in float32), not bitwise.
    With ``chunk_tokens`` at least ``input_ids.numel()`` (one chunk) the arithmetic is transformers' own
    and the loss and gradients are bitwise equal.

    Tokens are flattened (batch-major) before chunking, so a chunk may span sequences. Each chunk's
    output layer and loss run under non-reentrant :func:`torch.utils.checkpoint.checkpoint`: its logits
    are freed after its forward and recomputed in its backward. Works for transformers causal LMs
    (Llama, Mistral, Qwen2, GPT-2, ...) whose forward takes ``logits_to_keep``, wrapped by
    :func:`carina.offload.wrap` or not. Models that transform logits after the output layer (final
    soft-capping, logit scaling) are not covered: their loss would differ.

    Args:
        model: A transformers causal LM (``get_output_embeddings()`` and ``base_model``).
        input_ids: Token ids, ``(batch, seq)``.
        labels: Targets, the shape of ``input_ids`` (unshifted, as transformers takes them); None: the
            inputs themselves (language modelling).
        chunk_tokens: Tokens per chunk of the output layer and loss (> 0); None: the wrapped model's
            ``Config.head_chunk_tokens`` when set, else 4096 (:func:`chunk_tokens_for`).
        ignore_index: Label value that is skipped.
        **kwargs: Passed to the model's forward (``attention_mask``, ``position_ids``, ...).

    Returns:
        The scalar mean loss (float32), differentiable; NaN when no label is valid, as transformers'.

    Raises:
        ConfigError: ``chunk_tokens`` is not a positive int, or ``labels`` has another shape.
        ModelFormatError: The model has no output layer, no base model, or no ``logits_to_keep``.
    """
    chunk_tokens = chunk_tokens_for(model, chunk_tokens)
    labels = input_ids if labels is None else labels
    if labels.shape != input_ids.shape:
        raise ConfigError(f"labels {tuple(labels.shape)} must have input_ids' shape {tuple(input_ids.shape)}",
                          key="labels")  # fmt: skip
    base, head = _parts(model)
    hidden = _final_hidden(model, base, input_ids, kwargs)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    target = shifted_labels(labels.to(hidden.device), ignore_index)
    if hidden.shape[0] <= chunk_tokens:  # one chunk: transformers' own reduction, bitwise
        return _chunk_loss(head, hidden, target, ignore_index, reduction="mean")
    from torch.utils.checkpoint import checkpoint

    total = hidden.new_zeros((), dtype=torch.float32)
    for h, t in zip(hidden.split(chunk_tokens), target.split(chunk_tokens), strict=True):
        total = total + checkpoint(_chunk_loss, head, h, t, ignore_index, use_reentrant=False)
    return total / (target != ignore_index).sum()
