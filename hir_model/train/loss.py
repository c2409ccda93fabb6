"""Multi-level cross-view self-distillation (SwAV-style balanced targets), fine -> coarse consistency, the
engagement objective, and (optional) swapped prediction across engagement pairs.

Sinkhorn-Knopp balancing (SwAV), not centring + sharpening (DINO). DINO was the first choice (one running centre,
per-sample targets) and it collapsed here: a window trains for tens of steps, and the EMA centre needs hundreds to
undo an early collapse. Measured on the synthetic source (3 windows x 40 steps): with centring the teacher's
products fell into one prototype at every level (NMI 0.0, 8% of the fine prototypes used); with Sinkhorn every
batch's targets spread over the prototypes from the first step (58-100% used). Sinkhorn's costs are acceptable:
under DDP each iteration is one all-reduce of a (K,) vector per level, and the equipartition over a batch smaller
than K (MovieLens: 64 seeds, 128 fine prototypes) is a soft constraint (each prototype gets B/K of the mass).
The other mechanism is left out: there is no centre buffer.

Levels run coarse to fine (level 0 has the fewest prototypes), as in hir_model.train.checkpoint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.train.config import TrainConfig


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum over ranks when torch.distributed is initialised; identity on one process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


def parent_assignment(fine: Tensor, coarse: Tensor, temp: float) -> Tensor:
    """(K_f, K_c): soft parent of each fine prototype, derived from the prototypes themselves (so it is learned
    with them): softmax over coarse prototypes of cosine(fine_j, coarse_i) / temp."""
    return F.softmax(F.normalize(fine, dim=-1) @ F.normalize(coarse, dim=-1).T / temp, dim=-1)


@torch.no_grad()
def sinkhorn(scores: Tensor, eps: float, iters: int) -> Tensor:
    """(B, K) balanced soft assignments of a batch (SwAV's Sinkhorn-Knopp): every prototype receives an equal share
    of the global batch (all ranks, through all-reduces of the column sums), every row sums to 1."""
    q = torch.exp((scores - 1) / eps).T  # (K, B); scores are cosines <= 1, the same shift on every rank: no overflow
    k = q.shape[0]
    n = all_reduce_sum(torch.tensor(float(q.shape[1]), device=q.device))  # global batch size
    q /= all_reduce_sum(q.sum())
    for _ in range(iters):
        q /= all_reduce_sum(q.sum(dim=1, keepdim=True)) * k  # each prototype: total mass 1 / K
        q /= q.sum(dim=0, keepdim=True) * n  # each sample: mass 1 / n (rows are local)
    return (q * n).T


class DistillationLoss(nn.Module):
    """Student narrow-view scores vs the teacher's broad-view scores of the same seeds, at every level."""

    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.cfg = cfg

    def targets(self, teacher_scores: list[Tensor]) -> list[Tensor]:
        """Balanced teacher assignments per level over the global batch: (B, K_l) probabilities, no gradient."""
        return [sinkhorn(t.detach(), self.cfg.teacher.sinkhorn_eps, self.cfg.teacher.sinkhorn_iters) for t in teacher_scores]

    def distill(self, student_scores: list[Tensor], targets: list[Tensor]) -> Tensor:
        terms = [-(t * F.log_softmax(s / self.cfg.teacher.student_temp, dim=-1)).sum(-1).mean() for s, t in zip(student_scores, targets)]
        return torch.stack(terms).mean()

    def swap(self, student_scores: list[Tensor], targets: list[Tensor], pairs: int, sign: Tensor) -> Tensor:
        """Swapped prediction over the batch's positive engagement pairs (rows [0, P) users, [P, 2P) their entities):
        each side's student scores predict the other side's balanced teacher target, at every level."""
        pos = torch.nonzero(sign > 0).squeeze(1)
        if not pairs or not len(pos):
            return student_scores[0].new_zeros(())
        u, e = pos, pos + pairs
        terms = [-(t[e] * F.log_softmax(s[u] / self.cfg.teacher.student_temp, dim=-1)).sum(-1).mean()
                 - (t[u] * F.log_softmax(s[e] / self.cfg.teacher.student_temp, dim=-1)).sum(-1).mean()
                 for s, t in zip(student_scores, targets)]
        return torch.stack(terms).mean() / 2

    def consistency(self, student_scores: list[Tensor], prototypes: list[Tensor]) -> Tensor:
        """Each level's p(coarse) must agree with p(fine) aggregated through the derived parent assignment."""
        if len(student_scores) < 2:
            return student_scores[0].new_zeros(())
        terms = []
        for lvl in range(1, len(student_scores)):
            p_fine = F.softmax(student_scores[lvl] / self.cfg.teacher.student_temp, dim=-1)  # (B, K_f)
            parent = parent_assignment(prototypes[lvl], prototypes[lvl - 1], self.cfg.objective.consistency_temp)  # (K_f, K_c)
            aggregated = p_fine @ parent  # (B, K_c)
            log_coarse = F.log_softmax(student_scores[lvl - 1] / self.cfg.teacher.student_temp, dim=-1)  # (B, K_c)
            terms.append(-(aggregated * log_coarse).sum(-1).mean())
        return torch.stack(terms).mean()


def engagement_loss(users: Tensor, entities: Tensor, sign: Tensor, temp: float, log_q: Tensor | None = None,
                    weight: Tensor | None = None, negatives: Tensor | None = None, neg_log_q: Tensor | None = None,
                    neg_is_pos: Tensor | None = None) -> Tensor:
    """Contrastive user-entity objective on L2-normalised embeddings.

    users, entities: (P, W), row i is one pair from the window's events; sign: (P,) +1 positive, -1 explicit
    negative (`not_interested`). Positives: symmetric InfoNCE with the batch's other entities (users) as
    negatives. Explicit negatives: softplus(cos / temp) pushes their similarity below zero. Deeper funnel stages
    are weighted up upstream, by drawing their pairs more often (hir_model.train.data). log_q: (2, P) log draw
    probability of each pair's user and entity; given, each candidate's logit is lowered by its own (the logQ
    correction of a sampled softmax), so frequently drawn candidates are not pushed down for being frequent.
    weight: (P,) each row's weight (a weighted mean over rows; None: all 1). negatives: (M, W) entities shared by every
    user as further candidates of its softmax (mixed negative sampling), each lowered by neg_log_q (M,) when given;
    neg_is_pos (P, M) marks a negative that is the row's own entity (left out).
    """
    pos, neg = sign > 0, sign < 0
    total = users.new_zeros(())
    if weight is not None or (negatives is not None and len(negatives)):
        return _weighted_engagement(users, entities, pos, neg, temp, log_q, weight, negatives, neg_log_q, neg_is_pos)
    if pos.any():
        logits = users[pos] @ entities[pos].T / temp  # (P+, P+)
        labels = torch.arange(logits.shape[0], device=logits.device)
        if log_q is None:
            total = total + (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        else:
            lq = log_q[:, pos]
            total = total + (F.cross_entropy(logits - lq[1][None, :], labels) + F.cross_entropy(logits.T - lq[0][None, :], labels)) / 2
    if neg.any():
        total = total + F.softplus((users[neg] * entities[neg]).sum(-1) / temp).mean() * temp
    return total


def _weighted_engagement(users: Tensor, entities: Tensor, pos: Tensor, neg: Tensor, temp: float, log_q: Tensor | None,
                         weight: Tensor | None, negatives: Tensor | None, neg_log_q: Tensor | None,
                         neg_is_pos: Tensor | None) -> Tensor:
    """engagement_loss with row weights and shared negatives (the same terms, weighted means)."""
    w = torch.ones(len(users), device=users.device) if weight is None else weight.to(users.dtype)
    total = users.new_zeros(())
    if pos.any():
        u, e, wp = users[pos], entities[pos], w[pos]
        logits = u @ e.T / temp  # (P+, P+)
        labels = torch.arange(logits.shape[0], device=logits.device)
        to_entity, to_user = logits, logits.T
        if log_q is not None:
            lq = log_q[:, pos]
            to_entity, to_user = logits - lq[1][None, :], logits.T - lq[0][None, :]
        if negatives is not None and len(negatives):
            extra = u @ negatives.T / temp  # (P+, M)
            if neg_log_q is not None:
                extra = extra - neg_log_q[None, :]
            if neg_is_pos is not None:
                extra = extra.masked_fill(neg_is_pos[pos], float("-inf"))
            to_entity = torch.cat([to_entity, extra], dim=1)  # (P+, P+ + M)
        ce = (F.cross_entropy(to_entity, labels, reduction="none") + F.cross_entropy(to_user, labels, reduction="none")) / 2
        total = total + (ce * wp).sum() / wp.sum().clamp_min(1e-12)
    if neg.any():
        wn = w[neg]
        total = total + (F.softplus((users[neg] * entities[neg]).sum(-1) / temp) * wn).sum() / wn.sum().clamp_min(1e-12) * temp
    return total


def usage_stats(assignments: Tensor, k: int) -> tuple[float, float]:
    """(normalised usage entropy in [0, 1], share of prototypes used) of hard assignments (M,) in [0, k)."""
    counts = torch.bincount(assignments, minlength=k).double()
    p = counts / counts.sum().clamp_min(1)
    entropy = -(p[p > 0] * p[p > 0].log()).sum() / torch.log(torch.tensor(float(k), dtype=torch.float64))
    return float(entropy), float((counts > 0).double().mean())
