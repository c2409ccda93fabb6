"""Structural encodings (FastRP of the engagement graph): who shares engagement shares direction, knowledge-graph and
never-engaged nodes get none, rows follow ids not positions, and edges after the cutoff are never read."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from hir_model.graph.csr import NodeTable
from hir_model.graph.hashing import hash_codes
from hir_model.graph.structure import random_signs
from hir_model.graph.types import NODE_TYPES
from tests.hir_model.graph.graphs import AS_OF, DAY_US, make_graph

USER, PRODUCT, KG = (NODE_TYPES.index(t) for t in ("user", "product", "kg_entity"))
# users 0-4, films 5-9, one knowledge-graph node (10) linked to film 5 by a relation
EDGES = [(0, 5), (0, 6), (1, 5), (1, 6), (2, 6), (2, 7), (3, 8), (3, 9), (4, 8)]
TYPES = [USER] * 5 + [PRODUCT] * 5 + [KG]


def graph(order: np.ndarray | None = None, recent_last: bool = False, drop_last: bool = False):
    """The graph above; `order` renumbers node i as order[i] (same ids, other positions)."""
    edges = EDGES[:-1] if drop_last else EDGES
    src = [u for u, _ in edges] + [10]
    dst = [i for _, i in edges] + [5]
    ts = [AS_OF - 10 * DAY_US] * len(edges) + [AS_OF - 30 * DAY_US]
    if recent_last and not drop_last:
        ts[len(edges) - 1] = AS_OF - DAY_US
    kinds = ["click"] * len(edges) + ["relation"]
    weight = [1.0] * len(src)
    order = np.arange(11) if order is None else order
    g = make_graph(11, order[src], order[dst], kinds, weight, ts, node_type=np.asarray(TYPES)[np.argsort(order)])
    ids = [f"n{i}" for i in np.argsort(order)]  # make_graph names node i "n{i}": the ids move with their nodes
    return replace(g, nodes=NodeTable(pa.array(ids), g.nodes.node_type, g.nodes.first_seen_us, hash_codes(ids, 2, 1000)))


def cos(a, b) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_shared_engagement_is_shared_direction_and_unengaged_nodes_have_none():
    e = graph().structure_until(AS_OF, 256)
    assert e.shape == (11, 256) and e.dtype == np.float32
    np.testing.assert_allclose(e[0], e[1], atol=1e-6)  # the same films, the same weights: the same place
    assert cos(e[0], e[2]) > 0.5 > cos(e[0], e[4]) + 0.3  # a shared film vs another component
    assert cos(e[5], e[6]) > 0.5  # films rated by the same users
    assert not e[10].any()  # the knowledge-graph node: relation edges are not engagement
    np.testing.assert_allclose(np.linalg.norm(e[:10], axis=1), 1.0, rtol=1e-5)


def test_rows_follow_ids_not_node_positions():
    order = np.random.default_rng(0).permutation(11)
    a, b = graph().structure_until(AS_OF, 32), graph(order).structure_until(AS_OF, 32)
    np.testing.assert_allclose(b[order], a, atol=1e-6)  # node i there is node order[i] here: the same vector
    codes = graph().nodes.hash_codes
    np.testing.assert_array_equal(random_signs(codes[[3, 1]], 16), random_signs(codes, 16)[[3, 1]])
    assert set(np.unique(random_signs(codes, 16) * 4)) == {-1.0, 1.0}


def test_edges_after_the_cutoff_are_not_read():
    recent = graph(recent_last=True)  # user 4 -> film 8 happened a day before as_of
    before = recent.structure_at(np.arange(11), AS_OF - 2 * DAY_US, 32)
    np.testing.assert_allclose(before, graph(drop_last=True).structure_until(AS_OF, 32), atol=1e-6)
    assert not before[4].any() and recent.structure_at(np.array([4, -1]), AS_OF, 32)[0].any()
    assert not recent.structure_at(np.array([-1]), AS_OF, 32).any()  # -1 (no node): zeros
    with pytest.raises(ValueError, match="dim >= 1"):
        recent.structure_until(AS_OF, 0)


def test_ids_sharing_a_first_hash_code_still_get_their_own_rows():
    codes = np.array([[7, 1, 2], [7, 1, 3], [7, 1, 2]])  # the first two codes collide, the last differs
    rows = random_signs(codes, 64)
    assert not np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[2])
