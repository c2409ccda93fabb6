from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.graph.hashing import HashConfig, hash_codes
from hir_model.nn.batch import collate
from hir_model.nn.config import EncoderConfig
from hir_model.nn.embedding import DeepHashEmbedding, TokenEmbedding, strength_bucket
from tests.hir_model.nn.random_batches import random_batch


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("vocabulary", [1_000, 100_000_000])
def test_deep_hash_parameters_do_not_depend_on_the_vocabulary(vocabulary):
    cfg = EncoderConfig()
    ids = np.random.default_rng(0).choice(vocabulary, 1_000, replace=False)
    codes = torch.from_numpy(hash_codes([f"product:{i}" for i in ids], HashConfig.k, HashConfig.buckets))
    dhe = DeepHashEmbedding(cfg)
    with torch.no_grad():
        vectors = dhe(codes)  # (1000, width)
    assert vectors.shape == (1_000, cfg.width) and torch.isfinite(vectors).all()
    assert torch.unique(vectors, dim=0).shape[0] == 1_000  # distinct ids, distinct vectors
    expected = (cfg.hash_codes + 1) * cfg.hash_hidden + (cfg.hash_hidden + 1) * cfg.hash_hidden + (cfg.hash_hidden + 1) * cfg.width
    assert n_params(dhe) == expected  # 1 thousand or 100 million ids: the same ~100k parameters, no per-id row


def test_deep_hash_codes_are_scaled_to_unit_interval_even_if_negative():
    dhe = DeepHashEmbedding(EncoderConfig(hash_codes=3, hash_buckets=1000))
    x = dhe.encode(torch.tensor([[0, 999, -1]]))
    torch.testing.assert_close(x, torch.tensor([[-1.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="hash codes"):
        dhe(torch.zeros(2, 5, dtype=torch.int64))


def test_token_embedding_uses_content_where_present_and_the_no_content_vector_elsewhere():
    cfg = EncoderConfig(content_dim=4, strength_buckets=24)
    embed = TokenEmbedding(cfg)
    batch = collate(random_batch(np.random.default_rng(1), [6, 3], content_dim=4)[0])
    with torch.no_grad():
        x = embed(batch)
        base = embed.ids(batch.hash_codes) + embed.types(batch.node_type) + embed.strength.weight[0]  # no strength: bucket 0
        content = embed.content(batch.content)
    assert x.shape == (2, 6, cfg.width)
    has = batch.has_content
    torch.testing.assert_close(x[has], (base + content)[has])
    torch.testing.assert_close(x[~has], (base + embed.no_content)[~has])


def test_token_embedding_without_content_config():
    embed = TokenEmbedding(EncoderConfig(strength_buckets=24))
    batch = collate(random_batch(np.random.default_rng(2), [2], content_dim=4)[0])  # content is ignored
    assert embed.content is None
    with torch.no_grad():
        torch.testing.assert_close(embed(batch), embed.ids(batch.hash_codes) + embed.types(batch.node_type) + embed.no_content
                                   + embed.strength.weight[0])


def test_strength_buckets_are_log2_from_one_with_zero_for_none():
    s = torch.tensor([0.0, -1.0, 1e-9, 2.0 ** -8, 0.9, 1.0, 3.0, 1e9])
    assert strength_bucket(s, 24).tolist() == [0, 0, 1, 1, 8, 9, 10, 23]


def test_token_strength_moves_the_embedding_and_old_configs_have_none():
    from dataclasses import replace as dc_replace
    from hir_model.train.config import TrainConfig, with_overrides
    embed = TokenEmbedding(EncoderConfig(strength_buckets=24))
    sampled = random_batch(np.random.default_rng(3), [4])[0]
    with torch.no_grad():
        none = embed(collate(sampled))
        some = embed(collate(dc_replace(sampled, strength=np.full(len(sampled.node), 3.0, np.float32))))
        torch.testing.assert_close(some - none, (embed.strength.weight[10] - embed.strength.weight[0]).expand_as(some))
    old = with_overrides(TrainConfig(), {"encoder": {"strength_buckets": 24}}).to_dict()
    assert TrainConfig.from_dict(old).encoder.strength_buckets == 24
    del old["encoder"]["strength_buckets"]  # a checkpoint's config from before the strength embedding
    assert TrainConfig.from_dict(old).encoder.strength_buckets == 0
    assert TokenEmbedding(EncoderConfig(strength_buckets=0)).strength is None
    with pytest.raises(ValueError, match="strength_bucket"):
        with_overrides(TrainConfig(), {"encoder": {"strength_bucket": 24}})


def test_a_structural_encoding_adds_its_projection_and_old_configs_have_none():
    from dataclasses import replace as dc_replace
    from hir_model.train.config import TrainConfig, with_overrides
    embed = TokenEmbedding(EncoderConfig(structure_dim=8))
    sampled = random_batch(np.random.default_rng(4), [5, 2])[0]
    s = np.random.default_rng(5).standard_normal((len(sampled.node), 8)).astype(np.float32)
    with torch.no_grad():
        none = embed(collate(sampled))
        zeros = embed(collate(dc_replace(sampled, structure=np.zeros_like(s))))
        some = embed(collate(dc_replace(sampled, structure=s)))
        torch.testing.assert_close(zeros, none)  # no place in the graph: nothing added (no bias)
        batch = collate(dc_replace(sampled, structure=s))
        torch.testing.assert_close((some - none)[batch.valid], embed.structure(batch.structure)[batch.valid])
    with pytest.raises(ValueError, match="structural encodings have 4 dims"):
        embed(collate(dc_replace(sampled, structure=s[:, :4])))
    old = with_overrides(TrainConfig(), {"encoder": {"structure_dim": 8}}).to_dict()
    assert TrainConfig.from_dict(old).encoder.structure_dim == 8
    del old["encoder"]["structure_dim"]  # a checkpoint's config from before the structural encoding
    assert TrainConfig.from_dict(old).encoder.structure_dim == 0 and TokenEmbedding(EncoderConfig()).structure is None
    with pytest.raises(ValueError, match="structure_dim must be >= 0"):
        EncoderConfig(structure_dim=-1)


def test_the_hashed_id_table_starts_at_zero_learns_per_id_and_skips_nodes_without_engagement():
    from dataclasses import replace as dc_replace
    rows = 1 << 12
    plain, tabled = TokenEmbedding(EncoderConfig(strength_buckets=24)), TokenEmbedding(EncoderConfig(strength_buckets=24, id_table_rows=rows))
    tabled.load_state_dict(plain.state_dict(), strict=False)
    sampled = random_batch(np.random.default_rng(4), [5, 3])[0]
    engaged = dc_replace(sampled, strength=np.where(np.arange(len(sampled.node)) % 2 == 0, 1.0, 0.0).astype(np.float32))
    batch = collate(engaged)
    with torch.no_grad():
        torch.testing.assert_close(tabled(batch), plain(batch))  # zero at start: a fresh table changes nothing
    tabled(batch).sum().backward()
    grad = tabled.id_table.rows.weight.grad  # (rows, W)
    codes = torch.from_numpy(engaged.hash_codes[engaged.strength > 0])
    touched = torch.unique(torch.remainder(codes[:, :2], rows))
    assert set(torch.nonzero(grad.abs().sum(-1)).squeeze(1).tolist()) == set(touched.tolist())  # only engaged nodes' rows
    with torch.no_grad():
        tabled.id_table.rows.weight.add_(1.0)
        moved = tabled(batch) - plain(batch)  # (B, N, W): 2 rows of +1 each where engaged, nothing elsewhere
    valid = torch.arange(batch.node_type.shape[1])[None, :] < torch.tensor([5, 3])[:, None]
    strength = batch.strength
    on, off = moved[valid & (strength > 0)], moved[valid & (strength == 0)]
    torch.testing.assert_close(on, torch.full_like(on, 2.0))
    torch.testing.assert_close(off, torch.zeros_like(off))


@pytest.mark.parametrize("rows", [1 << 10, 1 << 14])
def test_the_hashed_id_table_size_is_fixed_by_its_rows_not_the_vocabulary(rows):
    embed = TokenEmbedding(EncoderConfig(id_table_rows=rows))
    assert embed.id_table.rows.weight.shape == (rows, EncoderConfig().width)
    assert n_params(embed) - n_params(TokenEmbedding(EncoderConfig())) == rows * EncoderConfig().width
    with pytest.raises(ValueError, match="id_table_hashes"):
        EncoderConfig(id_table_rows=rows, id_table_hashes=0)
    old = EncoderConfig(id_table_rows=rows).__dict__ | {}
    del old["id_table_rows"]  # a checkpoint's config from before the id table
    assert EncoderConfig.from_dict(old).id_table_rows == 0
