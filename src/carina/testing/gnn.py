"""GNN test kit: a reference feature store, its conformance suite, and fake multi-GPU machines.

* :class:`InMemoryFeatureStore` is the reference PyG ``FeatureStore``: a dict of
  tensors, nothing else. Every carina feature store must answer like it.
* :class:`FeatureStoreTests` is the conformance suite. A backend's test module
  subclasses it and implements :meth:`FeatureStoreTests.make_store`, returning a
  store that serves ``expected`` (a ``[n, d]`` tensor) under ``attr_name="x"``.
* :class:`RecordingSideStream` stands in for the sampler's CUDA stream
  (:mod:`carina.gnn.sidestream`) on a machine without one: it records what the
  pipeline does with the stream, so the hand-over order is tested on the CPU.
* :class:`FakeTimingEvents` makes fake CUDA timing events for
  :class:`carina.gnn.sidestream.StageEvents`: times from a clock the test drives,
  completion held back on request, every wait counted.
* :func:`fake_topology` returns multi-GPU machines that cannot exist on a test
  host; every plan or figure computed on them is **simulated** and says so
  (``Topology.simulated`` is ``True``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch
from torch_geometric.data import FeatureStore, TensorAttr

__all__ = [
    "FakeTimingEvent",
    "FakeTimingEvents",
    "FeatureStoreTests",
    "InMemoryFeatureStore",
    "RecordingSideStream",
    "fake_topology",
    "gpu_machine",
    "placed_training_worker",
    "two_gpu_machine",
]


class InMemoryFeatureStore(FeatureStore):
    """Reference feature store: tensors in a dict keyed by ``(group_name, attr_name)``."""

    def __init__(self) -> None:
        super().__init__()
        self._store: dict[tuple[Any, str], torch.Tensor] = {}

    def _put_tensor(self, tensor: torch.Tensor, attr: TensorAttr) -> bool:
        key = (attr.group_name, attr.attr_name)
        if attr.index is None:
            self._store[key] = tensor.clone()
            return True
        if key not in self._store:
            return False
        self._store[key][attr.index] = tensor
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        t = self._store.get((attr.group_name, attr.attr_name))
        if t is None:
            return None
        return t if attr.index is None else t[attr.index]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._store.pop((attr.group_name, attr.attr_name), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        t = self._store.get((attr.group_name, attr.attr_name))
        return None if t is None else tuple(t.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every stored attribute."""
        return [TensorAttr(group_name=g, attr_name=a) for g, a in self._store]


class FeatureStoreTests:
    """Conformance suite for PyG feature stores serving node features.

    Subclasses implement :meth:`make_store`; pytest collects the ``test_*``
    methods. Rows must come back bit-identical to ``expected``.
    """

    def make_store(self, expected: torch.Tensor) -> FeatureStore:
        """A store serving ``expected`` as ``(group_name=None, attr_name="x")``."""
        raise NotImplementedError

    @pytest.fixture
    def expected(self) -> torch.Tensor:
        """Features the store must serve (fp32, 4 KiB-unfriendly width on purpose)."""
        gen = torch.Generator().manual_seed(7)
        return torch.randn(1000, 24, generator=gen)

    @pytest.fixture
    def store(self, expected: torch.Tensor) -> FeatureStore:
        """The store under test."""
        return self.make_store(expected)

    def test_full_tensor(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """``index=None`` returns every row."""
        assert torch.equal(store.get_tensor(group_name=None, attr_name="x", index=None), expected)

    def test_index_rows(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """Arbitrary, unsorted, repeated indices."""
        idx = torch.tensor([999, 0, 5, 5, 512, 3, 999, 42])
        assert torch.equal(store.get_tensor(group_name=None, attr_name="x", index=idx), expected[idx])

    def test_slice(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """Slices select contiguous rows."""
        assert torch.equal(store.get_tensor(group_name=None, attr_name="x", index=slice(10, 20)), expected[10:20])

    def test_multi_get(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """``multi_get_tensor`` answers each attribute in order."""
        attrs = [TensorAttr(None, "x", torch.tensor([1, 2])), TensorAttr(None, "x", torch.tensor([900]))]
        out = store.multi_get_tensor(attrs)
        assert torch.equal(out[0], expected[[1, 2]])
        assert torch.equal(out[1], expected[[900]])

    def test_size_and_attrs(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """Sizes and the attribute list."""
        assert tuple(store.get_tensor_size(group_name=None, attr_name="x")) == tuple(expected.shape)
        assert [(a.group_name, a.attr_name) for a in store.get_all_tensor_attrs()] == [(None, "x")]

    def test_missing_attr(self, store: FeatureStore) -> None:
        """An unknown attribute has no size and no rows (PyG returns ``None``)."""
        assert store.get_tensor_size(group_name=None, attr_name="nope") is None
        assert store.get_tensor(group_name=None, attr_name="nope", index=None) is None

    def test_out_of_range(self, store: FeatureStore, expected: torch.Tensor) -> None:
        """Indices past the end are refused, not wrapped."""
        with pytest.raises((IndexError, ValueError)):
            store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([expected.shape[0]]))


def small_machine() -> Any:
    """2 GPUs under 2 PCIe switches, one SSD each, one DRAM (simulated): small enough for the exact MILP."""
    from carina.gnn.placement.topology import NodeKind, Topology

    t = Topology(name="small-2gpu")
    t.add("cpu0", NodeKind.CPU)
    t.add("dram0", NodeKind.DRAM, capacity_gb=2.0)
    t.connect("dram0", "cpu0", 20.0)
    for s in range(2):
        t.add(f"sw{s}", NodeKind.SWITCH)
        t.connect(f"sw{s}", "cpu0", 12.0)
        t.add(f"gpu{s}", NodeKind.GPU, capacity_gb=1.0)
        t.connect(f"gpu{s}", f"sw{s}", 24.0)
        t.add(f"ssd{s}", NodeKind.SSD, capacity_gb=8.0)
        t.connect(f"ssd{s}", f"sw{s}", 3.0, both=False)
    return t


def two_gpu_machine() -> Any:
    """A small simulated machine: one socket, DRAM, two switches each with a GPU and an SSD."""
    return gpu_machine(2)


def gpu_machine(n: int, *, chain: bool = False) -> Any:
    """A small simulated machine: one socket, DRAM, ``n`` switches each with a GPU and an SSD.

    The GPUs are joined pairwise by 50 GB/s peer links so that peers' caches are worth using;
    with ``chain`` only neighbours are (``gpu0-gpu1-gpu2``...), so traffic between distant GPUs
    is relayed by the ones between them or crosses the 12 GB/s switch uplinks.
    """
    from carina.gnn.placement.topology import NodeKind, Topology

    t = Topology(name=f"fake-{n}gpu", simulated=True)
    t.add("cpu0", NodeKind.CPU)
    t.add("dram0", NodeKind.DRAM)
    t.connect("dram0", "cpu0", 20.0)
    for s in range(n):
        t.add(f"sw{s}", NodeKind.SWITCH)
        t.connect(f"sw{s}", "cpu0", 12.0)
        t.add(f"gpu{s}", NodeKind.GPU)
        t.connect(f"gpu{s}", f"sw{s}", 24.0)
        t.add(f"ssd{s}", NodeKind.SSD)
        t.connect(f"ssd{s}", f"sw{s}", 3.0, both=False)
    for a in range(n):
        for b in range(a + 1, a + 2 if chain else n):
            if b < n:
                t.connect(f"gpu{a}", f"gpu{b}", 50.0)
    return t


def placed_training_worker(rank: int, world: int, root: str, init_file: str, out_dir: str, chain: bool = False) -> None:
    """One process of a simulated multi-GPU run (gloo, CPU): in-memory vs placed features.

    With ``chain`` the machine's GPUs form a chain (:func:`gpu_machine`) and the routes may
    relay peer rows through the GPUs in between.

    Each rank trains a DDP replica on its shard twice from the same seed: once with all
    features in memory, once with features served by :class:`PlacedFeatures` following a
    greedy placement on :func:`gpu_machine` and the per-batch routes. Losses, served-row
    counts and each batch's planned / pulled bytes per source go to ``out_dir/rank<r>.json``.
    """
    import json
    from dataclasses import asdict
    from pathlib import Path

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from carina.gnn.dataset import Dataset
    from carina.gnn.placement.runtime import PlacedFeatures
    from carina.gnn.sampler import NeighborSampler
    from carina.gnn.store import OutOfCoreFeatures
    from carina.gnn.train import GNN, InMemoryFeatures, ModelKind, TrainConfig, train_epoch
    from carina.io import IOConfig, IOEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ds = Dataset.open(root)
    m = ds.manifest
    chunk = 128
    topo = gpu_machine(world, chain=chain)
    gpus = [f"gpu{r}" for r in range(world)]
    placement = _worker_placement(ds, topo, gpus, chunk)
    cfg = TrainConfig(hidden=16, fanouts=[5, 5], batch_size=32, max_batches=3, pipeline_depth=2)
    shard = ds.train_idx[rank::world]
    out: dict[str, Any] = {"simulated": topo.simulated}
    with IOEngine(IOConfig(workers=2)) as eng:
        store = OutOfCoreFeatures(ds, engine=eng)
        group = dist.new_group(backend="gloo")
        placed = PlacedFeatures(
            ds, placement, chunk_rows=chunk, gpus=gpus, store=store, topology=topo, group=group, relay=chain
        )
        for name, src in (("in-memory", InMemoryFeatures(ds.read_all_features())), ("placed", placed)):
            torch.manual_seed(0)
            model = DistributedDataParallel(GNN(ModelKind.SAGE, m.feature_dim, 16, m.num_classes, 2))
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            sampler = NeighborSampler(ds.graph, fanouts=cfg.fanouts, seed=100 + rank)
            out[name] = train_epoch(model, opt, sampler, src, ds.labels, shard, cfg).losses
        out["served"] = asdict(placed.stats)
        out["batches"] = [asdict(b) for b in placed.log]
        out["row_bytes"] = placed.row_bytes
        placed.close()
        store.close()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _worker_placement(ds: Any, topo: Any, gpus: list[str], chunk: int) -> Any:
    """Greedy single-holder placement of 128-row chunks by degree hotness (GPU caches, DRAM, SSDs)."""
    import numpy as np

    from carina.gnn.cache import degree_hotness
    from carina.gnn.placement.place import Items, place_greedy

    n = ds.manifest.num_nodes
    hot = degree_hotness(ds.graph)
    n_chunks = -(-n // chunk)
    per_chunk = torch.zeros(n_chunks).index_add_(0, torch.arange(n) // chunk, hot).numpy()
    noise = np.random.default_rng(0).uniform(0.5, 1.5, (n_chunks, len(gpus)))
    items = Items(size_gb=np.ones(n_chunks), traffic=per_chunk[:, None] * noise / per_chunk.sum(), gpus=gpus)
    caps = {g: 0.2 * n_chunks for g in gpus} | {"dram0": 0.2 * n_chunks}
    caps |= {s: float(n_chunks) for s in topo.nodes if s.startswith("ssd")}
    return place_greedy(topo, items, capacity_gb=caps, replicate=(0.0,))


def fake_topology(name: str) -> Any:
    """A built-in multi-GPU topology, marked simulated (no such machine is here)."""
    from carina.gnn.placement.topology import builtin

    topo = builtin(name)
    topo.simulated = True
    return topo


class RecordingSideStream:
    """A stand-in for :class:`carina.gnn.sidestream.CudaSideStream` (no CUDA stream here): a log.

    :attr:`events` holds ``("mark", token)`` and ``("hand_over", token, tensor ids)`` in order;
    :meth:`inside` says whether the calling thread is inside :meth:`context` now.
    """

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._tokens = 0

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        self._local.inside = True
        try:
            yield
        finally:
            self._local.inside = False

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The stream is current in this thread for the body."""
        return self._entered()

    def inside(self) -> bool:
        """Whether the calling thread is inside :meth:`context`."""
        return bool(getattr(self._local, "inside", False))

    def mark(self) -> int:
        """A new token, logged."""
        with self._lock:
            self._tokens += 1
            self.events.append(("mark", self._tokens))
            return self._tokens

    def hand_over(self, token: Any, tensors: Iterable[torch.Tensor]) -> None:
        """Log the hand-over with the ids of the tensors kept alive."""
        with self._lock:
            self.events.append(("hand_over", token, frozenset(id(t) for t in tensors)))


class FakeTimingEvents:
    """Makes fake timing events (a stand-in for ``torch.cuda.Event(enable_timing=True)`` on the CPU).

    An event takes ``clock()`` (seconds) when recorded. With ``complete=False`` no event has
    completed (``query`` is False) until it is waited for (``synchronize``); reading the time of
    an event that has not completed raises, as CUDA does. :attr:`waits` counts the waits.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, *, complete: bool = True) -> None:
        self.clock = clock
        self.complete = complete
        self.waits = 0
        self.made = 0
        self._lock = threading.Lock()

    def __call__(self) -> FakeTimingEvent:
        with self._lock:
            self.made += 1
        return FakeTimingEvent(self)


class FakeTimingEvent:
    """One fake timing event of :class:`FakeTimingEvents`."""

    def __init__(self, owner: FakeTimingEvents) -> None:
        self.owner = owner
        self.at: float | None = None
        self.waited = False

    def record(self) -> None:
        """Take the owner's clock now."""
        self.at = self.owner.clock()

    def query(self) -> bool:
        """Completed: always when the owner says so, else once waited for."""
        return self.owner.complete or self.waited

    def synchronize(self) -> None:
        """Wait (counted); the event has completed after it."""
        with self.owner._lock:
            self.owner.waits += 1
        self.waited = True

    def elapsed_time(self, end: FakeTimingEvent, /) -> float:
        """Milliseconds from this event to ``end``; both recorded, ``end`` (the later one) completed."""
        if self.at is None or end.at is None or not end.query():
            raise RuntimeError("elapsed_time of an event not recorded or not completed")
        return (end.at - self.at) * 1e3
