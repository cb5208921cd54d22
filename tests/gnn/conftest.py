from pathlib import Path

import pytest
import torch

from carina.gnn.dataset import Dataset, PrepareConfig, prepare

# Two xdist workers share two cores: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """4096 nodes, 100-d fp32 features (512 B stride), 10% training nodes."""
    root: Path = tmp_path_factory.mktemp("gnn") / "small"
    cfg = PrepareConfig(num_nodes=4096, avg_degree=8, feature_dim=100, num_classes=5, train_fraction=0.1, seed=3)
    return prepare(cfg, root)
