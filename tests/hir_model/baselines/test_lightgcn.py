from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.baselines.lightgcn import LightGCN, LightGCNConfig, _MeanPropagation, normalised_adjacency, propagate
from hir_model.baselines.popularity import Popularity
from hir_model.protocol.metrics import ranking_metrics
from tests.hir_model.baselines.planted import as_cold, planted, top1

torch.set_num_threads(1)


def _dense_a_hat(user, item, n_users, n_items):
    n = n_users + n_items
    a = np.zeros((n, n))
    a[user, n_users + item] = a[n_users + item, user] = 1.0
    d = a.sum(1)
    inv = np.zeros(n)
    inv[d > 0] = d[d > 0] ** -0.5
    return inv[:, None] * a * inv[None, :]


def test_propagation_equals_the_closed_form():
    user, item = np.array([0, 0, 1, 2, 2, 2, 3]), np.array([0, 1, 1, 2, 3, 4, 0])  # item 5 is isolated
    n_u, n_i, K = 4, 6, 3
    a_hat = _dense_a_hat(user, item, n_u, n_i)
    assert np.allclose(normalised_adjacency(user, item, n_u, n_i).toarray(), a_hat)
    e0 = np.random.default_rng(0).normal(size=(n_u + n_i, 5))
    final = propagate(normalised_adjacency(user, item, n_u, n_i), torch.tensor(e0, dtype=torch.float32), K).mean(0)
    closed = sum(np.linalg.matrix_power(a_hat, k) @ e0 for k in range(K + 1)) / (K + 1)  # (1/(K+1)) sum_k A^k E0
    np.testing.assert_allclose(final.numpy(), closed, rtol=1e-5, atol=1e-5)


def test_gradient_equals_the_dense_reference():
    user, item = np.array([0, 1, 1, 2]), np.array([0, 0, 2, 1])
    a_hat = torch.tensor(_dense_a_hat(user, item, 3, 3), dtype=torch.float32)
    w = torch.randn(6, 4)
    e_sparse = torch.randn(6, 4, requires_grad=True)
    e_dense = e_sparse.detach().clone().requires_grad_(True)
    (propagate(normalised_adjacency(user, item, 3, 3), e_sparse, 2).mean(0) * w).sum().backward()
    layers = [e_dense, a_hat @ e_dense, a_hat @ (a_hat @ e_dense)]
    (torch.stack(layers).mean(0) * w).sum().backward()
    torch.testing.assert_close(e_sparse.grad, e_dense.grad)


def test_fused_mean_propagation_matches_the_layerwise_one_forward_and_backward():
    user, item = np.array([0, 0, 1, 2, 2, 2, 3]), np.array([0, 1, 1, 2, 3, 4, 0])
    adj = normalised_adjacency(user, item, 4, 6)
    w = torch.randn(10, 5)
    fused = torch.randn(10, 5, requires_grad=True)
    layerwise = fused.detach().clone().requires_grad_(True)
    out_fused = _MeanPropagation.apply(fused, adj, 3)
    out_layerwise = propagate(adj, layerwise, 3).mean(0)
    torch.testing.assert_close(out_fused, out_layerwise)
    (out_fused * w).sum().backward()
    (out_layerwise * w).sum().backward()
    torch.testing.assert_close(fused.grad, layerwise.grad)


def test_lightgcn_beats_popularity_on_planted_clusters():
    data = planted(seed=1)
    gcn = LightGCN(LightGCNConfig(dim=16, steps=300, batch_size=512, lr=0.02))
    gcn.fit(data.train, data.items)
    pop = Popularity()
    pop.fit(data.train, data.items)
    recall = {}
    for m in (gcn, pop):
        recall[m.name] = ranking_metrics(m.score(data.queries, data.items), data.targets, data.queries.context,
                                         (5,), (5,)).recall[5]
    assert recall["lightgcn"] > 0.6 and recall["lightgcn"] > recall["popularity"] + 0.2, recall
    assert gcn.losses[-1] < gcn.losses[0]
    # warm users' favourite and cold users' (folded in from the same context) both sit in their own cluster
    for queries in (data.queries, as_cold(data.queries)):
        best = top1(gcn.score(queries, data.items), queries)
        assert np.mean(data.item_cluster[best] == data.user_cluster) > 0.9


def test_items_first_seen_later_get_one_constant_score():
    data = planted(n_clusters=2, users_per=6, items_per=4)
    gcn = LightGCN(LightGCNConfig(dim=8, steps=5))
    gcn.fit(data.train, data.items)
    items = data.items
    wider = type(items)(np.append(items.ids, ["new1", "new2"]), items.n_known, np.append(items.parent, [-1, -1]), items.parent_ids)
    scores = gcn.score(data.queries, wider)
    assert scores.shape == (len(data.queries), len(items) + 2) and np.all(scores[:, -2:] == scores[0, -1])


@pytest.mark.parametrize("later_first", [True, False])
def test_warm_start_only_from_an_earlier_window(later_first):
    import dataclasses
    data = planted(n_clusters=2, users_per=6, items_per=4)
    gcn = LightGCN(LightGCNConfig(dim=8, steps=7, warm_steps=3))
    early = data.train
    late = dataclasses.replace(early, end_us=early.end_us + 1)
    first, second = (late, early) if later_first else (early, late)
    gcn.fit(first, data.items)
    gcn.fit(second, data.items)
    assert len(gcn.losses) == (7 if later_first else 3)
