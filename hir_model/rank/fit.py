"""Fitting the ranking head's state at end(t): the item priors and the prior's weight, from window t alone.

- The item prior: temp x log of each item's decayed engagement in graph(t) at end(t) (`Graph.strength`), the causal
  forecast of how often window t+1 engages it; items without any share one floor, half the smallest engaged item's.
- The prior's weight, fitted on window t's own last days: `fit_prior_weight` holds out the events of the last
  `calibrate_days` before end(t), builds each held-out user's recent-items score from their events before the cut and
  the prior from graph(t) at the cut, and keeps the candidate weight with the best deep-funnel Recall@k on the held-out
  events (their earlier items excluded, as in the evaluation). Published rows have seen the held-out days, so the
  calibration scores the recent-items part alone (the recent-items query and the kernel, in the score's shares).
  Once earlier heads have a track record (hir_model.rank.track), the weights come from it instead.
- The new users' prior: a cold user is new, and what new users engage with first is not what everyone engages with (on
  MovieLens, the films a sign-up is asked to rate). `new_user_engagement` counts, per item, the engagements made in
  their users' first days, stage-weighted and decayed from end(t).
Nothing after end(t) is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hir_model.protocol.method import US_PER_DAY, decay, event_weights
from hir_model.protocol.metrics import Ragged, ranking_metrics
from hir_model.protocol.split import Interactions, Queries, UserGroup, warm_group
from hir_model.rank.head import HeadConfig, warm_scores

WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # candidate prior weights (1: the training's logit units)
FIT_CELLS = 1 << 25  # held-out users x items scored at once (128 MB a float32 matrix: 170 users at 200k items)


def floored_log(engagement: np.ndarray, temp: float) -> tuple[np.ndarray, float] | None:
    """(temp x log of each item's engagement, items with none at the floor; the floor, temp x log of half the smallest
    positive engagement); None when no item has any."""
    engaged = engagement > 0
    if not engaged.any():
        return None
    floor = float(temp * np.log(engagement[engaged].min() / 2))
    return np.where(engaged, temp * np.log(np.where(engaged, engagement, 1.0)), floor).astype(np.float32), floor


@dataclass(frozen=True)
class PriorCalibration:
    weight: float  # the kept weight
    recall: dict[float, float]  # Recall@k of each candidate weight on the held-out days
    users: int  # users with held-out deep-funnel targets and an earlier history
    cut_us: int  # events at or after it were held out

    def as_dict(self) -> dict:
        return {"weight": self.weight, "users": self.users, "cut_us": self.cut_us,
                "recall": {str(w): round(r, 4) for w, r in self.recall.items()}}


def held_out_split(train: Interactions, cut_us: int) -> UserGroup | None:
    """Window t's last days as the evaluation's warm group (`split.warm_group`): users with events both before `cut_us`
    and after it, their events before the cut the context, their later items the targets; None when there are none."""
    before = train.ts < cut_us
    pre = replace(train, user=train.user[before], item=train.item[before], ts=train.ts[before], deep=train.deep[before],
                  end_us=cut_us)
    after = ~before & (np.bincount(pre.user, minlength=train.n_users) > 0)[train.user]
    if not after.any():
        return None
    later = pd.DataFrame({"user_id": train.user_ids[train.user[after]], "item": train.item[after], "deep": train.deep[after]})
    return warm_group(pre, later)


def mode_recalls(group: UserGroup, scores: Callable[[Queries], Iterable[tuple[str, np.ndarray]]], log_prior: np.ndarray,
                 weights: tuple[float, ...], k: int, max_users: int, seed: int = 0) -> dict[str, dict[float, np.ndarray]]:
    """Per score and candidate weight, the deep-funnel Recall@k of `base + w x log_prior` for each of the group's users
    with targets (at most `max_users`, a seeded sample), their context excluded, FIT_CELLS scores at a time; `scores`
    yields (mode, base) for a block of queries, one base at a time, so what several scores share is computed once."""
    judged = np.flatnonzero(group.deep_funnel.sizes > 0)  # the others have no target: they never count
    if len(judged) > max_users:
        judged = np.sort(np.random.default_rng(seed).choice(judged, max_users, replace=False))
    out: dict[str, dict[float, list]] = {}
    step = max(1, FIT_CELLS // max(len(log_prior), 1))
    for lo in range(0, len(judged), step):
        sel = judged[lo:lo + step]
        queries = group.queries.take(sel)
        ptr, pos = group.deep_funnel.gather(sel)
        exclude = Ragged(queries.context.ptr, queries.context.idx)
        for mode, base in scores(queries):
            for w in weights:
                out.setdefault(mode, {x: [] for x in weights})[w].append(ranking_metrics(
                    base + w * log_prior[None, :], Ragged(ptr, group.deep_funnel.idx[pos]), exclude, recall_ks=(k,),
                    ndcg_ks=(k,)).per_user[f"recall@{k}"])
    return {m: {w: np.concatenate(v) for w, v in by_w.items()} for m, by_w in out.items()}


def weight_recalls(group: UserGroup, score: Callable[[Queries], np.ndarray], log_prior: np.ndarray,
                   weights: tuple[float, ...], k: int, max_users: int, seed: int = 0) -> dict[float, np.ndarray]:
    """`mode_recalls` of the one score `score(queries)`."""
    per_mode = mode_recalls(group, lambda q: [("", score(q))], log_prior, weights, k, max_users, seed)
    return per_mode.get("", {w: np.zeros(0) for w in weights})


def fit_prior_weight(train: Interactions, item_vectors: np.ndarray, log_prior_at: Callable[[int], np.ndarray | None],
                     config: HeadConfig, min_users: int = 20, k: int = 20,
                     weights: tuple[float, ...] = WEIGHTS, max_users: int = 2000, seed: int = 0) -> PriorCalibration | None:
    """The candidate prior weight with the best held-out deep-funnel Recall@k (module docstring); None when fewer than
    `min_users` users have held-out deep-funnel targets. `item_vectors`: (n_items, W) rows of train's items; `log_prior_at(cut_us)`:
    (n_items,) temp x log prior of the same items as of the cut (weight 1), None when no item is engaged by then.
    The held-out users with deep-funnel targets (at most `max_users`, a seeded sample) are ranked by `warm_scores`
    without their rows (the kernel's share and temperature of `config`), at most FIT_CELLS user x item scores at once."""
    cut = int(train.end_us - config.calibrate_days * US_PER_DAY)
    group = held_out_split(train, cut)
    users = 0 if group is None else int((group.deep_funnel.sizes > 0).sum())
    if users < min_users:
        return None
    prior = log_prior_at(cut)
    if prior is None:  # nothing engaged before the cut: no prior to weigh
        return None
    vectors = item_vectors[:train.n_items]
    per_user = weight_recalls(group, lambda q: warm_scores(q, vectors, None, config), prior, weights, k, max_users, seed)
    recall = {w: float(np.mean(v)) for w, v in per_user.items()}
    best = max(recall.values())
    weight = min((w for w, r in recall.items() if r == best), key=lambda w: abs(w - 1.0))  # a tie keeps the unit weight
    return PriorCalibration(weight, recall, users, cut)


def _engagement(train: Interactions, keep: np.ndarray, as_of_us: int, half_life_days: float | None,
                deep_weight: float) -> np.ndarray:
    """(n_items,) the kept events per item: 1 each, `deep_weight` for a conversion, x 2^(-age / half-life), age counted
    back from `as_of_us` (None: no decay)."""
    weight = event_weights(train.deep[keep], deep_weight) * decay(as_of_us - train.ts[keep], half_life_days)
    return np.bincount(train.item[keep], weights=weight, minlength=train.n_items)


def decayed_engagement(train: Interactions, cutoff_us: int, half_life_days: float, deep_weight: float) -> np.ndarray:
    """(n_items,) each item's engagement before `cutoff_us`, decayed from the cutoff (`_engagement`): the popularity
    baseline's estimate, as of any cutoff <= end(t)."""
    return _engagement(train, train.ts < cutoff_us, cutoff_us, half_life_days, deep_weight)


def new_user_engagement(train: Interactions, days: float, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(n_items,) each item's engagements made within `days` of their user's first event (module docstring), decayed
    from end(t) (`_engagement`)."""
    first = np.full(train.n_users, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, train.user, train.ts)
    early = train.ts - first[train.user] < days * US_PER_DAY
    return _engagement(train, early, train.end_us, half_life_days, deep_weight)
