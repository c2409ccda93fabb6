"""The token arrays of a cold user's sequence while hir_model.rank.inductive puts it together: the user's own token, its
context items (leaves, or their graph(t) trees grafted one level below the user), concatenated and put in BFS order;
and the content vectors of its graph(t) tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hir_model.content import to_matrix
from hir_model.graph.csr import Graph
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES, SELF_EDGE, SampledBatch

USER_TYPE, ITEM_TYPE = NODE_TYPES.index("user"), NODE_TYPES.index("product")
CLICK_EDGE, PURCHASE_EDGE = EDGE_TYPES.index("click"), EDGE_TYPES.index("purchase")


@dataclass
class Tokens:
    """One sequence's (or several sequences') token arrays while a cold user's sequence is put together."""

    node: np.ndarray  # (T,) graph node, -1 for a token outside graph(t)
    codes: np.ndarray  # (T, K)
    node_type: np.ndarray  # (T,)
    depth: np.ndarray  # (T,)
    ancestors: np.ndarray  # (T, D + 1) local indices within the sequence, -1 beyond the depth
    edge_type: np.ndarray  # (T,)
    edge_age: np.ndarray  # (T,) float64 seconds
    content: np.ndarray  # (T, C)
    has: np.ndarray  # (T,)

    @classmethod
    def seed(cls, codes: np.ndarray, width: int, dim: int) -> Tokens:
        anc = np.full((1, width), -1, np.int64)
        anc[0, 0] = 0
        return cls(np.full(1, -1, np.int64), codes[None, :], np.full(1, USER_TYPE, np.int64), np.zeros(1, np.int64), anc,
                   np.full(1, SELF_EDGE, np.int64), np.zeros(1), np.zeros((1, dim), np.float32), np.zeros(1, bool))

    @classmethod
    def leaf(cls, codes: np.ndarray, base: int, width: int, content: np.ndarray, has: np.ndarray) -> Tokens:
        anc = np.full((1, width), -1, np.int64)
        anc[0, :2] = (0, base)
        return cls(np.full(1, -1, np.int64), codes, np.full(1, ITEM_TYPE, np.int64), np.ones(1, np.int64), anc,
                   np.full(1, CLICK_EDGE, np.int64), np.zeros(1), content.astype(np.float32), has.astype(bool))

    @classmethod
    def grafted(cls, sub: SampledBatch, lo: int, hi: int, base: int, width: int, content: np.ndarray, has: np.ndarray,
                shift_s: float) -> Tokens:
        """An item's sampled tree (tokens lo:hi of `sub`) one level below the user token, starting at local index `base`."""
        old = sub.ancestors[lo:hi]  # (t, D') local within the item's sequence
        anc = np.full((hi - lo, width), -1, np.int64)
        anc[:, 0] = 0
        anc[:, 1:1 + old.shape[1]] = np.where(old >= 0, old + base, -1)
        return cls(sub.node[lo:hi].copy(), sub.token_codes[lo:hi], sub.node_type[lo:hi].copy(), sub.depth[lo:hi] + 1, anc,
                   sub.edge_type[lo:hi].copy(), sub.edge_age[lo:hi].astype(np.float64) + shift_s, content, has)

    @classmethod
    def concat(cls, parts: list[Tokens]) -> Tokens:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))

    def bfs(self) -> Tokens:
        """The same sequence reordered by depth (stable), local indices remapped: the sampler's layout."""
        perm = np.argsort(self.depth, kind="stable")
        new = np.empty(len(perm), np.int64)
        new[perm] = np.arange(len(perm))
        anc = np.where(self.ancestors >= 0, new[np.maximum(self.ancestors, 0)], -1)
        return Tokens(self.node[perm], self.codes[perm], self.node_type[perm], self.depth[perm], anc[perm], self.edge_type[perm],
                       self.edge_age[perm], self.content[perm], self.has[perm])


class ContentLookup:
    """Content vectors by graph node (from the content table of t) for the encoder's width, or nothing."""

    def __init__(self, graph: Graph | None, content: pa.Table | None, dim: int):
        self.dim, self.matrix, self.row = dim, None, None
        if dim == 0 or content is None or graph is None:
            return
        matrix, valid = to_matrix(content.column("embedding"))
        if matrix.shape[1] != dim:
            raise ValueError(f"content vectors have {matrix.shape[1]} dims, the encoder expects {dim}")
        nodes = graph.nodes.index_of(content.column("entity_id"))
        self.row = np.full(graph.num_nodes, -1, np.int64)
        keep = (nodes >= 0) & valid
        self.row[nodes[keep]] = np.flatnonzero(keep)
        self.matrix = np.nan_to_num(matrix)

    def of_nodes(self, node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """((T, C) vectors, (T,) has) of graph nodes (-1: none)."""
        out, has = np.zeros((len(node), self.dim), np.float32), np.zeros(len(node), bool)
        if self.matrix is not None:
            row = np.where(node >= 0, self.row[np.maximum(node, 0)], -1)
            has = row >= 0
            out[has] = self.matrix[row[has]]
        return out, has
