"""New items placed by their content among window t's warm products: by their nearest neighbours in content (the
default) or through a ridge map from content to the published rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hir_model.embed.entities import EntityEmbeddings
from hir_model.embed.content_map import NEIGHBOURS, fit_content_map, fit_neighbours, place_by_neighbours
from hir_model.embed.entities import EmbedConfig
from hir_model.rank.inductive import InductiveConfig

C, W, N = 12, 8, 60


def world(seed: int = 0):
    """N products whose rows are a fixed linear map of their content (unit rows), 5 users, 4 cold products."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(C, W))
    content = rng.normal(size=(N, C)).astype(np.float32)
    rows = content @ truth
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    types = np.array(["product"] * N + ["user"] * 5, object)
    vectors = np.vstack([rows, rng.normal(size=(5, W))]).astype(np.float32)
    cold = np.zeros(N + 5, bool)
    cold[-9:-5] = True  # four products without an edge: their rows are the single token's, not the map's to learn
    vectors[-9:-5] = rng.normal(size=(4, W))
    ids = np.array([f"p{i}" for i in range(N)] + [f"u{i}" for i in range(5)], object)
    emb = EntityEmbeddings(ids, types, vectors, cold, np.arange(N + 5))
    table = pa.table({"entity_id": list(ids[:N]),
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(content.reshape(-1)), C)})
    return emb, table, truth, rng


def test_the_map_places_new_content_where_the_rows_of_similar_content_are():
    emb, table, truth, rng = world()
    mapping = fit_content_map(emb, table, ridge=1e-4)
    assert mapping.shape == (C, W)
    new = rng.normal(size=(20, C)).astype(np.float32)  # items first seen after t
    got, want = new @ mapping, new @ truth
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.mean() > 0.98 and cos.min() > 0.9  # the direction warm rows take for such content (rows are unit: not linear)
    noisy = fit_content_map(emb, table, ridge=10.0)  # a strong ridge shrinks it toward the mean row
    assert not np.allclose(noisy, mapping, atol=1e-3)


def test_too_few_warm_products_give_no_map():
    emb, table, _, _ = world()
    few = EntityEmbeddings(emb.entity_id, emb.entity_type, emb.vectors, emb.cold_start | (np.arange(len(emb)) >= 9), emb.node)
    assert fit_content_map(few, table, ridge=0.1) is None


def test_the_path_is_checked():
    assert InductiveConfig().new_items == EmbedConfig().new_items == "neighbours"  # served, evaluated and published alike
    for config in (InductiveConfig, EmbedConfig):
        with pytest.raises(ValueError, match="new_items"):
            config(new_items="nearest")


def test_neighbours_place_an_item_among_the_rows_of_the_products_nearest_in_content():
    """Content in two tight clusters whose rows point two ways: a new item is placed where its cluster's rows are, and its
    vector is the softmax-weighted mean of its NEIGHBOURS nearest warm products' rows (by hand), normalised."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(2, C))
    cluster = np.repeat([0, 1], N // 2)
    content = (centres[cluster] + 0.05 * rng.normal(size=(N, C))).astype(np.float32)
    rows = np.where(cluster[:, None] == 0, np.eye(W)[0], np.eye(W)[1]) + 0.1 * rng.normal(size=(N, W))
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    ids = np.array([f"p{i}" for i in range(N)], object)
    emb = EntityEmbeddings(ids, np.array(["product"] * N, object), rows, np.zeros(N, bool), np.arange(N))
    table = pa.table({"entity_id": list(ids), "embedding": pa.FixedSizeListArray.from_arrays(pa.array(content.reshape(-1)), C)})
    fitted = fit_neighbours(emb, table)
    new = (centres[[1, 0]] + 0.05 * rng.normal(size=(2, C))).astype(np.float32)
    got = place_by_neighbours(new, fitted)
    assert got[0] @ np.eye(W)[1] > 0.9 and got[1] @ np.eye(W)[0] > 0.9
    unit = content / np.linalg.norm(content, axis=1, keepdims=True)
    sims = unit @ (new[0] / np.linalg.norm(new[0]))
    top = np.argsort(-sims)[:NEIGHBOURS]
    w = np.exp((sims[top] - sims[top].max()) / 0.05)
    want = (w / w.sum()) @ rows[top]
    np.testing.assert_allclose(got[0], want / np.linalg.norm(want), atol=1e-5)
    few = EntityEmbeddings(ids, emb.entity_type, rows, np.arange(N) >= NEIGHBOURS - 1, np.arange(N))
    assert fit_neighbours(few, table) is None  # fewer warm products than neighbours
