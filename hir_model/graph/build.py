"""Build the cumulative engagement graph as of a window end, incrementally: graph(t) = decay(graph(t-1)) + window t.

Weights. An engagement event of type s at time ts adds `stage_weight[s] * exp(-(end - ts) / tau)` to the
edge (user, entity, s) and to its reverse (entity, user, s_rev); the edge keeps the latest ts. Carrying
graph(t-1) forward multiplies its engagement weights by `exp(-(end_t - end_{t-1}) / tau)`, which is the
same sum written recursively, so the incremental build equals a build from scratch over all windows
(up to float32 rounding of the stored weights; a test holds them together).

`not_interested` is an engagement type like the others: its weight is positive (how strong and recent
the signal is) and its *type* carries the negative sign; the encoder reads the type, never a negative
weight, so weights stay valid sampling probabilities.

Structural edges are facts of the catalog snapshot at the window end, not accumulated: each window drops
graph(t-1)'s structural edges and re-derives them from catalog(t): child -> parent (`parent`) and back
(`child`) from `parent_id`, and every relation src -> dst (`relation`) and back (`relation_rev`), each with
the constant `structural_weight` (not decayed: a product is still sold by its advertiser however old the
fact is) and last_ts = when the fact became known (the later end's first_seen_ts, or the relation's).

Nodes are append-only: catalog(t) entities that graph(t-1) lacks are appended, ordered by
(first_seen_ts, entity_id), so graph(t-1)'s node i is graph(t)'s node i, and a from-scratch build (which
sorts all nodes the same way) gives the same indices whenever the catalog only grows.

Bad input is never dropped silently: every excluded row is counted in `GraphBuildReport.excluded` under
`<table>.<reason>` (a row counts once, under the first reason that applies, in the order of REASONS).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.vocab import ENGAGEABLE_TYPES, EVENT_TYPES
from hir_model.graph.csr import (IS_ENGAGEMENT, EdgeSet, Graph, NodeTable, aggregate, both_directions, from_graph,
                                 merge, node_bits, to_graph)
from hir_model.graph.hashing import HashConfig, hash_codes
from hir_model.graph.storage import release_pages
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES

US = 1_000_000
DAY_S = 86_400.0
# Exclusion reasons, in the order they are tested: a row is counted under the first that applies.
# type_changed: a catalog row that gives a known node another type (the node keeps its first type: indices and
# types are append-only); node_type_mismatch: an event whose user is not a `user` node or whose entity is not engageable.
REASONS = ("null_key", "unknown_type", "after_window_end", "duplicate_id", "type_changed", "unknown_node", "self_loop",
           "node_type_mismatch")
EVENT_COLUMNS = ["user_id", "entity_id", "event_type", "ts"]
CATALOG_COLUMNS = ["entity_id", "entity_type", "parent_id", "first_seen_ts"]
RELATION_COLUMNS = ["src_id", "relation", "dst_id", "first_seen_ts"]
PENDING_EDGES = 4_000_000  # window edges held before they are aggregated together
USER_TYPE = np.array([t == "user" for t in NODE_TYPES])  # bool [len(NODE_TYPES)]
ENGAGEABLE = np.isin(np.array(NODE_TYPES), ENGAGEABLE_TYPES)  # bool [len(NODE_TYPES)]: what an event may point at


@dataclass(frozen=True)
class GraphConfig:
    tau_days: float = 30.0  # decay time constant: an engagement loses 1/e of its weight every 30 days
    impression: float = 0.1  # stage weights: deeper in the funnel weighs more ...
    click: float = 1.0
    add_to_cart: float = 3.0
    purchase: float = 10.0  # ... the deep-funnel conversion most of all
    interested: float = 2.0  # explicit positive feedback
    not_interested: float = 1.0  # explicit negative feedback: own edge type, positive weight (the type carries the sign)
    structural_weight: float = 1.0  # parent/child and relation edges (not decayed)
    min_weight: float = 1e-30  # edges decayed below this are dropped (float32 holds little less); counted as `expired`
    hashing: HashConfig = field(default_factory=HashConfig)  # deep-hash codes cached in the node table

    def __post_init__(self) -> None:
        bad = {t: w for t, w in zip(EVENT_TYPES, self.stage_weights) if not (np.isfinite(w) and w > 0)}
        if bad or self.tau_days <= 0 or self.structural_weight <= 0:
            raise ValueError(f"GraphConfig needs positive finite weights and tau; got stage weights {bad or 'ok'}, "
                             f"tau_days={self.tau_days}, structural_weight={self.structural_weight}")

    @property
    def stage_weights(self) -> np.ndarray:
        return np.array([getattr(self, t) for t in EVENT_TYPES], np.float64)  # [len(EVENT_TYPES)]

    @property
    def tau_s(self) -> float:
        return self.tau_days * DAY_S


@dataclass
class GraphBuildReport:
    """What one build did: sizes, and every input row it left out, by `<table>.<reason>`."""

    as_of_us: int
    nodes: int = 0
    new_nodes: int = 0
    edges: int = 0
    events_in: int = 0
    events_used: int = 0
    expired: int = 0  # carried edges whose decayed weight fell below GraphConfig.min_weight
    excluded: Counter = field(default_factory=Counter)  # "events.unknown_node" -> rows
    seconds: float = 0.0

    def exclude(self, table: str, masks: dict[str, np.ndarray]) -> np.ndarray:
        """Count rows by the first reason whose mask is set; return the mask of rows that survive."""
        dropped = np.zeros(len(next(iter(masks.values()))), bool)
        for reason in REASONS:
            if reason in masks:
                hit = masks[reason] & ~dropped
                if hit.any():
                    self.excluded[f"{table}.{reason}"] += int(hit.sum())
                dropped |= hit
        return ~dropped


def column_us(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """int64 microseconds of a timestamp column (nulls as int64 min: callers test nulls first)."""
    col = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return np.asarray(pc.fill_null(col, np.iinfo(np.int64).min).to_numpy(zero_copy_only=False), np.int64).reshape(-1)


def _null(column) -> np.ndarray:
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), bool).reshape(-1)


def extend_nodes(prev: NodeTable | None, catalog: pa.Table, end_us: int, config: GraphConfig,
                 report: GraphBuildReport) -> tuple[NodeTable, np.ndarray]:
    """graph(t-1)'s nodes, then catalog entities it lacks, by (first_seen_ts, entity_id). Hash codes for the new ones only.

    Also returns the catalog rows that were not excluded (bool [rows]): only they contribute parent edges.
    """
    hc = config.hashing
    prev = prev if prev is not None else NodeTable.empty(hc.k)
    if prev.hash_codes.shape[1] != hc.k:
        raise ValueError(f"graph(t-1) has {prev.hash_codes.shape[1]} hash codes per node, the config asks for {hc.k}: "
                         "rebuild from the first window")
    ids, fs = catalog.column("entity_id"), column_us(catalog.column("first_seen_ts"))
    type_idx = np.asarray(pc.fill_null(pc.index_in(catalog.column("entity_type"), value_set=pa.array(NODE_TYPES)), -1), np.int64)
    null = _null(ids) | _null(catalog.column("entity_type")) | _null(catalog.column("first_seen_ts"))
    unique = np.zeros(len(ids), bool)
    if len(ids):
        _, first = np.unique(np.asarray(pc.fill_null(pc.index_in(ids, value_set=pc.unique(ids)), -1), np.int64), return_index=True)
        unique[first] = True
    at = prev.index_of(ids) if len(prev) else np.full(len(ids), -1)  # the row's node in graph(t-1), or -1
    known = at >= 0
    changed = known & (np.asarray(prev.node_type, np.int64)[np.maximum(at, 0)] != type_idx) if len(prev) else known
    keep = report.exclude("catalog", {"null_key": null, "unknown_type": type_idx < 0, "after_window_end": fs >= end_us,
                                      "duplicate_id": ~unique, "type_changed": changed})
    new = pa.table({"entity_id": catalog.column("entity_id"), "fs": fs, "t": type_idx}).filter(pa.array(keep & ~known))
    new = new.sort_by([("fs", "ascending"), ("entity_id", "ascending")])
    report.new_nodes = new.num_rows
    new_ids = new.column("entity_id").combine_chunks()
    return NodeTable(
        entity_id=pa.concat_arrays([prev.entity_id.cast(pa.string()), new_ids.cast(pa.string())]),
        node_type=np.concatenate([prev.node_type, new.column("t").to_numpy().astype(np.int8)]),
        first_seen_us=np.concatenate([prev.first_seen_us, new.column("fs").to_numpy().astype(np.int64)]),
        hash_codes=np.concatenate([np.asarray(prev.hash_codes), hash_codes(new_ids, hc.k, hc.buckets)]),
    ), keep


def event_edges(batch: pa.Table | pa.RecordBatch, nodes: NodeTable, end_us: int, config: GraphConfig, bits: int,
                report: GraphBuildReport) -> EdgeSet:
    """One batch of events -> engagement edges in both directions, decayed to end_us (one per event and direction)."""
    if isinstance(batch, pa.RecordBatch):
        batch = pa.Table.from_batches([batch])
    report.events_in += batch.num_rows
    user, ent = nodes.index_of(batch.column("user_id")), nodes.index_of(batch.column("entity_id"))
    etype = np.asarray(pc.fill_null(pc.index_in(batch.column("event_type"), value_set=pa.array(EVENT_TYPES)), -1), np.int64)
    ts = column_us(batch.column("ts"))
    null = np.zeros(batch.num_rows, bool)
    for c in EVENT_COLUMNS:
        null |= _null(batch.column(c))
    types = np.asarray(nodes.node_type)
    mismatch = ~USER_TYPE[types[np.maximum(user, 0)]] | ~ENGAGEABLE[types[np.maximum(ent, 0)]]
    keep = report.exclude("events", {"null_key": null, "unknown_type": etype < 0, "after_window_end": ts >= end_us,
                                     "unknown_node": (user < 0) | (ent < 0), "self_loop": user == ent,
                                     "node_type_mismatch": mismatch})
    report.events_used += int(keep.sum())
    user, ent, etype, ts = user[keep], ent[keep], etype[keep], ts[keep]
    weight = config.stage_weights[etype] * np.exp(-(end_us - ts) / (config.tau_s * US))  # float64 [m]
    code = np.array([EDGE_TYPES.index(t) for t in EVENT_TYPES], np.int8)[etype]
    return both_directions(user, ent, code, weight, ts, np.full(len(ts), -1, np.int32), bits)  # aggregated by the caller


def structural_edges(catalog: pa.Table, catalog_ok: np.ndarray, relations: pa.Table, nodes: NodeTable, end_us: int,
                     config: GraphConfig, bits: int, report: GraphBuildReport) -> tuple[EdgeSet, tuple[str, ...]]:
    """Parent/child edges from catalog(t)'s parent_id (rows in catalog_ok), relation edges from its relations; both directions."""
    child, parent = nodes.index_of(catalog.column("entity_id")), nodes.index_of(catalog.column("parent_id"))
    fs = column_us(catalog.column("first_seen_ts"))
    has = ~_null(catalog.column("parent_id")) & catalog_ok  # excluded rows were counted by extend_nodes
    keep = report.exclude("parents", {"unknown_node": has & (parent < 0), "self_loop": has & (child == parent)}) & has
    c, p = child[keep], parent[keep]
    ts = np.maximum(fs[keep], np.asarray(nodes.first_seen_us)[p])
    parts = [both_directions(c, p, np.full(len(c), EDGE_TYPES.index("parent"), np.int8), np.full(len(c), config.structural_weight),
                             ts, np.full(len(c), -1, np.int32), bits)]
    names = pc.unique(pc.drop_null(relations.column("relation"))).to_pylist()
    names = tuple(sorted(names))
    src, dst = nodes.index_of(relations.column("src_id")), nodes.index_of(relations.column("dst_id"))
    rts = column_us(relations.column("first_seen_ts"))
    null = np.zeros(relations.num_rows, bool)
    for col in RELATION_COLUMNS:
        null |= _null(relations.column(col))
    keep = report.exclude("relations", {"null_key": null, "after_window_end": rts >= end_us,
                                        "unknown_node": (src < 0) | (dst < 0), "self_loop": src == dst})
    rel = np.asarray(pc.fill_null(pc.index_in(relations.column("relation"), value_set=pa.array(names, pa.string())), -1), np.int32)
    n = int(keep.sum())
    parts.append(both_directions(src[keep], dst[keep], np.full(n, EDGE_TYPES.index("relation"), np.int8),
                                 np.full(n, config.structural_weight), rts[keep], rel[keep], bits))
    return aggregate(EdgeSet.concat(parts)), names


def carried_edges(prev: Graph, end_us: int, config: GraphConfig, bits: int) -> EdgeSet:
    """graph(t-1)'s engagement edges, decayed from its end to end_us (structural edges are re-derived)."""
    if end_us < prev.as_of_us:
        raise ValueError(f"graph(t-1) is as of {prev.as_of_us} us, later than this window's end {end_us} us")
    if abs(prev.tau_s - config.tau_s) > 1e-6:
        raise ValueError(f"graph(t-1) was built with tau={prev.tau_s / DAY_S} days, the config says {config.tau_days}: "
                         "rebuild from the first window")
    edges = from_graph(prev, bits, keep=IS_ENGAGEMENT[np.asarray(prev.edge_type)])
    edges.weight *= np.exp(-(end_us - prev.as_of_us) / (config.tau_s * US))
    release_pages(prev)  # graph(t-1)'s CSR is copied: its mapped pages need not stay resident
    return edges


def build_graph(prev: Graph | None, catalog: pa.Table, relations: pa.Table, events: pa.Table | Iterable[pa.Table | pa.RecordBatch],
                end_us: int, config: GraphConfig = GraphConfig()) -> tuple[Graph, GraphBuildReport]:
    """graph(t) from graph(t-1) (None: from scratch), catalog(t) + relations(t) and window t's events (a table or batches).

    From scratch over all events up to end_us gives the same graph as the window-by-window fold.
    """
    t0 = time.perf_counter()
    report = GraphBuildReport(as_of_us=int(end_us))
    nodes, catalog_ok = extend_nodes(prev.nodes if prev is not None else None, catalog, end_us, config, report)
    bits = node_bits(max(len(nodes), 1))
    base = carried_edges(prev, end_us, config, bits) if prev is not None else EdgeSet.empty()
    new, names = structural_edges(catalog, catalog_ok, relations, nodes, end_us, config, bits, report)  # aggregated
    pending = []
    for batch in [events] if isinstance(events, (pa.Table, pa.RecordBatch)) else events:
        pending.append(event_edges(batch, nodes, end_us, config, bits, report))
        if sum(map(len, pending)) > PENDING_EDGES:  # keep memory flat however large the window
            new, pending = aggregate(EdgeSet.concat([new, *pending])), []
    base = merge(base, aggregate(EdgeSet.concat([new, *pending])))  # one pass over graph(t-1)'s edges per window
    del new, pending
    expired = base.weight < config.min_weight  # only decayed engagement can get there (structural weights are constant)
    if expired.any():
        report.expired = int(expired.sum())
        base = base.take(np.flatnonzero(~expired))
    graph = to_graph(base, nodes, bits, end_us, config.tau_s, names)  # consumes base
    report.nodes, report.edges, report.seconds = graph.num_nodes, graph.num_edges, time.perf_counter() - t0
    return graph, report
