"""The graph on the real MovieLens-100K + KG data (fetched once into $HIR_DATA_DIR or <repo>/data), first windows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from hir_model.data.movielens import MovieLensSource
from hir_model.data.windows import WindowSpec
from hir_model.graph.audit import audit_graph
from hir_model.graph.build import build_graph
from hir_model.graph.sampler import BROAD, NARROW, sample_views
from hir_model.graph.window import to_us
from tests.hir_model.graph.graphs import assert_same_graph, check_batch

REPO = Path(__file__).resolve().parents[3]
WINDOWS = 6


@pytest.fixture(scope="module")
def built():
    source = MovieLensSource(Path(os.environ.get("HIR_DATA_DIR", REPO / "data")))
    source.prepare()
    graphs, tables, previous = [], [], None
    for window in WindowSpec.covering("weekly", *source.span()).windows()[:WINDOWS]:
        catalog = pa.concat_tables([b.table for b in source.catalog(window.end)])
        relations = pa.concat_tables([b.table for b in source.relations(window.end)])
        events = [b.table for b in source.events(window)]
        previous, report = build_graph(previous, catalog, relations, events, to_us(window.end))
        graphs.append((window, previous, report))
        tables.append((catalog, relations, events))
    return graphs, tables


def test_movielens_windows_build_clean_and_grow(built):
    graphs, _ = built
    previous = None
    for window, graph, report in graphs:
        assert not report.excluded, (window.key, dict(report.excluded))
        audit = audit_graph(graph, to_us(window.end), previous.nodes if previous is not None else None)
        assert audit.leaks == 0 and audit.bad_weights == 0 and audit.untyped_nodes == 0 and audit.node_count_ok
        previous = graph
    counts = graph.counts_by_type()
    assert counts["click"] == counts["click_rev"] and counts["purchase"] > 0 and counts["relation"] > 10_000  # KG triples
    assert counts["parent"] > 0 and set(graph.nodes.counts_by_type()) == {"user", "advertiser", "product", "kg_entity"}
    assert any(name.startswith("film.film.") for name in graph.relation_names)


def test_movielens_incremental_equals_from_scratch(built):
    (graphs, tables) = built
    window, graph, _ = graphs[-1]
    catalog, relations, _ = tables[-1]
    scratch, _ = build_graph(None, catalog, relations, [e for _, _, events in tables for e in events], to_us(window.end))
    assert_same_graph(graph, scratch)


def test_movielens_views_respect_the_cutoff(built):
    window, graph, _ = built[0][-1]
    rng = np.random.default_rng(0)
    users = np.flatnonzero(graph.nodes.node_type == 0)
    cutoff = graph.as_of_us - 3 * 86_400 * 1_000_000  # mid-window: the last days' edges are invisible
    narrow, broad = sample_views(graph, rng.choice(users, 64), cutoff, rng)
    for batch, view in ((narrow, NARROW), (broad, BROAD)):
        check_batch(graph, batch, view, cutoff)
        assert batch.lengths.mean() > 1
