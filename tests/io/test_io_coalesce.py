"""Properties of batch planning: every request served once, only true neighbours merged."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from carina.io._coalesce import plan_runs

requests = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 64).map(lambda b: b * 512), st.sampled_from([0, 512, 1024, 4096])),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(reqs=requests, gap=st.sampled_from([0, 512, 4096]), max_bytes=st.sampled_from([4096, 16384, 1 << 20]))
def test_runs_cover_each_request_once_and_merge_only_neighbours(
    reqs: list[tuple[int, int, int]], gap: int, max_bytes: int
) -> None:
    runs = plan_runs(reqs, gap=gap, max_bytes=max_bytes)
    seen = sorted(i for r in runs for m, c in zip(r.members, r.copies, strict=True) for i in (m, *c))
    assert seen == list(range(len(reqs)))
    for run in runs:
        assert all(reqs[i][0] == run.key for i in run.members)
        for a, b in zip(run.members, run.members[1:], strict=False):
            end = reqs[a][1] + reqs[a][2]
            assert end <= reqs[b][1] <= end + gap  # in order, no overlap, hole within the gap
        if len(run.members) > 1:
            first, last = reqs[run.members[0]], reqs[run.members[-1]]
            assert last[1] + last[2] - first[1] <= max_bytes
        for m, dups in zip(run.members, run.copies, strict=True):
            assert all(reqs[d] == reqs[m] for d in dups)


@settings(max_examples=200, deadline=None)
@given(reqs=requests)
def test_exactly_adjacent_runs_are_maximal(reqs: list[tuple[int, int, int]]) -> None:
    runs = plan_runs(reqs, gap=0, max_bytes=1 << 30)
    for r1, r2 in itertools.pairwise(runs):
        last, first = reqs[r1.members[-1]], reqs[r2.members[0]]
        if r1.key == r2.key and first != last:
            assert first[1] != last[1] + last[2]  # had they touched, they would have merged


def test_the_documented_example() -> None:
    reqs = [(0, 8192, 4096), (0, 0, 4096), (0, 4096, 4096), (0, 20480, 4096), (0, 0, 4096)]
    runs = plan_runs(reqs)
    assert [r.members for r in runs] == [(1, 2, 0), (3,)]
    assert runs[0].copies == ((4,), (), ())
