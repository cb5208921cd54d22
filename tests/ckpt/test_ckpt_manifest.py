from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carina.ckpt.manifest import Manifest, ShardEntry, TensorEntry, parse_manifest
from carina.core.errors import CorruptCheckpoint


def valid() -> Manifest:
    tensors = (
        TensorEntry("w", "F32", (2, 3), 0, 24, 123),
        TensorEntry("b", "BF16", (3,), 24, 6, 0xFFFFFFFF),
    )
    shard = ShardEntry(0, "rank00000.safetensors", 4096 + 30, 4096, 7, tensors)
    return Manifest(step=12, world_size=1, shards=(shard,), objects={"0": {"pos": 3}})


def test_round_trip() -> None:
    m = valid()
    assert parse_manifest(m.to_json()) == m
    assert m.nbytes == 4096 + 30


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("step"), "lacks 'step'"),
        (lambda d: d.update(format="other"), "not a carina"),
        (lambda d: d.update(version=99), "unsupported manifest version"),
        (lambda d: d["shards"][0]["tensors"][0].update(offset=-1), "negative"),
        (lambda d: d["shards"][0]["tensors"][1].update(offset=4000), "runs past the end"),
        (lambda d: d["shards"][0]["tensors"][0].update(shape=[2, 4]), "does not match shape"),
        (lambda d: d["shards"][0].update(file="../evil"), "plain file name"),
        (lambda d: d.update(world_size=2), "expected 0..1"),
        (lambda d: d["shards"][0]["tensors"][0].update(crc32=1 << 33), "not a crc32"),
        (lambda d: d["shards"][0]["tensors"][0].update(dtype="F33"), "unknown"),
        (lambda d: d.update(step=True), "must be int"),
    ],
)
def test_bad_fields_are_named(mutate: Any, message: str) -> None:
    data = json.loads(valid().to_json())
    mutate(data)
    with pytest.raises(CorruptCheckpoint, match=message) as info:
        parse_manifest(json.dumps(data), path="m.json")
    assert info.value.context["path"] == "m.json"


def _check_invariants(m: Manifest) -> None:
    for s in m.shards:
        assert 8 <= s.data_start <= s.size
        for t in s.tensors:
            assert t.offset + t.nbytes <= s.size - s.data_start
            assert 0 <= t.crc32 <= 0xFFFFFFFF


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_bytes(raw: bytes) -> None:
    try:
        _check_invariants(parse_manifest(raw))
    except CorruptCheckpoint:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_field_mutations(data: st.DataObject) -> None:
    doc = json.loads(valid().to_json())
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(json_values)
    mutated = copy.deepcopy(doc)
    target = mutated
    for key in path[:-1]:
        target = target[key]
    if data.draw(st.booleans()) and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    try:
        _check_invariants(parse_manifest(json.dumps(mutated)))
    except CorruptCheckpoint:
        pass


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_checkpoint_crc32_is_zlibs_crc32(a: bytes, b: bytes) -> None:
    """The fast backend (ISA-L when installed) gives zlib's CRC-32, also continued across pieces."""
    import zlib

    from carina.ckpt.checksum import crc32

    assert crc32(a + b) == zlib.crc32(a + b) == crc32(b, crc32(a))
    assert crc32(memoryview(a + b)[len(a) :], zlib.crc32(a)) == zlib.crc32(a + b)
