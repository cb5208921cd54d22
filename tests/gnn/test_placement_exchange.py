import numpy as np
import pytest

from carina.gnn.placement.exchange import digest, plan_link_bytes, split_legs
from carina.gnn.placement.place import stores_of
from carina.gnn.placement.routes import plan_batch
from carina.gnn.placement.schedule import Demand, schedule_lp
from carina.testing.gnn import gpu_machine


def test_relay_lp_closed_form():
    """gpu2 -> gpu0 on a chain: 12 GB/s over the switches alone; with relaying also 50 GB/s through gpu1."""
    topo = gpu_machine(3, chain=True)
    d = [Demand("gpu2", "gpu0", 1.0)]
    assert schedule_lp(topo, d).time_s == pytest.approx(1 / 12, rel=1e-6)
    plan = schedule_lp(topo, d, relay_gpus=True)
    assert plan.time_s == pytest.approx(1 / 62, rel=1e-6)
    paths = {tuple(p): gb for p, gb in plan.routes()[("gpu2", "gpu0")]}
    assert paths[("gpu2", "gpu1", "gpu0")] == pytest.approx(50 / 62, rel=1e-6)
    # SSD and DRAM data are never relayed by a GPU
    ssd = schedule_lp(topo, [Demand("ssd2", "gpu0", 1.0)], relay_gpus=True)
    assert all("gpu1" not in p and "gpu2" not in p for p, _ in ssd.routes()[("ssd2", "gpu0")])


def test_split_legs_follows_paths_in_whole_rows():
    topo = gpu_machine(3, chain=True)
    gpus, sources = ["gpu0", "gpu1", "gpu2"], stores_of(topo)
    counts = np.zeros((3, len(sources)), dtype=np.int64)
    counts[0, sources.index("gpu2")] = 1001  # rank 0 wants 1001 rows of gpu2's cache
    counts[2, sources.index("gpu1")] = 7
    routes = plan_batch(topo, sources, gpus, counts, 100, relay=True)
    legs = split_legs(routes, topo, gpus, counts, sources)
    far = [x for x in legs if (x.src, x.dst) == (2, 0)]
    assert sum(x.rows for x in far) == 1001
    assert [x.offset for x in far] == [0, far[0].rows]  # consecutive slices of the request
    relay = next(x for x in far if x.ranks == (2, 1, 0))
    assert relay.rows == round(1001 * 50 / 62)  # 807 rows through gpu1, 194 over the switches
    assert relay.hops == ((("gpu2", "gpu1"),), (("gpu1", "gpu0"),))
    links = plan_link_bytes(legs, 100)
    assert links["gpu2->gpu1"] == 807 * 100 and links["gpu1->gpu0"] == 807 * 100
    assert links["sw0->gpu0"] == 194 * 100
    assert sum(x.rows for x in legs if (x.src, x.dst) == (1, 2)) == 7  # any route: not on the critical path
    assert digest(legs) == digest(split_legs(routes, topo, gpus, counts, sources))
