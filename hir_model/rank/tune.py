"""How many candidates the served path scores: BoM + head's top-k against the head's exact top-k, and the smallest
probe factor whose mean recall@k on calibration users reaches a target."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hir_model.rank.recommender import Recommender

# probe factors tried, ascending (within the candidate share cap): MovieLens stops at 2.5-3; the synthetic `large`
# preset's 215k items need 24 for the 0.95 target (16 reached 0.90)
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0)


@dataclass(frozen=True)
class RecallReport:
    recall: float  # mean |served top-k & exact top-k| / |exact top-k| over the users
    k: int
    queries: int
    items: int
    candidates_per_query: float  # items the head scored per served query
    served_qps: float
    exact_qps: float

    @property
    def candidate_fraction(self) -> float:
        return self.candidates_per_query / max(self.items, 1)


def served_recall(rec: Recommender, users: list[str], k: int = 100, probe_factor: float | None = None,
                  exact_top: list[np.ndarray] | None = None) -> RecallReport:
    """The served top-k (BoM candidates, head scores, seen items removed) against the head's exact top-k, per user."""
    if not users:
        return RecallReport(1.0, k, 0, rec.state.n_items, 0.0, 0.0, 0.0)
    batch = rec.user_batch(users)
    t0 = time.perf_counter()
    if exact_top is None:
        exact_top = [rows for rows, _ in rec.top(batch, k, exact=True)]
    t1 = time.perf_counter()
    cands = rec.candidates(batch, k, probe_factor)  # what the head scores: the engaged items are never scored
    served = rec.top(batch, k, probe_factor=probe_factor, candidates=cands)
    t2 = time.perf_counter()
    found = [len(np.intersect1d(e, s[0])) / len(e) for e, s in zip(exact_top, served) if len(e)]
    return RecallReport(float(np.mean(found)) if found else 1.0, k, len(users), rec.state.n_items,
                        float(np.mean([len(c) for c in cands])), len(users) / max(t2 - t1, 1e-9), len(users) / max(t1 - t0, 1e-9))


def tune_probe_factor(rec: Recommender, users: list[str], k: int, target: float, max_share: float) -> tuple[float, float]:
    """(factor, its mean recall@k on `users`): the smallest of FACTORS reaching `target` whose mean candidates stay within
    `max_share` of the items; the largest within that share when none reaches it.

    The served top-k is the head's top-k within the candidates, so an exact top-k item is served iff it is a candidate:
    recall is |exact top-k & candidates| / |exact top-k|, with no rescoring per factor."""
    if not users:
        return rec.probe_factor, 1.0
    batch = rec.user_batch(users)
    exact = [rows for rows, _ in rec.top(batch, k, exact=True)]
    best = (FACTORS[0], 0.0)
    for factor in FACTORS:
        cands = rec.candidates(batch, k, factor)
        if np.mean([len(c) for c in cands]) / max(rec.state.n_items, 1) > max_share and factor > FACTORS[0]:
            break
        found = [np.isin(e, c).sum() / len(e) for e, c in zip(exact, cands) if len(e)]
        best = (factor, float(np.mean(found)) if found else 1.0)
        if best[1] >= target:
            break
    return best
