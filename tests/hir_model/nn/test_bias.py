"""The structural bias: tree distances against BFS, values against the tables, gradients into every table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from hir_model.graph.types import SampledBatch
from hir_model.nn.backends import BiasWorkspace, build_dense_bias
from hir_model.nn.batch import collate
from hir_model.nn.bias import StructuralBias, age_bucket, dense_bias, tree_distance
from hir_model.nn.config import EncoderConfig
from hir_model.nn.encoder import Encoder
from tests.hir_model.nn.random_batches import bfs_distances, random_batch


def randomised(cfg: EncoderConfig, seed: int = 0) -> StructuralBias:
    torch.manual_seed(seed)
    bias = StructuralBias(cfg)
    for table in bias.parameters():
        torch.nn.init.normal_(table)
    return bias


def hand_tree() -> tuple[SampledBatch, np.ndarray]:
    """0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; 3 -> {6}: one sequence of 7 tokens, depth 3."""
    parent = np.array([-1, 0, 0, 1, 1, 2, 3])
    ancestors = np.array([[0, -1, -1, -1], [0, 1, -1, -1], [0, 2, -1, -1], [0, 1, 3, -1], [0, 1, 4, -1],
                          [0, 2, 5, -1], [0, 1, 3, 6]])
    sampled, _ = random_batch(np.random.default_rng(0), [7])
    return replace(sampled, depth=np.array([0, 1, 1, 2, 2, 2, 3]), ancestors=ancestors), parent


def test_tree_distance_of_a_hand_built_tree():
    sampled, parent = hand_tree()
    t = StructuralBias(EncoderConfig()).tensors(collate(sampled))
    dist = tree_distance(t)[0]
    assert dist[3, 4] == 2 and dist[3, 5] == 4 and dist[6, 5] == 5 and dist[6, 0] == 3 and dist[6, 6] == 0
    np.testing.assert_array_equal(dist.numpy(), bfs_distances(parent))


@pytest.mark.parametrize("seed", range(5))
def test_tree_distances_used_by_the_bias_equal_bfs_distances(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, 6).tolist()
    sampled, parents = random_batch(rng, lengths, max_depth=3)
    t = StructuralBias(EncoderConfig(max_depth=3)).tensors(collate(sampled), n_global=2)
    dist = tree_distance(t)
    for b, parent in enumerate(parents):
        n = len(parent)
        np.testing.assert_array_equal(dist[b, :n, :n].numpy(), bfs_distances(parent))


def test_bias_values_are_the_sum_of_the_tables():
    cfg = EncoderConfig(max_depth=3)
    rng = np.random.default_rng(7)
    sampled, parents = random_batch(rng, [9, 1, 14], max_depth=3)
    batch, bias, G = collate(sampled), randomised(cfg), 2
    with torch.no_grad():
        dense = dense_bias(bias.tensors(batch, n_global=G))  # (B, H, N, N + G)
        ages = age_bucket(batch.edge_age, cfg.age_unit_s, cfg.age_buckets)
        for b, parent in enumerate(parents):
            n, dist, types = len(parent), torch.from_numpy(bfs_distances(parent)), batch.node_type[b]
            expected = (bias.type_pair[:, types[:n, None], types[None, :n]] + bias.distance[:, dist]
                        + bias.edge[:, batch.edge_type[b, None, :n]] + bias.age[:, ages[b, None, :n]])  # (H, n, n)
            torch.testing.assert_close(dense[b, :, :n, :n], expected)
            global_keys = bias.type_pair[:, types[:n], cfg.global_type, None].expand(-1, -1, G)  # type pair only
            torch.testing.assert_close(dense[b, :, :n, -G:], global_keys)
            assert torch.isneginf(dense[b, :, :, n:dense.shape[-1] - G]).all()  # padding keys are masked


def test_compiled_dense_bias_equals_the_eager_reference():
    sampled, _ = random_batch(np.random.default_rng(3), [5, 1, 20, 13])
    t = randomised(EncoderConfig()).tensors(collate(sampled), n_global=3)
    with torch.no_grad():
        torch.testing.assert_close(build_dense_bias(t, compiled=True), dense_bias(t))


@pytest.mark.parametrize("seed", range(3))
def test_no_grad_bias_in_a_workspace_equals_the_definition_bit_for_bit(seed):
    """Passes without a gradient gather the bias their own way (grid_bias_into); the values must be `bias`'s exactly."""
    rng = np.random.default_rng(seed)
    sampled, _ = random_batch(rng, rng.integers(1, 40, 5).tolist(), max_depth=3)
    t = randomised(EncoderConfig(max_depth=3), seed).tensors(collate(sampled), n_global=2)
    workspace = BiasWorkspace()
    with torch.no_grad():
        fast = build_dense_bias(t, compiled=False, workspace=workspace)
        assert fast.data_ptr() == workspace.buffer.data_ptr()  # written in place, no fresh (B, H, N, Nk) tensor
        assert torch.equal(fast, dense_bias(t))


@pytest.mark.parametrize("compiled", [False, True])
def test_dense_path_gradients_reach_every_bias_table(compiled):
    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig(compile_dense_bias=compiled))  # CPU + grad: the dense backend
    batch = collate(random_batch(np.random.default_rng(4), [6, 11, 3])[0])
    out = encoder(batch, torch.randn(4, encoder.cfg.width))
    (out @ torch.randn(encoder.cfg.width)).sum().backward()
    assert encoder.last_choice.backend == "dense"
    for name in ("type_pair", "distance", "edge", "age"):
        grad = getattr(encoder.bias, name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert encoder.bias.type_pair.grad[:, :, encoder.cfg.global_type].abs().sum() > 0  # global keys' column too


def test_age_buckets_are_log2_of_the_age_in_units():
    hour = 3600.0
    ages = torch.tensor([-5.0, 0.0, 0.5 * hour, hour, 3 * hour, 365 * 86400.0, 1e12])
    assert age_bucket(ages, hour, 16).tolist() == [0, 0, 0, 1, 2, 13, 15]


def test_depth_beyond_the_config_is_refused():
    sampled, _ = random_batch(np.random.default_rng(5), [12], max_depth=3)
    with pytest.raises(ValueError, match="max_depth"):
        StructuralBias(EncoderConfig(max_depth=1)).tensors(collate(sampled))
