"""The prior's weight from the head's own track record.

At end(t) the heads of earlier windows have been judged by what came after them: head(s) with its users' published rows
ranked window s+1's deep-funnel engagements, exactly as the evaluation judges a window. `track_record` scores head(t-1)
on window t's events at every candidate weight, once for the head's full score (`exact`) and once for the published
rows plus the prior (`embeddings`), and where head(t-1) has co-engagement (hir_model.rank.coengagement) once more for the
full score with it at each of its candidate weights; each head publishes the records of the windows before it.
`pooled_choice` keeps the (co-engagement, prior) weights of the full score with the best Recall@k pooled over those
records' users, `pooled_weight` the prior's weight beside the rows alone. Unlike the held-out fit
(hir_model.rank.fit), the rows take part: they never saw the days that judge them. Nothing after end(t) is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from hir_model.protocol.split import Interactions, warm_group
from hir_model.rank.coengagement import COENGAGEMENT_WEIGHTS, coengagement_scores
from hir_model.rank.fit import mode_recalls
from hir_model.rank.head import HeadConfig, warm_scores

TRACK_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)  # candidate prior weights (training logit units)
CO_MODE = "exact+coengagement@"  # + its weight: the full score with co-engagement at that weight


def coengagement_mode(weight: float) -> str:
    return f"{CO_MODE}{weight:g}"


@dataclass(frozen=True)
class TrackRecord:
    window: str  # s: the head that ranked
    next_window: str  # s + 1: whose events judged it
    users: int  # warm users with deep-funnel targets scored (at most max_users, a seeded sample)
    recall: dict[str, dict[float, float]]  # mode -> candidate weight -> mean Recall@k over those users

    def as_dict(self) -> dict:
        return {"window": self.window, "next_window": self.next_window, "users": self.users,
                "recall": {m: {str(w): round(r, 5) for w, r in by_w.items()} for m, by_w in self.recall.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> TrackRecord:
        return cls(d["window"], d["next_window"], int(d["users"]),
                   {m: {float(w): float(r) for w, r in by_w.items()} for m, by_w in d["recall"].items()})


def track_record(history: Interactions, vectors: np.ndarray, log_prior: np.ndarray, rows: np.ndarray, has_row: np.ndarray,
                 config: HeadConfig, later: pd.DataFrame, next_window: str, k: int = 20, max_users: int = 2000,
                 seed: int = 0, weights: tuple[float, ...] = TRACK_WEIGHTS,
                 similarity: sp.csr_matrix | None = None) -> TrackRecord | None:
    """How head(s) ranked window s+1 at each weight. `history`, `vectors`, `log_prior` (weight 1), `similarity` (its
    co-engagement, None: none): head(s)'s state; `rows`, `has_row`: the published rows of history.user_ids; `later`:
    window s+1's engagements (user_id, item: a row of head(s)'s items, deep). Users with a row and a deep-funnel target
    not engaged with before are scored, their history the context and excluded (as the evaluation does); None when
    there are none."""
    known = pd.Index(history.user_ids).get_indexer(later.user_id)
    later = later[(known >= 0) & has_row[np.maximum(known, 0)]]
    if not len(later):
        return None
    group = warm_group(history, later)
    scored = int((group.deep_funnel.sizes > 0).sum())
    if not scored:
        return None
    def scores(q):  # the full score once a block, co-engagement's modes on top of it
        user_rows = rows[q.user_index]
        exact = warm_scores(q, vectors, user_rows, config)
        yield "exact", exact
        yield "embeddings", warm_scores(q, vectors, user_rows, config.embeddings_only())
        if similarity is not None and config.coengagement:
            co = coengagement_scores(q, similarity, config.coengagement_half_life_days, config.deep_weight)
            for w in COENGAGEMENT_WEIGHTS:
                yield coengagement_mode(w), exact + w * co

    recall = mode_recalls(group, scores, log_prior, weights, k, max_users, seed)
    return TrackRecord(history.window, next_window, min(scored, max_users),
                       {m: {w: float(np.mean(v)) for w, v in by_w.items()} for m, by_w in recall.items()})


def pooled_weight(records: list[TrackRecord], mode: str, min_users: int) -> float | None:
    """The weight with the best Recall@k pooled over the records' users (a tie keeps the one nearest 1); None when they
    hold fewer than `min_users` users."""
    users = sum(r.users for r in records)
    if not records or users < min_users:
        return None
    weights = sorted(set.intersection(*(set(r.recall[mode]) for r in records)))
    pooled = {w: sum(r.recall[mode][w] * r.users for r in records) / users for w in weights}
    best = max(pooled.values())
    return min((w for w, v in pooled.items() if v == best), key=lambda w: abs(w - 1.0))


def pooled_choice(records: list[TrackRecord], min_users: int, with_coengagement: bool = True) -> tuple[float, float] | None:
    """(co-engagement weight, prior weight) of the full score with the best Recall@k pooled over the records' users, over
    the modes every record holds (`exact` at co-engagement 0; without `with_coengagement` only it); a tie keeps the
    smaller co-engagement weight, then the prior weight nearest 1. None when they hold fewer than `min_users` users."""
    users = sum(r.users for r in records)
    if not records or users < min_users:
        return None
    modes = set.intersection(*(set(r.recall) for r in records))
    co = {"exact": 0.0} | ({m: float(m[len(CO_MODE):]) for m in modes if m.startswith(CO_MODE)} if with_coengagement else {})
    best, choice = -1.0, None
    for mode, co_w in sorted(co.items(), key=lambda x: x[1]):
        if mode not in modes:
            continue
        w = pooled_weight(records, mode, min_users)
        value = sum(r.recall[mode][w] * r.users for r in records) / users
        if value > best:
            best, choice = value, (co_w, w)
    return choice
