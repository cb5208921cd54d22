"""Fuzzing the YAML loader: any input loads or fails with a located ModelFormatError."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carina.core.errors import ModelFormatError
from carina.security.risk.loader import loads_model
from carina.testing import shared_data

KEYS = [
    "type",
    "layer",
    "links",
    "d",
    "s",
    "p",
    "n",
    "i",
    "g",
    "stencil",
    "modifier",
    "collapsed",
    "cprobability",
    "cimpact",
    "probability",
    "impact",
    "groups",
    "attacker",
    "target",
    "includes",
    "upper",
    "lower",
    "carina",
    "layers",
    "components",
    "nodes",
    "stencils",
    "rename",
    "remove",
    "scores",
    "collapse",
    "l",
    "x",
    "l.x",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.sampled_from([*KEYS, "layer", "stencil"]),
)
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(KEYS), kids, max_size=5)),
    max_leaves=25,
)


def _load(text: str) -> None:
    try:
        loads_model(text)
    except ModelFormatError as exc:
        assert exc.context.get("file"), exc
        assert exc.message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), trees, max_size=6))
def test_structured_garbage_fails_cleanly(tree: dict[str, object]) -> None:
    _load(yaml.safe_dump(tree))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_fails_cleanly(text: str) -> None:
    _load(text)


TESTCASE = (Path(shared_data("strong")) / "test" / "testcase.yml").read_text()
INLINED = (
    TESTCASE.replace("includes:\n  - stencil.yml\n", "")
    + "\n"
    + (Path(shared_data("strong")) / "test" / "stencil.yml").read_text()
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(INLINED) - 1), st.integers(1, 20), st.text(max_size=6))
def test_mutated_real_model_fails_cleanly(at: int, cut: int, insert: str) -> None:
    _load(INLINED[:at] + insert + INLINED[at + cut :])


def test_unmutated_inlined_model_loads() -> None:
    model = loads_model(INLINED)
    assert len(model.nodes) == 11
