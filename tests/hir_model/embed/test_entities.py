"""Embedding in the checkpoint's view, and length-sorted batching that does not change any entity's vector."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from hir_model.embed import DEFAULT_VIEW, EmbedConfig, embed_entities, trained_view
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
