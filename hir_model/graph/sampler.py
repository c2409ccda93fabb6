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
- Per (graph, cutoff, max_age) a table of the visible edges is built once and kept (about 48 bytes per visible edge):
  their CSR, their log weight decayed to the cutoff and a Walker alias table per node, packed so that a weighted
  draw is one aligned 32-byte read (O(1), no search) and a token's edge type and age one 8-byte read.
- A frontier token whose node has more than `scan_degree` visible edges draws `draws_per_slot` x fanout edges
  with replacement; dropped edges and nodes on its path are rejected, and the first distinct neighbours in draw
  order are kept (the first distinct values of an i.i.d. weighted sequence are a successive sample). All the
  uniforms are drawn at once, but a token's draws are looked at only until it is full: the first k - found for
  every token, the rest for those still short.
- A token that ends short of its fanout while its node has more distinct neighbours, and every token of a
  smaller node, continues exactly: a Gumbel-top-k scan of all its node's visible edges, without the neighbours
  it already has. Given the draws so far, the next distinct neighbours of an i.i.d. sequence are a successive
  sample of the rest, so the result is exact successive sampling either way (no truncation).
Tokens are laid out per sequence in BFS order: seed, depth 1, depth 2; within a parent in draw order. Each level is
written straight to its places in the batch; a pick travels as one int64, edge << 32 | neighbour.

The same seeds and generator give the same batch, bit for bit, as the sampler the demo ran with (9d8e473): every
speed-up here keeps the order and number of the generator's draws (tests/hir_model/graph/test_sampler_equivalence.py).
"""

from __future__ import annotations

import functools
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
SMALL = 1 << 17  # draws compare all pairs at once when draws^2 x rows is at most this (speed only)
MANY = 24  # more draws a row than this are deduplicated by sorting each row (speed only)
SPLIT = 1 << 15  # draws are split into those every row needs and the rest when they are at least this many (speed only)


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
    neighbours: np.ndarray  # int32 (int64 when N >= 2**31) [E'], its destination node
    log_weight: np.ndarray  # float32 [E'], log of its weight decayed to the cutoff
    # int64 [E', 4], one aligned 32-byte read per draw: a draw landing on slot e keeps e with probability prob (column 0,
    # float64 bits) and takes its alias (a visible edge of the same node) otherwise; columns 1, 2: e and the alias as
    # edge << 32 | neighbour; column 3: 0 (padding: 32-byte rows never straddle a cache line and take a faster copy)
    slots: np.ndarray
    # int64 [E' + 1], one read per token: edge type << 32 | the float32 bits of its age (seconds from its last event to
    # the cutoff); the last entry: a seed's (SELF_EDGE, 0)
    type_age: np.ndarray
    distinct: np.ndarray  # int64 [N], distinct visible neighbours per node
    node_type: np.ndarray  # int64 [N], the graph's node types (converted once)
    strength: np.ndarray  # float32 [N], Graph.strength_until(cutoff)
    self_loops: bool  # whether a visible edge joins a node to itself (if not, draws need not compare with their own node)


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
    if len(edge) >= 2**31 or n >= 2**32:
        raise ValueError(f"sampler: {len(edge)} visible edges / {n} nodes do not fit its packed draw table (2**31 / 2**32)")
    own = np.arange(len(edge), dtype=np.int64) << 32 | nbr.astype(np.int64)
    slots = np.stack([prob.view(np.int64), own, own[alias], np.zeros_like(own)], axis=1)
    age = np.append((cutoff_us - ts[edge]) / US, 0.0).astype(np.float32).view(np.uint32).astype(np.int64)
    return VisibleEdges(indptr, nbr.astype(_node_dtype(n)), log_w.astype(np.float32), slots,
                        np.append(etype[edge], SELF_EDGE) << 32 | age, np.bincount(src[first], minlength=n),
                        np.asarray(graph.nodes.node_type, np.int64), graph.strength_until(cutoff_us), bool((src == nbr).any()))


def _node_dtype(num_nodes: int) -> type:
    """The hot path's node index type: int32 halves its memory traffic; packed draws hold a node in their low 32 bits."""
    return np.int32 if num_nodes < 2**31 else np.int64


def _neighbour(packed: np.ndarray, dtype: type) -> np.ndarray:
    """The neighbour of packed edge << 32 | neighbour values, as `dtype` (_node_dtype)."""
    return packed.astype(np.int32) if dtype == np.int32 else packed & NEIGHBOUR_MASK  # int32: the low 32 bits


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


@functools.cache
def _earlier(m: int) -> np.ndarray:
    """bool (m, m, 1), read-only (it is shared): [i, j] is i < j."""
    out = np.triu(np.ones((m, m), bool), 1)[:, :, None]
    out.flags.writeable = False
    return out


def _running(keep: np.ndarray, base: np.ndarray) -> np.ndarray:
    """int64 (m, R): base + the running count of keep (m, R) over axis 0; np.cumsum over axis 0 is slow when R is large."""
    m, r = keep.shape
    if r < 256:
        pos = np.cumsum(keep, axis=0)
        pos += base
        return pos
    pos = np.empty((m, r), np.int64)
    np.add(base, keep[0], out=pos[0])
    for j in range(1, m):
        np.add(pos[j - 1], keep[j], out=pos[j])
    return pos


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated aranges [starts[i], starts[i] + lengths[i])."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)


def _uniform_hash(edge: np.ndarray, nonce: np.uint64) -> np.ndarray:
    """uint64 per edge index: splitmix64 of (edge + nonce), so one call drops an edge for every token. Its top 53 bits
    times 2**-53 are a uniform float64 in [0, 1)."""
    z = edge.astype(np.uint64) + nonce
    z *= np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _by_row_then_key(row: np.ndarray, key: np.ndarray, rows: int) -> np.ndarray:
    """np.lexsort((-key, row)) (row ascending, within it key descending, ties in input order), faster: an unstable SIMD
    argsort of the keys, then a stable radix argsort of their rows (int16); lexsort itself when two keys tie or rows are
    many."""
    by_key = np.argsort(-key)
    ordered = key.take(by_key)
    if rows >= 2**15 or (ordered[1:] == ordered[:-1]).any():
        return np.lexsort((-key, row))
    return by_key.take(np.argsort(row.take(by_key).astype(np.int16), kind="stable"))


def _rank(group: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (group sorted)."""
    at = np.arange(len(group))
    start = np.zeros(len(group), np.int64)
    start[1:] = np.where(group[1:] != group[:-1], at[1:], 0)
    return at - np.maximum.accumulate(start)


@dataclass(frozen=True)
class _Call:
    """One call's constants: the table, the view, the rng and the edge-drop nonce."""

    table: VisibleEdges
    view: ViewConfig
    rng: np.random.Generator
    nonce: np.uint64

    def kept(self, edge: np.ndarray) -> np.ndarray:
        """bool, edge's shape: visible edges (table indices) not dropped by this call's edge_drop: the hash's uniform
        u = (z >> 11) 2**-53 >= edge_drop, that is z >= ceil(edge_drop 2**53) << 11 (exact: both sides are integers)."""
        return _uniform_hash(edge, self.nonce) >= np.uint64(int(np.ceil(self.view.edge_drop * 2.0**53)) << 11)

    def draw(self, start: np.ndarray, deg: np.ndarray, path: list[np.ndarray], out: np.ndarray, rows: np.ndarray,
             found: np.ndarray, m: int) -> np.ndarray:
        """m alias draws for each of `rows` (its node's first visible edge, its visible degree as float64, its path),
        continuing its i.i.d. sequence: the distinct valid neighbours not yet in out[row] ((F, k) packed edge << 32 |
        neighbour, each row filled from the left, `found` filled, -1 empty) are appended there in draw order, up to k.
        Returns the new found [R]."""
        return self._draws(self.rng.random((m, len(rows))), start, deg, path, out, rows, found)  # (m, R): draw-major

    def _draws(self, x: np.ndarray, start: np.ndarray, deg: np.ndarray, path: list[np.ndarray], out: np.ndarray,
               rows: np.ndarray, found: np.ndarray) -> np.ndarray:
        """`draw` with its uniforms x (m, R). A row that is full ignores its later draws, so when rows are many, the
        first k - min(found) draws go to every row and the rest only to the rows that are still short."""
        (m, r), k, t = x.shape, out.shape[1], self.table
        have = int(found.max()) if r else 0  # columns of out that hold a pick in some row
        safe = k - have  # this many draws fill no row
        cut = k - (int(found.min()) if r else 0)  # this many draws every row but the fullest can use
        if cut < m and m * r >= SPLIT:
            got = self._draws(x[:cut], start, deg, path, out, rows, found)
            more = np.flatnonzero(got < k)
            if len(more):
                got[more] = self._draws(x[cut:].take(more, axis=1), start.take(more), deg.take(more),
                                        [c.take(more) for c in path], out, rows.take(more), got.take(more))
            return got
        x *= deg
        slot = x.astype(np.int64)  # floor(u * deg) < deg for float64 u < 1
        x -= slot  # the alias coin, uniform in [0, 1)
        slot += start
        row = t.slots.take(slot, axis=0)  # (m, R, 4); take: several times faster than [] on rows
        packed = np.where(x < row[..., 0].view(np.float64), row[..., 1], row[..., 2])  # (m, R) i.i.d. weighted draws
        nbr = _neighbour(packed, path[0].dtype)
        cols = path if t.self_loops else path[:-1]  # path[-1] is the row's own node
        ok = nbr != cols[0] if cols else np.ones((m, r), bool)
        for col in cols[1:]:
            ok &= nbr != col
        if have:
            seen = _neighbour(out.take(rows, axis=0), nbr.dtype)  # (R, k), -1 past found
            for j in range(have):
                ok &= nbr != seen[:, j]
        if self.view.edge_drop > 0:
            ok &= self.kept(packed >> 32)
            vals = np.where(ok, nbr, -1)  # a dropped draw hides nothing: the same neighbour may come by another edge
        else:  # validity is a property of the neighbour: an invalid draw's neighbour is invalid at every draw
            vals = nbr
        # pos[j, r]: where row r's next pick goes in out (flat) after draw j; a draw is kept when it is valid, its
        # neighbour is new in its row (no earlier valid draw had it) and the row is not full
        keep, base = ok, rows * k - 1 + found
        if m >= MANY and m * m * r > SMALL:  # many draws a row: sort each row's draws by value, then draw index
            v = vals.T.astype(np.int64) * m + np.arange(m)  # (R, m)
            v.sort(axis=1)
            fresh = np.ones((r, m), bool)  # the first of each value is new
            np.not_equal(v[:, 1:] // m, v[:, :-1] // m, out=fresh[:, 1:])
            new = np.zeros(r * m, bool)
            new[(np.arange(0, r * m, m)[:, None] + v % m)[fresh]] = True
            keep_t = new.reshape(r, m)
            keep_t &= ok.T
            pos = (np.cumsum(keep_t, axis=1) + base[:, None]).T  # (m, R) view of a row-major cumsum
            keep = keep_t.T
        else:
            if m * m * r <= SMALL:  # a few large numpy calls: (i, j, R) all pairs at once
                dup = vals[:, None] == nbr[None]  # (m, m, R): draw i's value is draw j's neighbour ...
                dup &= _earlier(m)  # ... and i < j
                keep &= ~dup.any(0)
            else:  # m calls on (<= m, R) arrays
                for j in range(1, m):
                    keep[j] &= ~(vals[:j] == nbr[j]).any(0)
            pos = _running(keep, base)
        if m > safe:
            keep &= pos < (rows + 1) * k
        at = np.flatnonzero(keep)  # kept draws, draw-major
        out.reshape(-1)[pos.take(at)] = packed.take(at)
        return np.minimum(pos[-1] - (rows * k - 1), k)

    def scan(self, start: np.ndarray, deg: np.ndarray, exclude: np.ndarray, found: np.ndarray,
             k: int) -> tuple[np.ndarray, ...]:
        """Exact continuation: Gumbel-top-(k - found) over all visible edges of each row's node, the neighbours in its row
        of `exclude` (R, X: its path and what it has; -1 none; X a multiple of 8) left out. Returns (row, slot, packed
        edge << 32 | neighbour) of the new picks."""
        t = self.table
        edge = _ranges(start, deg)  # (C,) CSR order: a row's edges to one neighbour are adjacent
        row = np.repeat(np.arange(len(start)), deg)
        nbr = t.neighbours.take(edge)
        hit = (exclude.take(row, axis=0) == nbr[:, None]).view(np.uint64)  # (C, X / 8): 8 compares per word
        ok = hit[:, 0] == 0 if hit.shape[1] == 1 else ~hit.any(1)
        if self.view.edge_drop > 0:
            ok &= self.kept(edge)
        keep = np.flatnonzero(ok)
        edge, row, nbr = edge.take(keep), row.take(keep), nbr.take(keep)
        if not len(edge):
            return row, row, edge
        key = t.log_weight.take(edge).astype(np.float64) + self.rng.gumbel(size=len(edge))
        first = np.ones(len(edge), bool)
        first[1:] = (row[1:] != row[:-1]) | (nbr[1:] != nbr[:-1])  # (row, neighbour) groups
        gid = np.cumsum(first) - 1
        top = np.maximum.reduceat(key, np.flatnonzero(first))  # a group's max Gumbel key ~ log(summed weight) + Gumbel
        rep = np.flatnonzero(key == top.take(gid))
        g = gid.take(rep)
        rep = rep[np.concatenate([[True], g[1:] != g[:-1]])]  # one edge per group, drawn by weight
        rep = rep.take(_by_row_then_key(row.take(rep), key.take(rep), len(start)))
        row = row.take(rep)
        slot = found.take(row) + _rank(row)
        sel = np.flatnonzero(slot < k)
        rep = rep.take(sel)
        return row.take(sel), slot.take(sel), edge.take(rep) << 32 | nbr.take(rep)


def _pick(call: _Call, path: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(count [F], packed [count.sum()]): up to k distinct neighbours of each frontier token (path[-1]) as visible edge <<
    32 | neighbour, grouped by token, within it in draw order."""
    t, view, node = call.table, call.view, path[-1]
    start = t.indptr.take(node)
    deg = t.indptr.take(node + 1) - start
    distinct = t.distinct.take(node)
    cap = np.minimum(distinct, k)  # what a token can give at most
    out = np.full((len(node), k), -1, np.int64)  # (F, k) packed picks, each row filled from the left
    found = np.zeros(len(node), np.int64)
    hub = np.flatnonzero((deg > view.scan_degree) & (distinct > k))  # the others are scanned: draws would come up short
    if len(hub):  # draws, then more draws for the rows that came up short
        every = len(hub) == len(node)
        start_h, deg_h, path_h = (start, deg, path) if every else (start[hub], deg[hub], [c[hub] for c in path])
        deg_h = deg_h.astype(np.float64)
        got = call.draw(start_h, deg_h, path_h, out, hub, found[hub], view.draws_per_slot * k)
        short = np.flatnonzero(got < cap[hub])
        if len(short):
            got[short] = call.draw(start_h[short], deg_h[short], [c[short] for c in path_h], out, hub[short], got[short],
                                   SECOND_ROUND * view.draws_per_slot * k)
        found[hub] = got
    rest = np.flatnonzero((found < cap) & (deg > 0))  # short of what the node may still give
    if len(rest):
        exclude = np.full((len(rest), -(-(len(path) + k) // 8) * 8), -1, node.dtype)  # (S, X): X a multiple of 8, -1 none
        for j, c in enumerate(path):
            exclude[:, j] = c[rest]
        exclude[:, len(path):len(path) + k] = _neighbour(out[rest], node.dtype)
        row, slot, packed = call.scan(start[rest], deg[rest], exclude, found[rest], k)
        out[rest[row], slot] = packed
        found[rest] += np.bincount(row, minlength=len(rest))
    at = np.flatnonzero(out.reshape(-1) >= 0)  # row-major: by row, within it in draw order
    return found, out.take(at)


def sample(graph: Graph, seeds: np.ndarray, cutoff_us: int, view: ViewConfig, rng: np.random.Generator) -> SampledBatch:
    """One time-respecting BFS tree per seed (node indices of `graph`), as a variable-length token batch."""
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    if len(seeds) and (seeds.min() < 0 or seeds.max() >= graph.num_nodes):
        raise IndexError(f"seeds must be node indices in [0, {graph.num_nodes}); got {seeds.min()}..{seeds.max()}")
    table = visible_edges(graph, int(cutoff_us), view.max_age_days)
    call = _Call(table, view, rng, np.uint64(rng.integers(0, 2**63)))
    # per level: each token as edge << 32 | node (a seed's edge: the tables' last entry, self), and for the levels below
    # the seeds, the children of each token of the level above and the index of each token's parent there
    tokens, count, owner = [np.int64(len(table.type_age) - 1) << 32 | seeds], [], []
    path = [seeds.astype(table.neighbours.dtype)]  # per depth 0..d, [F]: the nodes from the root to each frontier token
    for d, k in enumerate(view.fanout, 1):
        c, packed = _pick(call, path, k)
        o = np.repeat(np.arange(len(c)), c)
        tokens.append(packed), count.append(c), owner.append(o)
        if d < len(view.fanout):
            path = [col.take(o) for col in path] + [_neighbour(packed, path[0].dtype)]
    return _assemble(graph, table, seeds, int(cutoff_us), tokens, count, owner)


def _assemble(graph: Graph, table: VisibleEdges, seeds: np.ndarray, cutoff_us: int, tokens: list, count: list,
              owner: list) -> SampledBatch:
    """Per-level tokens (each grouped by sequence) -> one sequence per seed in BFS order, with local ancestor indices.
    A level's tokens keep their order, so a token's place is its sequence's offset, the tokens of its sequence at the
    levels above, and its rank among its sequence's tokens at its own level: each level is written straight to its
    places, no sort and no permutation pass."""
    b, levels = len(seeds), len(tokens)
    per_seq = np.ones((levels, b), np.int64)  # (L, B) tokens per sequence and level
    for d, c in enumerate(count, 1):  # a sequence's tokens at level d: the children of its tokens at level d - 1
        below = np.zeros(len(c) + 1, np.int64)
        np.cumsum(c, out=below[1:])
        end = np.cumsum(per_seq[d - 1])
        per_seq[d] = below.take(end) - below.take(end - per_seq[d - 1])
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(per_seq.sum(0), out=offsets[1:])
    t = int(offsets[-1])
    # (L, B): place of a sequence's first token at a level, minus that token's index within the level
    shift = offsets[:-1] + np.cumsum(per_seq, axis=0) - per_seq - (np.cumsum(per_seq, axis=1) - per_seq)
    packed = np.empty(t, np.int64)
    ancestors = np.empty((t, levels), np.int64)
    rows = ancestors.view(np.dtype((np.void, 8 * levels))).reshape(-1)  # one item per token: np.put moves whole rows
    block = np.full((b, levels), -1, np.int64)  # (n, L) the level's ancestors, in level order
    for d in range(levels):
        at = np.arange(len(tokens[d])) + np.repeat(shift[d], per_seq[d])  # place in the batch
        if d:  # the parent's ancestors (-1 from depth d on), then its own local index
            block = block.take(owner[d - 1], axis=0)
        block[:, d] = at - np.repeat(offsets[:-1], per_seq[d])
        np.put(packed, at, tokens[d])
        np.put(rows, at, block.view(rows.dtype).reshape(-1))
    nodes = packed & NEIGHBOUR_MASK
    type_age = table.type_age.take(packed >> 32)
    return SampledBatch(
        offsets=offsets, seeds=seeds, node=nodes, hash_codes=np.take(np.asarray(graph.nodes.hash_codes), nodes, axis=0),
        node_type=table.node_type.take(nodes), depth=np.repeat(np.tile(np.arange(levels), b), per_seq.T.reshape(-1)),
        ancestors=ancestors, edge_type=type_age >> 32, edge_age=type_age.astype(np.uint32).view(np.float32),
        cutoff_us=cutoff_us, strength=table.strength.take(nodes))


def sample_views(graph: Graph, seeds: np.ndarray, cutoff_us: int, rng: np.random.Generator,
                 narrow: ViewConfig = NARROW, broad: ViewConfig = BROAD) -> tuple[SampledBatch, SampledBatch]:
    """The student's (narrow) and the teacher's (broad) view of the same seeds at the same cutoff."""
    return sample(graph, seeds, cutoff_us, narrow, rng), sample(graph, seeds, cutoff_us, broad, rng)
