"""Serve features in a multi-process run (one process per GPU) along the planned routes.

Features are cut into chunks of ``chunk_rows`` consecutive node ids; a
:class:`~carina.gnn.placement.place.Placement` names each chunk's holders, and
:func:`~carina.gnn.placement.place.source_of` picks, per GPU, the holder it reads
from (own cache, a socket's DRAM, an SSD, a peer's cache) — the same rule the
placement's cost model used. Per batch, :meth:`PlacedFeatures.read`:

1. all-gathers every rank's row counts per source (one small ``int64`` matrix);
2. schedules the batch with :func:`~carina.gnn.placement.routes.plan_batch` (the
   multi-commodity LP over the topology; identical on every rank);
3. starts its fetches source by source in the plan's order (slowest route first):
   SSD rows through the out-of-core store (``carina.io``) on a background reader
   thread, one SSD after the other, while the next sources are served; DRAM rows
   from host memory, peer rows through one ``all_to_all_single`` whose per-peer split sizes
   are the gathered counts (each rank receives only the rows it asked for), and
   its own cache's rows last.

Bytes pulled per source are counted (:attr:`PlacedFeatures.log`) so a test can hold
them to the plan. All collectives run inside :meth:`read` on a process group of
their own; every rank must read the same number of batches::

    src = PlacedFeatures(dataset, placement, chunk_rows=4096, gpus=["gpu0", "gpu1"],
                         store=ooc_store, topology=topo, group=dist.new_group(backend="gloo"))
    train_epoch(ddp_model, opt, sampler, src, labels, my_shard, cfg)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from carina.core.errors import ConfigError
from carina.gnn.dataset import Dataset
from carina.gnn.placement.place import Placement, source_of, stores_of
from carina.gnn.placement.routes import BatchRoutes, plan_batch
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = ["BatchLog", "PlacedFeatures", "PlacedPlan"]


@dataclass
class PlacedPlan:
    """One batch: its node ids and the source index of each row."""

    n_id: torch.Tensor
    source: torch.Tensor  # index into PlacedFeatures.sources per row


@dataclass
class BatchLog:
    """What one batch did: the plan's bytes per source, the bytes pulled, the fetch order."""

    planned: dict[str, int] = field(default_factory=dict)
    routed: dict[str, float] = field(default_factory=dict)
    pulled: dict[str, int] = field(default_factory=dict)
    plan_order: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    predicted_s: float = 0.0


@dataclass
class PlacedStats:
    """Rows served per kind of source."""

    own: int = 0
    host: int = 0
    disk: int = 0
    peer: int = 0


class PlacedFeatures:
    """A feature source for rank ``dist.get_rank()`` following ``placement`` and the per-batch routes."""

    def __init__(
        self,
        dataset: Dataset,
        placement: Placement,
        *,
        chunk_rows: int,
        gpus: list[str],
        store: Any,
        topology: Topology,
        group: Any = None,
        device: str | torch.device = "cpu",
    ) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if len(gpus) != self.world:
            raise ConfigError(f"{len(gpus)} GPUs named for {self.world} processes", key="gpus")
        self.group, self.store, self.device, self.topo = group, store, torch.device(device), topology
        self.gpus, self.me = gpus, gpus[self.rank]
        self.sources = stores_of(topology)
        m = dataset.manifest
        self.dim, self.dtype, self.chunk_rows = m.feature_dim, m.torch_dtype, chunk_rows
        self.row_bytes = m.feature_dim * m.torch_dtype.itemsize
        chunk_src = [self.sources.index(_checked(topology, hs, self.me, gpus)) for hs in placement.holders]
        node_chunk = torch.arange(m.num_nodes) // chunk_rows
        self.row_source = torch.tensor(chunk_src, dtype=torch.int64)[node_chunk]
        own_chunks = [c for c, hs in enumerate(placement.holders) if self.me in hs]
        host_chunks = [c for c, s in enumerate(chunk_src) if self._kind(s) is NodeKind.DRAM]
        self.own_ids, self.host_ids = self._ids(own_chunks, m.num_nodes), self._ids(host_chunks, m.num_nodes)
        self.own = store.read_rows(self.own_ids).to(self.device)
        self.host = store.read_rows(self.host_ids)
        self.stats = PlacedStats()
        self.log: list[BatchLog] = []
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carina-placed-disk")

    def _kind(self, s: int) -> NodeKind:
        return self.topo.nodes[self.sources[s]].kind

    def _ids(self, chunks: list[int], n: int) -> torch.Tensor:
        parts = [torch.arange(c * self.chunk_rows, min((c + 1) * self.chunk_rows, n)) for c in chunks]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def plan(self, n_id: torch.Tensor) -> PlacedPlan:
        """Each row's source (local, no communication)."""
        ids = n_id.cpu()
        return PlacedPlan(n_id=ids, source=self.row_source[ids])

    def read(self, plan: PlacedPlan) -> torch.Tensor:
        """Plan the batch's routes with every rank, then fetch source by source in the plan's order."""
        counts = torch.bincount(plan.source, minlength=len(self.sources)).to(torch.int64)
        gathered = [torch.zeros_like(counts) for _ in range(self.world)]
        _dist().all_gather(gathered, counts, group=self.group)
        matrix = torch.stack(gathered).numpy()
        routes = plan_batch(self.topo, self.sources, self.gpus, matrix, self.row_bytes)
        log = self._start_log(routes)
        out = torch.empty(plan.n_id.numel(), self.dim, dtype=self.dtype)
        exchanged, disk = False, []
        for name in [*routes.order[self.me], self.me]:
            kind, s = self.topo.nodes[name].kind, self.sources.index(name)
            if kind is NodeKind.GPU and name != self.me:
                if not exchanged:
                    self._exchange(plan, matrix, out, log, routes.order[self.me])
                    exchanged = True
            elif bool((plan.source == s).any()):
                log.order.append(name)
                if kind is NodeKind.SSD:  # slow: runs in the background while the next sources are fetched
                    disk.append(self._disk.submit(self._fetch_local, plan, s, out, log))
                else:
                    self._fetch_local(plan, s, out, log)
        if not exchanged:
            self._exchange(plan, matrix, out, log, [])  # serve the peers even when we need nothing from them
        for fut in disk:
            fut.result()
        self.log.append(log)
        return out

    def close(self) -> None:
        """Stop the background disk reader (the store stays open)."""
        self._disk.shutdown(wait=True)

    def _start_log(self, routes: BatchRoutes) -> BatchLog:
        mine = {s: b for (s, g), b in routes.bytes.items() if g == self.me}
        routed = {s: routes.route_bytes(s, self.me) for s in mine}
        return BatchLog(planned=mine, routed=routed, plan_order=list(routes.order[self.me]), predicted_s=routes.time_s)

    def _fetch_local(self, plan: PlacedPlan, s: int, out: torch.Tensor, log: BatchLog) -> None:
        """Rows of source ``s`` (own cache, DRAM or SSD) into ``out``."""
        pos = torch.nonzero(plan.source == s).flatten()
        if pos.numel() == 0:
            return
        ids, kind, name = plan.n_id[pos], self._kind(s), self.sources[s]
        if kind is NodeKind.SSD:
            rows = self.store.read_rows(ids)
            self.stats.disk += ids.numel()
        elif kind is NodeKind.DRAM:
            rows = self.host[torch.searchsorted(self.host_ids, ids)]
            self.stats.host += ids.numel()
        else:
            rows = self.own[torch.searchsorted(self.own_ids, ids)].cpu()
            self.stats.own += ids.numel()
        out[pos] = rows
        if name != self.me:
            log.pulled[name] = log.pulled.get(name, 0) + rows.numel() * rows.element_size()

    def _exchange(
        self, plan: PlacedPlan, matrix: np.ndarray, out: torch.Tensor, log: BatchLog, order: list[str]
    ) -> None:
        """One all-to-all: each peer sends exactly the rows each rank's counts asked of it.

        Peers are logged in ``order`` (the plan's), since one exchange serves them all.
        """
        peer_src = [self.sources.index(g) for g in self.gpus]
        send_n = [int(matrix[self.rank, peer_src[p]]) if p != self.rank else 0 for p in range(self.world)]
        recv_n = [int(matrix[q, peer_src[self.rank]]) if q != self.rank else 0 for q in range(self.world)]
        want = [torch.nonzero(plan.source == peer_src[p]).flatten() if send_n[p] else None for p in range(self.world)]
        pos = torch.cat([w for w in want if w is not None] or [torch.zeros(0, dtype=torch.int64)])
        asked = torch.empty(sum(recv_n), dtype=torch.int64)
        dist = _dist()
        dist.all_to_all_single(asked, plan.n_id[pos].contiguous(), recv_n, send_n, group=self.group)
        answer = self.own[torch.searchsorted(self.own_ids, asked)].cpu().contiguous()
        got = torch.empty(pos.numel(), self.dim, dtype=self.dtype)
        dist.all_to_all_single(got, answer, send_n, recv_n, group=self.group)
        out[pos] = got
        self.stats.peer += pos.numel()
        for p, part in enumerate(torch.split(got, send_n)):
            if send_n[p]:
                log.pulled[self.gpus[p]] = part.numel() * part.element_size()
        log.order += [g for g in order if g in log.pulled and g in self.gpus]

    def assemble(self, plan: PlacedPlan, rows: torch.Tensor) -> torch.Tensor:
        """The batch on the compute device."""
        return rows.to(self.device)

    def gather(self, n_id: torch.Tensor) -> torch.Tensor:
        """All stages at once (collective: every rank must call it)."""
        plan = self.plan(n_id)
        return self.assemble(plan, self.read(plan))


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _checked(topo: Topology, holders: list[str], me: str, gpus: list[str]) -> str:
    src = source_of(topo, holders, me)
    if topo.nodes[src].kind is NodeKind.GPU and src not in gpus:
        raise ConfigError(f"chunk held by {holders}, none of which this run can read", key="placement")
    return src
