"""The trained network: encoder + one prototype matrix per level (coarse to fine). Student and teacher are two
copies; the teacher is the student's EMA (requires_grad False, updated under no_grad)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.nn import Encoder, EncoderBatch
from hir_model.train.config import TrainConfig


class HIRModel(nn.Module):
    def __init__(self, cfg: TrainConfig, encoder: Encoder | None = None):
        super().__init__()
        self.global_levels = cfg.prototypes.global_levels
        self.encoder = encoder if encoder is not None else Encoder(cfg.encoder)
        w = self.encoder.cfg.width
        self.prototypes = nn.ParameterList(nn.Parameter(F.normalize(torch.randn(k, w), dim=-1)) for k in cfg.prototypes.levels)

    def normalised_prototypes(self) -> list[Tensor]:
        return [F.normalize(p, dim=-1) for p in self.prototypes]  # per level (K_l, W)

    def global_tokens(self) -> Tensor | None:
        if not self.global_levels:
            return None
        return torch.cat(self.normalised_prototypes()[: self.global_levels])  # (G, W), G = sum of coarse K_l

    def forward(self, batch: EncoderBatch) -> tuple[Tensor, list[Tensor]]:
        """-> (z (B, W) unit norm, per level cosine scores (B, K_l))."""
        z = self.encoder(batch, self.global_tokens())  # (B, W)
        return z, [z @ p.T for p in self.normalised_prototypes()]


def make_teacher(student: HIRModel) -> HIRModel:
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


@torch.no_grad()
def ema_update(teacher: HIRModel, student: HIRModel, momentum: float) -> None:
    """teacher <- momentum * teacher + (1 - momentum) * student, parameter by parameter."""
    for t, s in zip(teacher.parameters(), student.parameters()):
        t.mul_(momentum).add_(s.detach(), alpha=1 - momentum)
    for t, s in zip(teacher.buffers(), student.buffers()):
        t.copy_(s)
