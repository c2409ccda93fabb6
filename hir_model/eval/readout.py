"""HIR's ranking head for users with a history: what they did last, and how much the item prior weighs.

Four parts, all reading only what window t holds (nothing of t+1 but the protocol's context):

- The recent-items readout. A warm user's published row is embedded at end(t) from a neighbourhood sampled by
  strength, aged from end(t): their long-run interests. What they engage with next follows what they did last (on
  MovieLens a returning rater picks up where their last session left off), so the query vector adds the unit mean of
  their history's item rows in the same space, each event weighted by its stage (a conversion counts
  `deep_weight` times) and by 2^(-age / half-life), age counted back from the user's own last event (not from end(t):
  a user last seen three weeks ago is still best described by that last session). The query is
  (1 - recent_weight) * row + recent_weight * recent items; its dot products stay on the cosine scale.
  This is the long- plus short-term user representation of PinnerSage / PinnerFormer-style systems, in HIR's one
  metric space.
- The interest kernel. One mean of a user's recent items sits between their interests: a user who rated two genres
  this week is matched best by films halfway between them. `interest_kernel` scores an item by a soft maximum of its
  similarity to each recent item instead, temp x log sum_c w_c exp(v_c.v / temp) over the user's distinct recent
  items c, w_c their stage- and recency-weights normalised to sum 1 (the multi-interest idea of PinnerSage, without
  clustering: the kernel sees every recent item). As temp grows it tends to the weighted mean of the dot products;
  at temp -> 0 to the best single match. A warm user's score is (1 - kernel_weight) x query.v + kernel_weight x kernel.
- The prior's weight, fitted on window t's own last days. score = query.v + weight * temp * log prior(item): with
  `calibrate_days`, `fit_prior_weight` holds out the events of the last days before end(t), builds each user's
  recent-items query from their events before the cut, the prior from graph(t) at the cut, and keeps the candidate
  weight with the best deep-funnel Recall@k on the held-out events (items of the context excluded, as in the
  evaluation). Published rows have seen the held-out days, so the calibration scores the recent-items part alone (the
  recent-items query and the kernel, in the score's shares).
  Nothing after end(t) is read: window t+1 only judges the outcome.
- The new users' prior. A cold user is new, and what new users engage with first is not what everyone engages with
  (on MovieLens, the films a sign-up is asked to rate). `new_user_engagement` counts, per item, the engagements made
  in their users' first days, stage-weighted and decayed from end(t); HIR ranks cold users with its log in place of
  the prior above (hir_model.eval.hir).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hir_model.eval.method import US_PER_DAY, decay, event_weights
from hir_model.eval.metrics import Ragged, ranking_metrics
from hir_model.eval.split import Interactions, Queries, UserGroup, warm_group

WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # candidate prior weights (1: the training's logit units)


def context_weights(queries: Queries, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(nnz,) weight of each context event: its stage (`deep_weight` for a conversion) x 2^(-age / half-life), age
    counted back from the query's own last event (None: no recency)."""
    row = queries.context.row_of
    last = np.full(len(queries), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last, row, queries.context_ts)
    return event_weights(queries.context_deep, deep_weight) * decay(last[row] - queries.context_ts, half_life_days)


def recent_items(queries: Queries, item_vectors: np.ndarray, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(Q, W) unit rows: each query's context item vectors weighted by stage and by recency (module docstring; None:
    no recency, the plain stage-weighted mean); zero for a query without context."""
    ctx = queries.context
    row = ctx.row_of
    w = context_weights(queries, half_life_days, deep_weight)
    out = np.zeros((len(queries), item_vectors.shape[1]))
    np.add.at(out, row, w[:, None] * item_vectors[ctx.idx])
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return np.divide(out, norm, out=np.zeros_like(out), where=norm > 0).astype(np.float32)


def interest_kernel(queries: Queries, item_vectors: np.ndarray, half_life_days: float | None, deep_weight: float,
                    temp: float, min_share: float = 1e-3) -> np.ndarray:
    """(Q, N) temp x log sum_c w_c exp(v_c . v_i / temp) over each query's distinct context items c (module docstring):
    w_c the summed `context_weights` of c's events, normalised to sum 1; items below `min_share` of the query's largest
    weight are left out (at a 2-day half-life, events ~20 days older than the query's last). Zero without context."""
    ctx = queries.context
    w = context_weights(queries, half_life_days, deep_weight)
    out = np.zeros((len(queries), item_vectors.shape[0]), np.float32)
    for q in np.flatnonzero(ctx.sizes > 0):
        lo, hi = ctx.ptr[q], ctx.ptr[q + 1]
        items, inverse = np.unique(ctx.idx[lo:hi], return_inverse=True)
        weight = np.bincount(inverse, weights=w[lo:hi])
        keep = weight >= min_share * weight.max()
        items, weight = items[keep], weight[keep] / weight[keep].sum()
        sims = item_vectors[items] @ item_vectors.T  # (C, N)
        top = sims.max(0)
        out[q] = temp * np.log((weight[:, None] * np.exp((sims - top) / temp)).sum(0)) + top
    return out


def warm_scores(queries: Queries, item_vectors: np.ndarray, rows: np.ndarray | None, recent_weight: float, half_life_days: float,
                deep_weight: float, kernel_weight: float, kernel_temp: float) -> np.ndarray:
    """(Q, N) a warm user's score before the prior (module docstring): (1 - kernel_weight) x query.v + kernel_weight x
    interest_kernel, query = (1 - recent_weight) x row + recent_weight x recent_items. rows: (Q, W) the users' published
    rows, or None for the recent-items part alone (the calibration's score: the rows have seen the held-out days)."""
    query = rows
    if rows is None or recent_weight:
        recent = recent_items(queries, item_vectors, half_life_days, deep_weight)
        query = recent if rows is None else (1 - recent_weight) * rows + recent_weight * recent
    out = (1 - kernel_weight) * (query @ item_vectors.T)
    if kernel_weight:
        out += kernel_weight * interest_kernel(queries, item_vectors, half_life_days, deep_weight, kernel_temp)
    return out


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


def fit_prior_weight(train: Interactions, item_vectors: np.ndarray, log_prior_at: Callable[[int], np.ndarray | None],
                     calibrate_days: float, half_life_days: float, deep_weight: float, min_users: int = 20, k: int = 20,
                     weights: tuple[float, ...] = WEIGHTS, kernel_weight: float = 0.0,
                     kernel_temp: float = 0.1) -> PriorCalibration | None:
    """The candidate prior weight with the best held-out deep-funnel Recall@k (module docstring); None when fewer than
    `min_users` users have held-out deep-funnel targets. `item_vectors`: (n_items, W) rows of train's items; `log_prior_at(cut_us)`:
    (n_items,) temp x log prior of the same items as of the cut (weight 1), None when no item is engaged by then.
    The held-out users are ranked by `warm_scores` without their rows (the kernel's share and temperature as the scores
    use them)."""
    cut = int(train.end_us - calibrate_days * US_PER_DAY)
    group = held_out_split(train, cut)
    users = 0 if group is None else int((group.deep_funnel.sizes > 0).sum())
    if users < min_users:
        return None
    prior = log_prior_at(cut)
    if prior is None:  # nothing engaged before the cut: no prior to weigh
        return None
    queries = group.queries
    vectors = item_vectors[:train.n_items]
    base = warm_scores(queries, vectors, None, 1.0, half_life_days, deep_weight, kernel_weight, kernel_temp)
    exclude = Ragged(queries.context.ptr, queries.context.idx)
    recall = {w: ranking_metrics(base + w * prior[None, :], group.deep_funnel, exclude, recall_ks=(k,), ndcg_ks=(k,)).recall[k]
              for w in weights}
    best = max(recall.values())
    weight = min((w for w, r in recall.items() if r == best), key=lambda w: abs(w - 1.0))  # a tie keeps the unit weight
    return PriorCalibration(weight, recall, users, cut)


def new_user_engagement(train: Interactions, days: float, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(n_items,) each item's engagements made within `days` of their user's first event (module docstring): 1 per event,
    `deep_weight` for a conversion, x 2^(-age / half-life), age counted back from end(t) (None: no decay)."""
    first = np.full(train.n_users, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, train.user, train.ts)
    early = train.ts - first[train.user] < days * US_PER_DAY
    weight = event_weights(train.deep, deep_weight) * decay(train.end_us - train.ts, half_life_days)
    return np.bincount(train.item[early], weights=weight[early], minlength=train.n_items)
