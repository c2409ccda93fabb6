"""Small graphs for the graph tests: random ones for property tests, and hand-made ones with chosen weights."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from hir_model.graph.csr import IS_ENGAGEMENT, Graph, NodeTable, aggregate, both_directions, node_bits, pack, to_graph
from hir_model.graph.hashing import hash_codes
from hir_model.graph.sampler import ViewConfig
from hir_model.graph.types import EDGE_TYPES, SELF_EDGE

US = 1_000_000
DAY_US = 86_400 * US
AS_OF = 1_700_000_000 * US  # graphs below are "as of" this instant
TAU_S = 30 * 86_400.0
FORWARD = [EDGE_TYPES.index(t) for t in ("impression", "click", "add_to_cart", "purchase", "interested", "not_interested",
                                         "parent", "relation")]


def make_graph(n: int, src, dst, edge_type, weight, last_ts, node_type=None, as_of_us: int = AS_OF) -> Graph:
    """A graph from forward edges (each gets its reverse); duplicates of a key merge as in a build."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    types = np.asarray([EDGE_TYPES.index(t) if isinstance(t, str) else t for t in edge_type], np.int8).reshape(-1)
    bits = node_bits(n)
    rel = np.where(types == EDGE_TYPES.index("relation"), 0, -1).astype(np.int32)
    edges = aggregate(both_directions(src, dst, types, np.asarray(weight, np.float64), np.asarray(last_ts, np.int64), rel, bits))
    ids = [f"n{i}" for i in range(n)]
    nodes = NodeTable(pa.array(ids), np.asarray(node_type if node_type is not None else np.zeros(n), np.int8),
                      np.zeros(n, np.int64), hash_codes(ids, 2, 1000))
    return to_graph(edges, nodes, bits, as_of_us, TAU_S, ("related_to",))


def random_graph(rng: np.random.Generator) -> Graph:
    """2..40 nodes, 0..300 forward edges of random types, weights log-normal, timestamps over the last 90 days."""
    n = int(rng.integers(2, 41))
    m = int(rng.integers(0, 301))
    src = rng.integers(0, n, m)
    dst = (src + rng.integers(1, n, m)) % n  # no self-loops
    hub = rng.random(m) < 0.5  # half the edges touch node 0: a hub for the draw path
    src[hub] = 0
    dst[hub] = rng.integers(1, n, int(hub.sum()))
    return make_graph(n, src, dst, rng.choice(FORWARD, m), rng.lognormal(0, 1.5, m),
                      AS_OF - rng.integers(0, 90 * DAY_US, m), node_type=rng.integers(0, 6, n))


def edge_keys(graph: Graph) -> np.ndarray:
    return pack(graph.src(), np.asarray(graph.neighbours), np.asarray(graph.edge_type), node_bits(graph.num_nodes))


def assert_same_graph(a: Graph, b: Graph) -> None:
    assert a.as_of_us == b.as_of_us and a.relation_names == b.relation_names
    assert a.nodes.entity_id.equals(b.nodes.entity_id)
    for f in ("node_type", "first_seen_us", "hash_codes"):
        assert np.array_equal(getattr(a.nodes, f), getattr(b.nodes, f)), f
    for f in ("indptr", "neighbours", "edge_type", "last_ts", "relation"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    np.testing.assert_allclose(a.weight, b.weight, rtol=2e-6)


def token_parents(batch) -> tuple[np.ndarray, np.ndarray]:
    """(seq, global index of the parent token, -1 for seeds) per token."""
    seq = np.repeat(np.arange(batch.num_sequences), batch.lengths)
    t = np.arange(len(batch.node))
    local_parent = batch.ancestors[t, np.maximum(batch.depth - 1, 0)]
    return seq, np.where(batch.depth > 0, batch.offsets[seq] + local_parent, -1)


def check_batch(graph, batch, view: ViewConfig, cutoff: int) -> None:
    """Every invariant of one sampled batch against its graph."""
    t = len(batch.node)
    assert batch.offsets[0] == 0 and batch.offsets[-1] == t and np.all(batch.lengths >= 1)
    assert batch.ancestors.shape == (t, len(view.fanout) + 1)
    assert np.array_equal(batch.token_codes, np.asarray(graph.nodes.hash_codes)[batch.node])  # each token's node's codes
    seeds = batch.offsets[:-1]
    assert np.array_equal(batch.node[seeds], batch.seeds) and np.all(batch.depth[seeds] == 0)
    assert np.all(batch.edge_type[seeds] == SELF_EDGE) and np.all(batch.edge_age[seeds] == 0)
    assert np.all(batch.depth[1:][np.diff(batch.depth) < 0] == 0)  # BFS order within a sequence
    seq, parent = token_parents(batch)
    assert np.array_equal(batch.ancestors[np.arange(t), batch.depth], np.arange(t) - batch.offsets[seq])  # own local index
    assert np.all((batch.ancestors == -1) == (np.arange(batch.ancestors.shape[1]) > batch.depth[:, None]))
    child = parent >= 0
    assert np.all(batch.depth[parent[child]] == batch.depth[child] - 1)
    for d in range(batch.ancestors.shape[1] - 1):  # a token's ancestors are its parent's, plus itself
        rows = np.flatnonzero(child & (batch.depth > d))
        assert np.array_equal(batch.ancestors[rows, d], batch.ancestors[parent[rows], d])
    # every sampled edge exists, is no later than the cutoff, and its age is the cutoff minus its last_ts
    keys = pack(batch.node[parent[child]], batch.node[child], batch.edge_type[child], node_bits(graph.num_nodes))
    where = np.searchsorted(edge_keys(graph), keys)
    assert np.array_equal(edge_keys(graph)[np.minimum(where, graph.num_edges - 1)], keys)
    ts = graph.last_ts[where]
    assert np.all(ts <= cutoff), "an edge later than the cutoff"
    np.testing.assert_allclose(batch.edge_age[child], (cutoff - ts) / US, rtol=1e-6)
    if view.max_age_days is not None:
        engagement = IS_ENGAGEMENT[batch.edge_type[child]]
        assert np.all(batch.edge_age[child][engagement] <= view.max_age_days * 86_400 * (1 + 1e-6))
    # fanout, distinct children per parent, no node twice on a root-to-token path
    pairs = Counter(zip(parent[child].tolist(), batch.node[child].tolist()))
    assert not pairs or max(pairs.values()) == 1
    kids = Counter(parent[child].tolist())
    assert all(n <= view.fanout[batch.depth[p]] for p, n in kids.items())
    on_path = batch.node[np.maximum(batch.ancestors + batch.offsets[seq][:, None], 0)]
    path_nodes = np.where(batch.ancestors >= 0, on_path, -1 - np.arange(batch.ancestors.shape[1]))  # distinct fillers
    assert all(len(set(row)) == len(row) for row in path_nodes.tolist())
    assert np.array_equal(batch.node_type, graph.nodes.node_type[batch.node])
