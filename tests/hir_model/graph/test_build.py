"""Graph build: decay arithmetic, incremental == from scratch, append-only nodes, structural edges, counted exclusions."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from data_contracts.schemas import EVENTS_SCHEMA
from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
from hir_model.data.windows import WindowSpec
from hir_model.graph.build import GraphConfig, build_graph
from hir_model.graph.csr import Graph
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES
from hir_model.graph.window import to_us
from tests.conftest import W0, W1, catalog_table
from tests.hir_model.graph.graphs import assert_same_graph

E0, E1 = W1, W1 + timedelta(weeks=1)  # ends of the fixture's two weekly windows
LOOSE = pa.schema([f.with_nullable(True) for f in EVENTS_SCHEMA])


def catalog_at(end) -> pa.Table:
    table = catalog_table()
    return table.filter(pc.less(table["first_seen_ts"], pa.scalar(end, table.schema.field("first_seen_ts").type)))


def relations(rows=(("c1", "promotes", "p1", W0),)) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.table({"src_id": pa.array(cols[0], pa.string()), "relation": pa.array(cols[1], pa.string()),
                     "dst_id": pa.array(cols[2], pa.string()), "first_seen_ts": pa.array(cols[3], pa.timestamp("us", tz="UTC"))})


def events(rows) -> pa.Table:
    """rows of (user_id, entity_id, event_type, ts)."""
    cols = list(zip(*rows)) if rows else [[], [], [], []]
    n = len(rows)
    return pa.table({"event_id": [f"e{i}" for i in range(n)], "user_id": pa.array(cols[0], pa.string()),
                     "entity_id": pa.array(cols[1], pa.string()), "entity_type": ["product"] * n,
                     "event_type": pa.array(cols[2], pa.string()), "ts": pa.array(cols[3], pa.timestamp("us", tz="UTC")),
                     "value": pa.nulls(n, pa.float64())}, schema=LOOSE)


def edge(graph: Graph, src: str, dst: str, edge_type: str) -> tuple[float, int]:
    """(weight, last_ts) of one edge, looked up by entity ids."""
    s, d = graph.nodes.index_of(pa.array([src, dst]))
    lo, hi = graph.indptr[s], graph.indptr[s + 1]
    hit = np.flatnonzero((graph.neighbours[lo:hi] == d) & (graph.edge_type[lo:hi] == EDGE_TYPES.index(edge_type)))
    assert len(hit) == 1, f"no single {src} -{edge_type}-> {dst} edge"
    return float(graph.weight[lo + hit[0]]), int(graph.last_ts[lo + hit[0]])


def test_decay_arithmetic_by_hand():
    day = timedelta(days=1)
    g0, report = build_graph(None, catalog_at(E0), relations(), events([
        ("u1", "p1", "click", E0 - 2 * day), ("u1", "p1", "click", E0 - 30 * day), ("u1", "p1", "purchase", E0 - day)]), to_us(E0))
    # click: 1 * exp(-2/30) + 1 * exp(-30/30); purchase: 10 * exp(-1/30)   (tau = 30 days)
    assert edge(g0, "u1", "p1", "click") == pytest.approx((1.3033864262030601, to_us(E0 - 2 * day)), rel=1e-6)
    assert edge(g0, "p1", "u1", "click_rev") == edge(g0, "u1", "p1", "click")
    assert edge(g0, "u1", "p1", "purchase")[0] == pytest.approx(9.672161004820058, rel=1e-6)
    g1, _ = build_graph(g0, catalog_at(E1), relations(), events([("u1", "p1", "add_to_cart", E1 - day / 2)]), to_us(E1))
    # a week later: carried weights times exp(-7/30); the new event: 3 * exp(-0.5/30)
    assert edge(g1, "u1", "p1", "click")[0] == pytest.approx(1.0321381118151889, rel=1e-6)
    assert edge(g1, "u1", "p1", "purchase")[0] == pytest.approx(7.659283383646486, rel=1e-6)
    assert edge(g1, "u1", "p1", "add_to_cart") == pytest.approx((2.9504143614648526, to_us(E1 - day / 2)), rel=1e-6)
    assert edge(g1, "p1", "a1", "parent") == (1.0, to_us(W0)) and edge(g1, "a1", "p1", "child") == (1.0, to_us(W0))  # not decayed


def test_incremental_build_equals_from_scratch(tmp_path):
    config = replace(SyntheticConfig(), n_windows=4, events_per_window=4_000, n_users=300, n_products=200, n_advertisers=12,
                     new_users_per_window=30, new_products_per_window=20, new_advertisers_per_window=2, image_size=4)
    source = SyntheticSource(config, tmp_path / "synthetic")
    windows = WindowSpec.covering("weekly", *source.span()).windows()
    graph, seen, counts = None, [], []
    for window in windows:
        catalog = pa.concat_tables([b.table for b in source.catalog(window.end)])
        rels = pa.concat_tables([b.table for b in source.relations(window.end)])
        batches = [b.table for b in source.events(window)]
        seen += batches
        graph, report = build_graph(graph, catalog, rels, batches, to_us(window.end))
        assert not report.excluded and report.events_used == sum(b.num_rows for b in batches)
        scratch, _ = build_graph(None, catalog, rels, seen, to_us(window.end))
        assert_same_graph(graph, scratch)
        counts.append(graph.num_nodes)
    assert counts == sorted(counts) and counts[-1] > counts[0]  # new entities every window
    assert {"impression", "click", "purchase", "parent", "child", "relation", "relation_rev"} <= set(graph.counts_by_type())


def test_node_indices_are_append_only_and_typed():
    g0, r0 = build_graph(None, catalog_at(E0), relations(), events([]), to_us(E0))
    g1, r1 = build_graph(g0, catalog_at(E1), relations(), events([]), to_us(E1))
    assert g0.nodes.entity_id.to_pylist() == ["a1", "c1", "p1", "u1", "u2", "p2"]  # by (first_seen, id)
    assert g1.nodes.entity_id.to_pylist() == g0.nodes.entity_id.to_pylist() + ["u3", "p3"]
    assert (r0.new_nodes, r1.new_nodes) == (6, 2)
    types = ["advertiser", "campaign", "product", "user", "user", "product", "user", "product"]
    assert [NODE_TYPES[t] for t in g1.nodes.node_type] == types
    assert np.array_equal(g1.nodes.hash_codes[:6], g0.nodes.hash_codes)


def test_structural_edges_are_facts_of_the_snapshot():
    rels = relations([("c1", "promotes", "p1", W0), ("p1", "similar_to", "p2", W0 + timedelta(days=2)), ("c1", "promotes", "p2", W0)])
    g0, _ = build_graph(None, catalog_at(E0), rels, events([]), to_us(E0))
    assert g0.relation_names == ("promotes", "similar_to")
    assert edge(g0, "p1", "p2", "relation") == (1.0, to_us(W0 + timedelta(days=2)))
    assert edge(g0, "p2", "p1", "relation_rev") == (1.0, to_us(W0 + timedelta(days=2)))
    assert edge(g0, "p2", "a1", "parent")[1] == to_us(W0 + timedelta(days=1))  # known when the later end was first seen
    p1 = slice(*g0.indptr[g0.nodes.index_of(pa.array(["p1"]))[0]:][:2])
    rel = g0.relation[p1][g0.edge_type[p1] == EDGE_TYPES.index("relation")]
    assert [g0.relation_names[r] for r in rel] == ["similar_to"]  # the relation name stays on the edge
    g1, _ = build_graph(g0, catalog_at(E1), relations([]), events([]), to_us(E1))  # the relation left the catalog: so does the edge
    assert "relation" not in g1.counts_by_type() and g1.counts_by_type()["parent"] == 4


def test_not_interested_is_its_own_edge_type_with_a_positive_weight():
    rows = [("u1", "p1", "not_interested", W0), ("u1", "p1", "click", W0)]
    g, _ = build_graph(None, catalog_at(E0), relations(), events(rows), to_us(E0))
    weight, _ = edge(g, "u1", "p1", "not_interested")
    assert weight > 0 and edge(g, "p1", "u1", "not_interested_rev")[0] == weight
    assert edge(g, "u1", "p1", "click")[0] == pytest.approx(weight)  # stage weights 1 and 1, same time


def test_bad_input_is_counted_never_dropped_silently():
    catalog = pa.concat_tables([catalog_at(E0), catalog_table().filter(pc.equal(catalog_table()["entity_id"], "u3")),
                                catalog_at(E0).slice(0, 1)])  # u3 is first seen after the end; u1 twice
    kinds = catalog.column("entity_type").to_pylist()
    kinds[2] = "robot"  # a1's row: an unknown type
    catalog = catalog.set_column(1, "entity_type", pa.array(kinds))
    good = [("u1", "p1", "click", W0), ("u2", "p2", "purchase", W0 + timedelta(days=2))]
    bad = [("u1", "p9", "click", W0), ("u1", "u1", "click", W0), ("u1", "p1", "bought", W0), ("u1", "p1", "click", E0),
           (None, "p1", "click", W0), ("p1", "p2", "click", W0), ("u1", "u2", "click", W0)]
    rels = relations([("c1", "promotes", "p1", W0), ("c1", "promotes", "c1", W0), ("zz", "promotes", "p1", W0),
                      ("c1", "promotes", "p2", E0)])
    graph, report = build_graph(None, catalog, rels, events(good + bad), to_us(E0))
    assert dict(report.excluded) == {
        "catalog.unknown_type": 1, "catalog.after_window_end": 1, "catalog.duplicate_id": 1,
        "parents.unknown_node": 3,  # p1, p2, c1 point at a1, which was excluded
        "events.null_key": 1, "events.unknown_type": 1, "events.after_window_end": 1, "events.unknown_node": 1, "events.self_loop": 1,
        "events.node_type_mismatch": 2,  # a product as the user, a user as the entity
        "relations.after_window_end": 1, "relations.unknown_node": 1, "relations.self_loop": 1}
    assert (report.events_in, report.events_used) == (9, 2)
    assert graph.counts_by_type() == {"click": 1, "purchase": 1, "click_rev": 1, "purchase_rev": 1, "relation": 1, "relation_rev": 1}


def test_a_known_node_keeps_its_index_and_type():
    g0, _ = build_graph(None, catalog_at(E0), relations(), events([]), to_us(E0))
    catalog = catalog_at(E1)
    kinds = catalog.column("entity_type").to_pylist()
    kinds[4] = "service"  # p1 was a product
    g1, report = build_graph(g0, catalog.set_column(1, "entity_type", pa.array(kinds)), relations(), events([]), to_us(E1))
    assert dict(report.excluded) == {"catalog.type_changed": 1}
    assert g1.nodes.entity_id.to_pylist()[:6] == g0.nodes.entity_id.to_pylist() and NODE_TYPES[g1.nodes.node_type[2]] == "product"


def test_edges_decayed_below_the_floor_expire_and_are_counted():
    config = GraphConfig(min_weight=0.5)
    g0, _ = build_graph(None, catalog_at(E0), relations(), events([("u1", "p1", "click", E0 - timedelta(days=1))]), to_us(E0), config)
    g1, report = build_graph(g0, catalog_at(E1 + timedelta(days=30)), relations(), events([]), to_us(E1 + timedelta(days=30)), config)
    assert report.expired == 2 and "click" not in g1.counts_by_type()  # exp(-38/30) < 0.5, both directions


def test_config_rejects_weights_that_are_not_positive():
    with pytest.raises(ValueError, match="positive"):
        GraphConfig(impression=0.0)
    with pytest.raises(ValueError, match="positive"):
        GraphConfig(tau_days=-1)
    assert GraphConfig().stage_weights.tolist() == [0.1, 1.0, 3.0, 10.0, 2.0, 1.0]
