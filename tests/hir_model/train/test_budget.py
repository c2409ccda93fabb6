"""The epoch budget, the pair batch (replay, shared negatives) and the named budgets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hir_model.graph.types import NODE_TYPES
from hir_model.train.config import BUDGETS, TrainConfig, set_fields, with_overrides
from hir_model.train.data import ENGAGEABLE_CODES, pair_order, step_batch
from hir_model.train.loss import engagement_loss
from hir_model.train.trainer import train_window
from tests.hir_model.train.tiny import tiny_config, tiny_data


def budget_config(**kw) -> TrainConfig:
    return tiny_config(**{"epochs": 2.0, "pair_batch": 16, "shared_negatives": 8, "replay_share": 0.25, "logq_correction": True,
                          **kw})


def test_an_epoch_budget_sets_the_step_count_from_the_windows_pairs():
    cfg = budget_config()  # 12 of the 16 pairs a step are the window's own
    assert cfg.budget.replay_pairs == 4 and cfg.budget.window_steps(72) == 12 and cfg.budget.window_steps(0) == 1
    assert set_fields(cfg, max_steps=5).budget.window_steps(72) == 5
    assert set_fields(cfg, epochs=0.0).budget.window_steps(72) == cfg.budget.steps  # no budget: the fixed count
    with pytest.raises(ValueError, match="needs pair_batch"):
        set_fields(TrainConfig(), epochs=1.0)
    with pytest.raises(ValueError, match="replay_share"):
        set_fields(TrainConfig(), pair_batch=8, replay_share=1.0)


def test_a_root_budget_grows_with_the_square_root_of_the_windows_pairs():
    cfg = set_fields(TrainConfig(), root_steps=5.0)  # 64 seeds a step, half of them pairs: 32 of the window's pairs
    b = cfg.budget
    assert b.step_pairs == 32
    assert b.window_steps(32 * 100) == 50 and b.window_steps(32 * 400) == 100  # 4x the pairs, 2x the steps
    assert b.window_steps(0) == 1 and b.window_steps(20_000) == 125 and b.window_steps(200_000) == 396
    assert set_fields(cfg, max_steps=60).budget.window_steps(32 * 400) == 60
    assert set_fields(cfg, root_steps=0.0).budget.window_steps(32 * 400) == cfg.budget.steps
    with pytest.raises(ValueError, match="one budget rule"):
        set_fields(cfg, epochs=1.0, pair_batch=16)
    with pytest.raises(ValueError, match="root_steps must be"):
        set_fields(TrainConfig(), root_steps=-1.0)


def test_every_pair_is_seen_once_an_epoch():
    data, _ = tiny_data()
    cfg = budget_config()
    n = len(data.pair_user)
    order = pair_order(data, cfg, window_seed=3, steps=cfg.budget.window_steps(n))  # (steps, 12): 2 epochs of 72 pairs
    assert order.shape == (12, 12)
    first, second = order.reshape(-1)[:n], order.reshape(-1)[n:]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n)) and not np.array_equal(first, second)
    np.testing.assert_array_equal(order, pair_order(data, cfg, window_seed=3, steps=12))  # seeded


def test_a_pair_batch_holds_window_pairs_replayed_edges_and_shared_negatives():
    data, _ = tiny_data()
    cfg = budget_config()
    order = pair_order(data, cfg, 0, 12)
    sb = step_batch(data, cfg, 0, 0, order[0])
    pb, b = sb.pair_batch, sb.seeds
    assert b == cfg.budget.batch_size and sb.narrow.num_sequences == b + 2 * cfg.budget.pair_batch + cfg.budget.shared_negatives
    nodes = sb.narrow.seeds[b:]
    users, entities, negs = nodes[:16], nodes[16:32], nodes[32:]
    np.testing.assert_array_equal(users[:12], data.pair_user[order[0]])  # the window's own pairs, in epoch order
    np.testing.assert_array_equal(entities[:12], data.pair_entity[order[0]])
    node_type = np.asarray(data.graph.nodes.node_type, np.int64)
    assert (node_type[users] == NODE_TYPES.index("user")).all()
    assert np.isin(node_type[entities], ENGAGEABLE_CODES).all() and np.isin(node_type[negs], ENGAGEABLE_CODES).all()
    ru, re, _ = data.replay  # replayed rows are engagement edges of the graph
    edges = set(zip(ru.tolist(), re.tolist()))
    assert all((u, e) in edges for u, e in zip(users[12:], entities[12:]))
    np.testing.assert_array_equal(pb.neg_is_pos, entities[:, None] == negs[None, :])
    log_u, log_e = data.stream_log_q(cfg.budget.replay_share)
    np.testing.assert_allclose(pb.log_q, np.stack([log_u[users], log_e[entities]]))
    assert np.isclose(np.exp(log_e).sum(), 1.0) and np.isclose(np.exp(log_u).sum(), 1.0)


def test_shared_negatives_join_each_users_softmax_corrected_and_without_its_own_entity():
    g = torch.Generator().manual_seed(0)
    u, e, n = (F.normalize(torch.randn(k, 8, generator=g), dim=-1) for k in (3, 3, 4))
    sign, w = torch.ones(3), torch.tensor([1.0, 2.0, 0.5])
    log_q = torch.log(torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]]))
    neg_q = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    own = torch.zeros(3, 4, dtype=torch.bool)
    own[1, 2] = True
    logits = u @ e.T / 0.1
    extra = (u @ n.T / 0.1 - neg_q[None, :]).masked_fill(own, float("-inf"))
    to_e = torch.cat([logits - log_q[1][None, :], extra], 1)
    ce = (F.cross_entropy(to_e, torch.arange(3), reduction="none")
          + F.cross_entropy(logits.T - log_q[0][None, :], torch.arange(3), reduction="none")) / 2
    got = engagement_loss(u, e, sign, 0.1, log_q, weight=w, negatives=n, neg_log_q=neg_q, neg_is_pos=own)
    torch.testing.assert_close(got, (ce * w).sum() / w.sum())
    # unit weights and no negatives: the plain term
    torch.testing.assert_close(engagement_loss(u, e, sign, 0.1, log_q, weight=torch.ones(3)), engagement_loss(u, e, sign, 0.1, log_q))


def test_a_budgeted_window_trains_its_steps_reproducibly_and_lowers_the_held_out_loss():
    data, _ = tiny_data()
    cfg = budget_config(encoder=replace(tiny_config().encoder, id_table_rows=1024))
    a, b = train_window(data, cfg), train_window(data, cfg)
    assert a.window_steps == 12 and len(a.losses) == 12
    assert a.weights_digest == b.weights_digest and a.losses == b.losses
    assert a.held_out_final < a.held_out_start


def test_a_budgeted_run_killed_midway_resumes_to_the_same_weights(tmp_path):
    data, _ = tiny_data()
    cfg = budget_config(epochs=1.0)
    whole = train_window(data, cfg, tmp_path / "whole.pt", window="w")
    train_window(data, cfg, tmp_path / "cut.pt", window="w", stop_after=5)
    resumed = train_window(data, cfg, tmp_path / "cut.pt", window="w")
    assert resumed.resumed_from == 5 and resumed.window_steps == whole.window_steps == 6
    assert resumed.weights_digest == whole.weights_digest


def test_named_budgets_expand_before_the_fields_beside_them():
    cfg = with_overrides(TrainConfig(), {"budget": "cpu", "encoder": {"strength_buckets": 24}, "max_steps": 7})
    assert cfg.budget.epochs == BUDGETS["cpu"]["epochs"] and cfg.budget.pair_batch == BUDGETS["cpu"]["pair_batch"] and cfg.budget.max_steps == 7
    assert cfg.encoder.id_table_rows == BUDGETS["cpu"]["encoder"]["id_table_rows"] and cfg.encoder.strength_buckets == 24
    assert with_overrides(TrainConfig(), {"budget": "full"}).budget.epochs >= 1
    with pytest.raises(ValueError, match="unknown training budget 'huge'"):
        with_overrides(TrainConfig(), {"budget": "huge"})


def test_views_take_field_overrides_and_reject_unknown_ones():
    cfg = with_overrides(TrainConfig(), {"narrow": {"fanout": [12, 3], "max_age_days": 28.0}})
    assert cfg.narrow.fanout == (12, 3) and cfg.narrow.max_age_days == 28.0
    assert cfg.narrow.edge_drop == TrainConfig().narrow.edge_drop and cfg.broad == TrainConfig().broad  # the rest kept
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # a checkpoint's config reads back
    with pytest.raises(ValueError, match="fanot"):
        with_overrides(TrainConfig(), {"broad": {"fanot": [4]}})
    with pytest.raises(ValueError, match="name"):
        with_overrides(TrainConfig(), {"narrow": {"name": "broad"}})
