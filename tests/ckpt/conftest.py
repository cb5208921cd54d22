from __future__ import annotations

import pytest


@pytest.fixture(params=["sync", "thread", "fork", "process"])
def writer(request: pytest.FixtureRequest) -> str:
    return str(request.param)
