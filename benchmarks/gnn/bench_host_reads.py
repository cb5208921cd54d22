"""The sampler thread's host reads per batch, now and at an earlier commit (counted on the CPU, no timing).

Every read of a device value on the host (a boolean mask's size, ``nonzero``, ``unique``'s size, an
``int(t)``, a copy to the CPU) makes the sampler thread wait for its stream on CUDA. This counts them
per batch with :func:`carina.testing.gnn_sync.count_host_syncs` for the sampler and the cache lookup of
this tree and of the code at ``--before`` (its ``sampler.py`` and ``cache.py``, read from git), on a
small Chung-Lu graph (the counts do not depend on the sizes)::

    PYTHONPATH=$PWD/src python benchmarks/gnn/bench_host_reads.py      # -> results/cpu/gnn_host_reads.json
    PYTHONPATH=$PWD/src python benchmarks/gnn/bench_host_reads.py --before 715a07b --name gnn_host_reads_s14 \
        --epoch-batches 8     # also an epoch of 8 batches through ``NeighborSampler.batches``

Code from before session 13 (no :mod:`carina.gnn.hostread`) has its copies to the CPU (``Tensor.cpu``)
counted by wrapping that method while it runs (a CPU tensor's ``cpu()`` never reaches the dispatcher);
its copy of the misses' order back to the device (``order.to(device)``) is not counted. Code that reads
through :mod:`carina.gnn.hostread` is counted by its calls alone (its ``to_host`` is a ``cpu()``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.cache import CacheConfig, StaticCache
from carina.gnn.graph import chung_lu
from carina.gnn.sampler import NeighborSampler
from carina.testing.gnn_sync import HostSyncs, count_host_syncs

ROOT = Path(__file__).resolve().parents[2]
FANOUTS = {"25x10": [25, 10], "15x10x5": [15, 10, 5]}


def module_at(commit: str, path: str, name: str, into: Path) -> ModuleType:
    """``path`` as it was at ``commit``, imported as ``name``."""
    text = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
    file = into / f"{name}.py"
    file.write_text(text.stdout)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def counting_cpu_copies(seen: HostSyncs) -> Iterator[None]:
    """Count ``Tensor.cpu`` calls into ``seen`` (the earlier code's copies to the host)."""
    original = torch.Tensor.cpu

    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.add("Tensor.cpu")
        return original(self, *args, **kwargs)

    torch.Tensor.cpu = cpu  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cpu = original  # type: ignore[method-assign]


def count(fn: Any, *, copies: bool) -> dict[str, int]:
    """Host reads of one call of ``fn``, by operation."""
    with count_host_syncs() as seen, counting_cpu_copies(seen) if copies else contextlib.nullcontext():
        fn()
    return dict(seen.ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="98f8e8c", help="the commit of the earlier code")
    ap.add_argument("--name", default="gnn_host_reads")
    ap.add_argument("--epoch-batches", type=int, default=0, help="also count an epoch of this many batches")
    a = ap.parse_args()
    graph = chung_lu(num_nodes=1 << 14, avg_degree=15, gamma=2.1, seed=5)
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    seeds, epoch = perm[:512], perm[: 512 * a.epoch_batches]
    hot = torch.rand(graph.num_nodes, generator=torch.Generator().manual_seed(2))
    n = graph.num_nodes
    kw: dict[str, Any] = dict(config=CacheConfig(gpu_rows=n // 4, host_rows=n // 4), dim=1, dtype=torch.float32)
    kw |= dict(device="cpu", fetch=lambda ids: torch.zeros(ids.numel(), 1))
    counts: dict[str, dict[str, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old_sampler = module_at(a.before, "src/carina/gnn/sampler.py", "sampler_before", Path(tmp))
        old_cache = module_at(a.before, "src/carina/gnn/cache.py", "cache_before", Path(tmp))
        old_s, old_c = (not hasattr(m, "hostread") for m in (old_sampler, old_cache))  # count Tensor.cpu
        for label, fo in FANOUTS.items():
            for when, cls, copies in (("now", NeighborSampler, False), ("before", old_sampler.NeighborSampler, old_s)):
                s = cls(graph, fanouts=fo, seed=0)
                counts.setdefault(f"sample {label}", {})[when] = count(lambda s=s: s.sample(seeds), copies=copies)
                if a.epoch_batches:
                    key = f"epoch of {a.epoch_batches} batches {label}"
                    counts.setdefault(key, {})[when] = count(lambda s=s: list(s.batches(epoch, 512)), copies=copies)
        n_id = NeighborSampler(graph, fanouts=[25, 10], seed=0).sample(seeds).n_id
        for when, cls, copies in (("now", StaticCache, False), ("before", old_cache.StaticCache, old_c)):
            cache = cls(hotness=hot, **kw)
            for path, on_device in (("device path", True), ("cpu path", False)):
                counts.setdefault(f"lookup {path}", {})[when] = count(
                    lambda c=cache, d=on_device: c.lookup(n_id, host_on_device=d), copies=copies
                )
    figures = [
        Figure(
            name=f"host_reads_per_batch.{what.replace(' ', '_')}"
            if not what.startswith("epoch")
            else f"host_reads_per_epoch_of_{a.epoch_batches}_batches.sample_{what.rsplit(' ', 1)[1]}",
            value=sum(v["now"].values()),
            unit="reads",
            basis=Basis.MEASURED,
            peers={f"before ({a.before})": sum(v["before"].values())},
        )
        for what, v in counts.items()
    ]
    rec = make_record(
        name=a.name,
        figures=figures,
        config={"before": a.before, "fanouts": FANOUTS, "nodes": n, "seeds": seeds.numel()}
        | ({"epoch_batches": a.epoch_batches} if a.epoch_batches else {}),
        metrics={"by_operation": counts},
        notes="Counted on the CPU (operations that wait for the device on CUDA), not timed."
        + (" The earlier lookup's copy of the misses' order back to the device is not in its count." if old_c else ""),
    )
    print(write_record(rec))
    for f in figures:
        print(f"{f.name:44s} {f.value:6g} {f.peers}")


if __name__ == "__main__":
    main()
