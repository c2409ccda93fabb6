"""Embedding in the checkpoint's view (users on its student view when asked), and length-sorted batching that does not
change any entity's vector."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from hir_model.embed import DEFAULT_VIEW, EmbedConfig, embed_defaults, embed_entities, trained_view, user_view
from hir_model.embed.entities import _content_lookup, _with_content, take_sequences
from hir_model.graph.sampler import ViewConfig, sample
from hir_model.nn import collate
from hir_model.train.config import TrainConfig
from tests.hir_model.graph.graphs import AS_OF
from tests.hir_model.retrieval.fixtures import tiny_model, tiny_world


def test_trained_view_reads_the_checkpoint_and_falls_back():
    view = ViewConfig("broad", fanout=(3, 2), max_age_days=7.0)
    extra = {"train_config": TrainConfig(broad=view).to_dict()}
    assert trained_view(extra) == view and isinstance(trained_view(extra).fanout, tuple)
    assert trained_view({}) == DEFAULT_VIEW == TrainConfig().broad  # a bare checkpoint: TrainConfig's teacher view
    assert trained_view({"train_config": {"broad": asdict(view)}}) == view


def test_take_sequences_reorders_whole_sequences():
    graph, _, _ = tiny_world()
    batch = sample(graph, np.arange(12), AS_OF, DEFAULT_VIEW, np.random.default_rng(0))
    order = np.argsort(batch.lengths, kind="stable")
    sub = take_sequences(batch, order)
    back = take_sequences(sub, np.argsort(order))
    for name in ("offsets", "seeds", "node", "hash_codes", "node_type", "depth", "ancestors", "edge_type", "edge_age"):
        np.testing.assert_array_equal(getattr(back, name), getattr(batch, name), err_msg=name)
    assert (np.diff(sub.lengths) >= 0).all()


def test_batch_composition_does_not_change_embeddings():
    """A sequence's vector depends on its own tokens only: sorted, regrouped batches give the same rows."""
    graph, content, _ = tiny_world()
    model = tiny_model()
    lookup = _content_lookup(graph, content, model.encoder.cfg.content_dim)
    batch = sample(graph, np.arange(35), AS_OF, DEFAULT_VIEW, np.random.default_rng(1))
    with torch.inference_mode():
        whole = model.encoder(collate(_with_content(batch, lookup))).numpy()  # (35, W)
        order = np.argsort(batch.lengths, kind="stable")
        parts = [model.encoder(collate(_with_content(take_sequences(batch, order[i:i + 8]), lookup))).numpy()
                 for i in range(0, 35, 8)]
    np.testing.assert_allclose(np.concatenate(parts), whole[order], atol=1e-5)
    small = embed_entities(model, graph, AS_OF, content, EmbedConfig(batch_size=4, sort_chunk=8))
    big = embed_entities(model, graph, AS_OF, content, EmbedConfig(batch_size=256))
    assert small.entity_id.tolist() == big.entity_id.tolist()
    assert np.isfinite(small.vectors).all() and np.allclose(np.linalg.norm(small.vectors, axis=1), 1, atol=1e-5)


def test_the_student_view_for_users_reads_the_checkpoint_without_its_edge_drop():
    narrow = ViewConfig("narrow", fanout=(4, 2), max_age_days=10.0, edge_drop=0.3)
    extra = {"train_config": TrainConfig(narrow=narrow).to_dict()}
    assert trained_view(extra, "narrow") == narrow
    assert user_view(extra) == ViewConfig("narrow", fanout=(4, 2), max_age_days=10.0, edge_drop=0.0)
    assert user_view({}) == replace(TrainConfig().narrow, edge_drop=0.0)  # a bare checkpoint: TrainConfig's student view
    with pytest.raises(ValueError, match="one of"):
        trained_view(extra, "teacher")


def test_users_on_the_narrow_view_change_user_rows_only():
    """users="narrow": the other entities' rows are what embedding them alone in the broad view gives, the users' what
    embedding the users alone on the narrow view gives (one sampler pass per view), and the view changes warm users'."""
    graph, content, _ = tiny_world()
    model = tiny_model()
    narrow = ViewConfig("narrow", fanout=(3, 2), max_age_days=2.0)
    broad = embed_entities(model, graph, AS_OF, content, EmbedConfig(view=DEFAULT_VIEW))
    mixed = embed_entities(model, graph, AS_OF, content, EmbedConfig(view=DEFAULT_VIEW, users="narrow", user_view=narrow))
    users = embed_entities(model, graph, AS_OF, content, EmbedConfig(view=narrow, entity_types=("user",)))
    others = embed_entities(model, graph, AS_OF, content, EmbedConfig(view=DEFAULT_VIEW, entity_types=("product", "advertiser")))
    assert mixed.entity_id.tolist() == broad.entity_id.tolist()
    is_user = mixed.entity_type == "user"
    warm_users = is_user & ~mixed.cold_start
    assert warm_users.sum() >= 3 and (~is_user).sum() >= 3
    np.testing.assert_array_equal(mixed.vectors[~is_user], others.vectors[others.rows(mixed.entity_id[~is_user])])
    np.testing.assert_array_equal(mixed.vectors[is_user], users.vectors[users.rows(mixed.entity_id[is_user])])
    assert not np.allclose(mixed.vectors[warm_users], broad.vectors[warm_users], atol=1e-4)


def test_embed_defaults_take_hir_toml_fields_and_refuse_unknown_ones():
    assert embed_defaults({"users": "narrow", "batch_size": 32}) == EmbedConfig(users="narrow", batch_size=32)
    assert embed_defaults(None) == EmbedConfig()
    with pytest.raises(ValueError, match=r"unknown fields \['user'\]"):
        embed_defaults({"user": "narrow"})
    with pytest.raises(ValueError, match="users must be one of"):
        embed_defaults({"users": "student"})


@pytest.mark.parametrize("path", ["neighbours", "content_map"])
def test_cold_start_products_with_content_take_their_contents_place(path):
    """Cold-start products with content are placed from the warm products' rows by their content (the path's function,
    fitted on the single-token run's warm rows); every other row is the single-token or neighbourhood vector it was."""
    from hir_model.content import to_matrix
    from hir_model.embed.content_map import fit_content_map, fit_neighbours, place, place_by_neighbours

    graph, content, _ = tiny_world()
    model = tiny_model()
    token = embed_entities(model, graph, AS_OF, content, EmbedConfig(new_items="encoder"))
    placed = embed_entities(model, graph, AS_OF, content, EmbedConfig(new_items=path))
    matrix, valid = to_matrix(content.column("embedding"))
    row = {e: i for i, e in enumerate(content.column("entity_id").to_pylist())}
    has = np.array([e in row and valid[row[e]] for e in token.entity_id])
    moved = token.cold_start & (token.entity_type == "product") & has
    assert moved.sum() >= 1 and (~token.cold_start & (token.entity_type == "product")).sum() >= 10
    np.testing.assert_array_equal(placed.vectors[~moved], token.vectors[~moved])
    x = matrix[[row[e] for e in token.entity_id[moved]]]
    want = (place_by_neighbours(x, fit_neighbours(token, content)) if path == "neighbours"
            else place(x, fit_content_map(token, content)))
    np.testing.assert_allclose(placed.vectors[moved], want, atol=1e-6)
    assert not np.allclose(placed.vectors[moved], token.vectors[moved], atol=1e-3)
