import json

import torch.multiprocessing as mp

from carina.gnn.dataset import PrepareConfig, prepare
from carina.testing.gnn import placed_training_worker


def test_two_process_gloo_run_with_placement_matches_in_memory(tmp_path):
    """Simulated 2-GPU run (two CPU processes, gloo): placed features give the in-memory losses."""
    root = tmp_path / "ds"
    prepare(PrepareConfig(num_nodes=2048, avg_degree=6, feature_dim=24, num_classes=4, train_fraction=0.2), root)
    mp.spawn(placed_training_worker, args=(2, str(root), str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["simulated"] is True
        assert len(res["placed"]) == 3
        assert res["placed"] == res["in-memory"]
        served = res["served"]
        assert served["own"] > 0 and served["peer"] > 0 and served["disk"] > 0
