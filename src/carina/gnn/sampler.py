"""Uniform neighbour sampling in pure torch, on the GPU or the CPU.

Each hop takes, for every frontier node, a uniform sample without replacement
of ``min(fanout, degree)`` in-neighbours: nodes with few neighbours keep them
all; the rest use Floyd's algorithm vectorised over nodes (``fanout``
vector steps, ``O(nodes * fanout**2)`` comparisons), so a hub costs no more
than a leaf. Nodes are relabelled through a persistent map of ``num_nodes + 1``
entries on the sampling device (reset after each batch; the last one labels
padding), seeds first, then each hop's new nodes in id order, like PyG's
``NeighborLoader``. A batch reads device values on the host once per hop and
once more (:mod:`carina.gnn.hostread`); in :meth:`NeighborSampler.batches` the
first hop's reads are one for the whole epoch::

    sampler = NeighborSampler(graph, fanouts=[15, 10, 5], seed=0)
    batch = sampler.sample(torch.arange(1024))
    data = batch.to_data(x=features[batch.n_id])    # a torch_geometric Data
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from carina.core.errors import ConfigError
from carina.gnn import hostread
from carina.gnn.graph import CSCGraph

__all__ = ["FIRST_HOPS_WINDOW", "NeighborSampler", "SampledBatch", "sample_uniform"]

FIRST_HOPS_WINDOW = 1 << 22
"""Most training ids whose first-hop sizes :meth:`NeighborSampler.batches` sums at once (whole batches)."""


@dataclass
class SampledBatch:
    """One mini-batch subgraph in PyG's layout.

    Attributes:
        n_id: Global ids of every node in the subgraph, seeds first.
        edge_index: ``[2, E]`` local ``(src, dst)`` ids; messages flow src -> dst.
        batch_size: Number of seed nodes (the first ``batch_size`` of ``n_id``).
        num_sampled_nodes: New nodes per hop (hop 0 = the seeds).
        num_sampled_edges: Edges per hop.
        index: Position of this batch in its epoch.
    """

    n_id: torch.Tensor
    edge_index: torch.Tensor
    batch_size: int
    num_sampled_nodes: list[int] = field(default_factory=list)
    num_sampled_edges: list[int] = field(default_factory=list)
    index: int = 0

    def to_data(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        """A ``torch_geometric.data.Data`` holding this batch with features ``x``."""
        from torch_geometric.data import Data

        data = Data(x=x, edge_index=self.edge_index.to(x.device), n_id=self.n_id, batch_size=self.batch_size)
        data.num_sampled_nodes = list(self.num_sampled_nodes)
        data.num_sampled_edges = list(self.num_sampled_edges)
        if y is not None:
            data.y = y
        return data

    def to(self, device: str | torch.device) -> SampledBatch:
        """The same batch with tensors on ``device``."""
        return SampledBatch(
            n_id=self.n_id.to(device),
            edge_index=self.edge_index.to(device),
            batch_size=self.batch_size,
            num_sampled_nodes=self.num_sampled_nodes,
            num_sampled_edges=self.num_sampled_edges,
            index=self.index,
        )


def sample_uniform(
    graph: CSCGraph, nodes: torch.Tensor, fanout: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to ``fanout`` distinct in-neighbours of each node uniformly.

    Nodes with at most ``fanout`` neighbours keep them all, the others draw ``fanout`` by Floyd's
    algorithm; the result holds the first group's edges, then the second's, each in frontier order.
    One host read per call (the first group's size and edge count, :func:`carina.gnn.hostread.host_ints`):
    the groups are made by scattering positions, not by boolean masks (a mask index waits for the
    device once per tensor it selects from: six waits a hop before session 13).

    Args:
        graph: Topology on the sampling device.
        nodes: Global ids of the frontier.
        fanout: Neighbours per node; ``-1`` takes all of them.
        gen: Random generator on the sampling device.

    Returns:
        ``(src, owner)``: global id of each sampled neighbour and the position in
        ``nodes`` of the node it was sampled for.
    """
    n_small, total = hostread.host_ints(_hop_sizes(graph, nodes, fanout))
    return _draw(graph, nodes, fanout, gen, n_small, total)


def _hop_sizes(graph: CSCGraph, nodes: torch.Tensor, fanout: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """What a hop must know on the host, on the device: ``[n_small, total]``, or ``[count, n_small, total]``.

    ``n_small`` nodes have at most ``fanout`` neighbours (all of them with ``-1``) and ``total``
    neighbours between them. With ``count`` (a device scalar), ``nodes`` is padded: its first
    ``count`` entries are the frontier, the rest ``num_nodes`` (degree 0 here, left out of
    ``n_small``), and ``count`` leads the result so the three come to the host in one read.
    """
    small, edges = _groups(graph, nodes, fanout)
    if count is None:
        return torch.stack([small.sum(), edges.sum()])
    valid = torch.arange(nodes.numel(), device=nodes.device) < count
    return torch.stack([count, (small & valid).sum(), edges.sum()])


def _groups(graph: CSCGraph, nodes: torch.Tensor, fanout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each node takes all its neighbours, and how many it takes that way (0 for the others)."""
    start = graph.indptr[nodes]
    deg = graph.indptr[torch.clamp(nodes + 1, max=graph.num_nodes)] - start
    small = deg <= fanout if fanout >= 0 else torch.ones_like(deg, dtype=torch.bool)
    return small, torch.where(small, deg, 0)


def _draw(
    graph: CSCGraph, nodes: torch.Tensor, fanout: int, gen: torch.Generator, n_small: int, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_uniform` given its host read (``n_small``, ``total``: :func:`_hop_sizes`)."""
    start = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - start
    pos = torch.arange(nodes.numel(), device=nodes.device)
    if fanout < 0:
        own, edge = _take_all(start, deg, pos, total)
        return graph.indices[edge].to(torch.int64), own
    small = deg <= fanout
    order = _small_first(small, pos)
    keep, draw = order[:n_small], order[n_small:]
    own_s, edge_s = _take_all(start[keep], deg[keep], keep, total)
    own_b, edge_b = _floyd(start[draw], deg[draw], draw, fanout, gen)
    edges = torch.cat([edge_s, edge_b])
    owner = torch.cat([own_s, own_b])
    return graph.indices[edges].to(torch.int64), owner


def _small_first(small: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Positions of the ``small`` nodes in order, then the others in order (no wait for the device).

    Each position goes to its rank in its group, the others after all the small ones: the same
    order as ``cat([pos[small], pos[~small]])``, without the two masks' host reads.
    """
    s = small.to(torch.int64)
    before = torch.cumsum(s, 0) - s  # small nodes before each position
    dest = torch.where(small, before, pos - before + s.sum())
    order = torch.empty_like(pos)
    order[dest] = pos
    return order


def _take_all(
    start: torch.Tensor, deg: torch.Tensor, pos: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    owner = torch.repeat_interleave(pos, deg, output_size=total)
    first = torch.repeat_interleave(start - (torch.cumsum(deg, 0) - deg), deg, output_size=total)
    return owner, first + torch.arange(total, device=start.device)


def _floyd(
    start: torch.Tensor, deg: torch.Tensor, pos: torch.Tensor, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Floyd's uniform k-subset of ``range(deg)`` for each node, all nodes at once."""
    m = deg.numel()
    picks = torch.empty(m, k, dtype=torch.int64, device=deg.device)
    for i in range(k):
        j = deg - k + i
        t = (torch.rand(m, generator=gen, device=deg.device, dtype=torch.float64) * (j + 1)).long()
        t = torch.minimum(t, j)
        dup = (picks[:, :i] == t.unsqueeze(1)).any(dim=1)
        picks[:, i] = torch.where(dup, j, t)
    return pos.unsqueeze(1).expand(m, k).reshape(-1), (start.unsqueeze(1) + picks).reshape(-1)


class NeighborSampler:
    """Multi-hop uniform neighbour sampler producing PyG-style subgraphs.

    Args:
        graph: CSC topology (moved to ``device``).
        fanouts: Neighbours per hop, outermost last (``[25, 10]``, ``[15, 10, 5]``).
        device: Where sampling runs (``"cuda"`` or ``"cpu"``; same code).
        seed: Seed of the sampler's generator; same seed, same batches.
    """

    def __init__(
        self,
        graph: CSCGraph,
        *,
        fanouts: Sequence[int],
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        if not fanouts or any(f == 0 or f < -1 for f in fanouts):
            raise ConfigError("fanouts must be positive (or -1 for all neighbours)", key="fanouts")
        self.device = torch.device(device)
        self.graph = graph.to(self.device)
        self.fanouts = list(fanouts)
        self.seed = seed
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)
        self._local = torch.full((graph.num_nodes + 1,), -1, dtype=torch.int64, device=self.device)
        self._past_last = torch.tensor([graph.num_nodes], dtype=torch.int64, device=self.device)

    def reseed(self, seed: int) -> None:
        """Restart the generator (same seed -> same batches)."""
        self.seed = seed
        self.gen.manual_seed(seed)

    def sample(self, seeds: torch.Tensor, *, index: int = 0) -> SampledBatch:
        """Sample the subgraph of ``seeds`` (distinct global ids): one host read per hop, and one more.

        A hop's new nodes stay on the device, in a buffer as long as its sampled edges (plus one)
        with their count beside them (:meth:`_new_nodes`); the next hop reads that count together
        with its own sizes (:func:`_hop_sizes`) and the last count is read after the last hop.
        Before session 14 each hop read twice (its sizes, then ``torch.unique``'s size).
        """
        return self._sample(seeds, index, None)

    def _sample(self, seeds: torch.Tensor, index: int, first: list[int] | None) -> SampledBatch:
        """:meth:`sample`, given the first hop's sizes (read already by :meth:`batches`) or not."""
        seeds = seeds.to(self.device, torch.int64)
        n = seeds.numel()
        local = self._local
        local[seeds] = torch.arange(n, device=self.device)
        parts, labelled, srcs, dsts = [seeds], [seeds], [], []
        frontier, frontier_local = seeds, torch.arange(n, device=self.device)
        counts_n, counts_e = [n], []
        count: torch.Tensor | None = None  # new nodes in ``frontier`` (padded) when read later
        try:
            for fanout in self.fanouts:
                if first is not None and count is None:  # the first hop, its sizes read for the epoch
                    sizes = list(first)
                else:
                    sizes = hostread.host_ints(_hop_sizes(self.graph, frontier, fanout, count))
                if count is not None:
                    fresh = sizes.pop(0)
                    frontier = frontier[:fresh]
                    frontier_local = torch.arange(n, n + fresh, device=self.device)
                    parts.append(frontier)
                    counts_n.append(fresh)
                    n += fresh
                src, owner = _draw(self.graph, frontier, fanout, self.gen, *sizes)
                padded, count = self._new_nodes(src)
                local[padded] = torch.arange(n, n + padded.numel(), device=self.device)
                labelled.append(padded)
                srcs.append(local[src])
                dsts.append(frontier_local[owner])
                counts_e.append(src.numel())
                frontier = padded
            (fresh,) = hostread.host_ints(count.reshape(1)) if count is not None else (0,)
            parts.append(frontier[:fresh])
            counts_n.append(fresh)
            n_id = torch.cat(parts)
        finally:
            local[torch.cat(labelled)] = -1
        edge_index = torch.stack([torch.cat(srcs), torch.cat(dsts)])
        return SampledBatch(n_id, edge_index, seeds.numel(), counts_n, counts_e, index)

    def _new_nodes(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct ids of ``src`` not labelled yet, ascending, then ``num_nodes``; and their count.

        No host read: the result is ``src.numel() + 1`` long whatever the count, so its size needs
        none, and the count stays on the device until the next host read. Labelled ids become
        ``num_nodes`` (one past the last id), one such id is appended, the ids are sorted, and the
        first of each run of equal ids other than ``num_nodes`` is scattered to its rank: the
        values of ``torch.unique`` (before session 14, one host read a hop) in its order. The
        padding, ``num_nodes``, labels the relabel map's spare last entry.
        """
        past = self._past_last
        pending = torch.where(self._local[src] < 0, src, past)
        ids = torch.sort(torch.cat([pending, past])).values
        first = torch.ones_like(ids, dtype=torch.bool)
        first[1:] = ids[1:] != ids[:-1]
        new = first & (ids != past)
        rank = torch.cumsum(new, 0) - 1
        out = past.expand(ids.numel() + 1).clone()  # the last entry takes the others, dropped below
        out.scatter_(0, torch.where(new, rank, ids.numel()), ids)
        return out[:-1], new.sum()

    def batches(self, train_idx: torch.Tensor, batch_size: int, *, shuffle: bool = True) -> Iterator[SampledBatch]:
        """Sample one epoch of batches over ``train_idx``: one host read per hop a batch, one more a batch.

        Every batch's seeds are known when the epoch starts, so the first hop's sizes of all the
        batches are read at once (:meth:`_first_hops`: one read an epoch, not one a batch).

        Raises:
            ConfigError: ``batch_size`` is below 1.
        """
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}", key="batch_size")
        idx = train_idx.to(self.device, torch.int64)
        if shuffle:
            idx = idx[torch.randperm(idx.numel(), generator=self.gen, device=self.device)]
        first = self._first_hops(idx, batch_size)
        for i, chunk in enumerate(idx.split(batch_size)):
            yield self._sample(chunk, i, first[2 * i : 2 * i + 2])

    def _first_hops(self, idx: torch.Tensor, batch_size: int) -> list[int]:
        """``n_small, total`` of the first hop (:func:`_hop_sizes`) of each ``batch_size`` chunk of ``idx``.

        One host read. The sums are over chunks padded to ``batch_size`` with zeros (no atomics:
        the same integers on every device), taken over windows of whole chunks of at most
        :data:`FIRST_HOPS_WINDOW` ids (or one chunk), so the temporaries stay bounded however
        large the epoch (about 50 bytes an id in a window) and only 16 bytes a chunk are kept.
        """
        chunks = max(1, -(-idx.numel() // batch_size))  # ``split`` makes one empty chunk of no ids
        per_window = max(1, FIRST_HOPS_WINDOW // batch_size) * batch_size
        sums = []
        for lo in range(0, chunks * batch_size, per_window):
            part = idx[lo : lo + per_window]
            small, edges = _groups(self.graph, part, self.fanouts[0])
            width = min(per_window, chunks * batch_size - lo)
            padded = torch.zeros(width, 2, dtype=torch.int64, device=idx.device)
            padded[: part.numel()] = torch.stack([small.to(torch.int64), edges], 1)
            sums.append(padded.view(-1, batch_size, 2).sum(1))
        return hostread.host_ints(torch.cat(sums).reshape(-1))
