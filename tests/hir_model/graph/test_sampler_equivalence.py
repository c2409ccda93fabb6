"""The vectorised sampler against the exact distribution and against the sampler it replaced (reference_sampler):
weight-proportional successive sampling, the same tokens per depth and the same node frequencies, exact alias tables;
and against its own earlier output (batches pinned by hash), so that making it faster never changes a batch."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import fields, replace

import numpy as np
import pytest

from hir_model.graph import sampler as new
from hir_model.graph import visible
from hir_model.graph.pick import Call, _by_row_then_key, _rank, _uniform_hash
from hir_model.graph.sampler import BROAD, NARROW, ViewConfig
from hir_model.graph.visible import TABLES_PER_GRAPH, _alias, visible_edges
from tests.hir_model.graph import reference_sampler as old
from tests.hir_model.graph.graphs import AS_OF, DAY_US, FORWARD, check_batch, make_graph, random_graph

# every path of the new sampler: scans only, draws then more draws then a scan (scan_degree 0, one draw per slot)
PATHS = {"scan": dict(scan_degree=10**9), "draws": dict(scan_degree=0, draws_per_slot=1), "default": {}}


def inclusion_exact(w: np.ndarray, k: int) -> np.ndarray:
    """P(item i is among the first k of a successive weighted sample without replacement), by enumerating sequences."""
    p = np.zeros(len(w))
    for seq in itertools.permutations(range(len(w)), k):
        left, prob = w.sum(), 1.0
        for i in seq:
            prob *= w[i] / left
            left -= w[i]
        p[list(seq)] += prob
    return p


def hub(weights, extra_edges: int = 0):
    """Node 0 linked to 1..n; node n+1.. give node 1 a second path (node 1 -> them) so depth 2 has choices."""
    n = len(weights)
    src, dst = list(np.zeros(n, int)), list(range(1, n + 1))
    for j in range(extra_edges):
        src.append(1), dst.append(n + 1 + j)
    w = list(weights) + [1.0 + j for j in range(extra_edges)]
    return make_graph(n + 1 + extra_edges, src, dst, ["click"] * len(src), w, np.full(len(src), AS_OF - DAY_US))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_inclusion_frequencies_match_successive_sampling_exactly(path, k):
    w = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 0.25])
    graph = hub(w)
    seeds = np.zeros(20_000, np.int64)
    batch = new.sample(graph, seeds, AS_OF, ViewConfig("v", (k,), **PATHS[path]), np.random.default_rng(k))
    assert np.all(batch.lengths == 1 + k)
    freq = np.bincount(batch.node[batch.depth == 1], minlength=len(w) + 1)[1:] / len(seeds)
    np.testing.assert_allclose(freq, inclusion_exact(w, k), atol=0.015)


@pytest.mark.parametrize("path", PATHS)
def test_the_first_pick_and_the_order_within_a_parent_follow_the_weights(path):
    w = np.array([1.0, 3.0, 6.0])
    graph = hub(w)
    batch = new.sample(graph, np.zeros(20_000, np.int64), AS_OF, ViewConfig("v", (2,), **PATHS[path]), np.random.default_rng(0))
    first = batch.node[batch.offsets[:-1] + 1]  # each sequence's first child: draw order
    np.testing.assert_allclose(np.bincount(first, minlength=4)[1:] / 20_000, w / w.sum(), atol=0.015)


def test_the_parent_is_never_drawn_back_and_depth_two_is_weighted_among_the_rest():
    # depth 1 is always node 1 (one neighbour); from node 1 the seed is on the path, so depth 2 picks among 2..4 by weight
    graph = make_graph(5, [0, 1, 1, 1], [1, 2, 3, 4], ["click"] * 4, [50.0, 1.0, 2.0, 7.0], np.full(4, AS_OF - DAY_US))
    for path in PATHS.values():
        batch = new.sample(graph, np.zeros(20_000, np.int64), AS_OF, ViewConfig("v", (1, 1), **path), np.random.default_rng(1))
        deep = batch.node[batch.depth == 2]
        assert len(deep) == 20_000 and not np.any(deep == 0)
        np.testing.assert_allclose(np.bincount(deep, minlength=5)[2:] / 20_000, [0.1, 0.2, 0.7], atol=0.015)


def node_frequencies(sample, graph, view, seeds, rng) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per depth per seed, node frequency per depth) over one batch."""
    batch = sample(graph, seeds, AS_OF, view, rng)
    depths = len(view.fanout) + 1
    per_depth = np.bincount(batch.depth, minlength=depths) / len(seeds)
    freq = np.stack([np.bincount(batch.node[batch.depth == d], minlength=graph.num_nodes) for d in range(depths)]) / len(seeds)
    return per_depth, freq


@pytest.mark.parametrize("view", [BROAD, replace(NARROW, edge_drop=0.0), ViewConfig("tight", (2, 2), scan_degree=0, draws_per_slot=1)],
                         ids=["broad", "narrow", "tight-draws"])
def test_old_and_new_agree_on_tokens_per_depth_and_node_frequencies(view):
    """The old sampler with every node scanned (its exact path: its draws kept what they found when they ran out) against
    the new one on its own paths."""
    rng = np.random.default_rng(11)
    for _ in range(3):
        graph = random_graph(rng)
        seeds = np.repeat(np.arange(graph.num_nodes), 3000 // graph.num_nodes + 1)
        n_old, f_old = node_frequencies(old.sample, graph, replace(view, scan_degree=10**9), seeds, np.random.default_rng(1))
        n_new, f_new = node_frequencies(new.sample, graph, view, seeds, np.random.default_rng(2))
        np.testing.assert_allclose(n_new, n_old, rtol=0.03, atol=0.02)
        # each node's expected number of tokens per seed, per depth: the same within sampling noise
        gap = np.abs(f_new - f_old) - (0.04 + 0.05 * f_old)
        assert gap.max() <= 0, f"depth, node {np.unravel_index(gap.argmax(), gap.shape)}: {f_new.flat[gap.argmax()]} vs {f_old.flat[gap.argmax()]}"


def test_every_sampled_edge_is_a_visible_edge_of_the_graph_on_every_path():
    rng = np.random.default_rng(3)
    views = [ViewConfig(f"{name}-{v.name}", v.fanout, v.max_age_days, v.edge_drop, **p)
             for name, p in PATHS.items() for v in (NARROW, BROAD, ViewConfig("small", (3, 2, 2), 30.0, 0.3))]
    for i in range(60):
        graph = random_graph(rng)
        cutoff = AS_OF - int(rng.integers(0, 60 * DAY_US)) if i % 2 else AS_OF
        seeds = rng.integers(0, graph.num_nodes, int(rng.integers(1, 12)))
        for view in views:
            check_batch(graph, new.sample(graph, seeds, cutoff, view, rng), view, cutoff)


def test_alias_tables_reproduce_each_nodes_weights_exactly():
    rng = np.random.default_rng(4)
    for trial in range(100):
        deg = rng.integers(0, 12, int(rng.integers(1, 30)))
        indptr = np.concatenate([[0], np.cumsum(deg)])
        seg = np.repeat(np.arange(len(deg)), deg)
        log_w = rng.normal(0, 2, len(seg))
        if trial % 3 == 0:
            log_w = np.round(log_w)  # ties: weights equal to the mean
        prob, alias = _alias(indptr, seg, log_w)
        assert np.all(seg[alias] == seg) and np.all((prob >= 0) & (prob <= 1))
        mass = prob.copy()
        np.add.at(mass, alias, 1 - prob)  # each slot is 1/deg of its node: what it keeps plus what it gives its alias
        for v in np.flatnonzero(deg):
            lo, hi = indptr[v], indptr[v + 1]
            w = np.exp(log_w[lo:hi])
            np.testing.assert_allclose(mass[lo:hi] / deg[v], w / w.sum(), atol=1e-12)


def test_sampling_is_deterministic_given_the_rng_and_tables_are_kept_per_cutoff():
    graph = random_graph(np.random.default_rng(5))
    seeds = np.arange(graph.num_nodes)
    a = new.sample(graph, seeds, AS_OF, BROAD, np.random.default_rng(9))
    b = new.sample(graph, seeds, AS_OF, BROAD, np.random.default_rng(9))
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("node", "edge_type", "ancestors", "edge_age", "offsets"))
    assert visible_edges(graph, AS_OF, None) is visible_edges(graph, AS_OF, None)
    for d in range(TABLES_PER_GRAPH + 2):
        visible_edges(graph, AS_OF - d * DAY_US, 7.0)
    assert len(visible._TABLES[graph]) == TABLES_PER_GRAPH


def batch_digest(batch) -> str:
    """sha256 of every field of a batch: name, dtype, shape and bytes; integer columns as int64 and the hash codes per
    token, as the sampler at 9d8e473 wrote them (narrower dtypes and codes left in the node table carry the same values)."""
    h = hashlib.sha256()
    for f in fields(batch):
        value = batch.token_codes if f.name == "hash_codes" else getattr(batch, f.name)
        if f.name == "code_table":
            continue
        if isinstance(value, np.ndarray):
            value = value.astype(np.int64) if value.dtype.kind in "iu" else value
            h.update(f"{f.name}:{value.dtype.str}:{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif value is not None:
            h.update(f"{f.name}={value}".encode())
    return h.hexdigest()


def test_batches_are_bit_for_bit_those_of_the_sampler_the_demo_ran_with():
    """Speed-ups must not move the demo's figures: the same seeds and RNG give the same batches (and so the same RNG
    use) as the sampler at 9d8e473. A hub graph reaches every path: draws, the all-pairs, looped and sorted
    duplicate checks, rows that stop drawing once full, second rounds, scans, edge drop and max age."""
    rng = np.random.default_rng(2025)
    n, m = 700, 30_000
    src = (rng.pareto(1.2, m) * 20).astype(np.int64) % n
    dst = (src + 1 + (rng.pareto(1.0, m) * 30).astype(np.int64)) % n
    hubs = make_graph(n, src, dst, rng.choice(FORWARD, m), rng.lognormal(0, 1.5, m), AS_OF - rng.integers(0, 90 * DAY_US, m),
                      node_type=rng.integers(0, 6, n))
    views = [NARROW, BROAD, ViewConfig("wide", (40, 3), 30.0, 0.1), ViewConfig("draws", (6, 3, 2), None, 0.3, scan_degree=0,
                                                                                 draws_per_slot=1)]
    digests = []
    for i, view in enumerate(views):
        for j, cutoff in enumerate((AS_OF, AS_OF - 20 * DAY_US)):
            seeds = np.random.default_rng(10 * i + j).integers(0, n, 300)
            digests.append(batch_digest(new.sample(hubs, seeds, cutoff, view, np.random.default_rng(100 + 10 * i + j)))[:16])
    rng = np.random.default_rng(7)
    for i in range(6):
        graph = random_graph(rng)
        for view in views:
            digests.append(batch_digest(new.sample(graph, np.arange(graph.num_nodes), AS_OF - i * 5 * DAY_US, view,
                                                   np.random.default_rng(i)))[:16])
    assert digests[:4] == ["5f7619247fc53848", "fddfa3642696ed4c", "a1afc45945efbc88", "a9e958dedd205223"]
    assert hashlib.sha256("".join(digests).encode()).hexdigest()[:16] == "a41e0aa1e57168bc"


def test_the_scan_order_is_lexsorts_with_ties_kept_in_input_order():
    rng = np.random.default_rng(12)
    for trial in range(50):
        rows = int(rng.integers(1, 40))
        row = np.sort(rng.integers(0, rows, int(rng.integers(0, 300))))
        key = rng.gumbel(size=len(row))
        if trial % 3 == 0:
            key = np.round(key)  # ties
        assert np.array_equal(_by_row_then_key(row, key, rows), np.lexsort((-key, row)))
    group = np.sort(rng.integers(0, 30, 500))
    assert np.array_equal(_rank(group), np.arange(len(group)) - np.searchsorted(group, group))


@pytest.mark.parametrize("drop", [0.2, 0.5, 1 / 3, 1e-9, 1 - 2**-52])
def test_edge_drop_as_an_integer_compare_is_the_float_compare(drop):
    call = Call(None, None, np.uint64(12345), drop, scan_degree=16, draws_per_slot=2)
    edge = np.arange(200_000)
    z = _uniform_hash(edge, call.nonce)
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    assert np.array_equal(call.kept(edge), u >= drop)
