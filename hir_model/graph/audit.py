"""What the `engagement_graph` checks and metadata read off a built graph: pure counts, no Dagster.

`future_edges` is the leak guard: a window's graph may only hold what was known before the window end
(end exclusive, like the events' `ts_in_window`), so any edge with last_ts >= end, or node first seen at
or after it, is a leak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from hir_model.graph.csr import Graph, NodeTable
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class GraphAudit:
    nodes: int
    edges: int
    future_edges: int  # last_ts >= end (the leak guard)
    future_nodes: int  # first_seen >= end
    latest_edge_us: int | None  # max last_ts (None: no edges)
    bad_weights: int  # not finite or <= 0
    untyped_nodes: int  # node_type outside NODE_TYPES, or a null id
    bad_edge_types: int  # edge_type outside EDGE_TYPES
    previous_nodes: int | None  # graph(t-1)'s node count (None: first window)
    prefix_changed: int  # graph(t-1) nodes whose id or type differs at the same index (stable indices: 0)
    nodes_by_type: dict[str, int]
    edges_by_type: dict[str, int]
    density: float  # E / (N (N - 1)), directed
    degree: dict[str, float]  # out-degree summary: mean, p50, p90, p99, max

    @property
    def leaks(self) -> int:
        return self.future_edges + self.future_nodes

    @property
    def node_count_ok(self) -> bool:
        return self.previous_nodes is None or (self.nodes >= self.previous_nodes and self.prefix_changed == 0)


def audit_graph(graph: Graph, end_us: int, previous: NodeTable | None = None) -> GraphAudit:
    """Counts behind every check of a graph that claims to be as of `end_us`; `previous` is graph(t-1)'s node table."""
    n, e = graph.num_nodes, graph.num_edges
    last_ts, weight, etype = np.asarray(graph.last_ts), np.asarray(graph.weight), np.asarray(graph.edge_type)
    ntype = np.asarray(graph.nodes.node_type)
    deg = graph.degrees()
    changed = 0
    if previous is not None:  # graph(t-1)'s nodes must be graph(t)'s first nodes, same ids and types
        m = min(len(previous), n)
        ids_differ = pc.sum(pc.not_equal(graph.nodes.entity_id.slice(0, m), previous.entity_id.slice(0, m))).as_py() or 0
        changed = (len(previous) - m) + ids_differ + int((ntype[:m] != np.asarray(previous.node_type)[:m]).sum())
    return GraphAudit(
        nodes=n, edges=e,
        future_edges=int((last_ts >= end_us).sum()),
        future_nodes=int((np.asarray(graph.nodes.first_seen_us) >= end_us).sum()),
        latest_edge_us=int(last_ts.max()) if e else None,
        bad_weights=int((~np.isfinite(weight) | (weight <= 0)).sum()),
        untyped_nodes=int(((ntype < 0) | (ntype >= len(NODE_TYPES))).sum()) + graph.nodes.entity_id.null_count,
        bad_edge_types=int(((etype < 0) | (etype >= len(EDGE_TYPES))).sum()),
        previous_nodes=None if previous is None else len(previous),
        prefix_changed=changed,
        nodes_by_type=graph.nodes.counts_by_type(),
        edges_by_type=graph.counts_by_type() if not ((etype < 0) | (etype >= len(EDGE_TYPES))).any() else {},
        density=e / (n * (n - 1)) if n > 1 else 0.0,
        degree={"mean": round(float(deg.mean()), 2) if n else 0.0,
                **{f"p{p}": round(float(np.percentile(deg, p)), 2) if n else 0.0 for p in PERCENTILES},
                "max": int(deg.max()) if n else 0},
    )
