"""write_probe.py and bench_offload.py's same-size probe: rates by window, the bound, the rules that name a limit."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "ckpt"))
sys.path.insert(0, str(REPO / "tests" / "ckpt"))  # ckpt_state: the timeline record test_ckpt_timeline.py uses
_spec = importlib.util.spec_from_file_location("ckpt_bench_offload_p", REPO / "benchmarks/ckpt/bench_offload.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from ckpt_methods import DcpSave, TorchSave  # noqa: E402
from ckpt_state import timeline_record  # noqa: E402
from write_probe import (  # noqa: E402
    REQUEST,
    attribute,
    break_even_Bps,
    same_size_probe,
    window_rates,
    write_passes,
    writer_row,
)

GiB = 1 << 30
# ckpt_offload7b_h200_s10: the process and thread writers' bytes and durable times.
BYTES, PROCESS, THREAD = 22_574_807_129, 14.035, 14.935


def test_rates_over_each_window_of_bytes():
    points = [[0.0, 0], [1.0, 4 * GiB], [2.5, 8 * GiB], [3.0, 9 * GiB], [5.0, 12 * GiB]]
    assert window_rates(points, 4 * GiB) == [4.295, 2.863, 1.718]
    assert window_rates(points, 16 * GiB) == []


def test_the_s10_saves_meet_the_bound_only_on_a_disk_at_most_this_fast():
    assert round(break_even_Bps(PROCESS, BYTES) / 1e9, 4) == 2.0015
    assert round(break_even_Bps(THREAD, BYTES) / 1e9, 4) == 1.8767
    assert break_even_Bps(0.5, BYTES) is None


def test_the_limit_rules():
    assert attribute(1.8, 2.0, 10.0, {}) == "disk"  # >= 0.9 of the probe's rate
    assert attribute(1.79, 2.0, 10.0, {"feed_frontier_s": 2.5}) == "copies"
    assert attribute(1.79, 2.0, 10.0, {"feed_frontier_s": 2.4, "feed_queue_s": 5.0}) == "io_path"
    assert attribute(1.79, 2.0, 10.0, {"feed_queue_s": 4.9}) == "feeder"
    assert attribute(1.79, None, 10.0, {}) is None and attribute(None, 2.0, 10.0, {}) is None


def test_a_row_sets_the_save_beside_its_same_size_probe():
    probe = {"s": 11.2874, "Bps": 2.0e9}
    row = writer_row(PROCESS, BYTES, timeline_record(), 0.125, probe)
    assert row == {
        "same_size_s": 11.2874,
        "same_size_GBps": 2.0,
        "durable_bound_same_s": 14.0449,  # 1.2 x 22574807129 / 2e9 + 0.5
        "within_bound_same": True,
        "received_s": 0.125,
        "first_write_s": 0.5,
        "write_s": 8.0,
        "write_GBps": 2.6844,
        "copies_done_s": 3.0,
        "feed_frontier_s": 0.25,
        "crc_frontier_s": 0.0,
        "feed_queue_s": 6.0,
        "crc_after_write_s": 0.5,
        "fsync_s": 0.5,
        "commit_s": 0.3,
        "retention_s": 6.0,
        "write_over_disk": 1.3422,
        "limit": "disk",
    }
    assert writer_row(THREAD, BYTES, None, None, probe)["within_bound_same"] is False  # 14.935 > 14.0449
    assert writer_row(PROCESS, BYTES, None, None, None) == {}


def test_metrics_writes_keeps_both_timelines_with_their_rates_by_window():
    tl = timeline_record()
    driver = SimpleNamespace(results={"carina-process": {"same_size": {"timeline": tl}, "timeline": tl},
                                      "torch.save": {}, "carina-fork": {"timeline": None}})  # fmt: skip
    (row,) = bench.writes(driver)  # the methods with neither are left out
    assert row["method"] == "carina-process" and row["window_GiB"] == 4 and row["timeline"] is tl
    assert row["probe_GBps_by_window"] == row["writer_GBps_by_window"] == [2.854]  # (20 GiB - 64 MiB) / 7.5 s


def test_the_probe_writes_whole_requests_fsyncs_and_deletes(tmp_path):
    got = same_size_probe(tmp_path, REQUEST + 1, every=REQUEST)
    assert got["bytes"] == 2 * REQUEST and list(tmp_path.iterdir()) == []
    tl = got["timeline"]  # (how many completions were counted before the last mark is the threads' business)
    assert tl["streams"]["written"][-1][1] == tl["streams"]["submitted"][-1][1] == 2 * REQUEST
    assert [v for _, v in tl["streams"]["submitted"]] == [REQUEST, 2 * REQUEST] and "fsynced" in tl["phases"]


def test_the_fixed_size_passes_write_the_same_way_and_delete(tmp_path):
    rates = write_passes(tmp_path, REQUEST, passes=2)  # after an untimed pass, which is not returned
    assert len(rates) == 2 and all(r > 0 for r in rates) and list(tmp_path.iterdir()) == []


def _tiny(root: Path, cls: Any) -> Any:
    model = torch.nn.Linear(4, 2)
    return cls(root, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_peers_delete_inside_start_unless_told_and_retire_keeps_the_newest(tmp_path):
    for cls, name in ((TorchSave, "{}.pt"), (DcpSave, "dcp_{}")):
        old, new = tmp_path / cls.__name__ / "old", tmp_path / cls.__name__ / "new"
        for root, prune in ((old, True), (new, False)):
            root.mkdir(parents=True)
            m = _tiny(root, cls)
            m.prune_in_start = prune
            for step in (9, 10):
                m.start(step)
        assert sorted(p.name for p in old.iterdir()) == [name.format(10)]
        assert sorted(p.name for p in new.iterdir()) == sorted(name.format(s) for s in (9, 10))
        _tiny(new, cls).retire()
        assert [p.name for p in new.iterdir()] == [name.format(10)]


class _Fake:
    name = "fake"
    prune_in_start = True

    def __init__(self, root: Path, log: list[str]) -> None:
        self.root, self.log, self.durable = root, log, False

    def start(self, step: int) -> None:
        self.log.append(f"start {step}")
        (self.root / f"{step}.bin").write_bytes(b"x" * 1000)
        self.durable = step == 0  # the untimed save is durable at once, the timed one a step later

    def done(self) -> bool:
        return self.durable

    def durable_at(self) -> None:
        return None

    def saved(self, step: int) -> Path:
        return self.root / f"{step}.bin"

    def retire(self) -> None:
        self.log.append("retire")

    def close(self) -> None:
        self.log.append("close")


def test_the_driver_probes_between_the_untimed_and_the_timed_save_and_retires_after_durable(tmp_path, monkeypatch):
    log: list[str] = []
    fake = _Fake(tmp_path, log)
    monkeypatch.setattr(bench, "make_method", lambda name, sub, model, opt: fake)
    monkeypatch.setattr(bench, "same_size_probe", lambda root, n: log.append(f"probe {n}") or {"s": 1.0, "Bps": 1e3})
    d = bench.Driver(["fake"], tmp_path, warmup=0, settle=1, deadline_s=60, probe_same=True)
    d.after_step(1)  # the untimed save
    d.after_step(2)  # it is durable: the probe, of its size
    d.after_step(3)  # the timed save
    fake.durable = True
    d.after_step(4)  # durable: the previous save goes
    assert log == ["start 0", "probe 1000", "start 3", "retire"] and fake.prune_in_start is False
    assert d.results["fake"]["same_size"] == {"s": 1.0, "Bps": 1e3}
