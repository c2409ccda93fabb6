"""The teacher's view of nodes outside the training step: sampled active nodes, their broad-view embeddings, hard
prototype assignments and the collapse metrics (usage entropy, share of prototypes used)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from hir_model.nn import collate
from hir_model.train.config import TrainConfig
from hir_model.train.data import TrainData, view_of
from hir_model.train.loss import usage_stats
from hir_model.train.model import HIRModel

PROBE_SEED = 7919  # the probe batch's view is sampled with rng (cfg.runtime.seed, PROBE_SEED); metrics and seeding use offsets


@torch.no_grad()
def embed_nodes(model: HIRModel | torch.nn.Module, global_tokens: Tensor | None, data: TrainData, nodes: np.ndarray,
                cfg: TrainConfig, seed: int = PROBE_SEED, chunk: int = 128, readout: bool = False) -> Tensor:
    """(M, W) embeddings of `nodes` on their broad view (deterministic by seed), the encoder in eval mode; with
    `readout`, the encoder's readout before the unit norm."""
    encoder = model.encoder if isinstance(model, HIRModel) else model
    device = next(encoder.parameters()).device
    was = encoder.training
    encoder.eval()
    run = encoder.readout if readout else encoder
    out = [run(collate(view_of(data, nodes[i:i + chunk], cfg, seed + i)).to(device), global_tokens).cpu()
           for i in range(0, len(nodes), chunk)]
    encoder.train(was)
    return torch.cat(out) if out else torch.zeros(0, encoder.cfg.width)


def sample_active(data: TrainData, cfg: TrainConfig, tag: int, size: int, sort: bool = True) -> np.ndarray:
    """int64 [<= size]: active nodes drawn without replacement by rng (cfg.runtime.seed, tag); sorted unless told not to."""
    nodes = np.random.default_rng([cfg.runtime.seed, tag]).permutation(data.active)[:size]
    return np.sort(nodes) if sort else nodes


def probe_nodes(data: TrainData, cfg: TrainConfig) -> np.ndarray:
    return sample_active(data, cfg, PROBE_SEED, cfg.runtime.probe_size)


@torch.no_grad()
def assignments(model: HIRModel, data: TrainData, nodes: np.ndarray, cfg: TrainConfig) -> list[np.ndarray]:
    """Per level (coarse -> fine): int64 [M] hard prototype assignment of each node (teacher scores, broad view)."""
    z = embed_nodes(model, model.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 1)  # (M, W)
    return [(z @ p.cpu().T).argmax(-1).numpy() for p in model.normalised_prototypes()]


def collapse_metrics(model: HIRModel, data: TrainData, cfg: TrainConfig) -> tuple[list[float], list[float]]:
    nodes = sample_active(data, cfg, PROBE_SEED + 2, cfg.runtime.metric_nodes, sort=False)
    stats = [usage_stats(torch.from_numpy(a), k) for a, k in zip(assignments(model, data, nodes, cfg), cfg.prototypes.levels)]
    return [round(e, 4) for e, _ in stats], [round(s, 4) for _, s in stats]
