from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.ckpt.tree import flatten, unflatten
from carina.core.errors import CheckpointError, CorruptCheckpoint


def _json_round_trip(tree: Any) -> Any:
    import json

    return json.loads(json.dumps(tree, allow_nan=False))


def test_rng_states_round_trip() -> None:
    state = {
        "py": random.getstate(),
        "np": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
        "odd": {1: b"\x00\xff", (2, "x"): [float("inf"), -math.inf]},
    }
    tree, tensors = flatten(state)
    back = unflatten(_json_round_trip(tree), tensors)
    assert back["py"] == state["py"]
    assert back["np"]["state"]["key"].tolist() == state["np"]["state"]["key"].tolist()
    assert torch.equal(back["torch"], state["torch"])
    assert back["odd"] == state["odd"]
    assert math.isnan(unflatten(_json_round_trip(flatten(float("nan"))[0]), {}))


def test_tensor_names_are_paths() -> None:
    _, tensors = flatten({"model": {"w": torch.ones(2)}, "opt": [torch.zeros(1)]})
    assert sorted(tensors) == ["model/w", "opt/0"]


def test_unsupported_value_is_named() -> None:
    with pytest.raises(CheckpointError, match="object") as info:
        flatten({"a": {"b": object()}})
    assert info.value.context["key"] == "a/b"


@pytest.mark.parametrize(
    "tree", [{"__tensor__": "missing"}, {"__tuple__": 3}, {"__dict__": [[1]]}, {"__bytes__": "zz"}, {"__float__": "1"}]
)
def test_corrupt_tree(tree: Any) -> None:
    with pytest.raises(CorruptCheckpoint):
        unflatten(tree, {})


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
    lambda c: (
        st.lists(c, max_size=3) | st.tuples(c, c) | st.dictionaries(st.text(max_size=5) | st.integers(), c, max_size=3)
    ),
    max_leaves=15,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=200, deadline=None)
@given(values)
def test_round_trip_property(value: Any) -> None:
    tree, tensors = flatten(value)
    assert _same(unflatten(_json_round_trip(tree), tensors), value)
