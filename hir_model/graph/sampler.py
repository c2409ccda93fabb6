"""Causal neighbourhood sampling: for each seed, a time-respecting BFS tree, flattened into a token sequence.

Semantics (one `sample` call, one cutoff):
- Only edges with last_ts <= cutoff exist. An edge's weight at the cutoff is its stored weight decayed from
  the graph's `as_of` to the cutoff (engagement edges only; structural weights do not decay). Edges with
  last_ts <= cutoff got no event after it, so this is exact.
- A view may also hide engagement edges older than `max_age_days` at the cutoff (structural facts stay
  visible) and drop each edge independently with probability `edge_drop` for the whole call.
- From each token at depth d, up to fanout[d] *distinct neighbour nodes* are drawn without replacement,
  each with probability proportional to its summed visible weight from that token (successive sampling);
  the token's edge type is one of the edges to that neighbour, drawn proportionally to its weight, and its
  age is that edge's.
- Tree semantics: a node may appear in several branches (two paths to it are two tokens), but never twice
  on one root-to-token path (no walking back to the parent, no cycles).

How (every step is one numpy pass over all tokens of a depth level of the whole batch; no per-seed Python):
- Per (graph, cutoff, max_age) a table of the visible edges is built once and kept (about 52 bytes per visible edge):
  their CSR, their log weight decayed to the cutoff and a Walker alias table per node, packed so that a weighted
  draw is one 24-byte read (O(1), no search).
- A frontier token whose node has more than `scan_degree` visible edges draws `draws_per_slot` x fanout edges
  with replacement; dropped edges and nodes on its path are rejected, and the first distinct neighbours in draw
  order are kept (the first distinct values of an i.i.d. weighted sequence are a successive sample).
- A token that ends short of its fanout while its node has more distinct neighbours, and every token of a
  smaller node, continues exactly: a Gumbel-top-k scan of all its node's visible edges, without the neighbours
  it already has. Given the draws so far, the next distinct neighbours of an i.i.d. sequence are a successive
  sample of the rest, so the result is exact successive sampling either way (no truncation).
Tokens are laid out per sequence in BFS order: seed, depth 1, depth 2; within a parent in draw order.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from hir_model.graph.csr import IS_ENGAGEMENT, Graph
from hir_model.graph.types import SELF_EDGE, SampledBatch

US = 1_000_000
NEIGHBOUR_MASK = np.int64(2**32 - 1)  # VisibleEdges.slots: edge << 32 | neighbour
TABLES_PER_GRAPH = 4  # visible-edge tables kept per graph (one per (cutoff, max_age) asked; training asks two)
SECOND_ROUND = 2  # a row that comes up short draws this many times more before it is scanned


@dataclass(frozen=True)
class ViewConfig:
    name: str
    fanout: tuple[int, ...]  # distinct neighbours drawn per token at depth 0, 1, ...: max depth D = len(fanout)
    max_age_days: float | None = None  # engagement edges older than this at the cutoff are hidden (None: full history)
    edge_drop: float = 0.0  # probability that an edge is hidden for the whole call
    scan_degree: int = 16  # nodes with at most this many visible edges are scanned at once (speed only: both ways are exact)
    draws_per_slot: int = 2  # larger ones: weighted draws with replacement, this many per fanout slot, before a scan of the rest

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanout", tuple(int(f) for f in self.fanout))
        if not self.fanout or min(self.fanout) < 1 or not 0 <= self.edge_drop < 1 or self.draws_per_slot < 1:
            raise ValueError(f"ViewConfig {self.name!r}: fanout must be positive ints, 0 <= edge_drop < 1, draws_per_slot >= 1")


NARROW = ViewConfig("narrow", fanout=(8, 4), max_age_days=14.0, edge_drop=0.2)  # the student's view: small, recent, noisy
BROAD = ViewConfig("broad", fanout=(16, 8, 4))  # the teacher's view: larger, deeper, full history


@dataclass(frozen=True, eq=False)
class VisibleEdges:
    """The edges one (cutoff, max_age) shows, as a CSR over the graph's nodes with an alias table per node. E' = visible edges."""

    indptr: np.ndarray  # int64 [N+1]: node i's visible edges are [indptr[i], indptr[i+1])
    edge: np.ndarray  # int32/int64 [E'], index of each visible edge in the graph
    neighbours: np.ndarray  # int64 [E'], its destination node
    log_weight: np.ndarray  # float32 [E'], log of its weight decayed to the cutoff
    # int64 [E', 3], one read per draw: a draw landing on slot e keeps e with probability prob (column 0, float64 bits)
    # and takes its alias (a visible edge of the same node) otherwise; columns 1, 2: e and the alias as edge << 32 | neighbour
    slots: np.ndarray
    edge_type: np.ndarray  # int64 [E' + 1], type of each visible edge; the last entry: a seed's (SELF_EDGE)
    edge_age: np.ndarray  # float32 [E' + 1], seconds from its last event to the cutoff; the last entry: a seed's (0)
    distinct: np.ndarray  # int64 [N], distinct visible neighbours per node


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # the prefetching loader samples in a background thread


def visible_edges(graph: Graph, cutoff_us: int, max_age_days: float | None) -> VisibleEdges:
    """The visible-edge table of (cutoff, max_age), built once per graph and kept (the last TABLES_PER_GRAPH)."""
    min_ts = None if max_age_days is None else int(cutoff_us) - int(max_age_days * 86_400 * US)
    key = (int(cutoff_us), min_ts)
    with _LOCK:
        tables = _TABLES.setdefault(graph, {})
        if key in tables:
            tables[key] = tables.pop(key)  # most recently used last
            return tables[key]
    table = _build(graph, int(cutoff_us), min_ts)
    with _LOCK:
        tables[key] = table
        while len(tables) > TABLES_PER_GRAPH:
            tables.pop(next(iter(tables)))
    return table


def _build(graph: Graph, cutoff_us: int, min_ts: int | None) -> VisibleEdges:
    ts, etype = np.asarray(graph.last_ts), np.asarray(graph.edge_type).astype(np.int64)
    w = np.asarray(graph.weight, np.float64)
    ok = (ts <= cutoff_us) & (w > 0)
    if min_ts is not None:
        ok &= (ts >= min_ts) | ~IS_ENGAGEMENT[etype]
    idx = np.int32 if graph.num_edges < 2**31 else np.int64
    edge = np.flatnonzero(ok)
    src = graph.src()[edge]  # [E'] sorted: the CSR order survives the filter
    n = graph.num_nodes
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    log_f = np.where(IS_ENGAGEMENT, (graph.as_of_us - cutoff_us) / (graph.tau_s * US), 0.0)  # decay from as_of to the cutoff
    log_w = np.log(w[edge]) + log_f[etype[edge]]
    nbr = np.asarray(graph.neighbours)[edge]
    first = np.ones(len(edge), bool)
    first[1:] = (src[1:] != src[:-1]) | (nbr[1:] != nbr[:-1])  # CSR is sorted by (src, dst): a neighbour's edges are adjacent
    prob, alias = _alias(indptr, src, log_w)
    nbr = nbr.astype(np.int64)
    if len(edge) >= 2**31 or n >= 2**32:
        raise ValueError(f"sampler: {len(edge)} visible edges / {n} nodes do not fit its packed draw table (2**31 / 2**32)")
    own = np.arange(len(edge), dtype=np.int64) << 32 | nbr
    slots = np.stack([prob.view(np.int64), own, own[alias]], axis=1)
    return VisibleEdges(indptr, edge.astype(idx), nbr, log_w.astype(np.float32), slots, np.append(etype[edge], SELF_EDGE),
                        np.append((cutoff_us - ts[edge]) / US, 0.0).astype(np.float32), np.bincount(src[first], minlength=n))


def _alias(indptr: np.ndarray, seg: np.ndarray, log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker alias tables of every node at once: (prob float64 [E'], alias int64 [E']).

    Node v's n edges get scaled weights p = n w / sum(w), mean 1. The sequential sweep (lights p < 1 and heavies in
    index order; the current heavy fills each light's deficit 1 - p; a heavy left with less than 1 becomes a light
    filled by the next heavy) has a closed form in the running deficit D of the lights and surplus S of the heavies:
    light i takes the first heavy j with S_j >= D before i; heavy j keeps 1 + S_j - D after the light i whose interval
    [D before i, D after i) holds S_j, and hands the rest to the next heavy. Two prefix sums and one sort, no loop."""
    e = len(log_w)
    if not e:
        return np.zeros(0), np.zeros(0, np.int64)
    starts = indptr[:-1]
    nonempty = np.flatnonzero(np.diff(indptr) > 0)
    peak = np.maximum.reduceat(log_w, starts[nonempty])  # per node, so exp cannot overflow
    top = np.zeros(len(starts))
    top[nonempty] = peak
    w = np.exp(log_w - top[seg])
    total = np.bincount(seg, weights=w, minlength=len(starts))
    p = np.diff(indptr)[seg] * w / total[seg]
    light = p < 1
    deficit, surplus = np.where(light, 1 - p, 0.0), np.where(light, 0.0, p - 1)
    d_after, s_incl = np.cumsum(deficit), np.cumsum(surplus)
    at = np.minimum(starts, e - 1)  # (empty nodes' values are never used)
    d_base, s_base = (d_after - deficit)[at], (s_incl - surplus)[at]  # per node: running sums from its first edge
    d_before = d_after - deficit - d_base[seg]
    d_after = d_after - d_base[seg]
    s_incl = s_incl - s_base[seg]
    value = np.where(light, d_before, s_incl)
    order = np.lexsort((~light, value, seg))  # by node, running sum; a light before a heavy at the same sum
    pos = np.arange(e)
    heavy_at = np.where(light[order], e, pos)
    next_heavy = np.minimum.accumulate(heavy_at[::-1])[::-1]  # [e] sorted position of the first heavy at or after
    next_heavy = np.append(next_heavy, e)
    light_at = np.maximum.accumulate(np.where(light[order], pos, -1))  # sorted position of the last light at or before
    ordered = np.append(order, e)  # sorted position -> edge (e: none)
    seg_ext = np.append(seg, -1)
    prob, alias = np.ones(e), np.arange(e)
    # lights: their own p, the rest from the current heavy
    li = order[light[order]]
    j = ordered[next_heavy[pos[light[order]]]]
    ok = seg_ext[j] == seg[li]
    prob[li] = np.where(ok, p[li], 1.0)
    alias[li[ok]] = j[ok]
    # heavies: what is left after the light that took them below 1; the rest from the next heavy
    hq = pos[~light[order]]
    hj = order[hq]
    i_star = np.where(light_at[hq] >= 0, order[np.maximum(light_at[hq], 0)], e)
    nxt = ordered[next_heavy[hq + 1]]
    ok = (seg_ext[i_star] == seg[hj]) & (seg_ext[nxt] == seg[hj])
    ok[ok] &= s_incl[hj[ok]] < d_after[i_star[ok]]
    prob[hj[ok]] = np.clip(1 + s_incl[hj[ok]] - d_after[i_star[ok]], 0.0, 1.0)
    alias[hj[ok]] = nxt[ok]
    return prob, alias


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


def _rank(group: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (group sorted)."""
    return np.arange(len(group)) - np.searchsorted(group, group, side="left")


@dataclass(frozen=True)
class _Call:
    """One call's constants: the table, the view, the rng and the edge-drop nonce."""

    table: VisibleEdges
    view: ViewConfig
    rng: np.random.Generator
    nonce: np.uint64

    def kept(self, edge: np.ndarray) -> np.ndarray:
        """bool, edge's shape: visible edges (table indices) not dropped by this call's edge_drop."""
        return _uniform_hash(edge, self.nonce) >= self.view.edge_drop

    def draw(self, node: np.ndarray, path: list[np.ndarray], out: np.ndarray, rows: np.ndarray, found: np.ndarray,
             m: int) -> np.ndarray:
        """m alias draws for each of `rows` (its node, its path), continuing its i.i.d. sequence: the distinct valid
        neighbours not yet in out[row] (F, k) visible edges; -1 empty; `found` filled) are appended there in draw order, up
        to k. Returns the new found [R]."""
        (r,), k, t = rows.shape, out.shape[1], self.table
        start = t.indptr[node]
        x = self.rng.random((m, r))  # (m, R): draw j of every row is contiguous
        x *= (t.indptr[node + 1] - start).astype(np.float64)
        slot = x.astype(np.int64)  # floor(u * deg) < deg for float64 u < 1
        x -= slot  # the alias coin, uniform in [0, 1)
        slot += start
        row = np.take(t.slots, slot, axis=0)  # (m, R, 3); np.take: several times faster than [] on rows
        packed = np.where(x < row[..., 0].view(np.float64), row[..., 1], row[..., 2])  # (m, R) i.i.d. weighted draws
        nbr = packed & NEIGHBOUR_MASK
        ok = nbr != path[0]
        for col in path[1:]:
            ok &= nbr != col
        if found.any():
            have = out[rows]
            seen = np.where(have >= 0, t.neighbours[np.maximum(have, 0)], -1)  # (R, k)
            for j in range(k):
                ok &= nbr != seen[:, j]
        if self.view.edge_drop > 0:
            ok &= self.kept(packed >> 32)
        keep = _first_distinct(np.where(ok, nbr, -1 - np.arange(m)[:, None]))  # (m, R)
        keep &= ok
        rank = np.cumsum(keep, axis=0, dtype=np.int16)
        rank += found.astype(np.int16)
        keep &= rank <= k
        flat = rows * k + rank - 1  # (m, R) where a kept draw goes in out
        out.reshape(-1)[flat[keep]] = packed[keep] >> 32
        return np.minimum(rank[-1], k).astype(np.int64)

    def scan(self, node: np.ndarray, path: np.ndarray, have: np.ndarray, found: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        """Exact continuation: Gumbel-top-(k - found) over all visible edges of each row's node, neighbours on its path or
        already in `have` (R, k; -1 empty) excluded. Returns (row, slot, visible edge) of the new picks."""
        t = self.table
        start = t.indptr[node]
        deg = t.indptr[node + 1] - start
        edge = _ranges(start, deg)  # (C,) CSR order: a row's edges to one neighbour are adjacent
        row = np.repeat(np.arange(len(node)), deg)
        nbr = t.neighbours[edge].astype(np.int64)
        ok = ~(have[row] == nbr[:, None]).any(1)
        for col in path:
            ok &= col[row] != nbr
        if self.view.edge_drop > 0:
            ok &= self.kept(edge)
        edge, row, nbr = edge[ok], row[ok], nbr[ok]
        if not len(edge):
            return row, row, edge
        key = t.log_weight[edge].astype(np.float64) + self.rng.gumbel(size=len(edge))
        first = np.ones(len(edge), bool)
        first[1:] = (row[1:] != row[:-1]) | (nbr[1:] != nbr[:-1])  # (row, neighbour) groups
        gid = np.cumsum(first) - 1
        top = np.maximum.reduceat(key, np.flatnonzero(first))  # a group's max Gumbel key ~ log(summed weight) + Gumbel
        rep = np.flatnonzero(key == top[gid])
        rep = rep[np.concatenate([[True], gid[rep][1:] != gid[rep][:-1]])]  # one edge per group, drawn by weight
        rep = rep[np.lexsort((-key[rep], row[rep]))]
        slot = found[row[rep]] + _rank(row[rep])
        sel = slot < k
        return row[rep][sel], slot[sel], edge[rep][sel]


def _first_distinct(draws: np.ndarray) -> np.ndarray:
    """bool (m, R): draws (draw j of row r at [j, r]; values >= 0 or distinct negatives) not seen earlier in their row."""
    m, r = draws.shape
    if m <= 16 or (m <= 32 and r >= 1024):  # pairwise compares with the earlier draws: fastest for few draws
        keep = np.empty((m, r), bool)
        keep[0] = True
        for j in range(1, m):
            keep[j] = ~(draws[:j] == draws[j]).any(0)
        return keep
    nbr = draws.T  # (R, m)
    s = np.sort(nbr * m + np.arange(m), axis=1)  # by value, then draw position: the first of a run is the earliest draw
    fresh = np.ones(s.shape, bool)
    fresh[:, 1:] = s[:, 1:] // m != s[:, :-1] // m
    keep = np.zeros(r * m, bool)
    keep[(np.arange(0, r * m, m)[:, None] + s % m)[fresh]] = True
    return keep.reshape(r, m).T


def _pick(call: _Call, node: np.ndarray, path: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner, visible edge): up to k distinct neighbours per frontier token, grouped by owner, within it in draw order."""
    t, view = call.table, call.view
    deg = t.indptr[node + 1] - t.indptr[node]
    out = np.full((len(node), k), -1, np.int64)  # (F, k) visible edge per slot
    found = np.zeros(len(node), np.int64)
    hub = np.flatnonzero((deg > view.scan_degree) & (t.distinct[node] > k))  # the others are scanned: draws would come up short
    if len(hub):  # draws, then more draws for the rows that came up short
        every = len(hub) == len(node)
        node_h, path_h = (node, path) if every else (node[hub], [c[hub] for c in path])
        got = call.draw(node_h, path_h, out, hub, found[hub], view.draws_per_slot * k)
        short = np.flatnonzero(got < np.minimum(k, t.distinct[node_h]))
        if len(short):
            got[short] = call.draw(node_h[short], [c[short] for c in path_h], out, hub[short], got[short],
                                   SECOND_ROUND * view.draws_per_slot * k)
        found[hub] = got
    rest = np.flatnonzero((found < np.minimum(k, t.distinct[node])) & (deg > 0))  # short of what the node may still give
    if len(rest):
        have = np.where(out[rest] >= 0, t.neighbours[np.maximum(out[rest], 0)], -1)  # (S, k) neighbours found by draws
        row, slot, edge = call.scan(node[rest], [c[rest] for c in path], have, found[rest], k)
        out[rest[row], slot] = edge
    owner, slot = np.nonzero(out >= 0)  # row-major: by owner, then draw order
    return owner, out[owner, slot]


def sample(graph: Graph, seeds: np.ndarray, cutoff_us: int, view: ViewConfig, rng: np.random.Generator) -> SampledBatch:
    """One time-respecting BFS tree per seed (node indices of `graph`), as a variable-length token batch."""
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    if len(seeds) and (seeds.min() < 0 or seeds.max() >= graph.num_nodes):
        raise IndexError(f"seeds must be node indices in [0, {graph.num_nodes}); got {seeds.min()}..{seeds.max()}")
    table = visible_edges(graph, int(cutoff_us), view.max_age_days)
    call = _Call(table, view, rng, np.uint64(rng.integers(0, 2**63)))
    b = len(seeds)
    seq, parent, node, edge = [np.arange(b)], [np.full(b, -1)], [seeds], [np.full(b, -1)]
    path = [seeds]  # per depth 0..d, int64 [F]: the nodes from the root to each frontier token
    for k in view.fanout:
        owner, e = _pick(call, node[-1], path, k)
        nbr = table.neighbours[e]
        seq.append(seq[-1][owner]), parent.append(owner), node.append(nbr), edge.append(e)
        path = [c[owner] for c in path] + [nbr]
    return _assemble(graph, table, seeds, int(cutoff_us), seq, parent, node, edge)


def _assemble(graph: Graph, table: VisibleEdges, seeds: np.ndarray, cutoff_us: int, seq: list, parent: list, node: list,
              edge: list) -> SampledBatch:
    """Per-level token arrays (each sorted by sequence) -> one sequence per seed in BFS order, with local ancestor indices.
    A level's tokens keep their order, so a token's place is its sequence's offset, the tokens of its sequence at the
    levels above, and its rank among its sequence's tokens at its own level: no sort."""
    b, levels = len(seeds), len(seq)
    counts = np.stack([np.bincount(s, minlength=b) for s in seq])  # (L, B) tokens per sequence and level
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(counts.sum(0), out=offsets[1:])
    t = int(offsets[-1])
    # (L, B): output position of a sequence's first token at a level, minus that token's index within the level
    shift = offsets[:-1] + np.cumsum(counts, axis=0) - counts - (np.cumsum(counts, axis=1) - counts)
    anc_lo = np.full((t, levels), -1, np.int64)  # ancestors, level-by-level order
    order = np.empty(t, np.int64)  # output position -> level-by-level index
    lo, cols = 0, []
    for d, s in enumerate(seq):
        n = len(s)
        pos = np.arange(n) + shift[d][s]  # (n,) output position
        order[pos] = np.arange(lo, lo + n)
        cols = [c[parent[d]] for c in cols] + [pos - offsets[s]]  # local index of the ancestor at each depth <= d
        for j, c in enumerate(cols):
            anc_lo[lo:lo + n, j] = c
        lo += n
    e = np.take(np.concatenate(edge), order)  # a seed's edge is -1: the tables' last entry (self, age 0)
    nodes = np.take(np.concatenate(node), order)
    depth = np.repeat(np.arange(levels), [len(s) for s in seq])[order]
    return SampledBatch(
        offsets=offsets, seeds=seeds, node=nodes, hash_codes=np.take(np.asarray(graph.nodes.hash_codes), nodes, axis=0),
        node_type=np.asarray(graph.nodes.node_type, np.int64)[nodes], depth=depth, ancestors=np.take(anc_lo, order, axis=0),
        edge_type=np.take(table.edge_type, e), edge_age=np.take(table.edge_age, e), cutoff_us=cutoff_us, strength=np.take(graph.strength_until(cutoff_us), nodes))


def sample_views(graph: Graph, seeds: np.ndarray, cutoff_us: int, rng: np.random.Generator,
                 narrow: ViewConfig = NARROW, broad: ViewConfig = BROAD) -> tuple[SampledBatch, SampledBatch]:
    """The student's (narrow) and the teacher's (broad) view of the same seeds at the same cutoff."""
    return sample(graph, seeds, cutoff_us, narrow, rng), sample(graph, seeds, cutoff_us, broad, rng)
