"""Assignment math, stable ids, ARI, labels, the super-graph and cold-start embeddings on tiny hand-made cases."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hir_model.embed import EmbedConfig, embed_entities, embeddings_table, read_embeddings
from hir_model.hierarchy import (AssignConfig, HierarchyConfig, adjusted_rand_index, build_hierarchy, distinctive_words,
                                 match_prototypes, soft_assign, super_graph)
from hir_model.train.centroids import primitive_centroids
from tests.hir_model.graph.graphs import AS_OF
from tests.hir_model.retrieval.fixtures import WIDTH, tiny_model, tiny_world


def test_soft_assign_matches_softmax_top_k():
    v = np.array([[1.0, 0.0], [0.6, 0.8]], np.float32)
    p = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], np.float32)
    a = soft_assign(v, p, AssignConfig(temperature=0.5, top_k=2))
    logits = v @ p.T / 0.5
    soft = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_array_equal(a.primitive, [[0, 1], [1, 0]])
    expect = np.sort(soft, 1)[:, ::-1][:, :2]
    np.testing.assert_allclose(a.weight, expect / expect.sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(a.weight.sum(1), 1.0, rtol=1e-6)
    assert a.sizes().tolist() == [1, 1, 0]


def test_primitive_centroids_move_to_their_members_and_reseed_unused_ones_on_request():
    rng = np.random.default_rng(0)
    centre = np.array([[1.0, 1.0, 0.0], [1.0, -1.0, 0.0]]) / np.sqrt(2)
    x = np.concatenate([c + 0.05 * rng.normal(size=(50, 3)) for c in centre]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    protos = np.array([[0.2, 0.3, 1.0], [0.2, -0.3, 1.0], [-1.0, 0.0, 0.0]], np.float32)  # off the data; the third unused
    c = primitive_centroids(x, protos, 5)
    np.testing.assert_allclose(c[:2], centre, atol=0.02)
    np.testing.assert_allclose(c[2], [-1, 0, 0])  # nobody is nearest to it: it stays at its prototype
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(primitive_centroids(x, protos, 0), protos / np.linalg.norm(protos, axis=1, keepdims=True))
    assert (soft_assign(x, c).top == np.repeat([0, 1], 50)).all()
    again = primitive_centroids(x, protos, 5, reseed=True)  # the unused one is re-seeded among the entities
    assert len(np.unique(soft_assign(x, again).top)) == 3
    perm = np.array([2, 0, 1])
    np.testing.assert_allclose(primitive_centroids(x, protos[perm], 5, reseed=True), again[perm], atol=1e-6)  # row order free


def test_top_k_larger_than_levels_keeps_every_primitive():
    a = soft_assign(np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32), AssignConfig(top_k=5))
    assert a.primitive.shape == (2, 2)


def test_stable_ids_follow_permuted_prototypes():
    rng = np.random.default_rng(0)
    prev = rng.normal(size=(6, 8)).astype(np.float32)
    prev_ids = np.array([10, 11, 12, 13, 14, 15])
    perm = rng.permutation(6)
    m = match_prototypes(prev[perm] + 0.01 * rng.normal(size=(6, 8)).astype(np.float32), prev, prev_ids)
    np.testing.assert_array_equal(m.ids, prev_ids[perm])
    assert m.share_matched == 1.0


def test_unmatched_prototypes_get_fresh_ids():
    prev = np.eye(3, 4, dtype=np.float32)
    cur = np.stack([prev[1], -prev[0]])  # one is kept, one points away from every previous prototype
    m = match_prototypes(cur, prev, np.array([5, 6, 7]), min_similarity=0.5)
    assert m.ids.tolist() == [6, 8] and m.matched.tolist() == [True, False] and m.share_matched == 0.5
    assert match_prototypes(cur).ids.tolist() == [0, 1]  # first window: rows are the ids


def test_adjusted_rand_index():
    a = np.array([0, 0, 1, 1, 2, 2])
    assert adjusted_rand_index(a, np.array([5, 5, 3, 3, 9, 9])) == pytest.approx(1.0)  # renaming does not matter
    # sklearn.metrics.adjusted_rand_score([0,0,1,1,2,2],[0,0,1,2,2,2]) = 0.4444...
    assert adjusted_rand_index(a, np.array([0, 0, 1, 2, 2, 2])) == pytest.approx(4 / 9)
    assert adjusted_rand_index(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])) == pytest.approx(-0.5)


def test_labels_pick_distinctive_words():
    texts = ["red shoe sale", "red boot sale", "blue hat sale", "blue cap sale", None]
    labels = distinctive_words(texts, np.array([0, 0, 1, 1, 0]), 2, top=2)
    assert labels[0][0] == "red" and labels[1][0] == "blue"
    assert "sale" not in labels[0] + labels[1]  # in every text: not distinctive


def test_super_graph_spreads_engagement_over_soft_pairs():
    a = soft_assign(np.array([[1, 0], [0, 1], [1, 0]], np.float32), np.eye(2, dtype=np.float32), AssignConfig(temperature=1e-3, top_k=1))
    s = super_graph(a, np.array([0, 0]), np.array([1, 2]), np.array([2.0, 3.0]), np.array([True, False, False]))
    assert sorted(zip(s.src.tolist(), s.dst.tolist(), s.weight.tolist())) == [(0, 0, 3.0), (0, 1, 2.0)]
    assert s.raw_density == pytest.approx(2 / 2) and s.density == pytest.approx(2 / 4)


def test_cold_start_entities_are_embedded_from_content_alone():
    """The single-token path (`new_items="encoder"`; the default places cold-start products among their content
    neighbours' rows instead: tests/hir_model/embed/test_entities.py)."""
    graph, content, types = tiny_world()
    model = tiny_model()
    token = EmbedConfig(new_items="encoder")
    emb = embed_entities(model, graph, AS_OF, content, token)
    cold = emb.entity_id[emb.cold_start].tolist()
    assert "n31" in cold  # the last product: no edge at all
    assert len(emb) == len(types) and np.allclose(np.linalg.norm(emb.vectors, axis=1), 1, atol=1e-5)
    # a single-token sequence: its vector follows its own content and nobody else's
    mat = np.asarray(content["embedding"].combine_chunks().values).reshape(len(types), -1).copy()
    vec = emb.vectors[emb.rows(["n31"])[0]]

    def with_row(i: int) -> np.ndarray:
        m = mat.copy()
        m[i] = -m[i]
        table = content.set_column(2, "embedding", pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), m.shape[1]))
        again = embed_entities(model, graph, AS_OF, table, token)
        return again.vectors[again.rows(["n31"])[0]]

    np.testing.assert_allclose(with_row(0), vec, atol=1e-6)
    assert not np.allclose(with_row(31), vec, atol=1e-3)
    back = read_embeddings(embeddings_table(emb))
    assert back.vectors.shape == (len(types), WIDTH) and back.cold_start.tolist() == emb.cold_start.tolist()


def test_hierarchy_ids_follow_prototypes_across_windows():
    graph, content, _ = tiny_world()
    model = tiny_model()
    emb = embed_entities(model, graph, AS_OF, content)
    protos = [p.numpy() for p in model.prototypes]
    first = build_hierarchy(emb, protos, graph, AS_OF, {})
    perms = [np.random.default_rng(lvl).permutation(len(p)) for lvl, p in enumerate(protos)]
    second = build_hierarchy(emb, [p[perm] for p, perm in zip(protos, perms)], graph, AS_OF, {}, first.tables["primitives"],
                             first.tables["assignments"])
    for lvl, perm in enumerate(perms):
        assert second.ids[lvl].ids.tolist() == perm.tolist()  # row r of window 2 is prototype perm[r] of window 1
        assert second.ari[lvl] == pytest.approx(1.0)
    a, b = first.tables["assignments"], second.tables["assignments"]  # same entities, same stable ids
    assert a.drop(["weight"]).equals(b.drop(["weight"]))
    np.testing.assert_allclose(a["weight"].to_numpy(), b["weight"].to_numpy(), atol=1e-5)
    assert all(s.density_ratio > 1 for s in first.super_graphs)
    assert "| level | primitive |" in first.markdown()
    raw = build_hierarchy(emb, protos, graph, AS_OF, {}, config=HierarchyConfig(centroid_steps=0))
    for a, p in zip(raw.levels, protos):  # no steps: assigned to the prototypes themselves
        np.testing.assert_array_equal(a.top, np.argmax(emb.vectors @ p.T, axis=1))
