"""Per depth level of a batch, up to k distinct neighbours of every frontier token at once (hir_model.graph.sampler): weighted
draws with replacement from the visible-edge table (hir_model.graph.visible) for tokens of large nodes, then an exact
Gumbel-top-k scan for the tokens that came up short and for those of small nodes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hir_model.graph.visible import VisibleEdges, neighbour_of, run_starts

SECOND_ROUND = 2  # a row that comes up short draws this many times more before it is scanned
SMALL = 1 << 17  # draws compare all pairs at once when draws^2 x rows is at most this (speed only)
MANY = 24  # more draws a row than this are deduplicated by sorting each row (speed only)
SPLIT = 1 << 15  # draws are split into those every row needs and the rest when they are at least this many (speed only)


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
    return at - np.maximum.accumulate(np.where(run_starts(group), at, 0))


@dataclass(frozen=True)
class Call:
    """One sample call's constants: the table, the rng, the edge-drop nonce and the view's (hir_model.graph.sampler.ViewConfig)
    edge_drop, scan_degree and draws_per_slot."""

    table: VisibleEdges
    rng: np.random.Generator
    nonce: np.uint64
    edge_drop: float
    scan_degree: int
    draws_per_slot: int

    def kept(self, edge: np.ndarray) -> np.ndarray:
        """bool, edge's shape: visible edges (table indices) not dropped by this call's edge_drop: the hash's uniform
        u = (z >> 11) 2**-53 >= edge_drop, that is z >= ceil(edge_drop 2**53) << 11 (exact: both sides are integers)."""
        return _uniform_hash(edge, self.nonce) >= np.uint64(int(np.ceil(self.edge_drop * 2.0**53)) << 11)

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
        nbr = neighbour_of(packed, path[0].dtype)
        cols = path if t.self_loops else path[:-1]  # path[-1] is the row's own node
        ok = nbr != cols[0] if cols else np.ones((m, r), bool)
        for col in cols[1:]:
            ok &= nbr != col
        if have:
            seen = neighbour_of(out.take(rows, axis=0), nbr.dtype)  # (R, k), -1 past found
            for j in range(have):
                ok &= nbr != seen[:, j]
        if self.edge_drop > 0:
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
        if self.edge_drop > 0:
            ok &= self.kept(edge)
        keep = np.flatnonzero(ok)
        edge, row, nbr = edge.take(keep), row.take(keep), nbr.take(keep)
        if not len(edge):
            return row, row, edge
        key = t.log_weight.take(edge).astype(np.float64) + self.rng.gumbel(size=len(edge))
        first = run_starts(row, nbr)  # (row, neighbour) groups
        gid = np.cumsum(first) - 1
        top = np.maximum.reduceat(key, np.flatnonzero(first))  # a group's max Gumbel key ~ log(summed weight) + Gumbel
        rep = np.flatnonzero(key == top.take(gid))
        rep = rep[run_starts(gid.take(rep))]  # one edge per group, drawn by weight
        rep = rep.take(_by_row_then_key(row.take(rep), key.take(rep), len(start)))
        row = row.take(rep)
        slot = found.take(row) + _rank(row)
        sel = np.flatnonzero(slot < k)
        rep = rep.take(sel)
        return row.take(sel), slot.take(sel), edge.take(rep) << 32 | nbr.take(rep)


def pick(call: Call, path: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(count [F], packed [count.sum()]): up to k distinct neighbours of each frontier token (path[-1]) as visible edge <<
    32 | neighbour, grouped by token, within it in draw order."""
    t, node = call.table, path[-1]
    start = t.indptr.take(node)
    deg = t.indptr.take(node + 1) - start
    distinct = t.distinct.take(node)
    cap = np.minimum(distinct, k)  # what a token can give at most
    out = np.full((len(node), k), -1, np.int64)  # (F, k) packed picks, each row filled from the left
    found = np.zeros(len(node), np.int64)
    hub = np.flatnonzero((deg > call.scan_degree) & (distinct > k))  # the others are scanned: draws would come up short
    if len(hub):  # draws, then more draws for the rows that came up short
        every = len(hub) == len(node)
        start_h, deg_h, path_h = (start, deg, path) if every else (start[hub], deg[hub], [c[hub] for c in path])
        deg_h = deg_h.astype(np.float64)
        got = call.draw(start_h, deg_h, path_h, out, hub, found[hub], call.draws_per_slot * k)
        short = np.flatnonzero(got < cap[hub])
        if len(short):
            got[short] = call.draw(start_h[short], deg_h[short], [c[short] for c in path_h], out, hub[short], got[short],
                                   SECOND_ROUND * call.draws_per_slot * k)
        found[hub] = got
    rest = np.flatnonzero((found < cap) & (deg > 0))  # short of what the node may still give
    if len(rest):
        exclude = np.full((len(rest), -(-(len(path) + k) // 8) * 8), -1, node.dtype)  # (S, X): X a multiple of 8, -1 none
        for j, c in enumerate(path):
            exclude[:, j] = c[rest]
        exclude[:, len(path):len(path) + k] = neighbour_of(out[rest], node.dtype)
        row, slot, packed = call.scan(start[rest], deg[rest], exclude, found[rest], k)
        out[rest[row], slot] = packed
        found[rest] += np.bincount(row, minlength=len(rest))
    at = np.flatnonzero(out.reshape(-1) >= 0)  # row-major: by row, within it in draw order
    return found, out.take(at)
