"""TensorStore: named tensors placed in tiers, with per-tier budgets and accounting.

Every byte a component keeps in a tier is *charged* to that tier's budget; a
charge that would exceed the budget raises :class:`CapacityError` before any
copy happens, so a budget is a promise, not a hint. Tensors the store owns
(``put``/``move``) and bytes owned elsewhere but accounted here (``charge``,
e.g. GPU-resident parameters or saved activations) share one ledger, whose
current and peak values per tier are the numbers ``carina train`` reports.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carina.core.config import Config, require
from carina.core.errors import CapacityError, ConfigError, IOEngineError
from carina.memory.batch import NvmeBatches
from carina.memory.tiers import Tier, TierEntry, format_bytes

if TYPE_CHECKING:
    import torch

    from carina.memory.batch import NvmeBatch
    from carina.memory.nvme import NvmeTier

__all__ = ["StoreStats", "TensorStore", "TierBudgets"]


@dataclass(kw_only=True)
class TierBudgets(Config):
    """Byte budgets of the tiers (None = unlimited).

    Attributes:
        device: Bytes of GPU memory carina may account for.
        host: Bytes of host RAM.
        nvme: Bytes of the NVMe file (0 = no NVMe tier).
        nvme_path: Directory of the NVMe tier's file (needed when ``nvme > 0``).
    """

    device: int | None = None
    host: int | None = None
    nvme: int = 0
    nvme_path: Path | None = None

    def validate(self) -> None:
        """Budgets are non-negative; an NVMe budget needs a path."""
        for name in ("device", "host", "nvme"):
            value = getattr(self, name)
            require(value is None or value >= 0, f"{name} budget must be >= 0", key=name)
        require(self.nvme == 0 or self.nvme_path is not None, "an NVMe budget needs nvme_path", key="nvme_path")

    def of(self, tier: Tier) -> int | None:
        """The budget of ``tier`` (None = unlimited)."""
        return {Tier.DEVICE: self.device, Tier.HOST: self.host, Tier.NVME: self.nvme}[tier]


@dataclass
class StoreStats:
    """Ledger snapshot: bytes used, peak and budget per tier, bytes moved per route."""

    used: dict[str, int]
    peak: dict[str, int]
    budget: dict[str, int | None]
    moved: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[dict[str, str]]:
        """One printable row per tier."""
        return [
            {
                "tier": t,
                "used": format_bytes(self.used[t]),
                "peak": format_bytes(self.peak[t]),
                "budget": "unlimited" if self.budget[t] is None else format_bytes(self.budget[t] or 0),
            }
            for t in self.used
        ]


class TensorStore(NvmeBatches):
    """Named tensors in tiers, with budgets that are checked before bytes move.

    Args:
        budgets: The per-tier budgets.
        device: The compute device (``"cuda"``, ``"cuda:1"`` or ``"cpu"``).
        pin: Host copies pinned: ``"auto"`` (when CUDA is present), ``"on"``, ``"off"``.
        engine: carina.io engine for the NVMe tier (made on first use when None).
    """

    def __init__(self, budgets: TierBudgets, *, device: str = "cpu", pin: str = "auto", engine: Any = None):
        import torch

        self.budgets = budgets
        self.device = torch.device(device)
        self.pinned = pin != "off" and torch.cuda.is_available()
        self._used = dict.fromkeys(Tier, 0)
        self._peak = dict.fromkeys(Tier, 0)
        self._moved: dict[str, int] = defaultdict(int)
        self._entries: dict[str, TierEntry] = {}
        self._lock = threading.Lock()
        self._engine = engine
        self._nvme: NvmeTier | None = None
        self._closed = False
        self._keys = threading.Lock()  # entries and reserved keys, changed by batches finishing on any thread
        self._reserved: set[str] = set()  # keys of NVMe writes in flight
        self._inflight: set[NvmeBatch] = set()

    # -- ledger --------------------------------------------------------------
    def charge(self, tier: Tier, nbytes: int, what: str = "") -> None:
        """Account ``nbytes`` more in ``tier``.

        Raises:
            CapacityError: The tier's budget would be exceeded (nothing is charged).
        """
        budget = self.budgets.of(tier)
        with self._lock:
            after = self._used[tier] + nbytes
            if budget is not None and after > budget:
                raise CapacityError(
                    f"{tier.value} budget exceeded by {what or 'a request'}: {format_bytes(after)} needed, "
                    f"budget {format_bytes(budget)}",
                    tier=tier.value,
                    requested=nbytes,
                    used=self._used[tier],
                    budget=budget,
                )
            self._used[tier] = after
            self._peak[tier] = max(self._peak[tier], after)

    def uncharge(self, tier: Tier, nbytes: int) -> None:
        """Give ``nbytes`` back to ``tier``'s budget."""
        with self._lock:
            self._used[tier] -= nbytes
            assert self._used[tier] >= 0, f"{tier} ledger went negative"

    def note_move(self, src: Tier, dst: Tier, nbytes: int) -> None:
        """Record ``nbytes`` copied from ``src`` to ``dst`` (for per-route statistics)."""
        with self._lock:
            self._moved[f"{src.value}->{dst.value}"] += nbytes

    def used(self, tier: Tier) -> int:
        """Bytes currently charged to ``tier``."""
        return self._used[tier]

    def peak(self, tier: Tier) -> int:
        """Most bytes ever charged to ``tier`` at once."""
        return self._peak[tier]

    def stats(self) -> StoreStats:
        """A snapshot of the ledger."""
        with self._lock:
            return StoreStats(
                used={t.value: self._used[t] for t in Tier},
                peak={t.value: self._peak[t] for t in Tier},
                budget={t.value: self.budgets.of(t) for t in Tier},
                moved=dict(self._moved),
            )

    def reset_peaks(self) -> None:
        """Set each tier's peak to its current use."""
        with self._lock:
            self._peak = dict(self._used)

    # -- owned tensors -------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: Any, tier: Tier, what: str = "") -> torch.Tensor:
        """Allocate (and charge) an uninitialised tensor resident in ``tier`` (device or host)."""
        import torch

        nbytes = _nbytes(shape, dtype)
        self.charge(tier, nbytes, what)
        if tier is Tier.DEVICE:
            return torch.empty(shape, dtype=dtype, device=self.device)
        if tier is Tier.HOST:
            return torch.empty(shape, dtype=dtype, pin_memory=self.pinned)
        self.uncharge(tier, nbytes)
        raise ConfigError("empty() allocates device or host tensors only", key="tier")

    def put(self, key: str, tensor: torch.Tensor, tier: Tier = Tier.HOST) -> None:
        """Store a copy of ``tensor`` under ``key`` in ``tier`` (charged; waits for NVMe writes)."""
        if key in self._entries or key in self._reserved:  # (reserved: an NVMe batch in flight writes it)
            raise ConfigError(f"key {key!r} already stored", key=key)
        if tier is Tier.NVME:
            self.put_nvme([(key, tensor)])
            return
        entry = TierEntry(tier, tuple(tensor.shape), tensor.dtype, tensor.numel() * tensor.element_size())
        entry.tensor = self.empty(entry.shape, entry.dtype, tier, key)
        entry.tensor.copy_(tensor)
        self._entries[key] = entry

    def put_nvme(self, items: list[tuple[str, torch.Tensor]]) -> None:
        """Store copies of many CPU tensors in the NVMe tier, every write in flight at once.

        A block's optimizer state is a dozen or more tensors: written one at a time, the device's
        queue drains after each one. All entries appear only once every write has completed; when
        one fails, none appears, their bytes are given back and the error is raised.
        """
        self.start_put_nvme(items).wait()

    def read_nvme(self, items: list[tuple[str, torch.Tensor]]) -> None:
        """Read many NVMe entries into contiguous CPU tensors, every read in flight at once."""
        self.start_read_nvme(items).wait()

    def get(self, key: str) -> torch.Tensor:
        """The stored tensor (read into a fresh host tensor when it lives on NVMe)."""
        entry = self._entry(key)
        if entry.tier is not Tier.NVME:
            return entry.tensor
        import torch

        out = torch.empty(entry.shape, dtype=entry.dtype, pin_memory=self.pinned)
        assert entry.extent is not None
        self._nvme_tier().read(entry.extent, out).result()
        self.note_move(Tier.NVME, Tier.HOST, entry.nbytes)
        return out

    def read_into(self, key: str, out: torch.Tensor) -> None:
        """Copy the stored tensor into ``out`` (a contiguous CPU tensor for NVMe entries)."""
        entry = self._entry(key)
        if entry.tier is not Tier.NVME:
            out.copy_(entry.tensor)
            return
        self.read_nvme([(key, out)])

    def tier_of(self, key: str) -> Tier:
        """The tier ``key`` lives in."""
        return self._entry(key).tier

    def move(self, key: str, tier: Tier) -> None:
        """Move ``key`` to ``tier``; the destination is charged before the source is freed."""
        entry = self._entry(key)
        if entry.tier is tier:
            return
        value = self.get(key)
        src = entry.tier
        del self._entries[key]
        try:
            self.put(key, value, tier)
        except BaseException:
            self._entries[key] = entry
            raise
        self._release(entry)
        if src is not Tier.NVME:  # reads from NVMe were counted by get()
            self.note_move(src, tier, entry.nbytes)

    def drop(self, key: str) -> None:
        """Forget ``key`` and give its bytes back."""
        with self._keys:
            entry = self._entries.pop(key)
        self._release(entry)

    def keys(self) -> list[str]:
        """Stored keys."""
        return list(self._entries)

    def close(self) -> None:
        """Wait for NVMe batches still in flight, drop everything and remove the NVMe file.

        The NVMe tier stays closed: a later NVMe request raises :class:`IOEngineError`.
        """
        self._closed = True  # no new NVMe batch starts
        self.wait_inflight()
        for key in list(self._entries):
            self.drop(key)
        if self._nvme is not None:
            self._nvme.close()
            self._nvme = None

    # -- internals -----------------------------------------------------------
    def _entry(self, key: str) -> TierEntry:
        try:
            return self._entries[key]
        except KeyError:
            raise ConfigError(f"no tensor stored under {key!r}", key=key) from None

    def _release(self, entry: TierEntry) -> None:
        if entry.extent is not None and self._nvme is not None:
            self._nvme.free(entry.extent)
        entry.tensor = None
        self.uncharge(entry.tier, entry.nbytes)

    def _nvme_tier(self) -> NvmeTier:
        if self._closed:
            raise IOEngineError("the store is closed: its NVMe tier is gone", path=str(self.budgets.nvme_path))
        if self._nvme is None:
            from carina.memory.nvme import NvmeTier

            if not self.budgets.nvme or self.budgets.nvme_path is None:
                raise CapacityError("no NVMe tier configured (nvme budget is 0)", tier="nvme")
            self._nvme = NvmeTier(self.budgets.nvme_path, self.budgets.nvme, self._engine)
        return self._nvme


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    import math

    import torch

    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
