"""The per-level sampler the project used before issue 25, kept only as the reference that the vectorised sampler
(hir_model.graph.sampler) is compared against: by tests/hir_model/graph/test_sampler_equivalence.py (distributions) and
by benchmarks/graph.py (throughput, old and new side by side). Not a production code path.

Its original docstring follows.

Causal neighbourhood sampling: for each seed, a time-respecting BFS tree, flattened into a token sequence.

Semantics (one `sample` call, one cutoff):
- Only edges with last_ts <= cutoff exist. An edge's weight at the cutoff is its stored weight decayed from
  the graph's `as_of` to the cutoff (engagement edges only; structural weights do not decay). Edges with
  last_ts <= cutoff got no event after it, so this is exact.
- A view may also hide engagement edges older than `max_age_days` at the cutoff (structural facts stay
  visible) and drop each edge independently with probability `edge_drop` for the whole call.
- From each token at depth d, up to fanout[d] *distinct neighbour nodes* are drawn without replacement,
  each with probability proportional to its summed visible weight from that token (successive sampling,
  done as Gumbel-top-k); the token's edge type is one of the edges to that neighbour, drawn proportionally
  to its weight, and its age is that edge's.
- Tree semantics: a node may appear in several branches (two paths to it are two tokens), but never twice
  on one root-to-token path (no walking back to the parent, no cycles).

Vectorised per depth level across the whole batch. Nodes with at most `scan_degree` edges are sampled
exactly by scanning them; larger ones by weighted draws with replacement from a per-node cumulative
weight (exact successive sampling while draws last); a token that ends short gets a second, 8x larger
round and then keeps what it found. Tokens are laid out per sequence in BFS order: seed, depth 1, depth 2.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from hir_model.graph.csr import IS_ENGAGEMENT, Graph
from hir_model.graph.sampler import ViewConfig
from hir_model.graph.storage import ARRAYS
from hir_model.graph.types import SELF_EDGE, SampledBatch

US = 1_000_000
SECOND_ROUND = 8  # the second round of weighted draws is this many times larger


_CUMULATIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cumulative(graph: Graph) -> np.ndarray:
    """float64 [E]: running sum of weight / (max weight of its node's edges), built once per graph."""
    if graph not in _CUMULATIVE:
        w = np.asarray(graph.weight, np.float64)
        nonempty = np.flatnonzero(graph.degrees() > 0)
        seg_max = np.maximum.reduceat(w, graph.indptr[nonempty]) if len(nonempty) else np.zeros(0)
        scale = np.zeros(graph.num_nodes)
        scale[nonempty] = seg_max
        _CUMULATIVE[graph] = np.cumsum(w / np.maximum(scale[graph.src()], 1e-300))
    return _CUMULATIVE[graph]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated aranges [starts[i], starts[i] + lengths[i])."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)


def _uniform_hash(edge: np.ndarray, nonce: np.uint64) -> np.ndarray:
    """float64 in [0, 1) per edge index: splitmix64 of (edge + nonce), so one call drops an edge for every token."""
    z = edge.astype(np.uint64) + nonce
    z *= np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class _Level:
    """One call's constants and the candidate filter shared by both ways of picking neighbours."""

    def __init__(self, graph: Graph, cutoff_us: int, view: ViewConfig, rng: np.random.Generator):
        # plain ndarray views of the (often memory-mapped) arrays: np.memmap indexing is slower
        self.g = replace(graph, **{f: np.asarray(getattr(graph, f)) for f in ARRAYS})
        self.cum = _cumulative(graph) if (graph.degrees() > view.scan_degree).any() else None
        self.cutoff, self.view, self.rng = int(cutoff_us), view, rng
        self.min_ts = None if view.max_age_days is None else self.cutoff - int(view.max_age_days * 86_400 * US)
        # log of the factor that decays a stored weight from as_of to the cutoff, per edge type
        self.log_f = np.where(IS_ENGAGEMENT, (graph.as_of_us - self.cutoff) / (graph.tau_s * US), 0.0)  # [len(EDGE_TYPES)]
        self.nonce = np.uint64(rng.integers(0, 2**63))

    def valid(self, edge: np.ndarray, path: np.ndarray) -> np.ndarray:
        """bool [C]: candidate edges visible at the cutoff in this view whose node is not on the owner's path ([C, d+1])."""
        g = self.g
        ts = g.last_ts[edge]
        ok = (ts <= self.cutoff) & (g.weight[edge] > 0)
        if self.min_ts is not None:
            ok &= (ts >= self.min_ts) | ~IS_ENGAGEMENT[g.edge_type[edge]]
        if self.view.edge_drop > 0:
            ok &= _uniform_hash(edge, self.nonce) >= self.view.edge_drop
        node = g.neighbours[edge]
        for j in range(path.shape[1]):
            ok &= path[:, j] != node
        return ok

    def scan(self, owner: np.ndarray, node: np.ndarray, path: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact: every edge of each owner's node is a candidate; Gumbel-top-k over distinct neighbours."""
        g = self.g
        start, deg = g.indptr[node], g.indptr[node + 1] - g.indptr[node]
        edge = _ranges(start, deg)  # int64 [C], CSR order: an owner's edges to one neighbour are adjacent
        cand = np.repeat(np.arange(len(owner)), deg)  # [C], row in owner / path
        ok = self.valid(edge, path[cand])
        edge, cand = edge[ok], cand[ok]
        if not len(edge):
            return owner[:0], edge
        key = np.log(g.weight[edge].astype(np.float64)) + self.log_f[g.edge_type[edge]] + self.rng.gumbel(size=len(edge))
        nbr = g.neighbours[edge]
        first = np.concatenate([[True], (cand[1:] != cand[:-1]) | (nbr[1:] != nbr[:-1])])  # (owner, neighbour) groups
        gid = np.cumsum(first) - 1
        top = np.maximum.reduceat(key, np.flatnonzero(first))  # a group's max Gumbel key ~ log(summed weight) + Gumbel
        rep = np.flatnonzero(key == top[gid])
        rep = rep[np.concatenate([[True], gid[rep][1:] != gid[rep][:-1]])]  # one edge per group, drawn by weight
        order = np.lexsort((-key[rep], cand[rep]))
        sel = rep[order][_rank(cand[rep][order]) < k]
        return owner[cand[sel]], edge[sel]

    def draw(self, owner: np.ndarray, node: np.ndarray, path: np.ndarray, k: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weighted draws with replacement (m per owner), invalid and repeated neighbours rejected; first k distinct kept."""
        g, cum = self.g, self.cum
        start, end = g.indptr[node], g.indptr[node + 1]
        base = np.where(start > 0, cum[np.maximum(start - 1, 0)], 0.0)
        total = cum[end - 1] - base
        row = np.repeat(np.arange(len(owner)), m)  # [H*m]
        u = np.sort(self.rng.random((len(owner), m)), axis=1).reshape(-1)  # sorted per row: searches stay in cache
        edge = np.searchsorted(cum, base[row] + u * total[row], side="right")
        edge = np.clip(edge, start[row], end[row] - 1)
        shuffle = np.argsort(self.rng.random((len(owner), m)), axis=1) + (np.arange(len(owner)) * m)[:, None]
        edge = edge[shuffle.reshape(-1)]  # back to iid draw order (the order decides which repeats count)
        accept = self.rng.random(len(row)) < np.exp(self.log_f[g.edge_type[edge]] - self.log_f.max())  # decay to the cutoff
        ok = self.valid(edge, path[row]) & accept
        row, edge = row[ok], edge[ok]
        _, first = np.unique(row * np.int64(g.num_nodes) + g.neighbours[edge], return_index=True)
        first = np.sort(first)  # draw order: the first time each neighbour came up
        sel = first[_rank(row[first]) < k]
        found = np.bincount(row[sel], minlength=len(owner))
        return owner[row[sel]], edge[sel], found < k


def _rank(group: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (group sorted)."""
    return np.arange(len(group)) - np.searchsorted(group, group, side="left")


def _pick(level: _Level, node: np.ndarray, path: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner, edge): up to k distinct neighbours per frontier token, grouped by owner (index into node)."""
    g, view = level.g, level.view
    deg = g.indptr[node + 1] - g.indptr[node]
    owners, edges = [], []
    scan = np.flatnonzero((deg > 0) & (deg <= view.scan_degree))
    o, e = level.scan(scan, node[scan], path[scan], k)
    owners.append(o), edges.append(e)
    hub = np.flatnonzero(deg > view.scan_degree)
    if len(hub):
        o, e, short = level.draw(hub, node[hub], path[hub], k, view.draws_per_slot * k)
        retry = hub[short]
        done = ~np.isin(o, retry)
        owners.append(o[done]), edges.append(e[done])
        if len(retry):
            o, e, _ = level.draw(retry, node[retry], path[retry], k, SECOND_ROUND * view.draws_per_slot * k)
            owners.append(o), edges.append(e)
    owner, edge = np.concatenate(owners), np.concatenate(edges)
    order = np.argsort(owner, kind="stable")  # by parent; within a parent in draw order
    return owner[order], edge[order]


def sample(graph: Graph, seeds: np.ndarray, cutoff_us: int, view: ViewConfig, rng: np.random.Generator) -> SampledBatch:
    """One time-respecting BFS tree per seed (node indices of `graph`), as a variable-length token batch."""
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    if len(seeds) and (seeds.min() < 0 or seeds.max() >= graph.num_nodes):
        raise IndexError(f"seeds must be node indices in [0, {graph.num_nodes}); got {seeds.min()}..{seeds.max()}")
    level = _Level(graph, cutoff_us, view, rng)
    graph = level.g
    b, depth_max = len(seeds), len(view.fanout)
    seq, parent, node, edge = [np.arange(b)], [np.full(b, -1)], [seeds], [np.full(b, -1)]
    path = seeds[:, None]  # int64 [F, d+1]: nodes from the root to each frontier token
    for k in view.fanout:
        owner, e = _pick(level, node[-1], path, k)
        nbr = np.asarray(graph.neighbours[e], np.int64)
        seq.append(seq[-1][owner]), parent.append(owner), node.append(nbr), edge.append(e)
        path = np.concatenate([path[owner], nbr[:, None]], axis=1)
    return _assemble(graph, seeds, int(cutoff_us), depth_max, seq, parent, node, edge)


def _assemble(graph: Graph, seeds: np.ndarray, cutoff_us: int, depth_max: int, seq: list, parent: list, node: list,
              edge: list) -> SampledBatch:
    """Per-level token arrays -> one sequence per seed (BFS order) with local ancestor indices."""
    sizes = [len(s) for s in seq]
    seq_all = np.concatenate(seq)
    t = len(seq_all)
    offsets = np.zeros(len(seeds) + 1, np.int64)
    np.cumsum(np.bincount(seq_all, minlength=len(seeds)), out=offsets[1:])
    order = np.argsort(seq_all, kind="stable")  # grouped by seed; within a seed by depth, then parent
    pos = np.empty(t, np.int64)
    pos[order] = np.arange(t)
    local = pos - offsets[seq_all]  # [T] in level order
    ancestors = np.full((t, depth_max + 1), -1, np.int64)
    lo = 0
    for d, n in enumerate(sizes):
        if d:
            ancestors[lo:lo + n, :d] = ancestors[lo - sizes[d - 1]:lo][parent[d], :d]
        ancestors[lo:lo + n, d] = local[lo:lo + n]
        lo += n
    depth = np.repeat(np.arange(len(sizes)), sizes)
    edge_all = np.concatenate(edge)
    has_edge = edge_all >= 0
    etype = np.full(t, SELF_EDGE, np.int64)
    etype[has_edge] = graph.edge_type[edge_all[has_edge]]
    age = np.zeros(t, np.float32)
    age[has_edge] = (cutoff_us - graph.last_ts[edge_all[has_edge]]) / US
    nodes = np.concatenate(node)[order]
    return SampledBatch(
        offsets=offsets, seeds=seeds, node=nodes, hash_codes=np.asarray(graph.nodes.hash_codes)[nodes],
        node_type=np.asarray(graph.nodes.node_type, np.int64)[nodes], depth=depth[order], ancestors=ancestors[order],
        edge_type=etype[order], edge_age=age[order], cutoff_us=cutoff_us, strength=graph.strength_at(nodes, cutoff_us))
