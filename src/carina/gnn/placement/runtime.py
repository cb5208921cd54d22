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
   from host memory, peer rows along the LP's paths (:mod:`~carina.gnn.placement.exchange`:
   the ids asked of each peer by one ``all_to_all_single``, the rows by staged point-to-point
   rounds, each pair's rows cut over its paths in proportion and relayed by the GPUs a path
   passes through when ``relay`` is on), and its own cache's rows last.

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
from carina.gnn.placement.exchange import Leg, digest, link_key, plan_link_bytes, run_legs, split_legs
from carina.gnn.placement.place import Placement, source_of, stores_of
from carina.gnn.placement.routes import UNIT_BYTES, BatchRoutes, plan_batch
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = ["BatchLog", "PlacedFeatures", "PlacedPlan"]


@dataclass
class PlacedPlan:
    """One batch: its node ids and the source index of each row."""

    n_id: torch.Tensor
    source: torch.Tensor  # index into PlacedFeatures.sources per row


@dataclass
class BatchLog:
    """What one batch did: the plan's bytes per source, the bytes pulled, the fetch order.

    ``sent_links`` holds the peer bytes this rank sent on each physical link (summed over
    ranks it is the batch's executed peer traffic per link); ``planned_links`` the plan's
    peer bytes per link in whole rows (same on every rank) and ``lp_links`` the LP's flows
    in bytes; ``relayed`` the bytes this rank forwarded for other ranks.
    """

    planned: dict[str, int] = field(default_factory=dict)
    routed: dict[str, float] = field(default_factory=dict)
    pulled: dict[str, int] = field(default_factory=dict)
    plan_order: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    predicted_s: float = 0.0
    sent_links: dict[str, int] = field(default_factory=dict)
    planned_links: dict[str, int] = field(default_factory=dict)
    lp_links: dict[str, float] = field(default_factory=dict)
    relayed: int = 0


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
        relay: bool = False,
    ) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if len(gpus) != self.world:
            raise ConfigError(f"{len(gpus)} GPUs named for {self.world} processes", key="gpus")
        self.group, self.store, self.device, self.topo = group, store, torch.device(device), topology
        self.gpus, self.me, self.relay = gpus, gpus[self.rank], relay
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
        routes = plan_batch(self.topo, self.sources, self.gpus, matrix, self.row_bytes, relay=self.relay)
        log = self._start_log(routes)
        # pinned for a CUDA device: assemble's copy is then asynchronous (the store's staging, session 8)
        pin = self.device.type == "cuda" and torch.cuda.is_available()
        out = torch.empty(plan.n_id.numel(), self.dim, dtype=self.dtype, pin_memory=pin)
        exchanged, disk = False, []
        for name in [*routes.order[self.me], self.me]:
            kind, s = self.topo.nodes[name].kind, self.sources.index(name)
            if kind is NodeKind.GPU and name != self.me:
                if not exchanged:
                    self._exchange(plan, matrix, out, log, routes)
                    exchanged = True
            elif bool((plan.source == s).any()):
                log.order.append(name)
                if kind is NodeKind.SSD:  # slow: runs in the background while the next sources are fetched
                    disk.append(self._disk.submit(self._fetch_local, plan, s, out, log))
                else:
                    self._fetch_local(plan, s, out, log)
        if not exchanged:
            self._exchange(plan, matrix, out, log, routes)  # serve and relay even when we need nothing
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
        self, plan: PlacedPlan, matrix: np.ndarray, out: torch.Tensor, log: BatchLog, routes: BatchRoutes
    ) -> None:
        """Peer rows along the plan's paths: ids by one all-to-all, rows by staged point-to-point rounds.

        Each peer pair's rows are cut over the LP's paths for that pair (whole rows, in
        proportion); a path through another GPU is relayed by that rank. Peers are logged in
        the plan's order, since one exchange serves them all.
        """
        peer_src = [self.sources.index(g) for g in self.gpus]
        send_n = [int(matrix[self.rank, peer_src[p]]) if p != self.rank else 0 for p in range(self.world)]
        recv_n = [int(matrix[q, peer_src[self.rank]]) if q != self.rank else 0 for q in range(self.world)]
        want = [torch.nonzero(plan.source == peer_src[p]).flatten() for p in range(self.world)]
        pos = torch.cat([want[p] for p in range(self.world) if send_n[p]] or [torch.zeros(0, dtype=torch.int64)])
        asked = torch.empty(sum(recv_n), dtype=torch.int64)
        dist = _dist()
        dist.all_to_all_single(asked, plan.n_id[pos].contiguous(), recv_n, send_n, group=self.group)
        asked_by = dict(enumerate(torch.split(asked, recv_n)))
        legs = split_legs(routes, self.topo, self.gpus, matrix, self.sources)
        self._check_same_plan(legs)
        log.planned_links = plan_link_bytes(legs, self.row_bytes)
        for (src, _), flow in routes.schedule.flows.items():
            for e, amount in flow.items() if src in self.gpus else ():
                log.lp_links[link_key(e)] = log.lp_links.get(link_key(e), 0.0) + amount * UNIT_BYTES

        def serve(dst: int, offset: int, rows: int) -> torch.Tensor:
            ids = asked_by[dst][offset : offset + rows]
            return self.own[torch.searchsorted(self.own_ids, ids)].cpu()

        got = run_legs(legs, self.rank, serve, (self.dim, self.dtype), log.sent_links, self.group)
        log.relayed = sum(x.rows * self.row_bytes for x in legs for r in x.ranks[1:-1] if r == self.rank)
        for p, parts in got.items():
            for offset, rows in parts:
                out[want[p][offset : offset + rows.shape[0]]] = rows
                log.pulled[self.gpus[p]] = log.pulled.get(self.gpus[p], 0) + rows.numel() * rows.element_size()
        self.stats.peer += pos.numel()
        log.order += [g for g in routes.order[self.me] if g in log.pulled and g in self.gpus]

    def _check_same_plan(self, legs: list[Leg]) -> None:
        """Every rank solved the LP itself; a different cut would deadlock the rounds, so compare first."""
        mine = torch.tensor([digest(legs)], dtype=torch.int64)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        _dist().all_gather(every, mine, group=self.group)
        if any(int(x) != int(mine) for x in every):
            raise ConfigError("ranks solved different transfer plans for one batch", key="routes", rank=self.rank)

    def assemble(self, plan: PlacedPlan, rows: torch.Tensor) -> torch.Tensor:
        """The batch on the compute device."""
        return rows.to(self.device, non_blocking=True)

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
