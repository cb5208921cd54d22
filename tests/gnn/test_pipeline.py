import threading
import time

import pytest
import torch

from carina.core.errors import ConfigError
from carina.gnn.pipeline import FeaturePipeline
from carina.gnn.sampler import SampledBatch
from carina.gnn.sidestream import StageEvents
from carina.testing.gnn import FakeTimingEvents, RecordingSideStream


class CountingSource:
    """Tracks how many batches are alive between plan and the consumer's release."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.planned = 0

    def plan(self, n_id):
        self.planned += 1
        return n_id

    def read(self, plan):
        if self.fail_at is not None and int(plan[0]) == self.fail_at:
            raise OSError("disk on fire")
        return plan.to(torch.float32)

    def assemble(self, plan, missing):
        return missing.unsqueeze(1)


def _batches(n):
    for i in range(n):
        yield SampledBatch(
            n_id=torch.tensor([i, i + 1000]), edge_index=torch.zeros(2, 0, dtype=torch.int64), batch_size=1, index=i
        )


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_bound_holds_with_slow_consumer(depth):
    src = CountingSource()
    pipe = FeaturePipeline(_batches(20), src, depth=depth)
    seen = []
    for _batch, x in pipe:
        time.sleep(0.005)  # the consumer is the bottleneck: producers must wait
        assert src.planned - len(seen) <= depth
        seen.append(int(x[0, 0]))
    assert seen == list(range(20))
    assert pipe.max_in_flight == depth
    assert pipe.times.batches == 20
    # every stage ran once per batch: per-batch stage times divide by these counts
    assert pipe.times.as_counts() == {"sample": 20, "plan": 20, "read": 20, "assemble": 20}
    calls = pipe.times.as_calls()
    assert {k: len(v) for k, v in calls.items()} == pipe.times.as_counts()
    assert sum(calls["assemble"]) == pytest.approx(pipe.times.assemble)  # each call's seconds, in order


def test_errors_reach_the_consumer():
    pipe = FeaturePipeline(_batches(10), CountingSource(fail_at=4), depth=3)
    got = []
    with pytest.raises(OSError, match="disk on fire"):
        for b, _ in pipe:
            got.append(b.index)
    assert got == [0, 1, 2, 3]
    assert not [t for t in threading.enumerate() if t.name.startswith("gnn-")]


def test_early_exit_stops_threads():
    src = CountingSource()
    pipe = FeaturePipeline(_batches(100), src, depth=2)
    for b, _ in pipe:
        if b.index == 3:
            break
    pipe.close()
    n = pipe.times.as_counts()
    assert n["assemble"] == 4 and n["plan"] == src.planned  # reads ahead are counted where they ran
    assert 4 <= n["read"] <= n["plan"] <= 4 + 2
    assert not [t for t in threading.enumerate() if t.name.startswith("gnn-")]


def test_depth_must_be_positive():
    with pytest.raises(ConfigError):
        FeaturePipeline(_batches(1), CountingSource(), depth=0)


class CountingReads(CountingSource):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def read(self, plan):
        self.reads += 1
        return super().read(plan)


def test_past_the_deadline_no_read_ahead_starts():
    """A deadline already passed: the first batch is still read and yielded, no later batch is read."""
    src = CountingReads()
    pipe = FeaturePipeline(_batches(10), src, depth=3, deadline=time.perf_counter() - 1.0)
    got = [b.index for b, _ in pipe]
    assert got == [0] and src.reads == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("gnn-")]


class PlanningSource(CountingSource):
    """Plans into a nested plan (as the store's ``FetchPlan``) and logs where each stage ran."""

    def __init__(self, side):
        super().__init__()
        self.side = side

    def plan(self, n_id):
        assert self.side.inside(), "planned off the sampler's stream"
        self.planned += 1
        return {"ids": n_id, "parts": [n_id * 2, None]}

    def read(self, plan):
        return plan["ids"].to(torch.float32)

    def assemble(self, plan, missing):
        assert not self.side.inside()
        self.side.events.append(("assemble", int(plan["ids"][0])))
        return missing.unsqueeze(1)


def test_the_sampler_runs_on_its_own_stream_and_each_batch_is_handed_over_before_it_is_assembled():
    side = RecordingSideStream()
    src = PlanningSource(side)
    sampled_inside = []

    def batches():
        for b in _batches(6):
            sampled_inside.append(side.inside())
            yield b

    kept = {}
    pipe = FeaturePipeline(batches(), src, depth=3, side=side)
    for batch, x in pipe:
        kept[batch.index] = (batch, x)
    assert sampled_inside == [True] * 6  # every batch sampled with the side stream current
    marks = [e[1] for e in side.events if e[0] == "mark"]
    assert marks == [1, 2, 3, 4, 5, 6]
    order = [e for e in side.events if e[0] != "mark"]
    assert [(e[0], e[1]) for e in order] == [x for i in range(6) for x in (("hand_over", i + 1), ("assemble", i))]
    for i, (_, _, ids) in enumerate(e for e in order if e[0] == "hand_over"):
        batch = kept[i][0]
        # the batch's tensors and every tensor of its plan stay alive for the caller's stream
        assert {id(batch.n_id), id(batch.edge_index)} <= ids and len(ids) == 3


def test_a_serial_pipeline_takes_no_side_stream():
    side = RecordingSideStream()
    pipe = FeaturePipeline(_batches(3), CountingSource(), depth=1, side=side)
    assert pipe.side is None
    assert [b.index for b, _ in pipe] == [0, 1, 2] and side.events == []


class _Clock:
    """A clock the test drives: the sampler and the lookup advance it by known amounts."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _timed_run(complete, n=8):
    """A pipelined run on a recording side stream, timed by fake events: each sample takes 2 ms, each lookup
    5 ms on the clock; the waits on events seen by the consumer are noted per batch."""
    clock = _Clock()
    events = FakeTimingEvents(clock, complete=complete)

    class Source(CountingSource):
        def plan(self, n_id):
            clock.now += 0.005
            return super().plan(n_id)

    def batches():
        for b in _batches(n):
            clock.now += 0.002
            yield b

    pipe = FeaturePipeline(batches(), Source(), depth=3, side=RecordingSideStream(), events=StageEvents(events))
    waits_seen = [events.waits for _ in pipe]
    return pipe, events, waits_seen


@pytest.mark.parametrize("complete", [True, False])
def test_the_sampler_s_stages_are_timed_on_its_stream_without_waiting_in_the_run(complete):
    pipe, events, waits_seen = _timed_run(complete)
    assert waits_seen == [0] * 8  # no event is waited for while the batches flow
    calls = pipe.device_calls()
    assert calls["sample"] == pytest.approx([0.002] * 8) and calls["plan"] == pytest.approx([0.005] * 8)
    # completed events were read as they came; held-back ones are waited for at the end, one per pair
    assert events.waits == (0 if complete else 16)
    assert events.made == 3 * 8 + 1  # before and after each stage, and one before the end of the batches


def test_stage_events_read_only_completed_pairs_until_finished():
    events = FakeTimingEvents(_Clock(), complete=False)
    timer = StageEvents(events)
    a, b = timer.stamp(), timer.stamp()
    timer.add("sample", a, b)
    events.complete = True
    c = timer.stamp()
    timer.add("plan", b, c)  # the head pair has completed now: both are read, in order
    assert timer.finish() == {"sample": [0.0], "plan": [0.0]} and events.waits == 0


@pytest.mark.parametrize("depth,side", [(1, True), (3, False)])
def test_no_device_timing_without_the_sampler_s_own_stream(depth, side):
    events = FakeTimingEvents()
    stream = RecordingSideStream() if side else None
    pipe = FeaturePipeline(_batches(4), CountingSource(), depth=depth, side=stream, events=StageEvents(events))
    assert len(list(pipe)) == 4
    assert pipe.events is None and pipe.device_calls() == {} and events.made == 0
