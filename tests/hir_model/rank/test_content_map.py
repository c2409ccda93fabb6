"""New items placed by their content: the ridge map from content to the published rows, fitted on warm products."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hir_model.embed.entities import EntityEmbeddings
from hir_model.embed.content_map import fit_content_map
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
    assert InductiveConfig().new_items == EmbedConfig().new_items == "content_map"  # served, evaluated and published alike
    for config in (InductiveConfig, EmbedConfig):
        with pytest.raises(ValueError, match="new_items"):
            config(new_items="nearest")
