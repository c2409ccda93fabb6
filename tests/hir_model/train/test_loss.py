"""The loss pieces on tiny tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hir_model.train.config import (FIELD_GROUP, GROUPS, TrainConfig, lr_schedule, momentum_schedule, parse_overrides,
                                    set_fields, with_overrides)
from hir_model.rank.artefacts import trained_prior_scale
from hir_model.train.loss import DistillationLoss, engagement_loss, parent_assignment, sinkhorn, usage_stats

CFG = set_fields(TrainConfig(), levels=(2, 4), batch_size=8, steps=10)


def test_targets_are_balanced_over_the_batch():
    loss = DistillationLoss(CFG)
    # every sample prefers prototype 0: balanced targets still give prototype 1 half of the batch's mass
    scores = [torch.tensor([[0.9, 0.1], [0.8, 0.3], [0.7, 0.6], [0.95, 0.0]]), torch.rand(4, 4)]
    t = loss.targets(scores)
    assert torch.allclose(t[0].sum(-1), torch.ones(4), atol=1e-5)
    plain = F.softmax(scores[0] / CFG.teacher.sinkhorn_eps, -1).sum(0)[1]  # unbalanced: prototype 1 gets ~0.5 of 4 samples
    assert t[0].sum(0)[1] > 1.2 > plain  # balanced (3 iterations): far closer to its equal share of 2
    assert t[0][2, 1] > t[0][3, 1]  # the sample closest to prototype 1 takes most of its share
    assert not list(loss.state_dict())  # nothing to carry between steps


def test_sinkhorn_matches_its_definition_on_a_tiny_case():
    s = torch.tensor([[0.2, 0.4, 0.0], [0.1, 0.0, 0.3]])
    q = sinkhorn(s, eps=0.5, iters=200)
    assert torch.allclose(q.sum(-1), torch.ones(2), atol=1e-4) and torch.allclose(q.sum(0), torch.full((3,), 2 / 3), atol=1e-4)
    # the solution is diag(u) exp(s / eps) diag(v): log-ratios across rows equal the score differences / eps
    r = torch.log(q[0] / q[1]) - (s[0] - s[1]) / 0.5
    assert torch.allclose(r, r[0].expand(3), atol=1e-3)


def test_distill_is_minimal_when_the_student_agrees():
    loss = DistillationLoss(CFG)
    target = [F.one_hot(torch.tensor([0, 1]), 2).float(), F.one_hot(torch.tensor([1, 3]), 4).float()]
    good = [torch.tensor([[1.0, -1.0], [-1.0, 1.0]]), torch.tensor([[-1.0, 1, -1, -1], [-1, -1, -1, 1.0]])]
    bad = [-g for g in good]
    assert loss.distill(good, target) < 0.01 < loss.distill(bad, target)


def test_consistency_rewards_a_fine_assignment_inside_its_parent():
    loss = DistillationLoss(CFG)
    coarse = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    fine = torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]])  # fine 0, 1 under coarse 0; 2, 3 under 1
    parent = parent_assignment(fine, coarse, 0.1)
    assert parent.argmax(-1).tolist() == [0, 0, 1, 1]
    z = F.normalize(torch.tensor([[1.0, 0.05]]), dim=-1)
    agree = [z @ F.normalize(coarse, dim=-1).T, z @ F.normalize(fine, dim=-1).T]
    disagree = [agree[0].flip(-1), agree[1]]
    assert loss.consistency(agree, [coarse, fine]) < loss.consistency(disagree, [coarse, fine])


def test_swap_asks_each_side_of_a_positive_pair_for_the_others_code():
    loss = DistillationLoss(CFG)
    # rows 0, 1: users; rows 2, 3: the entities they engaged with (pairs (0, 2) and (1, 3)); one level of 2 prototypes
    target = [F.one_hot(torch.tensor([0, 1, 1, 0]), 2).float()]  # each user's code differs from its entity's
    swapped = [torch.tensor([[-1.0, 1.0], [1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])]  # each row predicts its partner's code
    own = [-swapped[0]]  # each row predicts its own code
    sign = torch.tensor([1, 1])
    assert loss.swap(swapped, target, 2, sign) < 0.01 < loss.swap(own, target, 2, sign)
    assert loss.swap(own, target, 2, torch.tensor([-1, -1])) == 0  # explicit negatives are no pair of one interest
    assert loss.swap(own, target, 0, sign[:0]) == 0


def test_engagement_pulls_pairs_and_pushes_explicit_negatives():
    u = F.normalize(torch.eye(3), dim=-1)
    matched, shuffled = engagement_loss(u, u, torch.ones(3), 0.1), engagement_loss(u, u.roll(1, 0), torch.ones(3), 0.1)
    assert matched < shuffled
    neg = torch.tensor([1, 1, -1])
    close, far = engagement_loss(u, u, neg, 0.1), engagement_loss(u, torch.cat([u[:2], -u[2:]]), neg, 0.1)
    assert far < close  # a not_interested pair is better apart


def test_usage_stats():
    assert usage_stats(torch.tensor([0, 1, 2, 3]), 4) == (1.0, 1.0)
    e, share = usage_stats(torch.tensor([0, 0, 0, 0]), 4)
    assert e == 0.0 and share == 0.25


def test_schedules_are_precomputed_arrays():
    m, lr = momentum_schedule(CFG), lr_schedule(CFG)
    assert m.shape == lr.shape == (10,) and m[0] == CFG.teacher.momentum_start and abs(m[-1] - CFG.teacher.momentum_end) < 1e-12
    assert (lr > 0).all() and lr.max() <= CFG.optim.lr


def test_benchmark_overrides_parse_json_values_and_name_bad_ones():
    cfg = with_overrides(TrainConfig(), parse_overrides(["lr=0.005", "global_tokens=false", "levels=[4, 12, 36]"]))
    assert (cfg.optim.lr, cfg.prototypes.global_tokens, cfg.prototypes.levels) == (0.005, False, (4, 12, 36))
    with pytest.raises(ValueError, match="'steps'"):
        parse_overrides(["steps"])
    with pytest.raises(ValueError, match="not JSON"):
        parse_overrides(["backend=dense"])


def test_a_config_with_fields_from_a_newer_version_is_refused_by_name():
    d = TrainConfig().to_dict()
    assert TrainConfig.from_dict(d) == TrainConfig()
    d["future_knob"] = 1
    with pytest.raises(ValueError, match=r"does not know: \['future_knob'\]"):
        TrainConfig.from_dict(d)
    d = TrainConfig().to_dict()
    d["optim"]["future_knob"] = 1
    with pytest.raises(ValueError, match=r"does not know: \['optim.future_knob'\]"):
        TrainConfig.from_dict(d)


def test_flat_field_names_reach_their_group_and_the_dict_round_trips():
    cfg = with_overrides(TrainConfig(), {"lr": 0.005, "steps": 20, "seed": 3, "swap_weight": 1.0, "sinkhorn_iters": 5,
                                         "levels": [4, 12], "broad": TrainConfig().narrow})
    assert (cfg.optim.lr, cfg.budget.steps, cfg.runtime.seed, cfg.objective.swap_weight, cfg.teacher.sinkhorn_iters,
            cfg.prototypes.levels, cfg.broad) == (0.005, 20, 3, 1.0, 5, (4, 12), TrainConfig().narrow)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg == TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['learning_rate'\]"):
        with_overrides(cfg, {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="multiple of 2 \\* shards"):  # a rule spanning groups still holds
        set_fields(cfg, shards=3)


def test_a_checkpoints_flat_config_from_before_the_groups_reads_as_the_same_config():
    cfg = with_overrides(TrainConfig(), {"lr": 0.005, "steps": 20, "levels": [4, 12], "logq_correction": True})
    flat = {k: v for group in GROUPS for k, v in cfg.to_dict()[group].items()}
    flat |= {k: cfg.to_dict()[k] for k in ("narrow", "broad", "encoder")}
    assert len(flat) == len(FIELD_GROUP) + 3 and TrainConfig.from_dict(flat) == cfg
    assert trained_prior_scale({"train_config": flat}) == trained_prior_scale({"train_config": cfg.to_dict()}) == 0.1


def test_logq_correction_subtracts_each_sides_draw_log_probability_from_the_logits():
    u, e = F.normalize(torch.tensor([[1.0, 0.2], [0.3, 1.0]]), dim=-1), F.normalize(torch.tensor([[1.0, 0.0], [0.5, 1.0]]), dim=-1)
    sign = torch.ones(2)
    flat = torch.log(torch.full((2, 2), 0.5))
    torch.testing.assert_close(engagement_loss(u, e, sign, 0.1, flat), engagement_loss(u, e, sign, 0.1))  # a constant shift
    log_q = torch.log(torch.tensor([[0.3, 0.7], [0.9, 0.1]]))  # rows: the users' draw probabilities, the entities'
    logits = u @ e.T / 0.1
    expected = (F.cross_entropy(logits - log_q[1][None, :], torch.arange(2))
                + F.cross_entropy(logits.T - log_q[0][None, :], torch.arange(2))) / 2
    torch.testing.assert_close(engagement_loss(u, e, sign, 0.1, log_q), expected)


def test_a_pairs_log_q_is_the_draw_probability_of_its_user_and_of_its_entity():
    from tests.hir_model.train.tiny import tiny_data
    data, _ = tiny_data()
    i = 0
    same_user, same_entity = data.pair_user == data.pair_user[i], data.pair_entity == data.pair_entity[i]
    expected = np.log([data.pair_prob[same_user].sum(), data.pair_prob[same_entity].sum()])
    np.testing.assert_allclose(data.pair_log_q[:, i], expected)
    assert data.pair_log_q.shape == (2, len(data.pair_user)) and (data.pair_log_q <= 0).all()
