"""AES-GCM bounce buffers and the emulated CC link."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import ConfigError, ValidationFailed
from carina.security.tee.bounce import TAG, BounceBuffer
from carina.security.tee.emulate import CCLinkConfig, EmulatedCCLink


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=5000), st.integers(1, 700))
def test_open_of_seal_is_identity(data: bytes, chunk: int) -> None:
    buf = BounceBuffer(len(data), chunk=chunk)
    sealed = buf.seal(data)
    assert len(sealed.nonces) == math.ceil(len(data) / chunk)
    assert len(sealed.data) == len(data) + TAG * len(sealed.nonces)
    cipher = b"".join(bytes(sealed.data[a : b - TAG]) for a, b in map(sealed.chunk, range(len(sealed.nonces))))
    assert len(cipher) == len(data) and (cipher != data or len(data) < 8)  # it is encrypted
    assert buf.open(sealed).tobytes() == data


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.integers(1, 500), st.data())
def test_any_flipped_bit_is_rejected(data: bytes, chunk: int, pick: st.DataObject) -> None:
    buf = BounceBuffer(len(data), chunk=chunk)
    sealed = buf.seal(data)
    at = pick.draw(st.integers(0, len(sealed.data) - 1))
    sealed.data[at] ^= 1 << pick.draw(st.integers(0, 7))
    out = np.full(len(data), 7, dtype=np.uint8)
    with pytest.raises(ValidationFailed, match="tampered"):
        buf.open(sealed, out)
    bad = next(i for i in range(len(sealed.nonces)) if sealed.chunk(i)[0] <= at < sealed.chunk(i)[1])
    assert not out[: sealed.offsets[bad + 1]].any()  # nothing up to the bad chunk is left readable


def test_nonces_never_repeat_and_limits_hold() -> None:
    buf = BounceBuffer(1024, chunk=100)
    first, second = buf.seal(bytes(1000)), buf.seal(bytes(1000))
    assert not set(first.nonces) & set(second.nonces)
    with pytest.raises(ConfigError):
        buf.seal(bytes(1025))
    with pytest.raises(ConfigError):
        BounceBuffer(10, key=b"short")


def test_emulated_link_delivers_data_and_charges_modeled_cost() -> None:
    cfg = CCLinkConfig(chunk=4096, capacity=1 << 16, gpu_crypto_gbps=0.001, toll_us=50.0)
    link = EmulatedCCLink("cpu", cfg)
    src = torch.randint(0, 256, (10_000,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = link.h2d(src, dst)
    assert torch.equal(src, dst)
    modeled = 10_000 / 1e6 + 3 * 50e-6  # bytes at 1 MB/s plus a toll per chunk crossing
    assert t >= modeled and link.crossings == 3
    back = torch.empty_like(src)
    assert link.d2h(dst, back) >= modeled and torch.equal(back, src)
    floats = torch.randn(33, 7)
    out = torch.empty_like(floats)
    link.h2d(floats, out)
    assert torch.equal(out, floats)
    assert link.assumptions == {"gpu_crypto_gbps": 0.001, "toll_us": 50.0, "chunk": 4096}
