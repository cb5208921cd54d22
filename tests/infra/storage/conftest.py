from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from carina.testing.storage import TierThread, small_tier_config


@pytest.fixture
def start_tier(tmp_path: Path) -> Iterator[Callable[..., TierThread]]:
    """Start a real tier on loopback in a background thread; stopped at teardown."""
    running: list[TierThread] = []

    def start(**kw: object) -> TierThread:
        path = kw.pop("path", tmp_path / f"store{len(running)}")
        t = TierThread(small_tier_config(path, **kw))  # type: ignore[arg-type]
        t.__enter__()
        running.append(t)
        return t

    yield start
    for t in running:
        t.stop()
