"""The memory tiers carina moves tensors between, fastest first."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.memory.nvme import Extent

__all__ = ["Tier", "TierEntry", "format_bytes", "parse_bytes"]


class Tier(enum.Enum):
    """Where a tensor's bytes live."""

    DEVICE = "device"  # GPU memory (or, with device="cpu", the compute copy in RAM)
    HOST = "host"  # host RAM, pinned when CUDA is present
    NVME = "nvme"  # a file on local flash, reached through carina.io


@dataclass
class TierEntry:
    """Where one named tensor of a ``TensorStore`` lives, and what it is."""

    tier: Tier
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int
    tensor: Any = None  # resident copy (device/host)
    extent: Extent | None = None  # NVMe location


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}


def parse_bytes(text: str | int) -> int:
    """Parse ``"24GB"``, ``"512MiB"``, ``"1.5g"`` or an int into bytes (binary units).

    Raises:
        ValueError: The text is not a size.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative size {text}")
        return text
    s = text.strip().lower().replace("_", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num) :]
    if unit not in _UNITS or not num:
        raise ValueError(f"not a size: {text!r} (try 24GB, 512MiB, 4096)")
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (try 24GB, 512MiB, 4096)") from None
    if not math.isfinite(value):  # nan, inf: not a size
        raise ValueError(f"not a size: {text!r} (try 24GB, 512MiB, 4096)")
    if value < 0:
        raise ValueError(f"negative size {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """Render a byte count with a binary unit (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
