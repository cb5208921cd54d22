"""Serve features in a multi-process run (one process per GPU) as a placement says.

Features are cut into chunks of ``chunk_rows`` consecutive node ids; a
:class:`~carina.gnn.placement.place.Placement` names each chunk's holders. Rank
``r`` (GPU ``gpus[r]``) reads a row from, in order of preference: its own device
cache, host memory (DRAM holders), the feature file (SSD holders, through the
out-of-core store), or the device cache of the peer rank that holds it. Peer rows
travel through ``torch.distributed`` (gloo on CPU, NCCL-capable collectives on
GPUs) in one all-gather exchange per batch on a process group of their own, so
the training loop's collectives never interleave with them. Every rank must
fetch the same number of batches::

    src = PlacedFeatures(dataset, placement, chunk_rows=4096, gpus=["gpu0", "gpu1"],
                         store=ooc_store, group=dist.new_group(backend="gloo"))
    train_epoch(ddp_model, opt, sampler, src, labels, my_shard, cfg)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from carina.core.errors import ConfigError
from carina.gnn.dataset import Dataset
from carina.gnn.placement.place import Placement

__all__ = ["PlacedFeatures", "PlacedPlan"]

OWN, HOST, DISK, PEER = 0, 1, 2, 3


@dataclass
class PlacedPlan:
    """Where each row of one batch comes from."""

    n_id: torch.Tensor
    tier: torch.Tensor  # OWN / HOST / DISK / PEER per row
    owner: torch.Tensor  # holding rank for PEER rows, -1 otherwise
    disk_plan: Any = None


@dataclass
class PlacedStats:
    """Rows served per tier."""

    own: int = 0
    host: int = 0
    disk: int = 0
    peer: int = 0


class PlacedFeatures:
    """A feature source for rank ``dist.get_rank()`` following ``placement``."""

    def __init__(
        self,
        dataset: Dataset,
        placement: Placement,
        *,
        chunk_rows: int,
        gpus: list[str],
        store: Any,
        group: Any = None,
        device: str | torch.device = "cpu",
    ) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        if len(gpus) != self.world:
            raise ConfigError(f"{len(gpus)} GPUs named for {self.world} processes", key="gpus")
        self.group, self.store, self.device = group, store, torch.device(device)
        self.chunk_rows = chunk_rows
        n = dataset.manifest.num_nodes
        self.dim, self.dtype = dataset.manifest.feature_dim, dataset.manifest.torch_dtype
        me = gpus[self.rank]
        tier = torch.full((len(placement.holders),), DISK, dtype=torch.int8)
        owner = torch.full((len(placement.holders),), -1, dtype=torch.int64)
        for c, holders in enumerate(placement.holders):
            tier[c], owner[c] = _choose(holders, me, gpus)
        self.chunk_tier, self.chunk_owner = tier, owner
        node_chunk = torch.arange(n) // chunk_rows
        self.row_tier, self.row_owner = tier[node_chunk], owner[node_chunk]
        self.own_ids = self._ids_in(lambda c: me in placement.holders[c], n)
        self.host_ids = self._ids_in(lambda c: int(tier[c]) == HOST, n)
        self.own = store.read_rows(self.own_ids).to(self.device)
        self.host = store.read_rows(self.host_ids)
        self.stats = PlacedStats()

    def _ids_in(self, pred: Any, n: int) -> torch.Tensor:
        chunks = [c for c in range(len(self.chunk_tier)) if pred(c)]
        parts = [torch.arange(c * self.chunk_rows, min((c + 1) * self.chunk_rows, n)) for c in chunks]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def plan(self, n_id: torch.Tensor) -> PlacedPlan:
        """Classify the batch's rows; plan the disk reads."""
        ids = n_id.cpu()
        tier, owner = self.row_tier[ids], self.row_owner[ids]
        disk_ids = ids[tier == DISK]
        return PlacedPlan(n_id=ids, tier=tier, owner=owner, disk_plan=self.store.plan(disk_ids))

    def read(self, plan: PlacedPlan) -> torch.Tensor:
        """Disk reads, then the peer exchange; returns ``[rows, dim]`` in batch order (CPU)."""
        out = torch.empty(plan.n_id.numel(), self.dim, dtype=self.dtype)
        disk = plan.tier == DISK
        if plan.disk_plan is not None:
            rows = self.store.read(plan.disk_plan)
            fill = torch.empty_like(rows)
            fill[plan.disk_plan.lookup.miss_pos.cpu()] = rows
            out[disk] = fill
        host = plan.tier == HOST
        out[host] = self.host[torch.searchsorted(self.host_ids, plan.n_id[host])]
        own = plan.tier == OWN
        out[own] = self.own[torch.searchsorted(self.own_ids, plan.n_id[own])].cpu()
        peer = plan.tier == PEER
        out[peer] = self._exchange(plan.n_id[peer], plan.owner[peer])
        self.stats.own += int(own.sum())
        self.stats.host += int(host.sum())
        self.stats.disk += int(disk.sum())
        self.stats.peer += int(peer.sum())
        return out

    def assemble(self, plan: PlacedPlan, rows: torch.Tensor) -> torch.Tensor:
        """The batch on the compute device."""
        return rows.to(self.device)

    def gather(self, n_id: torch.Tensor) -> torch.Tensor:
        """All stages at once (a collective: every rank must call it)."""
        plan = self.plan(n_id)
        return self.assemble(plan, self.read(plan))

    def _exchange(self, ids: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """Ask each owner for its rows; answer the others' requests for ours."""
        reqs = _all_gather_var(torch.stack([ids, owners]).T.contiguous(), self.group, self.world)
        answer = []
        for q in range(self.world):
            if q == self.rank:
                continue
            mine = reqs[q][reqs[q][:, 1] == self.rank, 0]
            answer.append(self.own[torch.searchsorted(self.own_ids, mine)].cpu())
        flat = torch.cat(answer) if answer else torch.zeros(0, self.dim, dtype=self.dtype)
        answers = _all_gather_var(flat, self.group, self.world)
        out = torch.empty(ids.numel(), self.dim, dtype=self.dtype)
        for p in range(self.world):
            if p == self.rank:
                continue
            # p answered every other rank in rank order: skip the answers of ranks before us
            start = sum(int((reqs[q][:, 1] == p).sum()) for q in range(self.rank) if q != p)
            count = int((owners == p).sum())
            out[owners == p] = answers[p][start : start + count]
        return out


def _choose(holders: list[str], me: str, gpus: list[str]) -> tuple[int, int]:
    if me in holders:
        return OWN, -1
    if any(h.startswith("dram") for h in holders):
        return HOST, -1
    if any(h.startswith("ssd") for h in holders):
        return DISK, -1
    peers = [gpus.index(h) for h in holders if h in gpus]
    if not peers:
        raise ConfigError(f"chunk held by {holders}, none of which this run can read", key="placement")
    return PEER, peers[0]


def _all_gather_var(t: torch.Tensor, group: Any, world: int) -> list[torch.Tensor]:
    """All-gather tensors whose first dimension differs between ranks."""
    import torch.distributed as dist

    n = torch.tensor([t.shape[0]], dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    most = max(int(s) for s in sizes)
    pad = torch.zeros((most, *t.shape[1:]), dtype=t.dtype)
    pad[: t.shape[0]] = t
    got = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(got, pad, group=group)
    return [g[: int(s)] for g, s in zip(got, sizes, strict=True)]
