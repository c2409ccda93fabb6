from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from hir_model.nn.batch import collate
from tests.hir_model.nn.random_batches import random_batch


def test_collate_pads_sequences_and_keeps_every_token():
    sampled, _ = random_batch(np.random.default_rng(0), [3, 1, 5], content_dim=4)
    batch = collate(sampled)
    assert batch.node_type.shape == (3, 5) and batch.hash_codes.shape == (3, 5, 16) and batch.content.shape == (3, 5, 4)
    assert batch.lengths.tolist() == [3, 1, 5] and batch.valid.sum().item() == 9
    valid = batch.valid.numpy()
    np.testing.assert_array_equal(batch.node_type.numpy()[valid], sampled.node_type)
    np.testing.assert_array_equal(batch.ancestors.numpy()[valid], sampled.ancestors)
    np.testing.assert_array_equal(batch.hash_codes.numpy()[valid], sampled.hash_codes)
    assert (batch.ancestors.numpy()[~valid] == -1).all() and not batch.has_content.numpy()[~valid].any()
    np.testing.assert_array_equal(batch.has_content.numpy()[valid], sampled.has_content)
    assert (batch.content.numpy()[~batch.has_content.numpy()] == 0).all()  # no stale values where there is no content
    assert batch.to("cpu").lengths.tolist() == [3, 1, 5]


def test_collate_without_content():
    sampled, _ = random_batch(np.random.default_rng(1), [2, 2])
    batch = collate(sampled)
    assert batch.content is None and not batch.has_content.any()


def test_collate_refuses_empty_sequences_and_non_seed_starts():
    sampled, _ = random_batch(np.random.default_rng(2), [2, 3])
    with pytest.raises(ValueError, match="at least its seed"):
        collate(replace(sampled, offsets=np.array([0, 0, 5])))
    depth = sampled.depth.copy()
    depth[2] = 1
    with pytest.raises(ValueError, match="seed"):
        collate(replace(sampled, depth=depth))


def test_collate_dtypes():
    batch = collate(random_batch(np.random.default_rng(3), [4])[0])
    assert batch.hash_codes.dtype == torch.int64 and batch.edge_age.dtype == torch.float32 and batch.has_content.dtype == torch.bool


def test_a_batch_with_codes_in_the_node_table_collates_to_the_same_tensors_as_one_with_codes_per_token():
    """The sampler leaves hash codes in the graph's node table and writes narrow integer columns; collate gathers the
    codes straight into the padded layout and widens the rest to int64: the same tensors as the per-token, int64 form."""
    from hir_model.graph.sampler import BROAD, sample
    from tests.hir_model.graph.graphs import random_graph

    graph = random_graph(np.random.default_rng(4))
    sampled = sample(graph, np.arange(graph.num_nodes), graph.as_of_us, BROAD, np.random.default_rng(5))
    assert sampled.hash_codes is None and sampled.code_table is not None and sampled.depth.dtype == np.int8
    wide = replace(sampled, hash_codes=sampled.token_codes, code_table=None,
                   **{f: getattr(sampled, f).astype(np.int64) for f in ("node_type", "depth", "ancestors", "edge_type")})
    assert (sampled.lengths > 1).any() and (sampled.lengths < sampled.lengths.max()).any()  # padding is exercised
    for keep_node in (False, True):
        a, b = collate(sampled, keep_node=keep_node), collate(wide, keep_node=keep_node)
        for f in ("hash_codes", "node_type", "depth", "ancestors", "edge_type", "edge_age", "strength", "node"):
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None) == (f == "node" and not keep_node), f
            if x is not None:
                assert x.dtype == y.dtype and torch.equal(x, y), f
