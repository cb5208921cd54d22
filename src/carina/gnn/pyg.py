"""PyG ``FeatureStore`` / ``GraphStore`` over carina's stores, so PyG code uses them unchanged.

:class:`CarinaFeatureStore` serves node features by ``TensorAttr(group_name,
attr_name, index)`` from any source with a ``gather(ids)`` method (the
out-of-core store or the in-memory baseline); :class:`CSCGraphStore` hands out
the CSC topology. Both follow PyG's pattern: public methods validate and call
the ``_hooks`` filled here::

    fs = CarinaFeatureStore()
    fs.register(store, num_rows=n, dim=d)          # attr_name "x", group None
    x = fs.get_tensor(group_name=None, attr_name="x", index=batch.n_id)
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.typing import EdgeTensorType

from carina.core.errors import ConfigError
from carina.gnn.graph import CSCGraph

__all__ = ["CSCGraphStore", "CarinaFeatureStore"]


class _Gather(Protocol):
    def gather(self, n_id: torch.Tensor) -> torch.Tensor: ...


class CarinaFeatureStore(FeatureStore):
    """A read-mostly PyG feature store over carina feature sources."""

    def __init__(self) -> None:
        super().__init__()
        self._sources: dict[tuple[Any, str], tuple[_Gather, int, int]] = {}

    def register(
        self, source: _Gather, *, num_rows: int, dim: int, group_name: Any = None, attr_name: str = "x"
    ) -> None:
        """Serve ``(group_name, attr_name)`` from ``source`` (rows ``[0, num_rows)``)."""
        self._sources[(group_name, attr_name)] = (source, num_rows, dim)

    def _put_tensor(self, tensor: torch.Tensor, attr: TensorAttr) -> bool:
        from carina.gnn.train import InMemoryFeatures

        key = (attr.group_name, attr.attr_name)
        if attr.index is not None or key in self._sources:
            return False  # registered sources are read-only; partial puts are not supported
        self.register(
            InMemoryFeatures(tensor),
            num_rows=tensor.shape[0],
            dim=tensor.shape[1],
            group_name=attr.group_name,
            attr_name=attr.attr_name,
        )
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        key = (attr.group_name, attr.attr_name)
        if key not in self._sources:
            return None
        source, n, _ = self._sources[key]
        ids = _index(attr.index, n)
        return source.gather(ids)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._sources.pop((attr.group_name, attr.attr_name), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        entry = self._sources.get((attr.group_name, attr.attr_name))
        return None if entry is None else (entry[1], entry[2])

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every registered attribute."""
        return [TensorAttr(group_name=g, attr_name=a) for g, a in self._sources]


def _index(index: Any, n: int) -> torch.Tensor:
    if index is None:
        return torch.arange(n)
    if isinstance(index, slice):
        return torch.arange(n)[index]
    ids = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ConfigError(f"index out of range [0, {n})", key="index")
    return ids


class CSCGraphStore(GraphStore):
    """A PyG graph store holding CSC topologies by edge type."""

    def __init__(self) -> None:
        super().__init__()
        self._graphs: dict[Any, CSCGraph] = {}
        self._attrs: dict[Any, EdgeAttr] = {}

    def put_csc(self, graph: CSCGraph, edge_type: Any = None) -> None:
        """Store ``graph`` under ``edge_type`` (``None`` for a homogeneous graph)."""
        n = graph.num_nodes
        self.put_edge_index(
            (graph.indices.to(torch.int64), graph.indptr), edge_type=edge_type, layout="csc", size=(n, n)
        )

    def _put_edge_index(self, edge_index: EdgeTensorType, edge_attr: EdgeAttr) -> bool:
        if edge_attr.layout.value != "csc":
            return False
        row, colptr = edge_index
        assert row is not None and colptr is not None
        self._graphs[edge_attr.edge_type] = CSCGraph(indptr=colptr, indices=row)
        self._attrs[edge_attr.edge_type] = edge_attr
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr) -> EdgeTensorType | None:
        g = self._graphs.get(edge_attr.edge_type)
        if g is None or edge_attr.layout.value != "csc":
            return None
        return g.indices.to(torch.int64), g.indptr

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        self._attrs.pop(edge_attr.edge_type, None)
        return self._graphs.pop(edge_attr.edge_type, None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """Every stored edge type (CSC layout)."""
        return list(self._attrs.values())
