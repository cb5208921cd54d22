"""Helpers for testing carina.offload.disagg: a worker that dies mid-run, a partly frozen model."""

from __future__ import annotations

import os
from typing import Any

from carina.offload.disagg.demo import synthetic_batch, tiny_llama

__all__ = ["DIE_AT_STEP", "DYING_WORKER", "dying_batch", "frozen_embedding_llama"]

DYING_WORKER = 1
DIE_AT_STEP = 2


def dying_batch(step: int, rank: int, workers: int) -> Any:
    """Like the demo's batches, except worker 1 exits abruptly (as if killed) at step 2."""
    if rank == DYING_WORKER and step == DIE_AT_STEP:
        os._exit(17)
    return synthetic_batch(step, rank, workers)


def frozen_embedding_llama() -> Any:
    """The demo's tiny Llama with its (first) token embedding frozen: not every parameter trains."""
    model = tiny_llama()
    model.get_input_embeddings().weight.requires_grad_(False)
    return model
