"""A sequence-aware baseline: recency-weighted item-to-item (what a user did last, and what others did next).

HIR's head reads each user's recent items, so its fair peer is a method that does too. Fitted on window t's history:

- Co-engagement. Each user's engaged items, distinct, in the order of their first engagement before end(t) (weight 1,
  `deep_weight` when the user converted on it). Two items co-occur when one of them follows the other within `window`
  positions of a user's sequence (None: anywhere in the history, plain co-occurrence over users); the pair counts
  w_i x w_j x 2^(-age / fit_half_life_days), age of the later engagement from end(t) (recent co-engagement weighs
  more), the earlier->later direction x 1 and the reverse x `backward_weight` (order matters: what follows an item).
- Similarity. S[c, j] = C[c, j] / (n_c^alpha x n_j^(1 - alpha)), n the items' summed squared weights (alpha 0.5: the
  cosine; above it, popular candidates are penalised less). Each item keeps its `neighbours` most similar items.
- Score. A user's context events (warm: their history; cold: their t+1 context) each weigh their stage (`deep_weight`)
  x 2^(-age / half_life_days), age counted back from the user's own last event (as HIR's readout weighs recent items);
  score(j) = sum_c w_c S[c, j] / sum_c w_c, plus `popularity_weight` x the item's decayed popularity (scaled to max 1),
  which ranks the items no neighbour reaches. Items first seen in t+1 score a constant (chance, after the tie order).

Sparse throughout (S has at most `neighbours` entries per item), so tens of thousands of items fit.
The defaults were chosen by warm users' deep-funnel Recall@20 on MovieLens windows 1997-10-12 .. 1998-03-15 (each
judged on its next week), never on the last 4 (1998-03-22 .. 1998-04-12), a few knobs at a time (a coordinate search,
not a full grid): a 10-position window over 5, 20 and unwindowed co-occurrence; a 28-day pair decay over 7, 14, 56
days and none; a 7-day context half-life over 1, 2, 21 days and none; popularity weight 0.05 over 0.01 to 0.3;
alpha 0.5 over 0.65 and 0.8; both directions at full weight over 0 and 0.5 backward; 100 neighbours over 300.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.method import decay, event_weights, known_columns
from hir_model.protocol.split import Interactions, ItemSpace, Queries
from hir_model.rank.coengagement import SimilarityConfig, context_matrix, item_similarity


@dataclass(frozen=True)
class Item2ItemConfig(SimilarityConfig):
    """The similarity's fields (SimilarityConfig, shared with the ranking head's co-engagement), then the score's."""

    half_life_days: float | None = 7.0  # a context event's weight halves every this many days before the user's last one
    popularity_weight: float = 0.05  # x the decayed popularity (max 1): the backfill for items no neighbour reaches
    popularity_half_life_days: float | None = 3.0  # the backfill popularity's decay from end(t)


class Item2ItemRecent:
    """Recency-weighted item-to-item (module docstring)."""

    def __init__(self, config: Item2ItemConfig = Item2ItemConfig(), name: str = "item2item_recent"):
        self.config, self.name = config, name
        self.similarity: sp.csr_matrix | None = None  # (n_known, n_known)
        self.popularity: np.ndarray | None = None  # (n_known,) max 1
        self.ids: np.ndarray | None = None

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        c = self.config
        self.similarity = item_similarity(train, c)
        w = event_weights(train.deep, c.deep_weight) * decay(train.end_us - train.ts, c.popularity_half_life_days)
        pop = np.bincount(train.item, weights=w, minlength=train.n_items)
        self.popularity = pop / pop.max() if len(pop) and pop.max() > 0 else pop
        self.ids = items.ids

    def context(self, queries: Queries, n_known: int) -> sp.csr_matrix:
        return context_matrix(queries, n_known, self.config.half_life_days, self.config.deep_weight)

    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        if self.similarity is None or self.ids is None:
            raise RuntimeError(f"{self.name}: fit before score")
        n = self.similarity.shape[0]
        if not np.array_equal(items.ids[:n], self.ids):
            raise ValueError(f"{self.name}: scored on another item space than it was fitted on")
        scores = (self.context(queries, n) @ self.similarity).toarray()  # (Q, n_known)
        scores += self.config.popularity_weight * self.popularity[None, :]
        return known_columns(scores, len(items))
