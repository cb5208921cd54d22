"""The sampler thread's host reads: counted on the CPU, fixed per batch, and the outputs unchanged.

Session 13 removed the waits for the device that the sampler and the cache lookup did not need
(boolean masks, ``nonzero``, a CPU sort with its order copied back); session 14 left the sampler one
read a hop and one more (a hop's new nodes and their count stay on the device until the next hop's
read). These tests pin the count of what is left and compare the outputs bit for bit with the code
as it was (the references below: before session 13, and the session-13 sampler).
"""

import dataclasses

import pytest
import torch

from carina.core.errors import ConfigError
from carina.gnn import sampler as sampler_mod
from carina.gnn.cache import MISS, CacheConfig, CacheLookup, StaticCache
from carina.gnn.graph import chung_lu, from_edge_index, rmat
from carina.gnn.sampler import NeighborSampler
from carina.testing.gnn_sync import count_host_syncs


@pytest.fixture(scope="module")
def graph():
    return chung_lu(num_nodes=1 << 12, avg_degree=12, gamma=2.1, seed=5)


# -- the code before session 13, kept as the reference -------------------------------------------
def _ref_uniform(graph, nodes, fanout, gen):
    start = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - start
    pos = torch.arange(nodes.numel())
    small = deg <= fanout if fanout >= 0 else torch.ones_like(deg, dtype=torch.bool)

    def take_all(start, deg, pos):
        total = int(deg.sum())
        owner = torch.repeat_interleave(pos, deg)
        first = torch.repeat_interleave(start - (torch.cumsum(deg, 0) - deg), deg)
        return owner, first + torch.arange(total)

    own_s, edge_s = take_all(start[small], deg[small], pos[small])
    if fanout < 0:
        return graph.indices[edge_s].to(torch.int64), own_s
    big = ~small
    s, d, p = start[big], deg[big], pos[big]
    m = d.numel()
    picks = torch.empty(m, fanout, dtype=torch.int64)
    for i in range(fanout):
        j = d - fanout + i
        t = torch.minimum((torch.rand(m, generator=gen, dtype=torch.float64) * (j + 1)).long(), j)
        picks[:, i] = torch.where((picks[:, :i] == t.unsqueeze(1)).any(dim=1), j, t)
    own = torch.cat([own_s, p.repeat_interleave(fanout)])
    edges = torch.cat([edge_s, (s.unsqueeze(1) + picks).reshape(-1)])
    return graph.indices[edges].to(torch.int64), own


def _ref_sample(graph, fanouts, gen, seeds):
    local = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    n = seeds.numel()
    local[seeds] = torch.arange(n)
    parts, srcs, dsts, counts = [seeds], [], [], [n]
    frontier, frontier_local = seeds, torch.arange(n)
    for fanout in fanouts:
        src, owner = _ref_uniform(graph, frontier, fanout, gen)
        fresh = torch.unique(src[local[src] < 0])
        local[fresh] = torch.arange(n, n + fresh.numel())
        n += fresh.numel()
        parts.append(fresh)
        srcs.append(local[src])
        dsts.append(frontier_local[owner])
        counts.append(fresh.numel())
        frontier, frontier_local = fresh, local[fresh]
    return torch.cat(parts), torch.stack([torch.cat(srcs), torch.cat(dsts)]), counts


# -- the session-13 sampler (two reads a hop: the groups' sizes, then unique's size) -------------
def _s13_sample(graph, fanouts, gen, seeds):
    from carina.gnn.sampler import _floyd, _small_first, _take_all

    def uniform(nodes, fanout):
        start = graph.indptr[nodes]
        deg = graph.indptr[nodes + 1] - start
        pos = torch.arange(nodes.numel())
        if fanout < 0:
            total = int(deg.sum())
            own, edge = _take_all(start, deg, pos, total)
            return graph.indices[edge].to(torch.int64), own
        small = deg <= fanout
        n_small, total = (int(v) for v in torch.stack([small.sum(), torch.where(small, deg, 0).sum()]).tolist())
        order = _small_first(small, pos)
        keep, draw = order[:n_small], order[n_small:]
        own_s, edge_s = _take_all(start[keep], deg[keep], keep, total)
        own_b, edge_b = _floyd(start[draw], deg[draw], draw, fanout, gen)
        return graph.indices[torch.cat([edge_s, edge_b])].to(torch.int64), torch.cat([own_s, own_b])

    past = torch.tensor([graph.num_nodes])
    local = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    n = seeds.numel()
    local[seeds] = torch.arange(n)
    parts, srcs, dsts, counts_n, counts_e = [seeds], [], [], [n], []
    frontier, frontier_local = seeds, torch.arange(n)
    for fanout in fanouts:
        src, owner = uniform(frontier, fanout)
        fresh = torch.unique(torch.cat([torch.where(local[src] < 0, src, past), past]))[:-1]
        local[fresh] = torch.arange(n, n + fresh.numel())
        n += fresh.numel()
        parts.append(fresh)
        srcs.append(local[src])
        dsts.append(frontier_local[owner])
        counts_n.append(fresh.numel())
        counts_e.append(src.numel())
        frontier, frontier_local = fresh, local[fresh]
    return torch.cat(parts), torch.stack([torch.cat(srcs), torch.cat(dsts)]), counts_n, counts_e


def _ref_lookup(cache, n_id, host_on_device):
    s = cache.slot[n_id]
    gpu_pos = torch.nonzero(s >= 0).flatten()
    host_pos = torch.nonzero(s <= -2).flatten()
    miss_pos = torch.nonzero(s == MISS).flatten()
    miss_ids, order = torch.sort(n_id[miss_pos])
    return CacheLookup(
        gpu_pos=gpu_pos,
        gpu_slot=s[gpu_pos].to(torch.int64),
        host_pos=host_pos,
        host_slot=(-2 - s[host_pos]).to(torch.int64),
        miss_pos=miss_pos[order],
        miss_ids=miss_ids,
    )


# -- the sampler ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fanouts", [[25, 10], [15, 10, 5], [3], [-1], [4, -1]])
def test_sampler_batches_equal_the_masked_reference(graph, fanouts):
    sampler = NeighborSampler(graph, fanouts=fanouts, seed=7)
    gen = torch.Generator().manual_seed(7)
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(1))
    for i in range(4):  # one generator across batches: its state must advance alike
        seeds = perm[i * 64 : (i + 1) * 64]
        got = sampler.sample(seeds)
        n_id, edge_index, counts = _ref_sample(graph, fanouts, gen, seeds)
        assert torch.equal(got.n_id, n_id)
        assert torch.equal(got.edge_index, edge_index)
        assert got.num_sampled_nodes == counts
    assert torch.equal(sampler.gen.get_state(), gen.get_state())


@pytest.mark.parametrize("fanouts", [[25, 10], [15, 10, 5], [-1]])
def test_sampler_reads_the_host_once_a_hop_and_once_more(graph, fanouts):
    sampler = NeighborSampler(graph, fanouts=fanouts, seed=0)
    with count_host_syncs() as syncs:
        sampler.sample(torch.arange(0, 4096, 16))
    assert dict(syncs.ops) == {"host_ints": len(fanouts) + 1}


def _small_graph():
    """Hubs, leaves and isolated nodes: node 0 has 40 in-neighbours, 1-9 one or two, 10-19 none."""
    src = torch.cat([torch.arange(1, 41), torch.arange(1, 10), torch.arange(2, 10)])
    dst = torch.cat([torch.zeros(40, dtype=torch.int64), torch.arange(2, 11), torch.arange(1, 9)])
    return from_edge_index(torch.stack([src, dst]), num_nodes=50)


@pytest.mark.parametrize("which", ["chung_lu", "rmat", "small"])
@pytest.mark.parametrize("fanouts", [[25, 10], [15, 10, 5], [1], [-1, 3], [2, 2, 2, 2], [3, -1]])
def test_sampler_equals_the_session_13_sampler(graph, which, fanouts):
    g = {"chung_lu": graph, "rmat": rmat(scale=11, edge_factor=8, seed=3), "small": _small_graph()}[which]
    for seed in (0, 1, 2):
        sampler = NeighborSampler(g, fanouts=fanouts, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(g.num_nodes, generator=torch.Generator().manual_seed(seed + 10))
        for size in (1, 17, g.num_nodes // 3, g.num_nodes):  # a lone seed, a batch, a third, every node
            seeds = perm[:size]
            got = sampler.sample(seeds)
            n_id, edge_index, counts_n, counts_e = _s13_sample(g, fanouts, gen, seeds)
            assert torch.equal(got.n_id, n_id) and torch.equal(got.edge_index, edge_index)
            assert got.num_sampled_nodes == counts_n and got.num_sampled_edges == counts_e
            assert bool((sampler._local == -1).all())  # the spare entry too
        assert torch.equal(sampler.gen.get_state(), gen.get_state())


@pytest.mark.parametrize("fanouts,batch_size", [([25, 10], 100), ([15, 10, 5], 64), ([-1, 2], 333), ([4], 4096)])
def test_epoch_batches_equal_the_session_13_sampler(graph, fanouts, batch_size):
    """The first hop's sizes read once for the epoch give the batches one read each gave."""
    train_idx = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(6))[:1000]
    sampler = NeighborSampler(graph, fanouts=fanouts, seed=4)
    gen = torch.Generator().manual_seed(4)
    idx = train_idx[torch.randperm(train_idx.numel(), generator=gen)]
    got = list(sampler.batches(train_idx, batch_size))
    assert len(got) == -(-1000 // batch_size)
    for i, (b, seeds) in enumerate(zip(got, idx.split(batch_size), strict=True)):
        n_id, edge_index, counts_n, counts_e = _s13_sample(graph, fanouts, gen, seeds)
        assert b.index == i and torch.equal(b.n_id, n_id) and torch.equal(b.edge_index, edge_index)
        assert b.num_sampled_nodes == counts_n and b.num_sampled_edges == counts_e
    assert torch.equal(sampler.gen.get_state(), gen.get_state())


@pytest.mark.parametrize("window", [1 << 22, 300, 1])  # one window; 2 batches a window; 1 batch a window
@pytest.mark.parametrize("fanouts", [[25, 10], [15, 10, 5]])
def test_an_epoch_reads_the_first_hops_once(graph, fanouts, window, monkeypatch):
    monkeypatch.setattr(sampler_mod, "FIRST_HOPS_WINDOW", window)
    sampler = NeighborSampler(graph, fanouts=fanouts, seed=0)
    with count_host_syncs() as syncs:
        batches = list(sampler.batches(torch.arange(0, 4000, 4), 128))  # the last batch 104 seeds
    assert len(batches) == 8
    assert dict(syncs.ops) == {"host_ints": 8 * len(fanouts) + 1}
    want = NeighborSampler(graph, fanouts=fanouts, seed=0)
    want_idx = torch.arange(0, 4000, 4)[torch.randperm(1000, generator=want.gen)]
    for b, seeds in zip(batches, want_idx.split(128), strict=True):
        assert torch.equal(b.n_id, want.sample(seeds).n_id)


def test_batches_refuse_a_batch_size_below_one_and_sample_an_empty_epoch(graph):
    with pytest.raises(ConfigError, match="batch_size"):
        next(NeighborSampler(graph, fanouts=[3], seed=0).batches(torch.arange(10), 0))
    (empty,) = NeighborSampler(graph, fanouts=[3, 2], seed=0).batches(torch.zeros(0, dtype=torch.int64), 8)
    assert empty.n_id.numel() == 0 and empty.num_sampled_nodes == [0, 0, 0]  # as ``split`` gives: one empty batch


def test_new_nodes_are_as_long_as_the_edges_and_count_on_the_device(graph):
    """The padded new nodes: ``src.numel() + 1`` long (no bound beyond the edges), unique's values first."""
    sampler = NeighborSampler(graph, fanouts=[5], seed=0)
    src = torch.randint(0, graph.num_nodes, (3000,), generator=torch.Generator().manual_seed(4))
    sampler._local[src[:500]] = 7  # labelled already: left out
    with count_host_syncs() as syncs:
        padded, count = sampler._new_nodes(src)
    want = torch.unique(src[sampler._local[src] < 0])
    assert syncs.total == 0 and count.dim() == 0 and int(count) == want.numel()
    assert padded.numel() == src.numel() + 1 and torch.equal(padded[: int(count)], want)
    assert bool((padded[int(count) :] == graph.num_nodes).all())


# -- the cache lookup ----------------------------------------------------------------------------
def _cache(num_nodes, gpu_rows, host_rows):
    hot = torch.rand(num_nodes, generator=torch.Generator().manual_seed(2))
    return StaticCache(
        hotness=hot,
        config=CacheConfig(gpu_rows=gpu_rows, host_rows=host_rows),
        dim=4,
        dtype=torch.float32,
        device="cpu",
        fetch=lambda ids: ids.to(torch.float32).unsqueeze(1).expand(-1, 4),
    )


@pytest.mark.parametrize("host_on_device", [False, True])
@pytest.mark.parametrize("gpu_rows,host_rows", [(0, 0), (300, 0), (0, 500), (200, 700), (4096, 0), (0, 4096)])
def test_lookup_equals_the_nonzero_reference(graph, gpu_rows, host_rows, host_on_device):
    cache = _cache(graph.num_nodes, gpu_rows, host_rows)
    n_id = NeighborSampler(graph, fanouts=[10, 5], seed=3).sample(torch.arange(100, 300)).n_id
    got, want = cache.lookup(n_id, host_on_device=host_on_device), _ref_lookup(cache, n_id, host_on_device)
    for f in dataclasses.fields(CacheLookup):
        g, w = getattr(got, f.name), getattr(want, f.name)
        assert g.dtype == w.dtype == torch.int64 and torch.equal(g, w), f.name
    split = got.gpu_pos.numel() + got.host_pos.numel() + got.miss_pos.numel()
    assert split == n_id.numel() and got.gpu_pos.numel() <= gpu_rows and got.host_pos.numel() <= host_rows


@pytest.mark.parametrize("host_on_device", [False, True])
def test_lookup_reads_the_host_twice(graph, host_on_device):
    cache = _cache(graph.num_nodes, 1000, 1000)
    n_id = NeighborSampler(graph, fanouts=[10, 5], seed=3).sample(torch.arange(100, 300)).n_id
    with count_host_syncs() as syncs:
        lk = cache.lookup(n_id, host_on_device=host_on_device)
    assert lk.gpu_pos.numel() and lk.host_pos.numel() and lk.miss_pos.numel()
    assert dict(syncs.ops) == {"host_ints": 1, "to_host": 1}


def test_lookup_and_sample_of_nothing(graph):
    """An empty batch splits into empty tiers; a frontier whose neighbours are all labelled adds no node."""
    lk = _cache(graph.num_nodes, 100, 100).lookup(torch.zeros(0, dtype=torch.int64))
    assert all(getattr(lk, f.name).numel() == 0 for f in dataclasses.fields(CacheLookup))
    sampler = NeighborSampler(graph, fanouts=[-1], seed=0)
    padded, count = sampler._new_nodes(torch.zeros(0, dtype=torch.int64))
    assert int(count) == 0 and padded.tolist() == [graph.num_nodes]
    everyone = torch.arange(graph.num_nodes)
    b = NeighborSampler(graph, fanouts=[-1, -1, -1], seed=0).sample(everyone)
    assert b.num_sampled_nodes == [graph.num_nodes, 0, 0, 0] and torch.equal(b.n_id, everyone)


# -- the counter itself --------------------------------------------------------------------------
def test_the_counter_sees_each_kind_of_host_read():
    x = torch.arange(10)
    mask = x > 4
    reads = {
        "index[mask]": lambda: x[mask],
        "index_put_[mask]": lambda: x.clone().__setitem__(mask, 0),
        "nonzero": lambda: torch.nonzero(mask),
        "_unique2": lambda: torch.unique(x),
        "_local_scalar_dense": lambda: int(x.sum()),
        "bincount": lambda: torch.bincount(x),
        "repeat_interleave(no output_size)": lambda: torch.repeat_interleave(x, x),
    }
    for name, read in reads.items():
        with count_host_syncs() as syncs:
            read()
        assert dict(syncs.ops) == {name: 1}
    with count_host_syncs() as syncs:  # sized, sorted, gathered: none waits
        torch.repeat_interleave(x, x, output_size=45)
        torch.sort(x)
        x[x[:3]]
        x.repeat_interleave(3)
    assert syncs.total == 0


@pytest.mark.gpu
@pytest.mark.parametrize("host_on_device", [False, True])
def test_cuda_lookup_equals_the_cpu_lookup(graph, host_on_device):
    """The sort-based split on a CUDA cache gives the CPU's split, each tensor where the paths want it."""
    cpu = _cache(graph.num_nodes, 1000, 1000)
    cuda = StaticCache(
        hotness=torch.rand(graph.num_nodes, generator=torch.Generator().manual_seed(2)),
        config=CacheConfig(gpu_rows=1000, host_rows=1000),
        dim=4,
        dtype=torch.float32,
        device="cuda",
        fetch=lambda ids: ids.to(torch.float32).unsqueeze(1).expand(-1, 4),
    )
    n_id = NeighborSampler(graph, fanouts=[10, 5], seed=3).sample(torch.arange(100, 300)).n_id
    want, got = cpu.lookup(n_id), cuda.lookup(n_id.cuda(), host_on_device=host_on_device)
    for f in dataclasses.fields(CacheLookup):
        assert torch.equal(getattr(got, f.name).cpu(), getattr(want, f.name)), f.name
    assert got.gpu_pos.is_cuda and got.miss_pos.is_cuda and not got.miss_ids.is_cuda
    assert got.host_pos.is_cuda == got.host_slot.is_cuda == host_on_device
