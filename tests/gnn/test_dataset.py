import json

import numpy as np
import pytest
import torch

from carina.core.errors import ConfigError, ModelFormatError
from carina.gnn.dataset import PAGE, Dataset, GeneratorKind, PrepareConfig, prepare, prepare_from_arrays, row_stride
from carina.gnn.graph import node_features


@pytest.mark.parametrize("row,stride", [(4, 4), (400, 512), (512, 512), (4096, 4096), (4100, 8192), (6000, 8192)])
def test_row_stride(row, stride):
    assert row_stride(row) == stride
    assert PAGE % stride == 0 or stride % PAGE == 0


def test_prepared_dataset_is_complete(small_dataset):
    m = small_dataset.manifest
    assert small_dataset.features_path.stat().st_size == m.feature_bytes
    assert m.feature_bytes % PAGE == 0
    assert torch.equal(small_dataset.read_all_features(), node_features(torch.arange(4096), dim=100, seed=3))
    assert small_dataset.train_idx.numel() == 409
    again = Dataset.open(small_dataset.root, mmap=True)
    assert torch.equal(again.graph.indices, small_dataset.graph.indices)


def test_rmat_dataset(tmp_path):
    ds = prepare(PrepareConfig(generator=GeneratorKind.RMAT, num_nodes=1024, feature_dim=8), tmp_path)
    assert ds.manifest.num_nodes == 1024 and ds.manifest.source["generator"]["generator"] == "rmat"
    with pytest.raises(ConfigError, match="power-of-two"):
        PrepareConfig(generator=GeneratorKind.RMAT, num_nodes=1000)


def test_import_from_pyg_data(tmp_path):
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    ds = prepare_from_arrays(tmp_path, edge_index=data.edge_index, features=data.x, labels=data.y, name="karate")
    assert ds.manifest.num_nodes == 34 and ds.manifest.num_classes == 4
    assert torch.equal(ds.read_all_features(), data.x)


def test_import_from_edge_list_file(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n1 2\n2 0\n3 2\n")
    ei = np.loadtxt(path, dtype=np.int64).T
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    ds = prepare_from_arrays(tmp_path / "ds", edge_index=ei, features=x, labels=torch.tensor([0, 1, 0, 1]))
    assert ds.graph.in_degree().tolist() == [1, 1, 2, 0]


def test_bad_directories_are_named(tmp_path, small_dataset):
    with pytest.raises(ModelFormatError, match=r"manifest\.json is missing"):
        Dataset.open(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in small_dataset.root.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    man = json.loads((bad / "manifest.json").read_text())
    man["surprise"] = 1
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ModelFormatError, match="surprise"):
        Dataset.open(bad)
    man.pop("surprise")
    (bad / "manifest.json").write_text(json.dumps(man))
    with (bad / "features.bin").open("r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelFormatError, match=r"features\.bin"):
        Dataset.open(bad)


def test_import_rejects_mismatched_labels(tmp_path):
    with pytest.raises(ConfigError):
        prepare_from_arrays(tmp_path, edge_index=[[0], [1]], features=torch.zeros(2, 2), labels=torch.zeros(3))


@pytest.mark.parametrize("chunk_rows,dim", [(1000, 100), (256, 1024), (333, 7)])
def test_features_written_in_chunks_are_exact(tmp_path, chunk_rows, dim):
    """Chunks of any size (page-aligned or not) land where they belong; the file is padded to pages."""
    cfg = PrepareConfig(num_nodes=2500, avg_degree=3, feature_dim=dim, seed=4, chunk_rows=chunk_rows)
    ds = prepare(cfg, tmp_path)
    assert ds.features_path.stat().st_size == ds.manifest.feature_bytes
    assert torch.equal(ds.read_all_features(), node_features(torch.arange(2500), dim=dim, seed=4))
