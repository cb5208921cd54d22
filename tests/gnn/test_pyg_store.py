import pytest
import torch

from carina.gnn.dataset import prepare_from_arrays
from carina.gnn.graph import chung_lu
from carina.gnn.pyg import CarinaFeatureStore, CSCGraphStore
from carina.gnn.store import OutOfCoreFeatures
from carina.gnn.train import InMemoryFeatures
from carina.io import IOConfig, IOEngine
from carina.testing.gnn import FeatureStoreTests, InMemoryFeatureStore


class TestReferenceStore(FeatureStoreTests):
    def make_store(self, expected):
        fs = InMemoryFeatureStore()
        fs.put_tensor(expected, group_name=None, attr_name="x", index=None)
        return fs


class TestCarinaInMemory(FeatureStoreTests):
    def make_store(self, expected):
        fs = CarinaFeatureStore()
        fs.register(InMemoryFeatures(expected), num_rows=expected.shape[0], dim=expected.shape[1])
        return fs


class TestCarinaOutOfCore(FeatureStoreTests):
    @pytest.fixture
    def store(self, expected, tmp_path):
        ei = torch.stack([torch.arange(999), torch.arange(1, 1000)])
        ds = prepare_from_arrays(tmp_path, edge_index=ei, features=expected, labels=torch.zeros(1000, dtype=torch.long))
        with IOEngine(IOConfig(workers=2)) as eng:
            fs = CarinaFeatureStore()
            fs.register(OutOfCoreFeatures(ds, engine=eng), num_rows=1000, dim=expected.shape[1])
            yield fs


def test_put_is_refused_for_registered_sources():
    fs = CarinaFeatureStore()
    x = torch.randn(4, 2)
    assert fs.put_tensor(x, group_name=None, attr_name="x", index=None) is True
    assert fs.put_tensor(x, group_name=None, attr_name="x", index=None) is False
    assert fs.remove_tensor(group_name=None, attr_name="x", index=None) is True


def test_graph_store_round_trip():
    g = chung_lu(num_nodes=200, avg_degree=3, seed=0)
    gs = CSCGraphStore()
    gs.put_csc(g)
    row, colptr = gs.get_edge_index(edge_type=None, layout="csc")
    assert torch.equal(colptr, g.indptr) and torch.equal(row, g.indices.long())
    assert len(gs.get_all_edge_attrs()) == 1
    assert gs.remove_edge_index(edge_type=None, layout="csc")
