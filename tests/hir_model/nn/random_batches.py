"""Random `SampledBatch`es for the encoder tests: random BFS trees laid out seed, depth 1, depth 2, ...

Independent of the sampler (hir_model.graph.sampler): the encoder only relies on the contract in
hir_model.graph.types. `parents` are returned too, so tests can compute tree distances by BFS.
"""

from __future__ import annotations

import numpy as np

from hir_model.graph.types import EDGE_TYPES, NODE_TYPES, SampledBatch


def random_tree(rng: np.random.Generator, n: int, max_depth: int) -> np.ndarray:
    """Parent (local index, -1 for the seed) of each of n tokens in BFS order (depth never decreases), depth <= max_depth."""
    if n > 1 and max_depth < 1:
        raise ValueError("a tree of more than one token needs max_depth >= 1")
    parent, depth = np.full(n, -1), np.zeros(n, dtype=int)
    for t in range(1, n):
        prev = depth[t - 1]
        d = rng.choice(([prev] if prev > 0 else []) + ([prev + 1] if prev < max_depth else []))
        parent[t] = rng.choice(np.flatnonzero(depth[:t] == d - 1))
        depth[t] = d
    return parent


def random_batch(rng: np.random.Generator, lengths: list[int], max_depth: int = 3, k: int = 16,
                 content_dim: int = 0, buckets: int = 1_000_000) -> tuple[SampledBatch, list[np.ndarray]]:
    parents = [random_tree(rng, n, max_depth) for n in lengths]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(offsets[-1])
    depth = np.zeros(T, np.int64)
    ancestors = np.full((T, max_depth + 1), -1, np.int64)
    for off, par in zip(offsets[:-1], parents):
        for t in range(len(par)):
            d = 0 if par[t] < 0 else depth[off + par[t]] + 1
            depth[off + t] = d
            ancestors[off + t, :d] = ancestors[off + par[t], :d] if d else []
            ancestors[off + t, d] = t
    has_content = rng.random(T) < 0.5
    batch = SampledBatch(
        offsets=offsets,
        seeds=rng.integers(0, 10**8, len(lengths)),
        node=rng.integers(0, 10**8, T),
        hash_codes=rng.integers(0, buckets, (T, k)),
        node_type=rng.integers(0, len(NODE_TYPES), T),
        depth=depth,
        ancestors=ancestors,
        edge_type=np.where(depth == 0, 0, rng.integers(1, len(EDGE_TYPES), T)),
        edge_age=np.where(depth == 0, 0, rng.exponential(86400 * 7, T)).astype(np.float32),
        cutoff_us=1_700_000_000_000_000,
        content=rng.normal(size=(T, content_dim)).astype(np.float32) if content_dim else None,
        has_content=has_content if content_dim else None,
    )
    return batch, parents


def concat(a: SampledBatch, b: SampledBatch) -> SampledBatch:
    """The sequences of a, then those of b, in one batch."""
    def cat(x, y):
        return None if x is None else np.concatenate([x, y])
    return SampledBatch(
        offsets=np.concatenate([a.offsets, b.offsets[1:] + a.offsets[-1]]), seeds=cat(a.seeds, b.seeds), node=cat(a.node, b.node),
        hash_codes=cat(a.hash_codes, b.hash_codes), node_type=cat(a.node_type, b.node_type), depth=cat(a.depth, b.depth),
        ancestors=cat(a.ancestors, b.ancestors), edge_type=cat(a.edge_type, b.edge_type), edge_age=cat(a.edge_age, b.edge_age),
        cutoff_us=a.cutoff_us, content=cat(a.content, b.content), has_content=cat(a.has_content, b.has_content))


def bfs_distances(parent: np.ndarray) -> np.ndarray:
    """(n, n) tree distances by breadth-first search over the undirected tree."""
    n = len(parent)
    adj = [[] for _ in range(n)]
    for t, p in enumerate(parent):
        if p >= 0:
            adj[t].append(p)
            adj[p].append(t)
    dist = np.full((n, n), -1)
    for s in range(n):
        dist[s, s], frontier = 0, [s]
        while frontier:
            nxt = []
            for u in frontier:
                for w in adj[u]:
                    if dist[s, w] < 0:
                        dist[s, w] = dist[s, u] + 1
                        nxt.append(w)
            frontier = nxt
    return dist
