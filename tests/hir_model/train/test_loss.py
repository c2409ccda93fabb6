"""The loss pieces on tiny tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hir_model.train.config import TrainConfig, lr_schedule, momentum_schedule
from hir_model.train.loss import DistillationLoss, engagement_loss, parent_assignment, usage_stats

CFG = TrainConfig(levels=(2, 4), batch_size=8, steps=10)


def test_targets_are_centred_and_sharpened():
    loss = DistillationLoss(CFG)
    scores = [torch.tensor([[0.5, 0.1]]), torch.tensor([[0.3, 0.2, 0.1, 0.0]])]
    t = loss.targets(scores)
    assert torch.allclose(t[0], F.softmax(scores[0] / CFG.teacher_temp, -1)) and t[0][0, 0] > 0.99  # sharpened
    loss.centre0.copy_(torch.tensor([0.5, 0.0]))  # centring removes the always-high prototype's advantage
    assert loss.targets(scores)[0][0, 1] > 0.5
    assert {"centre0", "centre1"} <= set(loss.state_dict())  # saved with the checkpoint


def test_centre_update_is_an_ema_of_the_batch_mean():
    loss = DistillationLoss(CFG)
    loss.update_centre([torch.ones(4, 2), torch.zeros(4, 4)], global_count=4)
    assert torch.allclose(loss.centre0, torch.full((2,), 1 - CFG.centre_momentum))


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
    assert m.shape == lr.shape == (10,) and m[0] == CFG.momentum_start and abs(m[-1] - CFG.momentum_end) < 1e-12
    assert (lr > 0).all() and lr.max() <= CFG.lr
