import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import CapacityError, ConfigError
from carina.memory import HostArena


def test_alloc_bytes_and_shape_views_share_memory():
    arena = HostArena(1 << 16, pin="off")
    assert not arena.pinned
    raw = arena.alloc(64)
    assert raw.dtype == torch.uint8 and raw.shape == (64,)
    mat = arena.alloc((4, 8), dtype=torch.float32)
    assert mat.shape == (4, 8) and mat.data_ptr() % 4096 == 0
    mat.fill_(1.5)
    # the numpy view sees the same bytes
    view = arena.numpy(mat)
    assert view.nbytes == 128
    assert torch.from_numpy(view.copy()).view(torch.float32).eq(1.5).all()
    assert arena.used == 4096 + 128


def test_full_arena_raises_capacity_error_and_reset_frees():
    arena = HostArena(8192, pin="off")
    arena.alloc(8000)
    with pytest.raises(CapacityError) as err:
        arena.alloc(4096)
    assert err.value.context["requested"] == 4096
    arena.reset()
    assert arena.used == 0
    assert arena.alloc(8192).numel() == 8192
    assert arena.peak == 8192


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((0,), {}), ((-1,), {}), ((True,), {}), ((100,), {"pin": "maybe"})],
)
def test_bad_arena_arguments(args, kwargs):
    with pytest.raises(ConfigError):
        HostArena(*args, **kwargs)


def test_bad_alloc_arguments():
    arena = HostArena(4096, pin="off")
    with pytest.raises(ConfigError):
        arena.alloc(6, dtype=torch.float32)  # not a multiple of 4
    with pytest.raises(ConfigError):
        arena.alloc(8, align=3)
    with pytest.raises(ConfigError):
        arena.alloc((2, -1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_pin_on_without_cuda_is_a_config_error():
    with pytest.raises(ConfigError):
        HostArena(4096, pin="on")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.sampled_from([1, 8, 64, 512, 4096])), min_size=1, max_size=20))
def test_views_are_aligned_disjoint_and_within_capacity(requests):
    arena = HostArena(16384, pin="off")
    spans = []
    for nbytes, align in requests:
        try:
            t = arena.alloc(nbytes, align=align)
        except CapacityError:
            aligned = -(-(arena.base_ptr + arena.used) // align) * align - arena.base_ptr
            assert aligned + nbytes > arena.capacity
            continue
        if nbytes == 0:  # an empty tensor has no meaningful address
            assert t.numel() == 0
            continue
        start = t.data_ptr() - arena.base_ptr
        assert t.data_ptr() % align == 0
        assert start >= 0 and start + nbytes <= arena.capacity
        spans.append((start, start + nbytes))
        assert arena.used <= arena.capacity
    spans = sorted(s for s in spans if s[0] != s[1])
    for (_, a1), (b0, _) in itertools.pairwise(spans):
        assert a1 <= b0
