import numpy as np
import pytest
import scipy.sparse as sp
import torch

from carina.core.errors import ConfigError
from carina.gnn.graph import CSCGraph, chung_lu, from_edge_index, from_pyg, node_features, node_labels, rmat


def test_from_edge_index_matches_scipy_csc():
    rng = np.random.default_rng(0)
    flat = rng.choice(50 * 50, size=400, replace=False)  # distinct pairs: scipy would merge duplicates
    ei = np.stack([flat // 50, flat % 50])
    g = from_edge_index(ei, num_nodes=50)
    ref = sp.coo_matrix((np.ones(400), (ei[0], ei[1])), shape=(50, 50)).tocsc()
    assert np.array_equal(g.indptr.numpy(), ref.indptr)
    for v in range(50):
        got = sorted(g.indices[g.indptr[v] : g.indptr[v + 1]].tolist())
        assert got == sorted(ref.indices[ref.indptr[v] : ref.indptr[v + 1]].tolist())


def test_edge_index_round_trip():
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    g = from_edge_index(ei)
    back = g.edge_index()
    assert sorted(zip(*back.tolist(), strict=True)) == sorted(zip(*ei.tolist(), strict=True))


def test_from_pyg_karate():
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    g = from_pyg(data)
    assert g.num_nodes == 34 and g.num_edges == data.edge_index.shape[1]
    assert int(g.in_degree()[33]) == 17


@pytest.mark.parametrize("bad", [np.zeros((3, 4)), np.array([[0, 5], [1, 1]])])
def test_from_edge_index_rejects_bad_input(bad):
    with pytest.raises(ConfigError):
        from_edge_index(bad, num_nodes=3)


def test_csc_checks_lengths():
    with pytest.raises(ConfigError, match="indptr ends"):
        CSCGraph(indptr=torch.tensor([0, 2, 5]), indices=torch.tensor([1, 0]))


def test_chung_lu_is_power_law_and_deterministic():
    g = chung_lu(num_nodes=1 << 14, avg_degree=10, gamma=2.1, seed=1)
    again = chung_lu(num_nodes=1 << 14, avg_degree=10, gamma=2.1, seed=1)
    assert torch.equal(g.indices, again.indices)
    out_deg = torch.bincount(g.indices.long(), minlength=g.num_nodes).sort(descending=True).values
    top1 = out_deg[: g.num_nodes // 100].sum() / out_deg.sum()
    assert top1 > 0.25  # heavy tail: top 1% of nodes hold over a quarter of endpoints
    assert not bool((g.indices.long() == g.edge_index()[1]).any())  # no self loops
    flat = chung_lu(num_nodes=1 << 14, avg_degree=10, gamma=3.5, seed=1)
    flat_deg = torch.bincount(flat.indices.long(), minlength=flat.num_nodes).sort(descending=True).values
    assert flat_deg[: flat.num_nodes // 100].sum() / flat_deg.sum() < top1


def test_rmat_sizes_and_isolated_nodes():
    g = rmat(scale=12, edge_factor=8, seed=0)
    assert g.num_nodes == 4096
    assert 0.9 * 8 * 4096 < g.num_edges <= 8 * 4096
    assert (g.in_degree() == 0).float().mean() > 0.1


def test_rmat_rejects_bad_probabilities():
    with pytest.raises(ConfigError):
        rmat(scale=4, abc=(0.5, 0.3, 0.3))


def test_features_are_a_function_of_id():
    ids = torch.tensor([5, 0, 123456789, 5])
    x = node_features(ids, dim=16, seed=2)
    assert torch.equal(x[0], x[3])
    assert torch.equal(x[1], node_features(torch.tensor([0]), dim=16, seed=2)[0])
    assert not torch.equal(x, node_features(ids, dim=16, seed=3))
    assert float(x.min()) >= -1.0 and float(x.max()) < 1.0
    # values sit on a 2**-23 grid: exact in fp32
    assert torch.equal(x * 2**23, torch.round(x * 2**23))


def test_labels_are_deterministic_and_use_all_classes():
    x = node_features(torch.arange(2000), dim=32)
    y = node_labels(x, num_classes=4)
    assert torch.equal(y, node_labels(x, num_classes=4))
    assert set(y.tolist()) == {0, 1, 2, 3}
