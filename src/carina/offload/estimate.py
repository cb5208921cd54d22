"""Analytic profiles of Llama shapes, for planning before anything runs (``carina offload plan``).

The runtime profiles real tensors; this module predicts the same numbers from
the shape alone so that a plan (and a :class:`CapacityError`) can be had for a
7B model on a laptop. Saved activations per token and block, with SDPA and
bf16 compute: the block input and the RMSNorm inputs in float32, q/k/v, the
attention output, the MLP's gate/up/activation/down inputs (about
``item*(6h + 2kv + 4i) + 8h`` bytes). Forward FLOPs per token and block:
``2*params + 4*seq*h``. Outside the blocks, the loss saves the float32
log-softmax of the logits (4 bytes per logit) and, while the head runs, needs
a transient workspace of about three more float32 copies
(:func:`~carina.offload.simulator.logits_workspace_bytes`): the same terms the
runtime measures while profiling.

With a chunked head (:func:`carina.offload.chunkloss.chunked_lm_loss`, ``head_chunk_tokens`` below the
micro-batch's tokens) the loss saves no log-softmax: outside the blocks only the head's input is kept
(for the chunks' recomputation), and the workspace is one chunk's: its three float32 copies, its saved
log-softmax while its backward runs, and the chunks' input gradients before they are joined
(``tokens * hidden`` in the compute dtype). The head's forward then runs twice: its FLOPs are added to
the time outside the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carina.offload.simulator import BlockProfile, Hardware, ModelProfile, logits_workspace_bytes

__all__ = ["ShapeEstimate", "chunked", "estimate_profile", "nominal_hardware", "saved_bytes"]

BWD_OVER_FWD = ModelProfile.bwd_over_fwd  # the profile's backward-to-forward ratio, which the head time uses


@dataclass(frozen=True)
class ShapeEstimate:
    """What the estimate assumed."""

    tokens: int
    seq_len: int
    tflops: float
    dtype_bytes: int
    head_chunk_tokens: int = 0  # tokens per chunk of a chunked head and loss (0 or >= tokens: plain loss)


def _kv_width(config: Any) -> int:
    heads = config.num_attention_heads
    return int(config.hidden_size // heads * (getattr(config, "num_key_value_heads", None) or heads))


def chunked(tokens: int, head_chunk_tokens: int) -> bool:
    """Whether a head of ``head_chunk_tokens`` per chunk splits ``tokens`` (0: never)."""
    return 0 < head_chunk_tokens < tokens


def saved_bytes(config: Any, tokens: int, dtype_bytes: int, head_chunk_tokens: int = 0) -> tuple[int, int, int]:
    """``(per block, outside the blocks, head workspace)`` activation bytes of ``tokens`` tokens.

    Per block: the saved tensors of one Llama-style decoder layer (see the module docstring);
    outside: the saved float32 log-softmax and the head's input; the head workspace: its
    transient float32 copies of the logits. With a chunked head (``head_chunk_tokens``): the
    head's input outside, one chunk's logits and the chunks' input gradients as the workspace.
    """
    h, i = config.hidden_size, config.intermediate_size
    kv = _kv_width(config)
    block = tokens * (dtype_bytes * (6 * h + 2 * kv + 4 * i) + 8 * h)
    head_input = tokens * h * dtype_bytes
    if chunked(tokens, head_chunk_tokens):
        chunk = head_chunk_tokens * config.vocab_size
        return block, head_input, logits_workspace_bytes(chunk) + 4 * chunk + head_input
    logits = tokens * config.vocab_size
    return block, logits * 4 + head_input, logits_workspace_bytes(logits)


def estimate_profile(config: Any, est: ShapeEstimate, state_bytes: int = 8) -> ModelProfile:
    """A modeled :class:`ModelProfile` of a LlamaConfig for ``est.tokens`` tokens per micro-batch."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = _kv_width(config)
    item = est.dtype_bytes
    numel = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    act, other, workspace = saved_bytes(config, est.tokens, item, est.head_chunk_tokens)
    fwd = est.tokens * (2 * numel + 4 * est.seq_len * h) / (est.tflops * 1e12)
    rest = config.vocab_size * h * (1 if config.tie_word_embeddings else 2) + h
    other_fwd = est.tokens * 2 * rest / (est.tflops * 1e12)
    if chunked(est.tokens, est.head_chunk_tokens):  # the head's forward once more, in backward
        other_fwd += est.tokens * 2 * config.vocab_size * h / (est.tflops * 1e12) / (1 + BWD_OVER_FWD)
    copy = 0 if item == 4 else item  # the host copy of a block cast on the host
    return ModelProfile(
        blocks=tuple(BlockProfile(f"layers.{k}", numel * item, numel, act, fwd) for k in range(n)),
        resident_param_bytes=rest * item,
        resident_numel=rest,
        other_act_bytes=other,  # saved log-softmax, the head's input
        other_fwd_s=other_fwd,
        state_bytes_per_param=state_bytes,
        copy_bytes_per_param=copy,
        fold_on_device=True,  # carina's defaults: gradients folded and the rest cast on the device
        narrow_grads=False,  # ... and float32 gradients (narrow_grads is opt-in)
        rest_cast_on_device=True,
        head_workspace_bytes=workspace,
    )


def nominal_hardware(h2d_gbps: float, d2h_gbps: float, optim_gparams: float, disk_gbps: float) -> Hardware:
    """Rates given in GB/s and Gparam/s (fold and cast at the simulator's defaults)."""
    return Hardware(h2d=h2d_gbps * 1e9, d2h=d2h_gbps * 1e9, optim=optim_gparams * 1e9, disk=disk_gbps * 1e9)
