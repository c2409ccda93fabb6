"""Multi-level cross-view self-distillation (DINO-style), fine -> coarse consistency, and the engagement objective.

Centring + sharpening (DINO), not Sinkhorn-Knopp (SwAV): the teacher's targets then depend on one running
buffer (the centre) instead of an iterative batch-wide balancing, so (1) a target is a per-sample function of
the teacher's scores plus a vector, identical on one process and under DDP after one all-reduce of the batch
mean (Sinkhorn needs all-gathered scores and several all-reduces per iteration per level); (2) small windows and
batches (MovieLens: 64 seeds vs 128 fine prototypes) make Sinkhorn's equipartition constraint wrong: it forces
every prototype to be used in every batch, even when B < K; (3) the centre is one buffer saved with the
checkpoint, so warm-starting window t from t-1 keeps it. Collapse is watched by the usage-entropy metric instead.

Levels run coarse to fine (level 0 has the fewest prototypes), as in hir_model.train.checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.train.config import TrainConfig


def _all_reduce_sum(t: Tensor) -> Tensor:
    """Sum over ranks when torch.distributed is initialised; identity on one process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


def parent_assignment(fine: Tensor, coarse: Tensor, temp: float) -> Tensor:
    """(K_f, K_c): soft parent of each fine prototype, derived from the prototypes themselves (so it is learned
    with them): softmax over coarse prototypes of cosine(fine_j, coarse_i) / temp."""
    return F.softmax(F.normalize(fine, dim=-1) @ F.normalize(coarse, dim=-1).T / temp, dim=-1)


@dataclass(frozen=True)
class LossParts:
    total: Tensor  # scalar, differentiable
    distill: Tensor  # scalar: mean over levels of CE(teacher target, student)
    consistency: Tensor  # scalar
    engagement: Tensor  # scalar


class DistillationLoss(nn.Module):
    """Student narrow-view scores vs the teacher's broad-view scores of the same seeds, at every level."""

    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.cfg = cfg
        for i, k in enumerate(cfg.levels):
            self.register_buffer(f"centre{i}", torch.zeros(k))  # (K_l,) running mean of the teacher's scores

    def centres(self) -> list[Tensor]:
        return [getattr(self, f"centre{i}") for i in range(len(self.cfg.levels))]

    def targets(self, teacher_scores: list[Tensor]) -> list[Tensor]:
        """Centred, sharpened teacher assignments per level: (B, K_l) probabilities, no gradient."""
        return [F.softmax((s.detach() - c) / self.cfg.teacher_temp, dim=-1) for s, c in zip(teacher_scores, self.centres())]

    def distill(self, student_scores: list[Tensor], targets: list[Tensor]) -> Tensor:
        terms = [-(t * F.log_softmax(s / self.cfg.student_temp, dim=-1)).sum(-1).mean() for s, t in zip(student_scores, targets)]
        return torch.stack(terms).mean()

    def consistency(self, student_scores: list[Tensor], prototypes: list[Tensor]) -> Tensor:
        """Each level's p(coarse) must agree with p(fine) aggregated through the derived parent assignment."""
        if len(student_scores) < 2:
            return student_scores[0].new_zeros(())
        terms = []
        for lvl in range(1, len(student_scores)):
            p_fine = F.softmax(student_scores[lvl] / self.cfg.student_temp, dim=-1)  # (B, K_f)
            parent = parent_assignment(prototypes[lvl], prototypes[lvl - 1], self.cfg.consistency_temp)  # (K_f, K_c)
            aggregated = p_fine @ parent  # (B, K_c)
            log_coarse = F.log_softmax(student_scores[lvl - 1] / self.cfg.student_temp, dim=-1)  # (B, K_c)
            terms.append(-(aggregated * log_coarse).sum(-1).mean())
        return torch.stack(terms).mean()

    @torch.no_grad()
    def update_centre(self, teacher_scores: list[Tensor], global_count: int) -> None:
        """centre <- m * centre + (1 - m) * mean of the teacher's scores over the global batch (all ranks)."""
        m = self.cfg.centre_momentum
        for s, c in zip(teacher_scores, self.centres()):
            mean = _all_reduce_sum(s.detach().sum(0)) / global_count  # (K_l,)
            c.mul_(m).add_(mean, alpha=1 - m)


def engagement_loss(users: Tensor, entities: Tensor, sign: Tensor, temp: float) -> Tensor:
    """Contrastive user-entity objective on L2-normalised embeddings.

    users, entities: (P, W), row i is one pair from the window's events; sign: (P,) +1 positive, -1 explicit
    negative (`not_interested`). Positives: symmetric InfoNCE with the batch's other entities (users) as
    negatives. Explicit negatives: softplus(cos / temp) pushes their similarity below zero. Deeper funnel stages
    are weighted up upstream, by drawing their pairs more often (hir_model.train.data).
    """
    pos, neg = sign > 0, sign < 0
    total = users.new_zeros(())
    if pos.any():
        logits = users[pos] @ entities[pos].T / temp  # (P+, P+)
        labels = torch.arange(logits.shape[0], device=logits.device)
        total = total + (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    if neg.any():
        total = total + F.softplus((users[neg] * entities[neg]).sum(-1) / temp).mean() * temp
    return total


def usage_stats(assignments: Tensor, k: int) -> tuple[float, float]:
    """(normalised usage entropy in [0, 1], share of prototypes used) of hard assignments (M,) in [0, k)."""
    counts = torch.bincount(assignments, minlength=k).double()
    p = counts / counts.sum().clamp_min(1)
    entropy = -(p[p > 0] * p[p > 0].log()).sum() / torch.log(torch.tensor(float(k), dtype=torch.float64))
    return float(entropy), float((counts > 0).double().mean())
