"""The engagement graph as CSR arrays plus a node table, and the vectorised edge-set merge that builds it.

N = nodes, E = directed edges, K = hash codes per node. Edges are sorted by (src, dst, edge_type) and
unique on that key; an undirected fact is two directed edges (e.g. `click` user -> product and
`click_rev` product -> user) with the same weight and last timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.graph.structure import engagement_adjacency, structural_encoding
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES

TYPE_BITS = 5  # 17 edge types fit in 5 bits
NODE_BITS_MAX = (63 - TYPE_BITS) // 2  # src and dst share the rest of a non-negative int64: 2**29 nodes
STRUCTURAL = ("parent", "child", "relation", "relation_rev")
STRUCTURAL_CODES = np.array([EDGE_TYPES.index(t) for t in STRUCTURAL], np.int8)
IS_STRUCTURAL = np.isin(np.arange(len(EDGE_TYPES)), STRUCTURAL_CODES)  # bool [len(EDGE_TYPES)]
IS_ENGAGEMENT = ~IS_STRUCTURAL & (np.arange(len(EDGE_TYPES)) != 0)  # event edges and their `_rev`


def _reverse_codes() -> np.ndarray:
    rev = {**{t: f"{t}_rev" for t in EDGE_TYPES if f"{t}_rev" in EDGE_TYPES}, "parent": "child", "relation": "relation_rev", "self": "self"}
    rev |= {v: k for k, v in rev.items()}
    return np.array([EDGE_TYPES.index(rev[t]) for t in EDGE_TYPES], np.int8)


REVERSE = _reverse_codes()  # int8 [len(EDGE_TYPES)]: the type of the same edge walked the other way


@dataclass(frozen=True, eq=False)
class NodeTable:
    """Append-only: node i of graph(t-1) is node i of graph(t); new nodes come after the old ones."""

    entity_id: pa.Array  # string [N]
    node_type: np.ndarray  # int8 [N], index into NODE_TYPES
    first_seen_us: np.ndarray  # int64 [N], UTC microseconds (the catalog's first_seen_ts)
    hash_codes: np.ndarray  # int64 [N, K], hir_model.graph.hashing codes of entity_id

    def __len__(self) -> int:
        return len(self.node_type)

    @cached_property
    def _lookup(self) -> pd.Index:
        """Hash index of the ids, built once per table (pyarrow's index_in would rehash all N ids per call)."""
        return pd.Index(self.entity_id.to_numpy(zero_copy_only=False), dtype=object)

    def index_of(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """int64 [n]: the node index of each id, -1 where the id is not a node (or is null).

        Ids repeat (a user has many events), so only the distinct ones (arrow's dictionary encoding) are looked up.
        """
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks() if ids.num_chunks else pa.array([], ids.type)
        enc = ids if pa.types.is_dictionary(ids.type) else pc.dictionary_encode(ids)
        found = self._lookup.get_indexer(enc.dictionary.to_numpy(zero_copy_only=False)).astype(np.int64)
        found = np.append(found, -1)  # where nulls go
        return found[np.asarray(pc.fill_null(enc.indices, len(found) - 1).to_numpy(zero_copy_only=False), np.int64)]

    def counts_by_type(self) -> dict[str, int]:
        counts = np.bincount(self.node_type.astype(np.int64), minlength=len(NODE_TYPES))
        return {t: int(c) for t, c in zip(NODE_TYPES, counts) if c}

    @classmethod
    def empty(cls, k: int) -> NodeTable:
        return cls(pa.array([], pa.string()), np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros((0, k), np.int64))


@dataclass(frozen=True, eq=False)
class Graph:
    """The cumulative typed, time-decayed graph as of `as_of_us` (a window end), in CSR form."""

    as_of_us: int  # weights are decayed to this instant; every last_ts is before it
    tau_s: float  # decay time constant (seconds) the engagement weights were built with
    indptr: np.ndarray  # int64 [N+1]: node i's edges are [indptr[i], indptr[i+1])
    neighbours: np.ndarray  # int32 (int64 when N >= 2**31) [E], destination node of each edge
    edge_type: np.ndarray  # int8 [E], index into EDGE_TYPES
    weight: np.ndarray  # float32 [E], > 0: decayed engagement (stage weight x exp(-age/tau), summed) or the structural weight
    last_ts: np.ndarray  # int64 [E], UTC microseconds of the edge's latest event (structural: first seen)
    relation: np.ndarray  # int32 [E], index into relation_names for relation / relation_rev edges, else -1
    relation_names: tuple[str, ...]  # the relation vocabulary of this graph (sorted)
    nodes: NodeTable

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        return len(self.neighbours)

    @property
    def strength(self) -> np.ndarray:
        """float32 [N]: each node's decayed engagement as of `as_of_us`, the sum of its engagement edges' weights (0 for a
        node with none: structural and knowledge-graph nodes, never-engaged entities). A film's is its decayed popularity."""
        return self.strength_until(self.as_of_us)

    @cached_property
    def _strength_by_cutoff(self) -> dict[int, np.ndarray]:
        return {}

    def strength_until(self, cutoff_us: int) -> np.ndarray:
        """`strength` over the engagement edges whose last event is at or before `cutoff_us` only; an O(E) pass once per
        cutoff (the sampler asks on every batch)."""
        key = min(int(cutoff_us), self.as_of_us)  # every edge is before as_of: later cutoffs are the same
        if key not in self._strength_by_cutoff:
            keep = self._engagement_until(key)
            self._strength_by_cutoff[key] = np.bincount(self.src()[keep], weights=np.asarray(self.weight, np.float64)[keep],
                                                        minlength=self.num_nodes).astype(np.float32)
        return self._strength_by_cutoff[key]

    def strength_at(self, node: np.ndarray, cutoff_us: int) -> np.ndarray:
        """float32 [T]: the strength of `node` (-1: none, 0) as of `cutoff_us` (nothing later: causal like the sampler)."""
        node = np.asarray(node, np.int64)
        return np.where(node >= 0, self.strength_until(cutoff_us)[np.maximum(node, 0)], 0.0).astype(np.float32)

    @cached_property
    def _structure_by_key(self) -> dict[tuple[int, int], np.ndarray]:
        return {}

    def structure_until(self, cutoff_us: int, dim: int) -> np.ndarray:
        """float32 [N, dim]: every node's structural encoding (hir_model.graph.structure) over the engagement edges whose
        last event is at or before `cutoff_us`; computed once per (cutoff, dim) and kept (a few sparse products)."""
        key = (min(int(cutoff_us), self.as_of_us), int(dim))
        if key not in self._structure_by_key:
            keep = self._engagement_until(key[0])
            adjacency = engagement_adjacency(self.src()[keep], np.asarray(self.neighbours)[keep], np.asarray(self.weight)[keep],
                                             self.num_nodes)
            self._structure_by_key[key] = structural_encoding(adjacency, self.nodes.hash_codes, dim)
        return self._structure_by_key[key]

    def structure_at(self, node: np.ndarray, cutoff_us: int, dim: int) -> np.ndarray:
        """float32 [T, dim]: the structural encoding of `node` (-1: none, zeros) as of `cutoff_us` (structure_until)."""
        node = np.asarray(node, np.int64)
        return np.where((node >= 0)[:, None], self.structure_until(cutoff_us, dim)[np.maximum(node, 0)], 0.0).astype(np.float32)

    def _engagement_until(self, cutoff_us: int) -> np.ndarray:
        """bool [E]: engagement edges whose last event is at or before `cutoff_us`."""
        return IS_ENGAGEMENT[np.asarray(self.edge_type, np.int64)] & (np.asarray(self.last_ts) <= cutoff_us)

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)  # int64 [N], out-degree (= in-degree: every edge has its reverse)

    def src(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degrees())  # int64 [E]

    def counts_by_type(self) -> dict[str, int]:
        counts = np.bincount(self.edge_type.astype(np.int64), minlength=len(EDGE_TYPES))
        return {t: int(c) for t, c in zip(EDGE_TYPES, counts) if c}


FIELDS = ("key", "weight", "last_ts", "relation")  # EdgeSet's arrays


@dataclass
class EdgeSet:
    """Directed edges in build form: packed keys, sorted and unique once `aggregate`d."""

    key: np.ndarray  # int64 [M], pack(src, dst, edge_type)
    weight: np.ndarray  # float64 [M]
    last_ts: np.ndarray  # int64 [M]
    relation: np.ndarray  # int32 [M]

    def __len__(self) -> int:
        return len(self.key)

    @classmethod
    def empty(cls) -> EdgeSet:
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int32))

    @classmethod
    def concat(cls, parts: list[EdgeSet]) -> EdgeSet:
        parts = [p for p in parts if len(p)] or [cls.empty()]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))

    def take(self, idx: np.ndarray) -> EdgeSet:
        return EdgeSet(self.key[idx], self.weight[idx], self.last_ts[idx], self.relation[idx])


def node_bits(num_nodes: int) -> int:
    bits = max(1, int(num_nodes - 1).bit_length())
    if bits > NODE_BITS_MAX:
        raise ValueError(f"{num_nodes:,} nodes do not fit the packed edge key (at most 2**{NODE_BITS_MAX})")
    return bits


def pack(src: np.ndarray, dst: np.ndarray, edge_type: np.ndarray, bits: int, reuse_src: bool = False) -> np.ndarray:
    """int64 keys that sort like (src, dst, edge_type). reuse_src: src is an int64 temporary, packed in place."""
    key = src if reuse_src and src.dtype == np.int64 else src.astype(np.int64)  # in place from here on
    key <<= bits + TYPE_BITS
    tmp = dst.astype(np.int64)
    tmp <<= TYPE_BITS
    key |= tmp
    del tmp
    key |= edge_type.astype(np.int64)
    return key


def csr_arrays(key: np.ndarray, bits: int, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr int64 [N+1], neighbours int32/int64 [E], edge_type int8 [E]) of sorted keys, one temporary at a time."""
    indptr = np.searchsorted(key, np.arange(num_nodes + 1, dtype=np.int64) << (bits + TYPE_BITS))  # no src array needed
    edge_type = key.astype(np.int8)  # the low byte ...
    edge_type &= (1 << TYPE_BITS) - 1  # ... holds the type in its low bits
    dst = key >> TYPE_BITS
    dst &= (np.int64(1) << bits) - 1
    return indptr.astype(np.int64), dst.astype(np.int32 if num_nodes < 2**31 else np.int64), edge_type


def both_directions(src: np.ndarray, dst: np.ndarray, edge_type: np.ndarray, weight: np.ndarray, last_ts: np.ndarray,
                    relation: np.ndarray, bits: int) -> EdgeSet:
    """Each forward edge and its reverse (reverse type, same weight and timestamp), not yet aggregated."""
    return EdgeSet(np.concatenate([pack(src, dst, edge_type, bits), pack(dst, src, REVERSE[edge_type], bits)]),
                   np.concatenate([weight, weight]), np.concatenate([last_ts, last_ts]), np.concatenate([relation, relation]))


def aggregate(edges: EdgeSet) -> EdgeSet:
    """Sorted, unique keys: weights add, last_ts = max, relation = the smallest id (names are sorted)."""
    if not len(edges):
        return edges
    order = np.argsort(edges.key)  # deterministic; the order among equal keys only moves float sums by rounding
    key = edges.key[order]
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return EdgeSet(key[starts], np.add.reduceat(edges.weight[order], starts), np.maximum.reduceat(edges.last_ts[order], starts),
                   np.minimum.reduceat(edges.relation[order], starts))


def merge(base: EdgeSet, new: EdgeSet) -> EdgeSet:
    """Merge two aggregated edge sets: O(len(base) + len(new) log len(base)), no full re-sort.

    Consumes `base` (updated in place, or emptied field by field into the output to keep the peak low).
    """
    if not len(new):
        return base
    if not len(base):
        return new
    pos = np.searchsorted(base.key, new.key)  # int64 [M]
    hit = pos < len(base)
    hit[hit] = base.key[pos[hit]] == new.key[hit]
    at = pos[hit]
    base.weight[at] += new.weight[hit]
    base.last_ts[at] = np.maximum(base.last_ts[at], new.last_ts[hit])  # `at` is unique: both sides are aggregated
    base.relation[at] = np.minimum(base.relation[at], new.relation[hit])
    fresh = ~hit
    if not fresh.any():
        return base
    ins = pos[fresh] + np.arange(int(fresh.sum()))  # positions of the inserted edges in the output
    keep = np.ones(len(base) + len(ins), bool)
    keep[ins] = False
    out = {}
    for f in FIELDS:
        out[f] = np.empty(len(keep), getattr(base, f).dtype)
        out[f][keep] = getattr(base, f)
        out[f][ins] = getattr(new, f)[fresh]
        setattr(base, f, None)  # free base's copy before the next field is allocated
    return EdgeSet(**out)


def to_graph(edges: EdgeSet, nodes: NodeTable, bits: int, as_of_us: int, tau_s: float, relation_names: tuple[str, ...]) -> Graph:
    """The CSR graph of aggregated edges. Consumes `edges` field by field (the peak stays near one copy)."""
    indptr, neighbours, edge_type = csr_arrays(edges.key, bits, len(nodes))
    edges.key = None
    weight = edges.weight.astype(np.float32)
    edges.weight = None
    return Graph(as_of_us=int(as_of_us), tau_s=float(tau_s), indptr=indptr, neighbours=neighbours, edge_type=edge_type,
                 weight=weight, last_ts=edges.last_ts, relation=edges.relation.astype(np.int32),
                 relation_names=tuple(relation_names), nodes=nodes)


def from_graph(graph: Graph, bits: int, keep: np.ndarray) -> EdgeSet:
    """The graph's edges where `keep` (bool [E]) in build form (copies: the graph may be memory-mapped read-only)."""
    kept = np.concatenate([[0], np.cumsum(keep)])[graph.indptr]  # int64 [N+1]: kept edges before each node's first
    src = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(kept))  # [E kept], without a full-length src
    key = pack(src, np.asarray(graph.neighbours)[keep], np.asarray(graph.edge_type)[keep], bits, reuse_src=True)
    return EdgeSet(key, np.asarray(graph.weight)[keep].astype(np.float64), np.asarray(graph.last_ts)[keep],
                   np.asarray(graph.relation)[keep].astype(np.int32))
