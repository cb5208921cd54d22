"""Dataset directories: topology + labels as numpy files, features in one row-major file.

Layout written by :func:`prepare` (and ``carina gnn prepare``)::

    <dir>/manifest.json    DatasetManifest (sizes, dtype, row stride, how it was made)
    <dir>/indptr.npy       int64 CSC pointers
    <dir>/indices.npy      int32/int64 in-neighbours
    <dir>/labels.npy       int64 class of every node
    <dir>/train_idx.npy    int64 training nodes
    <dir>/features.bin     one row per node, ``row_stride`` bytes apart

Rows are padded to a stride that divides the 4 KiB page (or is a multiple of it),
so no row straddles pages needlessly and a page read yields whole rows.
Features of generated datasets are :func:`~carina.gnn.graph.node_features` of the
node id, so any fetched row can be checked bit for bit.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carina.core.config import Config, require
from carina.core.errors import ConfigError, ModelFormatError
from carina.gnn.graph import CSCGraph, chung_lu, from_edge_index, node_features, node_labels, rmat

__all__ = [
    "PAGE",
    "Dataset",
    "DatasetManifest",
    "GeneratorKind",
    "PrepareConfig",
    "prepare",
    "prepare_from_arrays",
    "row_stride",
]

PAGE = 4096
MANIFEST = "manifest.json"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class GeneratorKind(enum.Enum):
    """Offline graph generators."""

    CHUNG_LU = "chung-lu"
    RMAT = "rmat"


def row_stride(row_bytes: int, page: int = PAGE) -> int:
    """Bytes between rows: the next power of two up to a page, whole pages above."""
    if row_bytes <= 0:
        raise ConfigError("row_bytes must be positive", key="row_bytes")
    if row_bytes >= page:
        return -(-row_bytes // page) * page
    return 1 << (row_bytes - 1).bit_length()


@dataclass(kw_only=True)
class DatasetManifest(Config):
    """What a dataset directory holds."""

    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    dtype: str = "float32"
    row_bytes: int
    row_stride: int
    num_classes: int
    feature_seed: int | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Check sizes and the stride rule."""
        require(self.dtype in _DTYPES, f"dtype must be one of {sorted(_DTYPES)}", key="dtype")
        require(self.num_nodes > 0 and self.feature_dim > 0, "empty dataset", key="num_nodes")
        require(self.row_bytes == self.feature_dim * self.torch_dtype.itemsize, "row_bytes", key="row_bytes")
        require(self.row_stride == row_stride(self.row_bytes), "row_stride breaks the page rule", key="row_stride")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The feature dtype as a torch dtype."""
        return _DTYPES[self.dtype]

    @property
    def feature_bytes(self) -> int:
        """Size of ``features.bin``: the rows, padded to whole pages for O_DIRECT."""
        return -(-self.num_nodes * self.row_stride // PAGE) * PAGE


@dataclass(kw_only=True)
class PrepareConfig(Config):
    """How :func:`prepare` generates a dataset."""

    name: str = "synthetic"
    generator: GeneratorKind = GeneratorKind.CHUNG_LU
    num_nodes: int = 1 << 16
    avg_degree: float = 15.0
    gamma: float = 2.1
    feature_dim: int = 128
    dtype: str = "float32"
    num_classes: int = 16
    train_fraction: float = 0.01
    seed: int = 0
    chunk_rows: int = 1 << 18

    def validate(self) -> None:
        """Check ranges."""
        require(self.num_nodes >= 2, "num_nodes must be >= 2", key="num_nodes")
        require(self.feature_dim > 0, "feature_dim must be positive", key="feature_dim")
        require(self.dtype in _DTYPES, f"dtype must be one of {sorted(_DTYPES)}", key="dtype")
        require(0 < self.train_fraction <= 1, "train_fraction must be in (0, 1]", key="train_fraction")
        require(self.num_classes >= 2, "num_classes must be >= 2", key="num_classes")
        if self.generator is GeneratorKind.RMAT:
            n = self.num_nodes
            require(n & (n - 1) == 0, "rmat needs a power-of-two num_nodes", key="num_nodes")


def prepare(cfg: PrepareConfig, out_dir: str | Path, *, device: str = "cpu") -> Dataset:
    """Generate a graph, its features, labels and training split into ``out_dir``."""
    if cfg.generator is GeneratorKind.CHUNG_LU:
        graph = chung_lu(
            num_nodes=cfg.num_nodes, avg_degree=cfg.avg_degree, gamma=cfg.gamma, seed=cfg.seed, device=device
        )
    else:
        scale = cfg.num_nodes.bit_length() - 1
        graph = rmat(scale=scale, edge_factor=max(1, round(cfg.avg_degree)), seed=cfg.seed, device=device)
    graph = graph.to("cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = _DTYPES[cfg.dtype]
    stride = row_stride(cfg.feature_dim * dtype.itemsize)
    labels = _write_features(out / "features.bin", cfg, stride, device)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n_train = max(1, int(cfg.num_nodes * cfg.train_fraction))
    train_idx = torch.randperm(cfg.num_nodes, generator=gen)[:n_train].sort().values
    manifest = DatasetManifest(
        name=cfg.name,
        num_nodes=cfg.num_nodes,
        num_edges=graph.num_edges,
        feature_dim=cfg.feature_dim,
        dtype=cfg.dtype,
        row_bytes=cfg.feature_dim * dtype.itemsize,
        row_stride=stride,
        num_classes=cfg.num_classes,
        feature_seed=cfg.seed,
        source={"generator": cfg.to_dict()},
    )
    _write_arrays(out, graph, labels, train_idx, manifest)
    return Dataset.open(out)


def prepare_from_arrays(
    out_dir: str | Path,
    *,
    edge_index: Any,
    features: torch.Tensor,
    labels: torch.Tensor,
    train_idx: torch.Tensor | None = None,
    name: str = "imported",
) -> Dataset:
    """Write a dataset from arrays (e.g. a PyG ``Data``'s fields or an edge list)."""
    n, dim = features.shape
    dtype_name = next((k for k, v in _DTYPES.items() if v == features.dtype), None)
    if dtype_name is None:
        raise ConfigError(f"unsupported feature dtype {features.dtype}", key="features")
    if labels.numel() != n:
        raise ConfigError(f"{labels.numel()} labels for {n} nodes", key="labels")
    graph = from_edge_index(edge_index, num_nodes=n)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    row_bytes = dim * features.dtype.itemsize
    stride = row_stride(row_bytes)
    raw = _padded(features.cpu(), stride).tobytes()
    (out / "features.bin").write_bytes(raw + bytes(-len(raw) % PAGE))
    train = torch.arange(n) if train_idx is None else train_idx.to(torch.int64)
    manifest = DatasetManifest(
        name=name,
        num_nodes=n,
        num_edges=graph.num_edges,
        feature_dim=dim,
        dtype=dtype_name,
        row_bytes=row_bytes,
        row_stride=stride,
        num_classes=int(labels.max()) + 1,
        source={"imported": True},
    )
    _write_arrays(out, graph, labels.to(torch.int64), train, manifest)
    return Dataset.open(out)


def _write_features(path: Path, cfg: PrepareConfig, stride: int, device: str) -> torch.Tensor:
    """Write every node's features (made from its id on ``device``) and return the labels.

    Chunks of ``chunk_rows`` rows are made on the device, copied into one of two aligned host
    buffers and written through :mod:`carina.io` (``O_DIRECT`` where allowed, so the file does
    not fill the page cache), the write of one chunk overlapping the making of the next. The
    file is preallocated and padded with zeros to whole pages (chunks whose size is not a whole
    number of pages are written buffered: ``Direct.AUTO``).
    """
    from carina.io import IOConfig, IOEngine, aligned_buffer

    dtype = _DTYPES[cfg.dtype]
    n, step = cfg.num_nodes, cfg.chunk_rows
    total = -(-n * stride // PAGE) * PAGE
    labels = torch.empty(n, dtype=torch.int64)
    bufs = [aligned_buffer(min(step, n) * stride + PAGE) for _ in range(2)]
    pending: list[Any] = [None, None]
    with IOEngine(IOConfig(queue_depth=8)) as eng:
        handle = eng.open(str(path), "w", size=total)
        for i, lo in enumerate(range(0, n, step)):
            ids = torch.arange(lo, min(lo + step, n), device=device)
            x = node_features(ids, dim=cfg.feature_dim, seed=cfg.seed, dtype=dtype)
            labels[lo : lo + ids.numel()] = node_labels(x, num_classes=cfg.num_classes, seed=cfg.seed).cpu()
            rows = _padded(x.cpu(), stride).reshape(-1)
            if pending[i % 2] is not None:
                pending[i % 2].result()  # this buffer's previous write is done
            buf = bufs[i % 2]
            size = total - lo * stride if lo + step >= n else rows.size  # the last chunk pads the file
            buf[: rows.size] = rows
            buf[rows.size : size] = 0
            pending[i % 2] = eng.write(handle, lo * stride, buf[:size])
        for fut in pending:
            if fut is not None:
                fut.result()
        eng.close_file(handle)
    return labels


def _padded(x: torch.Tensor, stride: int) -> np.ndarray:
    raw = x.contiguous().view(torch.uint8).numpy()
    if raw.shape[1] == stride:
        return raw
    out = np.zeros((raw.shape[0], stride), dtype=np.uint8)
    out[:, : raw.shape[1]] = raw
    return out


def _write_arrays(
    out: Path, graph: CSCGraph, labels: torch.Tensor, train_idx: torch.Tensor, manifest: DatasetManifest
) -> None:
    np.save(out / "indptr.npy", graph.indptr.numpy())
    np.save(out / "indices.npy", graph.indices.numpy())
    np.save(out / "labels.npy", labels.numpy())
    np.save(out / "train_idx.npy", train_idx.numpy())
    # The manifest goes last: a directory without one is incomplete.
    (out / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")


@dataclass
class Dataset:
    """An opened dataset directory (topology and labels in memory, features on disk)."""

    root: Path
    manifest: DatasetManifest
    graph: CSCGraph
    labels: torch.Tensor
    train_idx: torch.Tensor

    @property
    def features_path(self) -> Path:
        """The row-major feature file."""
        return self.root / "features.bin"

    @classmethod
    def open(cls, root: str | Path, *, mmap: bool = False) -> Dataset:
        """Open a directory written by :func:`prepare`.

        Raises:
            ModelFormatError: The manifest is missing or disagrees with the files.
        """
        root = Path(root)
        path = root / MANIFEST
        if not path.is_file():
            raise ModelFormatError("not a dataset directory: manifest.json is missing", file=str(path))
        try:
            manifest = DatasetManifest.from_json(path.read_text())
        except ConfigError as exc:
            raise ModelFormatError(f"bad manifest: {exc}", file=str(path)) from exc
        names = ("indptr", "indices", "labels", "train_idx")
        # copy-on-write maps: pages load on use and the files stay untouched
        arrays = {k: np.load(root / f"{k}.npy", mmap_mode="c" if mmap else None) for k in names}
        feat = root / "features.bin"
        if not feat.is_file() or feat.stat().st_size != manifest.feature_bytes:
            raise ModelFormatError(f"features.bin must hold {manifest.feature_bytes} bytes", file=str(feat))
        if arrays["indptr"].shape[0] != manifest.num_nodes + 1 or arrays["indices"].shape[0] != manifest.num_edges:
            raise ModelFormatError("topology arrays disagree with the manifest", file=str(path))
        t = {k: torch.from_numpy(v) for k, v in arrays.items()}
        graph = CSCGraph(indptr=t["indptr"], indices=t["indices"])
        return cls(root=root, manifest=manifest, graph=graph, labels=t["labels"], train_idx=t["train_idx"])

    def read_all_features(self) -> torch.Tensor:
        """Every row, read with plain buffered IO (for the in-memory baseline)."""
        m = self.manifest
        raw = np.fromfile(self.features_path, dtype=np.uint8, count=m.num_nodes * m.row_stride)
        raw = raw.reshape(m.num_nodes, m.row_stride)
        rows = torch.from_numpy(np.ascontiguousarray(raw[:, : m.row_bytes]))
        return rows.view(m.torch_dtype).reshape(m.num_nodes, m.feature_dim)
