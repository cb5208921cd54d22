"""GraphSAGE / GCN mini-batch training over any feature source.

The model is made of PyG layers (``SAGEConv``, ``GCNConv``) applied to the
sampled subgraph; the loss is taken on the seed nodes. The feature source is
either the in-memory baseline (:class:`InMemoryFeatures`) or the out-of-core
store; with the same sampler seed both see the same batches, so their losses
must agree bit for bit (tested)::

    result = train_epoch(model, opt, sampler, source, dataset.labels, dataset.train_idx, cfg)
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from carina.core.config import Config, require
from carina.gnn.pipeline import FeaturePipeline, FeatureSource
from carina.gnn.sampler import NeighborSampler, SampledBatch
from carina.gnn.sidestream import cuda_stage_events, side_stream

__all__ = [
    "EpochResult",
    "GNN",
    "InMemoryFeatures",
    "ModelKind",
    "TrainConfig",
    "deterministic_algorithms",
    "train_epoch",
]


class ModelKind(enum.Enum):
    """GNN architectures built from PyG layers."""

    SAGE = "sage"
    GCN = "gcn"


@dataclass(kw_only=True)
class TrainConfig(Config):
    """Mini-batch training settings.

    Attributes:
        model: ``sage`` or ``gcn``.
        hidden: Hidden width.
        fanouts: Neighbours per hop (one layer per hop).
        batch_size: Seed nodes per batch.
        lr: Adam learning rate.
        max_batches: Stop the epoch after this many batches (0: all).
        pipeline_depth: Batches alive at once (1: serial).
        seed: Seed of the sampler and model init.
        time_limit_s: Stop the epoch after the batch that ends past this many seconds (0: no
            limit), and start no read of a further batch past it (the pipeline's ``deadline``):
            a time-boxed measurement on a slow disk.
        deterministic: Train under ``torch.use_deterministic_algorithms(True)`` (see
            :func:`deterministic_algorithms`): on CUDA, PyG's scatter-add aggregation and the
            backward of ``index_select`` then run sort-based instead of with atomics, so two runs
            on the same batches give bit-identical losses; an op with no deterministic kernel raises.
        sample_stream: On CUDA, the pipeline's sampler thread samples and plans on a stream of its
            own (:mod:`carina.gnn.sidestream`) instead of queueing behind the step; no effect on
            the CPU or with ``pipeline_depth`` 1.
    """

    model: ModelKind = ModelKind.SAGE
    hidden: int = 256
    fanouts: list[int] = field(default_factory=lambda: [25, 10])
    batch_size: int = 1024
    lr: float = 3e-3
    max_batches: int = 0
    pipeline_depth: int = 3
    seed: int = 0
    time_limit_s: float = 0.0
    deterministic: bool = False
    sample_stream: bool = True

    def validate(self) -> None:
        """Check ranges."""
        require(self.hidden > 0, "hidden must be positive", key="hidden")
        require(len(self.fanouts) > 0, "fanouts must not be empty", key="fanouts")
        require(self.batch_size > 0, "batch_size must be positive", key="batch_size")
        require(self.lr > 0, "lr must be positive", key="lr")
        require(self.max_batches >= 0, "max_batches must be >= 0", key="max_batches")
        require(self.pipeline_depth >= 1, "pipeline_depth must be >= 1", key="pipeline_depth")
        require(self.time_limit_s >= 0, "time_limit_s must be >= 0", key="time_limit_s")


class GNN(torch.nn.Module):
    """A stack of PyG convolutions with ReLU in between."""

    def __init__(self, kind: ModelKind, in_dim: int, hidden: int, out_dim: int, num_layers: int) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv

        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        layer: Callable[[int, int], Any] = SAGEConv if kind is ModelKind.SAGE else GCNConv
        self.convs = torch.nn.ModuleList(layer(a, b) for a, b in itertools.pairwise(dims))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits of every node of the subgraph (take the first ``batch_size``)."""
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
        return x


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True) -> Iterator[None]:
    """Run the body with torch's deterministic algorithms on (no-op when ``enabled`` is false).

    The global flag (it covers the pipeline's threads too) and its ``warn_only`` state are
    restored on exit. ``CUBLAS_WORKSPACE_CONFIG`` is set to ``:4096:8`` when unset, as cuBLAS
    requires for deterministic results; it takes effect only if no cuBLAS handle exists yet, so
    scripts should export it before starting Python.
    """
    if not enabled:
        yield
        return
    was, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn)


class InMemoryFeatures:
    """The in-memory baseline: every row in one tensor on the compute device."""

    def __init__(self, features: torch.Tensor, *, device: str | torch.device = "cpu") -> None:
        self.x = features.to(device)
        self.device = torch.device(device)

    def plan(self, n_id: torch.Tensor) -> torch.Tensor:
        """Nothing to plan: the ids themselves."""
        return n_id

    def read(self, plan: torch.Tensor) -> torch.Tensor:
        """Nothing to read."""
        return torch.empty(0)

    def assemble(self, plan: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
        """One ``index_select`` on the device."""
        return self.x.index_select(0, plan.to(self.device))

    def gather(self, n_id: torch.Tensor) -> torch.Tensor:
        """Rows of ``n_id``."""
        return self.assemble(n_id, torch.empty(0))


@dataclass
class EpochResult:
    """What one epoch did."""

    losses: list[float]
    batches: int
    seeds: int
    sampled_edges: int
    wall_s: float
    train_s: float
    stage_s: dict[str, float]
    max_in_flight: int
    stage_n: dict[str, int] = field(default_factory=dict)
    stage_calls: dict[str, list[float]] = field(default_factory=dict)
    train_calls: list[float] = field(default_factory=list)
    device_calls: dict[str, list[float]] = field(default_factory=dict)

    @property
    def seeds_per_s(self) -> float:
        """Training throughput."""
        return self.seeds / self.wall_s if self.wall_s else 0.0


def train_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: NeighborSampler,
    source: FeatureSource,
    labels: torch.Tensor,
    train_idx: torch.Tensor,
    cfg: TrainConfig,
    *,
    on_batch: Callable[[int, float], None] | None = None,
) -> EpochResult:
    """Train one epoch (or ``cfg.max_batches``) and return per-batch losses and timings."""
    device = next(model.parameters()).device
    labels_dev = labels.to(device)
    batches = _limited(sampler.batches(train_idx, cfg.batch_size), cfg.max_batches)
    t0 = time.perf_counter()
    deadline = t0 + cfg.time_limit_s if cfg.time_limit_s else 0.0
    side = side_stream(device, cfg.sample_stream) if cfg.pipeline_depth > 1 else None
    events = cuda_stage_events() if side is not None else None
    pipe = FeaturePipeline(batches, source, depth=cfg.pipeline_depth, deadline=deadline, side=side, events=events)
    losses: list[float] = []
    seeds = edges = 0
    train_calls: list[float] = []
    model.train()
    for batch, x in pipe:
        t1 = time.perf_counter()
        loss = train_step(model, optimizer, batch, x, labels_dev)
        train_calls.append(time.perf_counter() - t1)
        losses.append(loss)
        seeds += batch.batch_size
        edges += int(batch.edge_index.shape[1])
        if on_batch is not None:
            on_batch(len(losses), loss)
        if cfg.time_limit_s and time.perf_counter() - t0 >= cfg.time_limit_s:
            break  # leaving the loop closes the pipeline (its threads stop after their current batch)
    wall = time.perf_counter() - t0
    return EpochResult(
        losses=losses,
        batches=len(losses),
        seeds=seeds,
        sampled_edges=edges,
        wall_s=wall,
        train_s=sum(train_calls),
        stage_s=pipe.times.as_dict(),
        max_in_flight=pipe.max_in_flight,
        stage_n=pipe.times.as_counts(),
        stage_calls=pipe.times.as_calls(),
        train_calls=train_calls,
        device_calls=pipe.device_calls(),  # after the wall time: it waits for the sampler's last events
    )


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: SampledBatch,
    x: torch.Tensor,
    labels: torch.Tensor,
) -> float:
    """One optimizer step on one batch; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    edge_index = batch.edge_index.to(x.device)
    logits = model(x.to(torch.float32), edge_index)[: batch.batch_size]
    target = labels[batch.n_id[: batch.batch_size].to(labels.device)]
    if torch.are_deterministic_algorithms_enabled():
        # nll_loss has no deterministic CUDA kernel (it raises in this mode); the same loss from
        # log_softmax and gather, whose backward is deterministic in this mode
        logp = torch.log_softmax(logits, dim=1)
        loss = -logp.gather(1, target.view(-1, 1)).mean()
    else:
        loss = torch.nn.functional.cross_entropy(logits, target)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _limited(it: Any, limit: int) -> Any:
    for i, item in enumerate(it):
        if limit and i >= limit:
            return
        yield item
