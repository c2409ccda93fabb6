"""Where a window's prototypes start: k-means of the teacher's embeddings for a fresh model, a refinement towards
their centroids on a warm start, or a fresh k-means run where it fits clearly better (guarded: the coarse prototypes
are also the encoder's global tokens)."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from hir_model.train.centroids import primitive_centroids
from hir_model.train.config import TrainConfig
from hir_model.train.data import TrainData
from hir_model.train.loss import usage_stats
from hir_model.train.model import HIRModel
from hir_model.train.probe import PROBE_SEED, embed_nodes, sample_active

log = logging.getLogger("hir")


def spherical_kmeans(x: Tensor, k: int, iters: int, gen: torch.Generator) -> Tensor:
    """(k, W) unit centroids of unit rows x (N, W): k-means++-style seeding by farthest sampling, then Lloyd steps."""
    centres = [x[torch.randint(len(x), (1,), generator=gen)].squeeze(0)]
    for _ in range(1, k):
        d = 1 - (x @ torch.stack(centres).T).max(1).values  # (N,) cosine distance to the nearest centre
        centres.append(x[torch.multinomial(d.clamp_min(1e-12) ** 2, 1, generator=gen)].squeeze(0))
    c = torch.stack(centres)
    for _ in range(iters):
        a = (x @ c.T).argmax(1)  # (N,)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        used = torch.bincount(a, minlength=k) > 0
        c = torch.where(used[:, None], F.normalize(sums, dim=-1), c)
    return c


@torch.no_grad()
def seed_prototypes(student: HIRModel, teacher: HIRModel, data: TrainData, cfg: TrainConfig, fresh: bool) -> None:
    """Place prototypes where the data is before a window trains. Fresh model: k-means of the teacher's embeddings of
    a sample of active nodes, finest level first, each coarser level clustering the level below's centroids (so the
    hierarchy starts consistent). Warm start: every level takes `refine_iters` spherical k-means steps over those
    embeddings seeded by itself (hir_model.train.centroids.primitive_centroids), a prototype no node is nearest to
    (dead: it gets no gradient from the balanced targets' argmax) re-seeded; each keeps its row, so ids stay matched.
    A level where a fresh k-means run fits those embeddings clearly better takes that run instead (`restarted`).

    Why refine and not only re-seed the dead: a window's few steps move prototypes only so far, and the balanced targets
    spread mass evenly rather than to where the embeddings cluster. With dead re-seeding alone, the synthetic source's
    prototype argmax lagged k-means on the same embeddings by 0.1-0.15 NMI (0.70 / 0.75 / 0.86, coarse -> fine); with
    refinement, 0.76 / 0.95 / 0.90 and 0.99 / 0.96 / 0.91 (seeds 0 and 1, benchmarks/train.py). It reuses the
    embeddings the dead-prototype search needed, so it costs nothing more; refining at a window's end instead scored
    the same but added an embedding pass (2 s a MovieLens window).

    The coarse prototypes are also the encoder's global tokens, so refining them moves the embeddings they were fitted
    to. With global tokens the refined set is embedded with once more and kept only if its usage entropy stays above
    REFINE_KEEP x the previous prototypes' (see there); otherwise the window starts from the previous ones, warned."""
    gen = torch.Generator().manual_seed(cfg.runtime.seed)
    nodes = sample_active(data, cfg, PROBE_SEED + 3, cfg.runtime.metric_nodes)
    z = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 3)  # (M, W)
    if len(z) < 2:
        return
    protos = [p.detach().cpu().clone() for p in teacher.normalised_prototypes()]
    if fresh:
        below = z
        for lvl in reversed(range(len(cfg.prototypes.levels))):
            k = cfg.prototypes.levels[lvl]
            protos[lvl] = spherical_kmeans(below, k, 10, gen) if len(below) > k else F.normalize(torch.randn(k, z.shape[1], generator=gen), dim=-1)
            below = protos[lvl]
    else:
        before = protos
        protos = [torch.from_numpy(restarted(z.numpy(), p.numpy(), cfg, lvl)) for lvl, p in enumerate(protos)]
        if teacher.global_levels:  # the coarse prototypes are also the encoder's global tokens: moving them moves z
            _set_prototypes((teacher,), protos)
            moved = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 3)
            old, new = _min_usage_entropy(z, before), _min_usage_entropy(moved, protos)
            if new < REFINE_KEEP * old:
                log.warning("refined prototypes would collapse the window's assignments (min usage entropy %.3f -> %.3f "
                            "once they are the global tokens): keeping the previous window's", old, new)
                protos = before
    _set_prototypes((student, teacher), protos)


def fit(x: np.ndarray, centres: np.ndarray) -> float:
    """Spherical k-means' objective: the mean cosine of each row of x (N, W) to its nearest centre (K, W)."""
    return float((x @ centres.T).max(1).mean()) if len(x) else 0.0


def restarted(z: np.ndarray, prototypes: np.ndarray, cfg: TrainConfig, level: int) -> np.ndarray:
    """A warm start's prototypes for one level: `prototypes` refined (refine_iters spherical k-means steps over z), or,
    where one of `cfg.prototypes.prototype_restarts` fresh k-means runs fits z better by more than `cfg.prototypes.restart_gain` (mean
    cosine to the nearest centre), that run, its rows matched to the refined ones (Hungarian on cosine) so that a
    prototype keeps its row where it can (stable ids and the student's logits follow rows).

    Why: refinement only descends from where the prototypes are, and a level with few prototypes that started with two
    interests merged under one prototype and another split over two stays so in every later window (the synthetic
    source's 4 planted coarse interests, seed 0: coarse NMI 0.64 while the finer levels reached 0.93)."""
    refined = primitive_centroids(z, prototypes, cfg.prototypes.refine_iters, reseed=True, seed=cfg.runtime.seed)
    if cfg.prototypes.refine_iters == 0 or cfg.prototypes.prototype_restarts == 0 or len(z) <= len(prototypes):
        return refined
    gen = torch.Generator().manual_seed(cfg.runtime.seed * 1009 + level)
    best, best_fit = None, -np.inf
    x = torch.from_numpy(np.ascontiguousarray(z))
    for _ in range(cfg.prototypes.prototype_restarts):
        c = spherical_kmeans(x, len(prototypes), cfg.prototypes.refine_iters, gen).numpy()
        if (f := fit(z, c)) > best_fit:
            best, best_fit = c, f
    if best_fit <= (kept := fit(z, refined)) + cfg.prototypes.restart_gain:
        return refined
    log.info("level %d: a fresh k-means fits the window's embeddings better than the refined prototypes (mean cosine "
             "%.3f vs %.3f): taking it", level, best_fit, kept)
    rows, cols = linear_sum_assignment(-(refined @ best.T))  # refined row rows[i] <- restart row cols[i]
    out = refined.copy()
    out[rows] = best[cols]
    return out


# A warm start's refined prototypes are kept unless, fed back as global tokens, they leave the teacher's assignments
# with less than this share of the usage entropy the previous prototypes had (a refinement can put every node on one
# prototype at every level and the window ends collapsed; docs/decisions.md)
REFINE_KEEP = 0.5


def _set_prototypes(models, protos: list[Tensor]) -> None:
    for m in models:
        for param, value in zip(m.prototypes, protos):
            param.copy_(value.to(param.device))


def _min_usage_entropy(z: Tensor, protos: list[Tensor]) -> float:
    """The lowest normalised usage entropy over the levels of z's (M, W) hard assignments to `protos`."""
    return min(usage_stats((z @ F.normalize(p, dim=-1).to(z.dtype).T).argmax(1), len(p))[0] for p in protos)
