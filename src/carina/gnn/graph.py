"""Graph topology in CSC form, offline generators and checkable node features.

The topology lives in host memory as CSC: ``indptr[v]:indptr[v+1]`` indexes the
in-neighbours (message sources) of node ``v`` in ``indices``. Generators are
vectorised (Chung-Lu power law, noisy R-MAT) so graphs of 2^26 nodes build in
seconds on a GPU. Node features are a pure function of ``(seed, node id)``, so
every row fetched from any cache or disk path can be checked without a stored
reference::

    g = chung_lu(num_nodes=1 << 14, avg_degree=10, gamma=2.1, seed=0)
    x = node_features(torch.arange(4), dim=64, seed=0)   # bit-identical every time
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from carina.core.errors import ConfigError

__all__ = [
    "CSCGraph",
    "chung_lu",
    "from_edge_index",
    "from_pyg",
    "node_features",
    "node_labels",
    "rmat",
]


@dataclass
class CSCGraph:
    """Compressed sparse columns: in-neighbours of each node.

    Attributes:
        indptr: ``int64[num_nodes + 1]``.
        indices: Source node of each edge, grouped by destination (int32 or int64).
    """

    indptr: torch.Tensor
    indices: torch.Tensor

    def __post_init__(self) -> None:
        if self.indptr.dim() != 1 or self.indptr.numel() < 1:
            raise ConfigError("indptr must be a 1-d tensor of num_nodes + 1 entries", key="indptr")
        if int(self.indptr[-1]) != self.indices.numel():
            raise ConfigError(
                f"indptr ends at {int(self.indptr[-1])} but there are {self.indices.numel()} edges",
                key="indptr",
            )

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        """Number of (directed) edges."""
        return self.indices.numel()

    def in_degree(self) -> torch.Tensor:
        """In-degree of every node (int64)."""
        return self.indptr[1:] - self.indptr[:-1]

    def to(self, device: str | torch.device) -> CSCGraph:
        """The same graph with both arrays on ``device``."""
        return CSCGraph(indptr=self.indptr.to(device), indices=self.indices.to(device))

    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` edge index ``(src, dst)`` in PyG's convention."""
        dst = torch.repeat_interleave(torch.arange(self.num_nodes, device=self.indptr.device), self.in_degree())
        return torch.stack([self.indices.to(torch.int64), dst])


def from_edge_index(edge_index: Any, num_nodes: int | None = None) -> CSCGraph:
    """Build CSC from a ``[2, E]`` ``(src, dst)`` array (numpy or torch).

    Raises:
        ConfigError: The array is not ``[2, E]`` or ids fall outside ``num_nodes``.
    """
    ei = torch.as_tensor(np.asarray(edge_index) if not isinstance(edge_index, torch.Tensor) else edge_index)
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ConfigError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}", key="edge_index")
    ei = ei.to(torch.int64)
    n = int(ei.max()) + 1 if num_nodes is None and ei.numel() else int(num_nodes or 0)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ConfigError(f"node ids must lie in [0, {n})", key="edge_index")
    src, dst = ei[0], ei[1]
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=ei.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    idx_dtype = torch.int32 if n < 2**31 else torch.int64
    return CSCGraph(indptr=indptr, indices=src[order].to(idx_dtype))


def from_pyg(data: Any) -> CSCGraph:
    """Build CSC from a PyG ``Data`` object (its ``edge_index`` and ``num_nodes``)."""
    return from_edge_index(data.edge_index, num_nodes=int(data.num_nodes))


def _generator(seed: int, device: str | torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def chung_lu(
    *,
    num_nodes: int,
    avg_degree: float,
    gamma: float = 2.1,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> CSCGraph:
    """Chung-Lu graph whose expected degrees follow a power law with exponent ``gamma``.

    Both endpoints of each of ``num_nodes * avg_degree`` edges are drawn with
    probability proportional to the weight ``w_i = i^(-1/(gamma-1))``; node ids
    are then randomly permuted so hot nodes are spread over the feature file.
    Self loops are dropped.
    """
    if num_nodes < 2 or avg_degree <= 0 or gamma <= 1.0:
        raise ConfigError("need num_nodes >= 2, avg_degree > 0 and gamma > 1", key="chung_lu")
    gen = _generator(seed, device)
    ranks = torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device)
    weights = ranks.pow(-1.0 / (gamma - 1.0))
    cdf = torch.cumsum(weights, 0)
    cdf /= cdf[-1].clone()
    num_edges = int(num_nodes * avg_degree)
    ends = [
        torch.searchsorted(cdf, torch.rand(num_edges, generator=gen, device=device, dtype=torch.float64)).clamp_(
            max=num_nodes - 1
        )
        for _ in range(2)
    ]
    return _finish(ends, num_nodes, gen)


def rmat(
    *,
    scale: int,
    edge_factor: int = 16,
    abc: tuple[float, float, float] = (0.57, 0.19, 0.19),
    noise: float = 0.1,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> CSCGraph:
    """Noisy R-MAT graph with ``2**scale`` nodes and ``edge_factor * 2**scale`` edges.

    Each level picks a quadrant with probabilities ``(a, b, c, d)`` perturbed by up
    to ``noise`` per level (Seshadhri-Pinar-Kolda), which smooths the degree
    staircase of plain R-MAT. Expect many isolated nodes, as in Graph500.
    """
    a, b, c = abc
    if scale < 1 or a <= 0 or b <= 0 or c <= 0 or a + b + c >= 1.0 or not 0 <= noise < 1:
        raise ConfigError("need scale >= 1, positive a, b, c with a+b+c < 1, 0 <= noise < 1", key="rmat")
    n = 1 << scale
    num_edges = edge_factor * n
    gen = _generator(seed, device)
    src = torch.zeros(num_edges, dtype=torch.int64, device=device)
    dst = torch.zeros(num_edges, dtype=torch.int64, device=device)
    for level in range(scale):
        mu = (torch.rand(4, generator=gen, device=device, dtype=torch.float64) * 2 - 1) * noise
        p = torch.tensor([a, b, c, 1 - a - b - c], dtype=torch.float64, device=device) * (1 + mu)
        cum = torch.cumsum(p / p.sum(), 0)
        q = torch.searchsorted(cum, torch.rand(num_edges, generator=gen, device=device, dtype=torch.float64))
        bit = 1 << (scale - 1 - level)
        src += (q >= 2).to(torch.int64) * bit
        dst += (q % 2 == 1).to(torch.int64) * bit
    ends = [src, dst]
    del src, dst
    return _finish(ends, n, gen)


def _finish(ends: list[torch.Tensor], n: int, gen: torch.Generator) -> CSCGraph:
    """Permute ids, drop self loops, build CSC; ``ends`` (``[src, dst]``) is emptied as it is used.

    Taking the endpoints in a list the caller keeps no other reference to lets each array be
    freed as soon as its permuted copy exists: at 2^26 nodes and 1e9 edges every int64 array is
    8 GB, and the peak on the device stays near six of them instead of ten.
    """
    perm = torch.randperm(n, generator=gen, device=ends[0].device)
    src = perm[ends.pop(0)]
    dst = perm[ends.pop(0)]
    del perm
    keep = src != dst
    edge_index = torch.stack([src[keep], dst[keep]])
    del src, dst, keep
    return from_edge_index(edge_index, num_nodes=n)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A splitmix64-style integer hash on int64 (wrapping arithmetic, CPU == CUDA)."""
    x = x * -7046029254386353131  # 0x9E3779B97F4A7C15 as signed
    x = x ^ ((x >> 30) & 0x3FFFFFFFF)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9
    x = x ^ ((x >> 27) & 0x1FFFFFFFFF)
    x = x * -7723592293110705685  # 0x94D049BB133111EB
    return x ^ ((x >> 31) & 0x1FFFFFFFF)


def node_features(
    node_ids: torch.Tensor, *, dim: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Deterministic features: row ``v`` depends only on ``(seed, v, dim)``.

    Values lie in ``[-1, 1)`` on a grid of ``2**-23`` so they are exact in fp32
    (and rounded once in fp16/bf16).
    """
    ids = node_ids.to(torch.int64).reshape(-1, 1)
    cols = torch.arange(dim, dtype=torch.int64, device=ids.device).reshape(1, -1)
    salt = ((seed + 1) * 0x632BE59BD9B4E019 + 2**63) % 2**64 - 2**63  # wrapped to int64
    h = _mix(ids * dim + cols + salt)
    vals = (h & 0xFFFFFF).to(torch.float32) / float(1 << 23) - 1.0
    return vals.to(dtype)


def node_labels(features: torch.Tensor, *, num_classes: int, seed: int = 0) -> torch.Tensor:
    """Labels as the argmax of a fixed random projection of the features."""
    gen = _generator(seed + 7919, "cpu")
    proj = torch.randn(features.shape[1], num_classes, generator=gen).to(features.device, torch.float32)
    return (features.to(torch.float32) @ proj).argmax(dim=1)
