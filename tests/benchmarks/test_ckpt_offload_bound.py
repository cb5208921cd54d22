"""bench_offload.py's goal fields: bytes of a save, the bound 1.2 x bytes / disk bw + 0.5 s, the probe's best pass."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "ckpt"))
# benchmarks/offload has a bench_offload.py too: this one is loaded under its own name.
_spec = importlib.util.spec_from_file_location("ckpt_bench_offload", REPO / "benchmarks" / "ckpt" / "bench_offload.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
Driver, bound_row, probe_metrics = bench.Driver, bench.bound_row, bench.probe_metrics

from ckpt_methods import saved_bytes  # noqa: E402

# ckpt_offload7b_h200_s9: 22.6 GB of state, carina-process durable 13.374 s; the call's two probes (fork, overhead).
STATE, DURABLE = 22_574_579_712, 13.374
FORK_BW, OVERHEAD_BW = 2_142_635_322.7884521, 2_068_040_608.3872972


def test_bound_is_1_2_bytes_over_bw_plus_half_a_second():
    assert bound_row(6.5, 10**10, 2e9) == {"bytes_written": 10**10, "durable_bound_s": 6.5, "within_bound": True}
    assert bound_row(6.5001, 10**10, 2e9)["within_bound"] is False


def test_the_session_9_record_is_decided_by_which_probe_it_uses():
    assert bound_row(DURABLE, STATE, FORK_BW) == {"bytes_written": STATE, "durable_bound_s": 13.1431,
                                                  "within_bound": False}  # fmt: skip
    assert bound_row(DURABLE, STATE, OVERHEAD_BW) == {"bytes_written": STATE, "durable_bound_s": 13.5991,
                                                      "within_bound": True}  # fmt: skip


def test_no_probe_or_no_durable_gives_no_verdict():
    assert bound_row(1.0, 100, None) == {"bytes_written": 100, "durable_bound_s": None, "within_bound": None}
    assert bound_row(None, 10**10, 2e9) == {"bytes_written": 10**10, "durable_bound_s": 6.5, "within_bound": None}


def test_probe_keeps_every_pass_and_the_best_of_both_probes():
    got = probe_metrics({"before": [2.0e9, 2.1e9, 1.9e9], "after": [2.2e9, 1.4321e9]}, 4 << 30)
    assert got == {"size_bytes": 4 << 30, "before_GBps": [2.0, 2.1, 1.9], "after_GBps": [2.2, 1.432], "best_Bps": 2.2e9}
    assert probe_metrics({}, 0)["best_Bps"] is None


def test_summary_rows_carry_the_bound(tmp_path):
    d = Driver(["carina-process", "torch.save"], tmp_path, warmup=0, settle=0, deadline_s=60, cold=("torch.save",))
    d.steps = [(2.0, "clean"), (2.0, "carina-process")]
    d.results = {"carina-process": {"blocking_s": 0.1, "durable_s": DURABLE, "bytes_written": STATE},
                 "torch.save": {"blocking_s": 30.0, "durable_s": 30.0, "bytes_written": STATE + 1000}}  # fmt: skip
    rows = {r["method"]: r for r in d.summary(OVERHEAD_BW)}
    assert rows["carina-process"]["durable_bound_s"] == 13.5991 and rows["carina-process"]["within_bound"] is True
    assert rows["torch.save"]["bytes_written"] == STATE + 1000 and rows["torch.save"]["within_bound"] is False


def test_saved_bytes_counts_a_file_or_every_file_under_a_folder(tmp_path):
    (tmp_path / "step" / "sub").mkdir(parents=True)
    (tmp_path / "step" / "a.bin").write_bytes(b"x" * 1000)
    (tmp_path / "step" / "sub" / "b.bin").write_bytes(b"y" * 24)
    (tmp_path / "one.pt").write_bytes(b"z" * 7)
    assert saved_bytes(tmp_path / "step") == 1024
    assert saved_bytes(tmp_path / "one.pt") == 7
