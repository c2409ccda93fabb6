"""The visible-edge table of one (graph, cutoff, max_age), the sampler's (hir_model.graph.sampler) draw table: a CSR of the
edges that exist at the cutoff, their log weights decayed to it and a Walker alias table per node, packed so that a
weighted draw is one aligned 32-byte read and a token's edge type and age one 8-byte read. Built once and kept."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from hir_model.graph.csr import IS_ENGAGEMENT, Graph
from hir_model.graph.types import SELF_EDGE

US = 1_000_000
NEIGHBOUR_MASK = np.int64(2**32 - 1)  # VisibleEdges.slots: edge << 32 | neighbour
TABLES_PER_GRAPH = 4  # visible-edge tables kept per graph (one per (cutoff, max_age) asked; training asks two)


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
    n = graph.num_nodes
    if len(edge) >= 2**31 or n >= 2**32:
        raise ValueError(f"sampler: {len(edge)} visible edges / {n} nodes do not fit its packed draw table (2**31 / 2**32)")
    src = graph.src()[edge]  # [E'] sorted: the CSR order survives the filter
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    log_f = np.where(IS_ENGAGEMENT, (graph.as_of_us - cutoff_us) / (graph.tau_s * US), 0.0)  # decay from as_of to the cutoff
    log_w = np.log(w[edge]) + log_f[etype[edge]]
    nbr = np.asarray(graph.neighbours)[edge]
    first = run_starts(src, nbr)  # CSR is sorted by (src, dst): a neighbour's edges are adjacent
    prob, alias = _alias(indptr, src, log_w)
    own = np.arange(len(edge), dtype=np.int64) << 32 | nbr.astype(np.int64)
    slots = np.stack([prob.view(np.int64), own, own[alias], np.zeros_like(own)], axis=1)
    age = np.append((cutoff_us - ts[edge]) / US, 0.0).astype(np.float32).view(np.uint32).astype(np.int64)
    return VisibleEdges(indptr, nbr.astype(_node_dtype(n)), log_w.astype(np.float32), slots,
                        np.append(etype[edge], SELF_EDGE) << 32 | age, np.bincount(src[first], minlength=n),
                        bool((src == nbr).any()))


def _node_dtype(num_nodes: int) -> type:
    """The hot path's node index type: int32 halves its memory traffic; packed draws hold a node in their low 32 bits."""
    return np.int32 if num_nodes < 2**31 else np.int64


def neighbour_of(packed: np.ndarray, dtype: type) -> np.ndarray:
    """The neighbour of packed edge << 32 | neighbour values, as `dtype` (_node_dtype)."""
    return packed.astype(np.int32) if dtype == np.int32 else packed & NEIGHBOUR_MASK  # int32: the low 32 bits


def run_starts(*keys: np.ndarray) -> np.ndarray:
    """bool, the keys' length: where a run of equal key tuples starts (the first element, and each that differs from the one
    before it in some key)."""
    first = np.zeros(len(keys[0]), bool)
    first[:1] = True
    for key in keys:
        first[1:] |= key[1:] != key[:-1]
    return first


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
