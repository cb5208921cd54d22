"""Turn a batch of requests into runs: deduplicate, sort, merge neighbours.

Pure functions over ``(handle id, offset, length)``; the engine attaches the
buffers. Two requests are merged when the second starts at most ``gap`` bytes
after the first ends, the merged run stays within ``max_bytes`` and within
``max_members`` buffers. Identical requests (same file, offset, length) are
read once and copied; overlapping but unequal requests are never merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Run", "plan_runs"]


@dataclass(frozen=True)
class Run:
    """Indices of the requests one operation serves.

    Attributes:
        key: The file the run belongs to.
        members: Indices of the distinct requests, in file order.
        copies: For each member, indices of identical requests served by copying.
    """

    key: int
    members: tuple[int, ...]
    copies: tuple[tuple[int, ...], ...]


def plan_runs(
    requests: Sequence[tuple[int, int, int]], *, gap: int = 0, max_bytes: int = 1 << 20, max_members: int = 256
) -> list[Run]:
    """Group ``(key, offset, length)`` requests into runs.

    Args:
        requests: One tuple per request; ``key`` identifies the file.
        gap: Largest hole between merged neighbours (0: exactly adjacent only).
        max_bytes: Largest merged run, holes included (a larger single request
            still forms its own run).
        max_members: Most distinct requests in one run.

    Returns:
        Runs covering every request exactly once, ordered by (key, offset).
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i])
    runs: list[Run] = []
    members: list[int] = []
    copies: list[list[int]] = []
    for i in order:
        key, off, size = requests[i]
        if members:
            last = requests[members[-1]]
            if last == requests[i]:
                copies[-1].append(i)
                continue
            first = requests[members[0]]
            end = last[1] + last[2]
            if (
                key == last[0]
                and end <= off <= end + gap
                and off + size - first[1] <= max_bytes
                and len(members) < max_members
            ):
                members.append(i)
                copies.append([])
                continue
            runs.append(Run(first[0], tuple(members), tuple(tuple(c) for c in copies)))
        members, copies = [i], [[]]
    if members:
        runs.append(Run(requests[members[0]][0], tuple(members), tuple(tuple(c) for c in copies)))
    return runs
