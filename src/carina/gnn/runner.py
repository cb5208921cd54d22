"""One out-of-core training run, optionally beside the in-memory baseline.

:func:`run_training` opens the IO engine, measures hotness (degree or
pre-sampling with a separate sampler seed), fills the static cache, trains with
the bounded pipeline, and, when asked, trains the same model from the same seed
on all features in device memory with the same batches, then reports whether
the losses agree bit for bit::

    report = run_training(Dataset.open("data/papers"), RunConfig(device="cuda"))
    report.losses_equal, report.out_of_core["seeds_per_s"]
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from carina.core.config import Config, require
from carina.gnn.cache import CacheConfig, HotnessSource, StaticCache, degree_hotness, presample_hotness
from carina.gnn.dataset import Dataset
from carina.gnn.pipeline import FeatureSource
from carina.gnn.sampler import NeighborSampler
from carina.gnn.store import OutOfCoreFeatures, StoreConfig
from carina.gnn.train import GNN, EpochResult, InMemoryFeatures, TrainConfig, deterministic_algorithms, train_epoch
from carina.io import IOConfig, IOEngine

__all__ = ["Compare", "RunConfig", "RunReport", "presample", "run_training"]


class Compare(enum.Enum):
    """Which baseline runs beside carina in the same process."""

    NONE = "none"
    IN_MEMORY = "in-memory"


@dataclass(kw_only=True)
class RunConfig(Config):
    """Everything a training run needs; sub-configs stay nested."""

    train: TrainConfig = field(default_factory=TrainConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    io: IOConfig = field(default_factory=IOConfig)
    device: str = "cpu"
    compare: Compare = Compare.IN_MEMORY
    presample_seed: int = 1_000_003

    def validate(self) -> None:
        """The device is ``cpu``, ``cuda`` or ``cuda:N``."""
        known = re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None
        require(known, "device is cpu, cuda or cuda:N", key="device")


@dataclass
class RunReport:
    """Results of :func:`run_training`."""

    out_of_core: dict[str, Any]
    in_memory: dict[str, Any] | None
    losses_equal: bool | None
    fetch: dict[str, float]
    cache_bytes: dict[str, int]
    direct_io: bool


def presample(dataset: Dataset, cfg: RunConfig) -> list[torch.Tensor]:
    """``n_id`` of a few batches drawn with a seed of their own (for hotness)."""
    sampler = NeighborSampler(dataset.graph, fanouts=cfg.train.fanouts, device=cfg.device, seed=cfg.presample_seed)
    out = []
    for i, batch in enumerate(sampler.batches(dataset.train_idx, cfg.train.batch_size)):
        if i >= cfg.cache.presample_batches:
            break
        out.append(batch.n_id.cpu())
    return out


def build_cache(
    dataset: Dataset,
    cfg: RunConfig,
    store: OutOfCoreFeatures,
    *,
    fetch: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StaticCache:
    """Rank nodes by the configured hotness and fill the cache from the store (or ``fetch``).

    ``fetch`` (node ids -> rows, CPU) replaces the store's disk reads for filling, e.g. the
    generator's :func:`~carina.gnn.graph.node_features` for a generated dataset (the same bytes).
    """
    m = dataset.manifest
    if cfg.cache.hotness is HotnessSource.DEGREE:
        hot = degree_hotness(dataset.graph)
    else:
        hot = presample_hotness(presample(dataset, cfg), m.num_nodes)
    return StaticCache(
        hotness=hot,
        config=cfg.cache,
        dim=m.feature_dim,
        dtype=m.torch_dtype,
        device=cfg.device,
        fetch=fetch or store.read_rows,
    )


def train_once(
    dataset: Dataset, cfg: RunConfig, source: FeatureSource, on_batch: Callable[[int, float], None] | None = None
) -> EpochResult:
    """Build the model from ``cfg.train.seed`` and train one epoch from ``source``."""
    tc = cfg.train
    with deterministic_algorithms(tc.deterministic):  # before the model: PyG reads the flag at build time
        torch.manual_seed(tc.seed)
        m = dataset.manifest
        model = GNN(tc.model, m.feature_dim, tc.hidden, m.num_classes, len(tc.fanouts)).to(cfg.device)
        opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
        sampler = NeighborSampler(dataset.graph, fanouts=tc.fanouts, device=cfg.device, seed=tc.seed)
        return train_epoch(model, opt, sampler, source, dataset.labels, dataset.train_idx, tc, on_batch=on_batch)


def summarize(result: EpochResult) -> dict[str, Any]:
    """The JSON-friendly part of an epoch result."""
    return {
        "batches": result.batches,
        "seeds": result.seeds,
        "wall_s": result.wall_s,
        "train_s": result.train_s,
        "seeds_per_s": result.seeds_per_s,
        "stage_s": result.stage_s,
        "stage_n": result.stage_n,
        "max_in_flight": result.max_in_flight,
        "losses": result.losses,
    }


def run_training(
    dataset: Dataset, cfg: RunConfig, *, on_batch: Callable[[int, float], None] | None = None
) -> RunReport:
    """Train out of core (and the in-memory baseline if ``cfg.compare`` says so)."""
    with IOEngine(cfg.io) as engine:
        store = OutOfCoreFeatures(dataset, engine=engine, device=cfg.device, config=cfg.store)
        try:
            store.attach_cache(build_cache(dataset, cfg, store))
            ooc = train_once(dataset, cfg, store, on_batch)
            direct = bool(getattr(store.handle, "direct", False))
        finally:
            store.close()
    mem = None
    if cfg.compare is Compare.IN_MEMORY:
        mem = train_once(dataset, cfg, InMemoryFeatures(dataset.read_all_features(), device=cfg.device))
    assert store.cache is not None
    return RunReport(
        out_of_core=summarize(ooc),
        in_memory=summarize(mem) if mem else None,
        losses_equal=(mem.losses == ooc.losses) if mem else None,
        fetch=store.stats.as_dict(dataset.manifest.row_bytes),
        cache_bytes=store.cache.nbytes,
        direct_io=direct,
    )
