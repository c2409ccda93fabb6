"""The super-graph: interest primitives as nodes; an edge p -> q carries the decayed engagement between users whose
primitives include p and entities whose primitives include q, each event edge spread over the k x k soft pairs.

Sparse raw user-entity edges become dense primitive-primitive ones; `density_ratio` reports by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir_model.graph.csr import Graph
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES
from hir_model.hierarchy.assign import LevelAssignment
from data_contracts.vocab import EVENT_TYPES

FORWARD_EVENTS = np.array([EDGE_TYPES.index(t) for t in EVENT_TYPES], np.int64)  # user -> entity edge types


@dataclass(frozen=True)
class SuperGraph:
    src: np.ndarray  # int64 [M], user-side primitive (prototype row)
    dst: np.ndarray  # int64 [M], entity-side primitive (prototype row)
    weight: np.ndarray  # float64 [M], summed decayed engagement x assignment weights
    num_primitives: int
    raw_pairs: int  # distinct (user, entity) pairs with engagement
    users: int  # users with an assignment
    entities: int  # non-user entities with an assignment

    @property
    def raw_density(self) -> float:
        return self.raw_pairs / max(self.users * self.entities, 1)

    @property
    def density(self) -> float:
        return len(self.src) / max(self.num_primitives ** 2, 1)

    @property
    def density_ratio(self) -> float:
        return self.density / self.raw_density if self.raw_density else float("inf")


def engagement_pairs(graph: Graph, row_of_node: np.ndarray, cutoff_us: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user row, entity row, summed decayed weight) of every user -> entity engagement with both ends assigned."""
    src = graph.src()
    etype = np.asarray(graph.edge_type, np.int64)
    dst = np.asarray(graph.neighbours, np.int64)
    users = np.asarray(graph.nodes.node_type, np.int64)[src] == NODE_TYPES.index("user")
    keep = users & np.isin(etype, FORWARD_EVENTS) & (np.asarray(graph.last_ts) <= cutoff_us)
    u, e = row_of_node[src[keep]], row_of_node[dst[keep]]
    w = np.asarray(graph.weight, np.float64)[keep]
    ok = (u >= 0) & (e >= 0)
    u, e, w = u[ok], e[ok], w[ok]
    key = u * (len(row_of_node) + 1) + e  # one pair per (user, entity): event types merge
    uniq, inv = np.unique(key, return_inverse=True)
    return uniq // (len(row_of_node) + 1), uniq % (len(row_of_node) + 1), np.bincount(inv, w)


def super_graph(assign: LevelAssignment, user_rows: np.ndarray, entity_rows: np.ndarray, weight: np.ndarray,
                is_user: np.ndarray) -> SuperGraph:
    """Aggregate engagement pairs (rows of `assign`) into primitive -> primitive edges."""
    kk = assign.num_primitives
    pu, wu = assign.primitive[user_rows], assign.weight[user_rows]  # (E, k)
    pe, we = assign.primitive[entity_rows], assign.weight[entity_rows]  # (E, k)
    key = (pu[:, :, None] * kk + pe[:, None, :]).reshape(-1)  # (E * k * k,)
    val = (weight[:, None, None] * wu[:, :, None] * we[:, None, :]).reshape(-1)
    total = np.bincount(key, val, minlength=kk * kk) if len(key) else np.zeros(kk * kk)
    nz = np.nonzero(total > 0)[0]
    return SuperGraph(nz // kk, nz % kk, total[nz], kk, len(user_rows), int(is_user.sum()), int((~is_user).sum()))
