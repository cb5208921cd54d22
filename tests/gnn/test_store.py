import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import BackendUnavailable, CapacityError, ConfigError
from carina.gnn.cache import CacheConfig, CacheLookup, StaticCache, degree_hotness, presample_hotness
from carina.gnn.dataset import PAGE, PrepareConfig, prepare
from carina.gnn.graph import node_features
from carina.gnn.hostpath import HostGather
from carina.gnn.sampler import NeighborSampler
from carina.gnn.store import OutOfCoreFeatures, StoreConfig, _sorted_unique, page_runs
from carina.io import IOConfig, IOEngine


@pytest.fixture(scope="module")
def engine():
    with IOEngine(IOConfig(queue_depth=32, workers=2)) as eng:
        yield eng


def _store(ds, engine, gpu_rows=0, host_rows=0, **cfg):
    s = OutOfCoreFeatures(ds, engine=engine, config=StoreConfig(**cfg))
    m = ds.manifest
    cache = StaticCache(
        hotness=degree_hotness(ds.graph),
        config=CacheConfig(gpu_rows=gpu_rows, host_rows=host_rows),
        dim=m.feature_dim,
        dtype=m.torch_dtype,
        device="cpu",
        fetch=s.read_rows,
    )
    s.attach_cache(cache)
    return s


@pytest.mark.parametrize("host_gather", [HostGather.CPU, HostGather.DEVICE])
@pytest.mark.parametrize("gpu_rows,host_rows", [(0, 0), (300, 0), (0, 500), (200, 700), (4096, 0), (0, 4096)])
def test_rows_bit_exact_on_every_path(small_dataset, engine, gpu_rows, host_rows, host_gather):
    s = _store(small_dataset, engine, gpu_rows, host_rows, host_gather=host_gather)
    assert s.host_path is (host_gather if host_rows else HostGather.CPU)
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=0).sample(small_dataset.train_idx[:200])
    x = s.gather(b.n_id)
    assert torch.equal(x, node_features(b.n_id, dim=100, seed=3))
    st_ = s.stats
    assert st_.rows == b.n_id.numel() == st_.gpu_hits + st_.host_hits + st_.misses
    assert st_.gpu_hits <= gpu_rows and st_.host_hits <= host_rows
    if gpu_rows + host_rows == 0:
        assert st_.misses == b.n_id.numel()
    s.close()


@pytest.mark.parametrize("dim,dtype", [(1024, "float32"), (1500, "float32"), (64, "float16"), (7, "bfloat16")])
def test_row_layouts(tmp_path, engine, dim, dtype):
    ds = prepare(PrepareConfig(num_nodes=700, avg_degree=4, feature_dim=dim, dtype=dtype, seed=1), tmp_path)
    s = _store(ds, engine, 50, 50)
    ids = torch.tensor([699, 0, 1, 2, 350, 351, 17, 698])
    assert torch.equal(s.gather(ids), node_features(ids, dim=dim, seed=1, dtype=ds.manifest.torch_dtype))
    assert torch.equal(s.read_rows(torch.arange(700)), ds.read_all_features())


def test_pages_are_deduplicated_and_coalesced(small_dataset, engine):
    s = _store(small_dataset, engine)
    rows_per_page = PAGE // small_dataset.manifest.row_stride  # 8 rows of 512 B
    ids = torch.arange(0, 64)  # 8 whole pages, consecutive
    s.gather(ids)
    assert s.stats.pages == 64 // rows_per_page and s.stats.ios == 1
    assert s.stats.bytes_read == 8 * PAGE


def test_gap_pages_trade_bytes_for_ios(small_dataset, engine):
    ids = torch.tensor([0, 16, 32, 48])  # pages 0, 2, 4, 6
    tight = _store(small_dataset, engine, gap_pages=0)
    tight.gather(ids)
    loose = _store(small_dataset, engine, gap_pages=1)
    x = loose.gather(ids)
    assert tight.stats.ios == 4 and tight.stats.pages == 4
    assert loose.stats.ios == 1 and loose.stats.pages == 7
    assert torch.equal(x, node_features(ids, dim=100, seed=3))


@pytest.mark.parametrize("backend", ["posix", "uring"])
def test_one_gather_per_batch_one_read_per_run(small_dataset, backend, monkeypatch):
    """A batch's runs go to the engine as one vectorised gather, one read per run (no re-merging).

    Machine-independent counts: the reads the engine issues equal the store's IOs and
    runs, the bytes equal the pages, no per-request op is made, and the rows are exact.
    """
    from carina.io import choose_backend

    if choose_backend(backend).backend.reasons:
        pytest.skip(f"{backend} cannot run here")
    rows_per_page = PAGE // small_dataset.manifest.row_stride
    # pages 0-9 (cut into runs of 4 adjacent pages by max_run_pages), page 20, pages 40-41
    ids = torch.cat(
        [
            torch.arange(0, 10 * rows_per_page),
            torch.tensor([20 * rows_per_page + 3]),
            torch.arange(40 * rows_per_page, 42 * rows_per_page, 5),
        ]
    )
    with IOEngine(IOConfig(backend=backend, queue_depth=8)) as eng:
        s = OutOfCoreFeatures(small_dataset, engine=eng, config=StoreConfig(max_run_pages=4))
        gathers, ops = [], []
        real_gather, real_submit = eng.backend.submit_gather, eng.backend.submit
        monkeypatch.setattr(eng.backend, "submit_gather", lambda g: (gathers.append(len(g.offsets)), real_gather(g)))
        monkeypatch.setattr(eng.backend, "submit", lambda o: (ops.extend(o), real_submit(o)))
        plan = s.plan(ids)
        x = s.assemble(plan, s.read(plan))
        assert torch.equal(x, node_features(ids, dim=100, seed=3))
        runs = plan.runs
        assert runs.run_pages.tolist() == [4, 4, 2, 1, 2]  # the adjacent 4-page runs stay apart
        assert gathers == [5] and ops == []  # one gather of 5 reads; no request object per run
        assert s.stats.ios == eng.stats["ops"] == eng.stats["requests"] == 5
        assert eng.stats["merged"] == 0
        assert s.stats.pages == 13 and s.stats.bytes_read == eng.stats["bytes"] == 13 * PAGE
        other = torch.arange(100 * rows_per_page, 103 * rows_per_page)
        y = s.gather(other)  # reuses the page buffer of the first batch
        assert torch.equal(y, node_features(other, dim=100, seed=3))
        assert torch.equal(x, node_features(ids, dim=100, seed=3))  # the first batch's rows were copied out
        s.close()


def test_read_rows_rejects_out_of_range(small_dataset, engine):
    s = _store(small_dataset, engine)
    with pytest.raises(ConfigError):
        s.read_rows(torch.tensor([4096]))


def test_cache_prefers_hot_nodes(small_dataset, engine):
    s = _store(small_dataset, engine, gpu_rows=100, host_rows=100)
    hot = degree_hotness(small_dataset.graph)
    top = torch.sort(hot, descending=True, stable=True).indices
    lk = s.cache.lookup(top[:300])
    assert lk.gpu_pos.numel() == 100 and lk.host_pos.numel() == 100 and lk.miss_ids.numel() == 100
    assert torch.equal(s.cache.gpu, node_features(top[:100].sort().values, dim=100, seed=3))


def test_cache_budget_refused_before_allocating(small_dataset):
    with pytest.raises(CapacityError):
        StaticCache(
            hotness=torch.ones(4096),
            config=CacheConfig(host_rows=4096),
            dim=100,
            dtype=torch.float32,
            device="cpu",
            fetch=lambda ids: torch.zeros(ids.numel(), 100),
            host_budget_bytes=1000,
        )


def test_presample_hotness_counts():
    counts = presample_hotness([torch.tensor([0, 2]), torch.tensor([2, 3])], 5)
    assert counts.tolist() == [1, 0, 2, 1, 0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=0, max_size=80, unique=True),
    st.integers(0, 3),
    st.integers(1, 8),
)
def test_page_runs_cover_each_page_once(pages, gap, max_run):
    p = np.array(sorted(pages), dtype=np.int64)
    runs = page_runs(p, gap_pages=gap, max_run_pages=max_run)
    assert (runs.run_pages <= max_run).all()
    covered = (
        np.concatenate([np.arange(f, f + n) for f, n in zip(runs.run_first, runs.run_pages, strict=True)])
        if p.size
        else p
    )
    assert np.unique(covered).size == covered.size  # no page read twice
    assert set(p.tolist()) <= set(covered.tolist())
    assert runs.total_pages == covered.size
    if p.size:
        pos = runs.buffer_page(p)
        assert np.array_equal(covered[pos], p)  # every needed page found where the buffer holds it
    if gap == 0 and p.size:
        assert runs.total_pages == p.size  # no gap pages read


@given(st.lists(st.integers(0, 50), max_size=60), st.booleans())
@settings(max_examples=60, deadline=None)
def test_sorted_unique_equals_numpy_unique(values, presort):
    v = np.array(sorted(values) if presort else values, dtype=np.int64)
    assert np.array_equal(_sorted_unique(v), np.unique(v))


def _cuda_store(dataset, engine, config=None):
    """A CUDA store with a 100-row GPU slice and a 300-row host slice (skips without CUDA)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    kwargs = {} if config is None else {"config": config}
    s = OutOfCoreFeatures(dataset, engine=engine, device="cuda", **kwargs)
    m = dataset.manifest
    cache = StaticCache(
        hotness=degree_hotness(dataset.graph),
        config=CacheConfig(gpu_rows=100, host_rows=300),
        dim=m.feature_dim,
        dtype=m.torch_dtype,
        device="cuda",
        fetch=s.read_rows,
    )
    s.attach_cache(cache)
    return s, cache


@pytest.mark.gpu
def test_host_slice_is_filled_in_pinned_memory(small_dataset, engine):
    """On a CUDA machine the host slice is allocated pinned and filled in place: same rows, pinned."""
    s, cache = _cuda_store(small_dataset, engine)
    m = small_dataset.manifest
    assert cache.host.is_pinned() and cache.host.shape == (300, m.feature_dim)
    ids = torch.arange(m.num_nodes)
    want = node_features(ids, dim=m.feature_dim, seed=3)
    assert s.host_path is HostGather.DEVICE  # auto on CUDA with a pinned slice
    assert torch.equal(s.gather(ids).cpu(), want)  # ids on the CPU, a user's (raised in session 12)
    assert torch.equal(s.gather(ids.cuda()).cpu(), want)
    s.close()


def test_read_stage_gathers_the_host_hits(small_dataset, engine):
    """The host-cache gather runs in read() (the pipeline's IO thread), not in assemble (the training thread).

    Session 8 on the H200: with the gather and a pageable copy in assemble, carina at 100% cache ran at
    0.41x in-memory. Here assemble must succeed with the host slice gone once read() has run.
    """
    s = _store(small_dataset, engine, gpu_rows=200, host_rows=700)
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=1).sample(small_dataset.train_idx[:200])
    plan = s.plan(b.n_id)
    assert plan.host_rows is None and plan.lookup.host_pos.numel() > 0
    missing = s.read(plan)
    assert plan.host_rows is not None
    assert torch.equal(plan.host_rows, node_features(b.n_id[plan.lookup.host_pos], dim=100, seed=3))
    assert torch.equal(missing, node_features(plan.lookup.miss_ids, dim=100, seed=3))
    host, s.cache.host = s.cache.host, None  # the training thread never touches the host slice now
    x = s.assemble(plan, missing)
    assert torch.equal(x, node_features(b.n_id, dim=100, seed=3))
    s.cache.host = host
    plan2 = s.plan(b.n_id)  # a source that skips read() (the sync-reads peer) still assembles exact rows
    assert torch.equal(s.assemble(plan2, s.read_rows(plan2.lookup.miss_ids)), x)
    s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
@pytest.mark.parametrize("host_on_device", [False, True])
def test_lookup_takes_ids_on_either_device(small_dataset, engine, ids_on, host_on_device):
    """A CUDA cache splits ids from the CPU as it splits the same ids on the device (session 12 on the H200:
    CPU ids raised, indexed with device positions); positions come on the cache's device either way."""
    s, cache = _cuda_store(small_dataset, engine)
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=1).sample(small_dataset.train_idx[:200])
    want = cache.lookup(b.n_id.cuda(), host_on_device=host_on_device)
    got = cache.lookup(b.n_id.to(ids_on), host_on_device=host_on_device)
    assert want.gpu_pos.numel() and want.host_pos.numel() and want.miss_pos.numel()
    for f in dataclasses.fields(CacheLookup):
        w, g = getattr(want, f.name), getattr(got, f.name)
        assert g.device == w.device and torch.equal(g, w), f.name
    assert got.gpu_pos.device.type == got.miss_pos.device.type == "cuda" and got.miss_ids.device.type == "cpu"
    assert got.host_pos.device.type == ("cuda" if host_on_device else "cpu")
    s.close()


@pytest.mark.gpu
def test_staged_rows_are_pinned_for_a_cuda_device(small_dataset, engine):
    """On the cpu host path the IO thread stages the host hits and the misses in pinned memory.

    (The device path stages no host rows: the GPU reads them from the mapped slice,
    test_cuda_host_paths_are_bit_exact.)
    """
    s, _ = _cuda_store(small_dataset, engine, StoreConfig(host_gather=HostGather.CPU))
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=1).sample(small_dataset.train_idx[:200])
    plan = s.plan(b.n_id.cuda())
    assert plan.lookup.host_pos.numel() > 0 and plan.lookup.miss_ids.numel() > 0
    missing = s.read(plan)
    assert missing.is_pinned() and plan.host_rows is not None and plan.host_rows.is_pinned()
    x = s.assemble(plan, missing)
    assert torch.equal(x.cpu(), node_features(b.n_id, dim=100, seed=3))
    s.close()


def test_auto_host_path_keeps_the_cpu_gather_on_a_cpu_device(small_dataset, engine):
    s = _store(small_dataset, engine, 200, 700)
    assert s.config.host_gather is HostGather.AUTO and s.host_path is HostGather.CPU
    s.attach_cache(None)  # no cache, no host slice: nothing to gather
    assert s.host_path is HostGather.CPU
    s.close()


def test_device_host_path_gathers_in_assemble_from_the_slice_in_place(small_dataset, engine):
    """The device path: no CPU gather on the IO thread, no staging; assemble reads the host slice itself.

    On a CPU device the slice is the device's memory: the same code runs on CUDA over the slice
    mapped into the GPU's address space (carina.memory.mapped), a gpu test below.
    """
    s = _store(small_dataset, engine, gpu_rows=200, host_rows=700, host_gather=HostGather.DEVICE)
    assert s.host_path is HostGather.DEVICE and s._host_view is s.cache.host
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=1).sample(small_dataset.train_idx[:200])
    plan = s.plan(b.n_id)
    assert plan.lookup.host_pos.numel() > 0 and plan.lookup.host_pos.device == s.cache.device
    missing = s.read(plan)
    assert plan.host_rows is None  # the IO thread left the host hits alone
    s.cache.host[plan.lookup.host_slot[0]] = -1.0  # assemble reads the slice as it is now, in place
    x = s.assemble(plan, missing)
    want = node_features(b.n_id, dim=100, seed=3)
    first = plan.lookup.host_pos[0]
    assert torch.equal(x[first], torch.full((100,), -1.0))
    keep = torch.ones(b.n_id.numel(), dtype=torch.bool)
    keep[first] = False
    assert torch.equal(x[keep], want[keep])
    s.close()


def test_device_host_path_refused_where_the_slice_cannot_be_mapped(small_dataset, engine):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device maps the pinned slice")
    s = OutOfCoreFeatures(small_dataset, engine=engine, config=StoreConfig(host_gather=HostGather.DEVICE))
    s.device = torch.device("cuda")  # batches bound for a GPU this machine does not have
    cache = StaticCache(
        hotness=degree_hotness(small_dataset.graph),
        config=CacheConfig(host_rows=100),
        dim=100,
        dtype=torch.float32,
        device="cpu",
        fetch=s.read_rows,
    )
    with pytest.raises(BackendUnavailable, match="in place"):
        s.attach_cache(cache)
    s.config.host_gather = HostGather.AUTO
    s.attach_cache(cache)  # auto falls back to the CPU gather
    assert s.host_path is HostGather.CPU
    s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("host_gather", [HostGather.AUTO, HostGather.CPU, HostGather.DEVICE])
def test_cuda_host_paths_are_bit_exact(small_dataset, engine, host_gather):
    """On CUDA, auto maps the pinned host slice into the GPU (UVA) and gathers there; every path is exact."""
    s, cache = _cuda_store(small_dataset, engine, StoreConfig(host_gather=host_gather))
    device_path = host_gather is not HostGather.CPU
    assert s.host_path is (HostGather.DEVICE if device_path else HostGather.CPU)
    if device_path:
        assert s._host_view.device.type == "cuda" and s._host_view.data_ptr() == cache.host.data_ptr()
    b = NeighborSampler(small_dataset.graph, fanouts=[10, 5], seed=1, device="cuda").sample(
        small_dataset.train_idx[:200]
    )
    plan = s.plan(b.n_id)
    assert plan.lookup.host_pos.numel() > 0
    assert plan.lookup.host_pos.device.type == ("cuda" if device_path else "cpu")
    x = s.assemble(plan, s.read(plan))
    assert (plan.host_rows is None) is device_path
    assert torch.equal(x.cpu(), node_features(b.n_id.cpu(), dim=100, seed=3))
    s.close()
