import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import CapacityError, ConfigError
from carina.memory import TensorStore, Tier, TierBudgets
from carina.memory.nvme import ExtentAllocator
from carina.memory.tiers import format_bytes, parse_bytes


def test_budgets_are_checked_before_bytes_move():
    store = TensorStore(TierBudgets(device=1000, host=4096))
    store.charge(Tier.DEVICE, 600, "a")
    with pytest.raises(CapacityError) as err:
        store.charge(Tier.DEVICE, 500, "b")
    assert err.value.context == {"tier": "device", "requested": 500, "used": 600, "budget": 1000}
    assert store.used(Tier.DEVICE) == 600  # nothing charged by the failed request
    store.uncharge(Tier.DEVICE, 600)
    assert store.peak(Tier.DEVICE) == 600 and store.used(Tier.DEVICE) == 0
    store.put("x", torch.arange(512, dtype=torch.float32), Tier.HOST)  # 2048 B
    with pytest.raises(CapacityError):
        store.put("y", torch.zeros(1024), Tier.HOST)
    assert store.keys() == ["x"]
    with pytest.raises(ConfigError):
        store.put("x", torch.zeros(1), Tier.HOST)


def test_nvme_tier_roundtrip_through_carina_io(tmp_path):
    store = TensorStore(TierBudgets(host=1 << 20, nvme=1 << 20, nvme_path=tmp_path))
    values = {f"t{i}": torch.randn(100 + 37 * i) for i in range(6)}
    for key, value in values.items():
        store.put(key, value, Tier.NVME)
    assert store.used(Tier.NVME) == sum(v.numel() * 4 for v in values.values())
    store.drop("t2")
    store.move("t3", Tier.HOST)
    assert store.tier_of("t3") is Tier.HOST
    store.move("t3", Tier.NVME)
    for key, value in values.items():
        if key != "t2":
            assert torch.equal(store.get(key), value)
            out = torch.empty_like(value)
            store.read_into(key, out)
            assert torch.equal(out, value)
    stats = store.stats()
    assert stats.moved["host->nvme"] == values["t3"].numel() * 4
    assert stats.moved["nvme->host"] > 0
    assert [row["tier"] for row in stats.rows()] == ["device", "host", "nvme"]
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    store.close()
    assert not list(tmp_path.iterdir()) and store.used(Tier.NVME) == 0


def test_nvme_budget_and_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        TierBudgets(nvme=1 << 20)  # no path
    store = TensorStore(TierBudgets(nvme=8192, nvme_path=tmp_path))
    store.put("a", torch.zeros(1024), Tier.NVME)
    with pytest.raises(CapacityError):
        store.put("b", torch.zeros(4096), Tier.NVME)
    store.close()
    no_nvme = TensorStore(TierBudgets())
    with pytest.raises(CapacityError):
        no_nvme.put("a", torch.zeros(4), Tier.NVME)


def test_extent_allocator_reuses_and_merges():
    alloc = ExtentAllocator(16 * 4096)
    a, b, c = alloc.alloc(5000), alloc.alloc(4096), alloc.alloc(1)
    assert (a.offset, a.length, b.offset, c.offset) == (0, 8192, 8192, 12288)
    alloc.free(b)
    alloc.free(a)
    merged = alloc.alloc(3 * 4096)
    assert merged.offset == 0 and alloc.used == 4 * 4096
    with pytest.raises(CapacityError):
        alloc.alloc(13 * 4096)


@pytest.mark.parametrize(
    ("text", "value"), [("24GB", 24 << 30), ("512MiB", 512 << 20), ("1.5k", 1536), ("4096", 4096), (7, 7)]
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GB", "12XB", "-4", "1..2G"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 30) == "3.0 GiB"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_parse_bytes_never_fails_with_anything_but_value_error(text):
    try:
        value = parse_bytes(text)
    except ValueError:
        return
    assert isinstance(value, int) and value >= 0


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1 << 50), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "k", "GB"]))
def test_parse_bytes_integer_units(n, unit):
    scale = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "k": 1 << 10, "GB": 1 << 30}[unit]
    assert parse_bytes(f"{n}{unit}") == n * scale


def test_nvme_batches_write_and_read_every_tensor_in_flight_at_once(tmp_path):
    store = TensorStore(TierBudgets(host=1 << 20, nvme=1 << 20, nvme_path=tmp_path))
    values = [(f"s{i}", torch.randn(1000 + 513 * i)) for i in range(5)]
    store.put_nvme(values)
    assert store.used(Tier.NVME) == sum(v.numel() * 4 for _, v in values)
    outs = [(key, torch.empty_like(v)) for key, v in values]
    store.read_nvme(outs[::-1])  # any order
    assert all(torch.equal(out, v) for (_, out), (_, v) in zip(outs, values, strict=True))
    assert store.stats().moved["nvme->host"] == sum(v.numel() * 4 for _, v in values)
    with pytest.raises(ConfigError):  # a repeated key: nothing is written
        store.put_nvme([("a", torch.zeros(4)), ("a", torch.zeros(4))])
    with pytest.raises(ConfigError):
        store.put_nvme([("s0", torch.zeros(4))])
    assert sorted(store.keys()) == [k for k, _ in values]


@pytest.mark.parametrize("budget", [1 << 16, 10_000])  # the ledger refuses the third / the file has no extent
def test_a_batch_that_does_not_fit_stores_nothing_and_gives_every_byte_back(tmp_path, budget):
    store = TensorStore(TierBudgets(host=1 << 20, nvme=budget, nvme_path=tmp_path))
    store.put("kept", torch.ones(500), Tier.NVME)  # 2000 B (a 4 KiB extent)
    n = 6000 if budget > 10_000 else 600
    batch = [(f"b{i}", torch.full((n,), float(i))) for i in range(3)]
    with pytest.raises(CapacityError):  # started writes are waited for, then undone
        store.put_nvme(batch)
    assert store.keys() == ["kept"] and store.used(Tier.NVME) == 2000
    store.put_nvme(batch[:-1] if budget > 10_000 else batch[:1])  # the extents were given back
    out = torch.empty(n)
    store.read_nvme([("b0", out)])
    assert torch.equal(out, batch[0][1])
    with pytest.raises(ConfigError):
        store.read_nvme([("missing", out)])


def _held_store(tmp_path, script=None):
    """A store whose NVMe tier runs on the scripted mock backend, its requests held until ``release()``."""
    from carina.io import IOConfig, IOEngine
    from carina.testing.io import MockBackend

    backend = MockBackend(hold=True, script=script)
    engine = IOEngine(IOConfig(), backend=backend)
    return TensorStore(TierBudgets(host=1 << 20, nvme=1 << 20, nvme_path=tmp_path), engine=engine), backend, engine


def test_a_started_batch_returns_at_once_and_its_entries_appear_when_it_is_waited_for(tmp_path):
    store, backend, engine = _held_store(tmp_path)
    values = [(f"s{i}", torch.randn(1000 + 77 * i)) for i in range(3)]
    batch = store.start_put_nvme(values)  # nothing has been written yet: the backend holds every request
    assert not batch.done() and store.keys() == []
    assert store.used(Tier.NVME) == sum(v.numel() * 4 for _, v in values)  # charged before bytes move
    with pytest.raises(ConfigError):  # its keys are taken while it runs, in every tier
        store.start_put_nvme([("s1", torch.zeros(4))])
    with pytest.raises(ConfigError):
        store.put("s2", torch.zeros(4))
    backend.release()
    batch.wait()
    batch.wait()  # finished once, waited for any number of times
    assert sorted(store.keys()) == ["s0", "s1", "s2"]
    outs = [(k, torch.empty_like(v)) for k, v in values]
    store.start_read_nvme(outs).wait()
    assert all(torch.equal(o, v) for (_, o), (_, v) in zip(outs, values, strict=True))
    store.close()
    engine.close()


def test_a_failed_batch_raises_to_every_waiter_and_stores_nothing(tmp_path):
    import errno
    import os

    from carina.core.errors import IOEngineError
    from carina.io._future import OpKind

    def script(op):
        return OSError(errno.EIO, os.strerror(errno.EIO)) if op.kind is OpKind.WRITE and op.offset > 0 else None

    store, backend, engine = _held_store(tmp_path, script)
    batch = store.start_put_nvme([("a", torch.ones(2000)), ("b", torch.ones(2000))])  # b lands past offset 0
    backend.release()
    for _ in range(2):
        with pytest.raises(IOEngineError):
            batch.wait()
    assert store.keys() == [] and store.used(Tier.NVME) == 0
    store.put_nvme([("a", torch.ones(10))])  # the keys and extents were given back
    store.close()
    engine.close()


def test_close_finishes_batches_in_flight_and_the_nvme_tier_stays_closed(tmp_path):
    from carina.core.errors import IOEngineError

    store, backend, engine = _held_store(tmp_path)
    store.start_put_nvme([("a", torch.ones(4096))])  # nobody waits for it: close() must
    assert store.used(Tier.NVME) == 4096 * 4
    backend.release()
    store.close()
    assert store.keys() == [] and store.used(Tier.NVME) == 0 and not list(tmp_path.iterdir())
    with pytest.raises(IOEngineError):  # no new tier file behind a closed store
        store.put_nvme([("b", torch.ones(4))])
    assert not list(tmp_path.iterdir())
    engine.close()
