"""Capture and restore every random number generator a training step may use."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU and (when initialised) every CUDA device's RNG state."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators captured by :func:`capture_rng` (call last, after loading tensors)."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].clone())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.clone() for t in state["cuda"]])
