"""The causal sampler: no edge later than the cutoff, tree layout and ancestors, weighted draws without replacement."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from hir_model.graph.sampler import BROAD, NARROW, ViewConfig, sample, sample_views
from hir_model.graph.types import EDGE_TYPES
from tests.hir_model.graph.graphs import AS_OF, DAY_US, TAU_S, US, check_batch, make_graph, random_graph

DRAWS = dict(scan_degree=0)  # every node through the weighted-draw path
VIEWS = [NARROW, BROAD, replace(NARROW, name="narrow-draws", **DRAWS), replace(BROAD, name="broad-draws", scan_degree=3),
         ViewConfig("small", (3, 2, 2), max_age_days=30.0, edge_drop=0.3, scan_degree=4)]


def test_property_no_edge_later_than_cutoff_over_random_graphs():
    rng = np.random.default_rng(0)
    for i in range(150):
        graph = random_graph(rng)
        cutoff = AS_OF - int(rng.integers(0, 60 * DAY_US)) if i % 3 else AS_OF
        seeds = rng.integers(0, graph.num_nodes, int(rng.integers(1, 12)))
        for view in VIEWS:
            check_batch(graph, sample(graph, seeds, cutoff, view, rng), view, cutoff)


def tree_distances_bfs(parent_local: np.ndarray) -> np.ndarray:
    n = len(parent_local)
    adj = [[] for _ in range(n)]
    for t, p in enumerate(parent_local):
        if p >= 0:
            adj[t].append(p), adj[p].append(t)
    out = np.full((n, n), -1)
    for s in range(n):
        out[s, s], queue = 0, deque([s])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if out[s, v] < 0:
                    out[s, v] = out[s, u] + 1
                    queue.append(v)
    return out


def tree_distances_from_ancestors(anc: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """d(q, k) = depth[q] + depth[k] - 2 * lca_depth, lca_depth = common ancestor prefix length - 1: O(N D) data."""
    same = (anc[:, None, :] == anc[None, :, :]) & (anc[:, None, :] >= 0)  # [N, N, D+1]
    prefix = np.cumprod(same, axis=2).sum(axis=2)
    return depth[:, None] + depth[None, :] - 2 * (prefix - 1)


def test_tree_distances_from_ancestors_equal_bfs_distances():
    rng = np.random.default_rng(1)
    view = ViewConfig("small", (3, 2, 2), scan_degree=4)
    checked = 0
    for _ in range(40):
        graph = random_graph(rng)
        batch = sample(graph, rng.integers(0, graph.num_nodes, 4), AS_OF, view, rng)
        for b in range(batch.num_sequences):
            lo, hi = batch.offsets[b], batch.offsets[b + 1]
            anc, depth = batch.ancestors[lo:hi], batch.depth[lo:hi]
            parent_local = np.where(depth > 0, anc[np.arange(hi - lo), np.maximum(depth - 1, 0)], -1)
            assert np.array_equal(tree_distances_from_ancestors(anc, depth), tree_distances_bfs(parent_local))
            checked += hi - lo
    assert checked > 500


def star(weights, types=None, ts=None, **kw):
    """Node 0 linked to nodes 1..n with the given weights (forward type click unless told)."""
    n = len(weights)
    return make_graph(n + 1, np.zeros(n), np.arange(1, n + 1), types or ["click"] * n, weights,
                      ts if ts is not None else np.full(n, AS_OF - DAY_US), **kw)


@pytest.mark.parametrize("scan_degree", [64, 0], ids=["scan", "draws"])
def test_neighbours_are_drawn_without_replacement_in_proportion_to_weight(scan_degree):
    rng = np.random.default_rng(2)
    graph = star([1.0, 2.0, 7.0])
    seeds = np.zeros(20_000, np.int64)
    one = sample(graph, seeds, AS_OF, ViewConfig("one", (1,), scan_degree=scan_degree), rng)
    freq = np.bincount(one.node[one.depth == 1], minlength=4)[1:] / len(seeds)
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.7], atol=0.015)
    two = sample(graph, seeds, AS_OF, ViewConfig("two", (2,), scan_degree=scan_degree), rng)
    assert np.all(two.lengths == 3)  # two distinct neighbours per seed, never the same twice
    missing = 6 - (two.node[two.depth == 1].reshape(-1, 2).sum(1))  # the neighbour left out
    # successive sampling: P(leave out 1) = P({2, 3}) = .7 * 2/3 + .2 * 7/8
    assert abs(np.mean(missing == 1) - (0.7 * 2 / 3 + 0.2 * 7 / 8)) < 0.015


@pytest.mark.parametrize("scan_degree", [64, 0], ids=["scan", "draws"])
def test_a_neighbour_weighs_its_summed_edges_and_the_edge_type_is_drawn_by_weight(scan_degree):
    rng = np.random.default_rng(3)
    graph = make_graph(3, [0, 0, 0], [1, 1, 2], ["click", "purchase", "click"], [1.0, 3.0, 4.0], np.full(3, AS_OF - DAY_US))
    batch = sample(graph, np.zeros(20_000, np.int64), AS_OF, ViewConfig("one", (1,), scan_degree=scan_degree), rng)
    picked, etype = batch.node[batch.depth == 1], batch.edge_type[batch.depth == 1]
    assert abs(np.mean(picked == 1) - 0.5) < 0.015
    assert abs(np.mean(etype[picked == 1] == EDGE_TYPES.index("purchase")) - 0.75) < 0.02


@pytest.mark.parametrize("scan_degree", [64, 0], ids=["scan", "draws"])
def test_engagement_weights_decay_to_the_cutoff_and_structural_ones_do_not(scan_degree):
    rng = np.random.default_rng(4)
    old = AS_OF - 60 * DAY_US
    graph = star([1.0, 1.0], types=["click", "parent"], ts=np.array([old, old]))
    cutoff = AS_OF - int(TAU_S * US)  # one tau earlier: the click weighed e times more then
    batch = sample(graph, np.zeros(20_000, np.int64), cutoff, ViewConfig("one", (1,), scan_degree=scan_degree), rng)
    assert abs(np.mean(batch.node[batch.depth == 1] == 1) - np.e / (1 + np.e)) < 0.015


def test_only_edges_up_to_the_cutoff_and_narrow_only_recent_engagement():
    ts = np.array([AS_OF - 40 * DAY_US, AS_OF - 2 * DAY_US, AS_OF - 40 * DAY_US, AS_OF - DAY_US])
    graph = star([1.0, 1.0, 1.0, 1.0], types=["click", "click", "parent", "purchase"], ts=ts)
    rng = np.random.default_rng(5)
    seeds = np.zeros(50, np.int64)
    early = sample(graph, seeds, AS_OF - 3 * DAY_US, BROAD, rng)
    assert set(early.node[early.depth == 1].tolist()) == {1, 3}  # nodes 2 and 4 joined after the cutoff
    narrow = sample(graph, seeds, AS_OF, replace(NARROW, edge_drop=0.0), rng)
    assert set(narrow.node[narrow.depth == 1].tolist()) == {2, 3, 4}  # the 40-day-old click is hidden, the parent fact is not


def test_edge_drop_hides_the_same_edges_for_every_seed_of_a_call():
    graph = star(np.ones(200))
    rng = np.random.default_rng(6)
    view = ViewConfig("drop", (200,), edge_drop=0.5)
    counts = [np.unique(sample(graph, np.zeros(5, np.int64), AS_OF, view, rng).lengths) for _ in range(20)]
    assert all(len(c) == 1 for c in counts)
    assert abs(np.mean([c[0] - 1 for c in counts]) - 100) < 10


def test_views_share_seeds_and_sampling_is_reproducible():
    graph = random_graph(np.random.default_rng(7))
    seeds = np.arange(graph.num_nodes)
    narrow, broad = sample_views(graph, seeds, AS_OF, np.random.default_rng(8))
    assert np.array_equal(narrow.seeds, broad.seeds) and narrow.ancestors.shape[1] == 3 and broad.ancestors.shape[1] == 4
    again = sample_views(graph, seeds, AS_OF, np.random.default_rng(8))
    assert all(np.array_equal(a.node, b.node) and np.array_equal(a.edge_type, b.edge_type) for a, b in zip((narrow, broad), again))
    with pytest.raises(IndexError):
        sample(graph, [graph.num_nodes], AS_OF, NARROW, np.random.default_rng(0))


def test_strength_sums_engagement_weights_as_of_the_cutoff_and_travels_with_the_tokens():
    ts = np.array([AS_OF - 40 * DAY_US, AS_OF - 2 * DAY_US, AS_OF - 40 * DAY_US, AS_OF - DAY_US])
    graph = star([1.0, 2.0, 5.0, 4.0], types=["click", "click", "parent", "purchase"], ts=ts)
    # node 0: its three engagement edges (the parent fact is structural); leaves: their one edge's weight (reverse edge)
    np.testing.assert_allclose(graph.strength, [7.0, 1.0, 2.0, 0.0, 4.0])
    early = AS_OF - 3 * DAY_US  # the click 2 days ago and the purchase a day ago come later: not counted
    np.testing.assert_allclose(graph.strength_at(np.array([0, 2, 4, -1]), early), [1.0, 0.0, 0.0, 0.0])
    batch = sample(graph, np.zeros(4, np.int64), early, BROAD, np.random.default_rng(0))
    np.testing.assert_allclose(batch.strength, graph.strength_at(batch.node, early))
    batch = sample(graph, np.zeros(4, np.int64), AS_OF, BROAD, np.random.default_rng(0))
    np.testing.assert_allclose(batch.strength, graph.strength[batch.node])
