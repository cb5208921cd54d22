import json

import pytest
import torch.multiprocessing as mp

from carina.gnn.dataset import PrepareConfig, prepare
from carina.testing.gnn import placed_training_worker


def _expected_order(plan_order: list[str], me: str, own_rows: bool) -> list[str]:
    """The plan's order with every peer at the first peer's place (one exchange serves them all)."""
    out: list[str] = []
    for s in plan_order:
        if s.startswith("gpu"):
            if not any(x.startswith("gpu") for x in out):
                out += [p for p in plan_order if p.startswith("gpu")]
        else:
            out.append(s)
    return out + ([me] if own_rows else [])


@pytest.mark.slow
@pytest.mark.parametrize("world,chain", [(3, True)])
def test_gloo_run_follows_routes_and_matches_in_memory(tmp_path, world, chain):
    """Simulated multi-GPU run (CPU processes, gloo): routed features give the in-memory losses bit for bit.

    With ``chain`` (GPUs joined only to their neighbours, relaying on) the peer rows travel the
    LP's paths hop by hop: summed over ranks, the bytes sent on every physical link equal the
    plan's flow on that link (in whole rows), and the middle GPU relays rows between the ends.
    """
    root = tmp_path / "ds"
    prepare(PrepareConfig(num_nodes=2048, avg_degree=6, feature_dim=24, num_classes=4, train_fraction=0.2), root)
    args = (world, str(root), str(tmp_path / "init"), str(tmp_path), chain)
    mp.spawn(placed_training_worker, args=args, nprocs=world, join=True)
    kinds_seen: set[str] = set()
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]
    _check_links(results, relayed=chain)
    for rank in range(world):
        res = results[rank]
        assert res["simulated"] is True
        assert len(res["placed"]) == 3
        assert res["placed"] == res["in-memory"]  # floats from JSON: bitwise equal
        me = f"gpu{rank}"
        assert len(res["batches"]) >= 3
        for b in res["batches"]:
            # every byte pulled came from the source the plan assigned, in the amount its routes carry
            assert b["pulled"] == b["planned"]
            for src, n in b["planned"].items():
                assert n % res["row_bytes"] == 0
                assert b["routed"][src] == pytest.approx(n, rel=1e-6)
            assert b["order"] == _expected_order(b["plan_order"], me, own_rows=me in b["order"])
            assert b["predicted_s"] > 0
            kinds_seen |= {s.rstrip("0123456789") for s in b["pulled"]}
        served = res["served"]
        assert served["own"] > 0 and served["peer"] > 0 and served["disk"] > 0
    assert kinds_seen == {"gpu", "ssd", "dram"}


def _check_links(results: list[dict], relayed: bool) -> None:
    """Per batch: executed peer bytes per link (all ranks) == the plan's rows per link, and ~ the LP's flows."""
    row_bytes = results[0]["row_bytes"]
    relays = 0
    for i in range(len(results[0]["batches"])):
        batches = [r["batches"][i] for r in results]
        planned = batches[0]["planned_links"]
        assert all(b["planned_links"] == planned for b in batches)  # one plan on every rank
        sent: dict[str, int] = {}
        for b in batches:
            for link, n in b["sent_links"].items():
                sent[link] = sent.get(link, 0) + n
        assert sent == planned
        lp = {k: v for k, v in batches[0]["lp_links"].items() if v > 1e-6}
        assert set(lp) == set(planned)
        for link, n in planned.items():
            assert abs(n - lp[link]) <= 3 * row_bytes  # whole rows per path vs the LP's fractional flow
        relays += sum(b["relayed"] for b in batches)
    assert (relays > 0) == relayed
