"""A compact integer graph of a risk model: CSR adjacency plus per-node score arrays.

Scorers work on this form. Links are deduplicated as STRonG does (one edge per node
pair; both directions unless the model is directed); self-links are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from carina.core.errors import ConfigError
from carina.security.risk.model import Model

__all__ = ["RiskGraph"]


@dataclass(frozen=True, eq=False)
class RiskGraph:
    """Nodes ``0..n-1`` with probabilities, impacts and out-neighbour lists (CSR).

    Attributes:
        names: Full node names.
        layers: Layer of each node.
        probability: Exploit probability per node.
        impact: Impact score per node.
        indptr, indices: Out-neighbours of ``v`` are ``indices[indptr[v]:indptr[v+1]]``.
        attackers, targets: Node indices.
        directed: Whether links were read as one-way.
    """

    names: tuple[str, ...]
    layers: tuple[str, ...]
    probability: np.ndarray
    impact: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    attackers: np.ndarray
    targets: np.ndarray
    directed: bool = False

    @classmethod
    def from_model(cls, model: Model, *, directed: bool | None = None) -> RiskGraph:
        """Build from an expanded model; ``directed`` overrides the model's setting."""
        is_directed = model.directed if directed is None else directed
        names = tuple(model.nodes)
        index = {name: i for i, name in enumerate(names)}
        adj: list[list[int]] = [[] for _ in names]
        seen: set[tuple[int, int]] = set()
        for src, dest, _ in model.links:
            a, b = index[src], index[dest]
            if a == b:
                continue
            key = (a, b) if is_directed else (min(a, b), max(a, b))
            if key in seen:
                continue
            seen.add(key)
            adj[a].append(b)
            if not is_directed:
                adj[b].append(a)
        indptr = np.zeros(len(names) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(a) for a in adj])
        flat = [b for a in adj for b in a]
        return cls(
            names=names,
            layers=tuple(n.layer for n in model.nodes.values()),
            probability=np.array([n.probability for n in model.nodes.values()], dtype=np.float64),
            impact=np.array([n.impact for n in model.nodes.values()], dtype=np.float64),
            indptr=indptr,
            indices=np.array(flat, dtype=np.int64),
            attackers=np.array([index[a] for a in model.attackers], dtype=np.int64),
            targets=np.array([index[t] for t in model.targets], dtype=np.int64),
            directed=is_directed,
        )

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.names)

    @property
    def out_degree(self) -> np.ndarray:
        """Out-degree of each node (STRonG weighs impact by its square root)."""
        return np.diff(self.indptr)

    def neighbours(self, v: int) -> np.ndarray:
        """Out-neighbours of node ``v``."""
        return self.indices[self.indptr[v] : self.indptr[v + 1]]

    def index(self, name: str) -> int:
        """Index of the node called ``name``."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ConfigError(f"no node named {name!r}", key="node") from None

    def with_scores(self, probability: np.ndarray | None = None, impact: np.ndarray | None = None) -> RiskGraph:
        """The same topology with other node scores (noise trials, what-ifs)."""
        return RiskGraph(
            names=self.names,
            layers=self.layers,
            probability=self.probability if probability is None else np.asarray(probability, dtype=np.float64),
            impact=self.impact if impact is None else np.asarray(impact, dtype=np.float64),
            indptr=self.indptr,
            indices=self.indices,
            attackers=self.attackers,
            targets=self.targets,
            directed=self.directed,
        )

    def edges(self) -> list[tuple[int, int]]:
        """Directed edge list (an undirected link appears both ways)."""
        return [(v, int(w)) for v in range(self.n) for w in self.neighbours(v)]

    def relevant_nodes(self, source: int, target: int) -> np.ndarray:
        """Mask of nodes that can lie on a simple ``source``-``target`` path.

        Undirected: the blocks of the block-cut tree between the two (exact).
        Directed: reachable from ``source`` and reaching ``target`` (a superset).
        """
        import networkx as nx

        mask = np.zeros(self.n, dtype=np.bool_)
        g = nx.DiGraph() if self.directed else nx.Graph()
        g.add_nodes_from(range(self.n))
        g.add_edges_from(self.edges())
        if self.directed:
            keep = (nx.descendants(g, source) | {source}) & (nx.ancestors(g, target) | {target})
            mask[list(keep)] = True
            return mask
        if not nx.has_path(g, source, target):
            return mask
        tree = nx.Graph()
        blocks = [frozenset(b) for b in nx.biconnected_components(g)]
        for i, block in enumerate(blocks):
            for v in block:
                tree.add_edge(("b", i), ("v", v))
        ends = [("v", source), ("v", target)]
        for item in nx.shortest_path(tree, *ends):
            if item[0] == "b":
                mask[list(blocks[item[1]])] = True
        return mask
