"""Each save's write timeline: what the recorder keeps, what summarize() derives, what the writers record."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ckpt_state import make_state, timeline_record

from carina.ckpt import Checkpointer, Config, WriterKind, commit, writers
from carina.ckpt.commit import step_dir_name
from carina.ckpt.timeline import Timeline, summarize
from carina.core.errors import ConfigError

GiB = 1 << 30


def _at(t0: float = 10.0, every: int = 100) -> Timeline:
    tl = Timeline(every)
    tl.t0 = t0  # times below are given explicitly, relative to this
    return tl


def test_a_stream_keeps_its_first_point_each_multiple_it_passes_and_its_last() -> None:
    tl = _at()
    for t, v in [(10.5, 30), (11.0, 90), (11.5, 120), (12.0, 150), (12.5, 310), (13.0, 330)]:
        tl.mark("submitted", v, at=t)
    assert tl.to_dict()["streams"]["submitted"] == [[0.5, 30], [1.5, 120], [2.5, 310], [3.0, 330]]
    tl.mark("frontier", 500, at=11.0)  # a single point is first and last at once
    assert tl.to_dict()["streams"]["frontier"] == [[1.0, 500]]


def test_a_stream_only_rises_and_keeps_when_it_first_reached_a_value() -> None:
    tl = _at()
    for t, v in [(10.5, 130), (11.0, 120), (11.5, 130), (12.0, 140)]:  # 120: another thread's late, lower mark
        tl.mark("frontier", v, at=t)
    assert tl.to_dict()["streams"]["frontier"] == [[0.5, 130], [2.0, 140]]


def test_the_writer_counts_every_byte_written_though_completions_are_counted_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A future wakes ``result()`` before it runs its callbacks: ``finish()`` marks every byte written anyway."""
    from carina.io import IOConfig, IOEngine

    monkeypatch.setattr(commit, "CHUNK", 64 << 10)
    data = os.urandom((3 << 16) + 5)
    late: list[tuple[Any, Any]] = []

    class Late:
        """An engine future whose completion callbacks have not run yet."""

        def __init__(self, fut: Any) -> None:
            self.fut = fut

        def result(self) -> int:
            return int(self.fut.result())

        def exception(self) -> BaseException | None:
            return self.fut.exception()

        def add_done_callback(self, fn: Any) -> None:
            late.append((fn, self))

    tl = Timeline(1 << 16)
    with IOEngine(IOConfig()) as engine:
        real = engine.write
        monkeypatch.setattr(engine, "write", lambda handle, offset, buf: Late(real(handle, offset, buf)))
        writers.engine_writer(engine, timeline=tl)(str(tmp_path / "f"), memoryview(data))()
    assert [v for _, v in tl.to_dict()["streams"]["written"]] == [len(data)] and len(late) == 4
    for fn, fut in late:  # the completions counted after all: the stream stays where it is
        fn(fut)
    assert [v for _, v in tl.to_dict()["streams"]["written"]] == [len(data)]


def test_completions_are_summed_and_phases_keep_their_first_mark() -> None:
    tl = _at()
    for n in (64, 16, 64, 56):
        tl.add("written", n)
    assert [v for _, v in tl.to_dict()["streams"]["written"]] == [64, 144, 200]  # 80 is below the next 100
    tl.phase("durable", at=12.0)
    tl.phase("durable", at=13.0)
    tl.waited("feed_queue", 0.25)
    tl.waited("feed_queue", 0.5)
    got = tl.to_dict()
    assert got["phases"] == {"durable": 2.0} and got["waits_s"] == {"feed_queue": 0.75}
    assert got["t0"] == 10.0 and got["every"] == 100


def test_the_gate_marks_what_it_is_asked_and_what_it_answers() -> None:
    tl = _at()
    plain = tl.gate(None, "checksummed", "crc_frontier")
    assert [plain(n) for n in (64, 128)] == [64, 128]  # no copy gate: every byte is final
    copied = tl.gate(lambda n: max(n, 256), None, "feed_frontier")
    assert copied(64) == 256
    got = tl.to_dict()
    assert [v for _, v in got["streams"]["checksummed"]] == [64, 128]
    assert [v for _, v in got["streams"]["frontier"]] == [256]
    assert set(got["waits_s"]) == {"feed_frontier"}  # only a real gate's calls count as waits


def test_every_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="every"):
        Timeline(0)


def test_summarize_splits_a_save_into_its_parts() -> None:
    tl = timeline_record()
    assert summarize(tl) == {
        "first_write_s": 0.5,
        "written_s": 8.5,
        "write_s": 8.0,
        "bytes_written": 20 * GiB,
        "write_GBps": 2.6844,  # 21474836480 B / 8.0 s
        "copies_done_s": 3.0,  # the frontier reached its last value
        "checksummed_s": 9.0,
        "fsynced_s": 9.5,
        "durable_s": 9.8,
        "done_s": 15.8,
        "crc_after_write_s": 0.5,
        "fsync_s": 0.5,
        "commit_s": 0.3,
        "retention_s": 6.0,
        "feed_frontier_s": 0.25,
        "crc_frontier_s": 0.0,
        "feed_queue_s": 6.0,
    }
    tl["phases"]["copies_done"] = 2.0  # a writer that waited for every copy says when
    tl["phases"]["checksummed"] = 8.0  # checksums done before the last write: nothing after it
    got = summarize(tl)
    assert got["copies_done_s"] == 2.0 and got["crc_after_write_s"] == 0.0 and got["fsync_s"] == 1.0


@pytest.mark.parametrize("kind", ["sync", "thread", "process"])
def test_each_save_keeps_its_write_timeline(tmp_path: Path, kind: str) -> None:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind(kind), keep_last=1)) as ckpt:
        for step in (1, 2):
            ckpt.save(step, state)
            ckpt.wait()
        tl, when, old = ckpt.write_timeline(2), ckpt.durable_at(2), ckpt.write_timeline(1)
    assert tl is not None and when is not None and old is not None and old["t0"] < tl["t0"]
    size = os.path.getsize(tmp_path / step_dir_name(2) / "rank00000.safetensors")
    streams, phases = tl["streams"], tl["phases"]
    assert streams["submitted"][-1][1] == streams["written"][-1][1] == streams["checksummed"][-1][1] == size
    assert phases["checksummed"] <= phases["fsynced"] <= phases["durable"] <= phases["done"]
    assert tl["t0"] + phases["durable"] == pytest.approx(when, abs=1e-5)  # the moment durable_at names
    assert summarize(tl)["bytes_written"] == size
    assert ("copies_done" in phases) is (kind != "process")  # these two wait for every copy first


def test_the_fork_writer_keeps_no_timeline(tmp_path: Path) -> None:
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.FORK)) as ckpt:
        ckpt.save(1, make_state(0))
        ckpt.wait()
        assert ckpt.durable_at(1) is not None and ckpt.write_timeline(1) is None
