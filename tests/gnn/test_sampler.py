import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from carina.core.errors import ConfigError
from carina.gnn.graph import chung_lu, from_edge_index
from carina.gnn.sampler import NeighborSampler, sample_uniform


@pytest.fixture(scope="module")
def graph():
    return chung_lu(num_nodes=1 << 12, avg_degree=12, gamma=2.1, seed=5)


def _edge_set(g):
    ei = g.edge_index()
    return set(zip(ei[0].tolist(), ei[1].tolist(), strict=True))


def test_batch_structure(graph):
    s = NeighborSampler(graph, fanouts=[15, 10, 5], seed=0)
    seeds = torch.randperm(graph.num_nodes)[:256]
    b = s.sample(seeds)
    assert torch.equal(b.n_id[:256], seeds)
    assert b.n_id.unique().numel() == b.n_id.numel()
    assert sum(b.num_sampled_nodes) == b.n_id.numel()
    assert sum(b.num_sampled_edges) == b.edge_index.shape[1]
    edges = _edge_set(graph)
    src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
    assert all((a, c) in edges for a, c in zip(src.tolist(), dst.tolist(), strict=True))


def test_fanout_bounds_and_full_small_neighbourhoods(graph):
    s = NeighborSampler(graph, fanouts=[7], seed=1)
    seeds = torch.arange(500)
    b = s.sample(seeds)
    per_dst = torch.bincount(b.edge_index[1], minlength=500)
    deg = graph.in_degree()[seeds]
    assert torch.equal(per_dst, torch.minimum(deg, torch.tensor(7)))
    # no neighbour position is drawn twice for one node (without replacement)
    src, owner = sample_uniform(graph, seeds, 7, torch.Generator().manual_seed(0))
    assert src.numel() == int(torch.minimum(deg, torch.tensor(7)).sum())
    for v in range(0, 500, 25):
        nb = graph.indices[graph.indptr[v] : graph.indptr[v + 1]].tolist()
        got = src[owner == v].tolist()
        assert all(x in nb for x in got)
        if len(nb) == len(set(nb)):  # simple neighbourhood: samples are distinct
            assert len(got) == len(set(got))


def test_fanout_minus_one_takes_everything(graph):
    b = NeighborSampler(graph, fanouts=[-1], seed=0).sample(torch.tensor([3, 9]))
    assert b.edge_index.shape[1] == int(graph.in_degree()[[3, 9]].sum())


def test_uniformity_chi_square():
    # node 0 has 10 distinct in-neighbours; sample 3 of them many times
    ei = torch.stack([torch.arange(1, 11), torch.zeros(10, dtype=torch.int64)])
    g = from_edge_index(ei, num_nodes=11)
    gen = torch.Generator().manual_seed(1234)
    nodes = torch.zeros(20000, dtype=torch.int64)
    src, _ = sample_uniform(g, nodes, 3, gen)
    counts = torch.bincount(src, minlength=11)[1:].numpy()
    assert counts.sum() == 60000
    assert chisquare(counts).pvalue > 0.001
    # pairs are uniform too (Floyd gives uniform subsets, not only uniform marginals)
    picks = np.sort(src.reshape(-1, 3).numpy(), axis=1)
    assert (np.diff(picks, axis=1) > 0).all()
    keys = picks[:, 0] * 121 + picks[:, 1] * 11 + picks[:, 2]
    _, subset_counts = np.unique(keys, return_counts=True)
    assert subset_counts.size == 120
    assert chisquare(subset_counts).pvalue > 0.001


def test_same_seed_same_batches(graph):
    a = list(NeighborSampler(graph, fanouts=[5, 5], seed=9).batches(torch.arange(300), 100))
    b = list(NeighborSampler(graph, fanouts=[5, 5], seed=9).batches(torch.arange(300), 100))
    c = list(NeighborSampler(graph, fanouts=[5, 5], seed=10).batches(torch.arange(300), 100))
    assert all(
        torch.equal(x.n_id, y.n_id) and torch.equal(x.edge_index, y.edge_index) for x, y in zip(a, b, strict=True)
    )
    assert not all(torch.equal(x.n_id, y.n_id) for x, y in zip(a, c, strict=True))
    assert sorted(torch.cat([x.n_id[: x.batch_size] for x in a]).tolist()) == list(range(300))


def test_relabel_map_is_reset(graph):
    s = NeighborSampler(graph, fanouts=[10, 10], seed=0)
    s.sample(torch.arange(50))
    assert bool((s._local == -1).all())


def test_to_data_feeds_pyg_layers(graph):
    from torch_geometric.nn import SAGEConv

    b = NeighborSampler(graph, fanouts=[5], seed=0).sample(torch.arange(10))
    data = b.to_data(torch.randn(b.n_id.numel(), 8))
    out = SAGEConv(8, 4)(data.x, data.edge_index)
    assert out.shape == (b.n_id.numel(), 4) and data.batch_size == 10


@pytest.mark.parametrize("fanouts", [[], [0], [-2]])
def test_rejects_bad_fanouts(graph, fanouts):
    with pytest.raises(ConfigError):
        NeighborSampler(graph, fanouts=fanouts)


@pytest.mark.gpu
def test_gpu_sampler_matches_graph(graph):
    b = NeighborSampler(graph, fanouts=[10, 5], device="cuda").sample(torch.arange(64))
    edges = _edge_set(graph)
    src, dst = b.n_id[b.edge_index[0]].cpu(), b.n_id[b.edge_index[1]].cpu()
    assert all((a, c) in edges for a, c in zip(src.tolist(), dst.tolist(), strict=True))
