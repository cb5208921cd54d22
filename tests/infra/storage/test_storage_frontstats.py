"""Live stats of ``serve --frontends N``: per-process shared-memory slots merged by the parent."""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from carina.infra.storage import frontstats as fs
from carina.infra.storage.cli import _live_line, app
from carina.infra.storage.frontstats import CombinedStats, StatsBoard
from carina.infra.storage.stats import LatencyHistogram, TierStats
from carina.testing.storage import RawNbdClient, TierProcess

SIZE, BLOCK = 8 << 20, 16 << 10


def _samples(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(-8, 1.5) for _ in range(n)]  # ~0.3 ms median, a long tail


def test_merged_histogram_percentiles_equal_one_histogram_of_all_samples() -> None:
    samples = _samples(5000, 1)
    whole = LatencyHistogram()
    parts = [LatencyHistogram() for _ in range(3)]
    for k, t in enumerate(samples):
        whole.add(t)
        parts[0 if k < 400 else 1 if k < 1000 else 2].add(t)  # uneven shares, as front ends get
    merged = LatencyHistogram.merged(parts)
    assert merged.counts == whole.counts and merged.total == whole.total == 5000
    for q in (0.5, 0.9, 0.99, 0.999):
        assert merged.percentile(q) == whole.percentile(q)
    assert LatencyHistogram.from_counts(merged.counts).percentile(0.99) == whole.percentile(0.99)


def _fill(stats: TierStats, samples: list[float], op: str, nbytes: int) -> None:
    for t in samples:
        stats.record(op, nbytes, t)


def test_combined_stats_sum_counters_and_merge_histograms_per_window() -> None:
    board = StatsBoard(2)
    fast, slow, everything = TierStats(), TierStats(), TierStats()
    fast_s = [t / 10 for t in _samples(900, 2)]
    slow_s = [t * 10 for t in _samples(100, 3)]
    _fill(fast, fast_s, "read", 4096)
    _fill(slow, slow_s, "write", 65536)
    _fill(everything, fast_s, "read", 4096)
    _fill(everything, slow_s, "write", 65536)
    slow.connections = 1
    board.publish(0, fast, {"engine_jobs": 3, "engine_prepare_s": 0.5})
    board.publish(1, slow, {"engine_jobs": 4, "engine_prepare_s": 0.25})
    combined = CombinedStats(board)
    snap = combined.snapshot()
    want = everything.snapshot()
    assert snap["ops"] == {"read": 900, "write": 100} == want["ops"]
    assert (snap["bytes_read"], snap["bytes_written"], snap["connections"]) == (900 * 4096, 100 * 65536, 1)
    for key in ("p50_ms", "p99_ms", "p50_ms_total", "p99_ms_total"):
        assert snap[key] == want[key] > 0, key
    assert snap["engine_jobs"] == 7 and snap["engine_prepare_s"] == 0.5  # summed; the slowest warm-up
    assert [f["ops"] for f in snap["frontends"]] == [{"read": 900}, {"write": 100}]
    assert _live_line(snap).count("IOPS") == 1
    # the next window holds only what happened since: 50 new slow reads on front end 0
    later = _samples(50, 4)
    _fill(fast, later, "read", 4096)
    board.publish(0, fast, {})
    window = LatencyHistogram()
    for t in later:
        window.add(t)
    snap = combined.snapshot()
    assert snap["ops"] == {"read": 950, "write": 100} and snap["engine_jobs"] == 4
    assert snap["p50_ms"] == window.percentile(0.5) * 1e3 and snap["p99_ms"] == window.percentile(0.99) * 1e3
    assert snap["p50_ms_total"] == LatencyHistogram.merged([fast.latency, slow.latency]).percentile(0.5) * 1e3


def test_board_keeps_the_last_consistent_copy_of_a_slot_being_written() -> None:
    board = StatsBoard(1)
    stats = TierStats()
    _fill(stats, [1e-4] * 5, "write", 512)
    board.publish(0, stats, {})
    good = board.read(0)
    row = board.table[0]
    row[fs._SEQ] += 1  # the owner stopped between "odd" and its write
    row[fs._OPS + fs.OP_NAMES.index("write")] = 99
    assert (board.read(0) == good).all()
    row[fs._SEQ] += 1  # even again, but the counts and the histogram disagree: a torn copy
    assert (board.read(0) == good).all()


def _writer(board: StatsBoard, stop: Any) -> None:
    stats = TierStats()
    n = 0
    while not stop.is_set():
        for _ in range(7):
            n += 1
            stats.record("write", 4096, 1e-6 * (n % 5000))
        board.publish(0, stats, {"engine_jobs": n})


def test_concurrent_reads_of_a_slot_are_never_torn() -> None:
    board = StatsBoard(1)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    proc = ctx.Process(target=_writer, args=(board, stop))
    proc.start()
    try:
        seen = []
        combined = CombinedStats(board)
        for _ in range(1500):
            snap = combined.snapshot()
            writes = snap["ops"].get("write", 0)
            assert snap["bytes_written"] == 4096 * writes == 4096 * snap["engine_jobs"]  # one publish, whole
            seen.append(writes)
    finally:
        stop.set()
        proc.join(10)
    assert seen == sorted(seen) and seen[-1] > seen[0]  # counters only grow, and they did while we read


def _wait_for(events: list[dict[str, Any]], ops: dict[str, int], deadline_s: float = 20) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for e in list(events):
            if e["event"] == "stats" and e["ops"] == ops:
                return e
        time.sleep(0.02)
    stats = [e["ops"] for e in events if e["event"] == "stats"]
    raise AssertionError(f"no live stats line with {ops}; saw {stats[-3:]} in {len(stats)} lines")


def _drive(client: RawNbdClient, first: int, writes: int, reads: int, read_len: int) -> None:
    for k in range(writes):
        assert client.write((first + k) * BLOCK, bytes([0x41 + k]) * BLOCK) == 0
    for k in range(reads):
        client.read(first * BLOCK + (k % writes) * read_len, read_len)


def test_serve_with_two_front_ends_publishes_merged_live_stats(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ["--store", str(store), "--size", str(SIZE), "--block-size", str(BLOCK), "--engine", "inline",
            "--codec", "zstd", "--frontends", "2", "--stats-interval", "0.1"]  # fmt: skip
    with TierProcess(args) as tier:
        a = RawNbdClient(tier.port)
        a.go()  # through its handshake before b connects: the two land on different front ends
        b = RawNbdClient(tier.port)
        b.go()
        _drive(a, 0, writes=6, reads=4, read_len=2 * BLOCK)
        _wait_for(tier.events, {"write": 6, "read": 4})  # a line between the two drives: at least two lines
        _drive(b, 8, writes=3, reads=9, read_len=4096)
        live = _wait_for(tier.events, {"write": 9, "read": 13})
        a.disconnect()
        b.disconnect()
        tier.stop()
    assert live["bytes_written"] == 9 * BLOCK and live["bytes_read"] == 4 * 2 * BLOCK + 9 * 4096
    shares = sorted((f["ops"] for f in live["frontends"]), key=lambda o: o["write"])
    assert shares == [{"write": 3, "read": 9}, {"write": 6, "read": 4}]  # both front ends, each its own client
    assert live["connections"] == 2 and [f["connections"] for f in live["frontends"]] == [1, 1]
    assert live["p99_ms_total"] >= live["p50_ms_total"] > 0
    assert live["logical_bytes"] == 9 * BLOCK and 0 < live["stored_bytes"] < live["logical_bytes"]
    assert live["ratio"] == pytest.approx(live["logical_bytes"] / live["stored_bytes"])
    stats = [e for e in tier.events if e["event"] == "stats"]
    assert len(stats) >= 2 and all(e.keys() == live.keys() for e in stats)
    totals = [sum(e["ops"].values()) for e in stats]
    assert totals == sorted(totals)  # cumulative counts never go back
    final = tier.events[-1]
    assert final["event"] == "stopped" and final["ops"] == {"write": 9, "read": 13}
    per = final["frontends"]
    assert len(per) == 2 and sum((Counter(f["ops"]) for f in per), Counter()) == Counter(final["ops"])
    for key in ("bytes_read", "bytes_written", "errors", "protocol_errors"):
        assert final[key] == sum(f[key] for f in per), key
    p99s = sorted(f["p99_ms_total"] for f in per)
    assert p99s[0] <= final["p99_ms_total"] <= p99s[1]  # a merged percentile lies between the parts'
    result = CliRunner().invoke(app, ["stats", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    saved = json.loads(result.output)["live"]
    assert saved["ops"] == {"write": 9, "read": 13} and len(saved["frontends"]) == 2


def test_serve_with_two_front_ends_prints_the_live_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "carina", "storage", "serve", "--port", "0", "--store", str(store),
           "--size", str(SIZE), "--block-size", str(BLOCK), "--engine", "inline", "--frontends", "2",
           "--stats-interval", "0.05"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        client = RawNbdClient(int(url.rsplit(":", 1)[1].split("/")[0]))
        client.go()
        assert client.write(0, b"\x55" * BLOCK) == 0
        client.disconnect()
        end = time.monotonic() + 20
        while time.monotonic() < end:  # the parent writes stats.json just before it prints the line
            path = store / "stats.json"
            if path.exists() and json.loads(path.read_text() or "{}").get("ops", {}).get("write") == 1:
                break
            time.sleep(0.02)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    text = " ".join(err.split())  # the console wraps long lines
    line = r"(\d+) IOPS read [\d.]+ MB/s write [\d.]+ MB/s p50 [\d.]+ ms p99 [\d.]+ ms ratio ([\d.]+) conns \d+"
    lines = re.findall(line, text)
    assert lines and len(lines) == text.count("IOPS"), err[-2000:]  # every live line is whole
    assert any(float(ratio) > 1 for _, ratio in lines), err[-2000:]  # a line after the write
