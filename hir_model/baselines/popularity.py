"""Time-decayed popularity: every user gets the same ranking (context items are only excluded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir_model.protocol.method import decay, event_weights
from hir_model.protocol.split import Interactions, ItemSpace, Queries


@dataclass(frozen=True)
class PopularityConfig:
    # half_life_days, deep_weight: chosen on MovieLens windows before the last 4 (3 days beat 7 and 14 there)
    half_life_days: float | None = 3.0  # an engagement's weight halves every this many days before end(t)
    deep_weight: float = 2.0  # a deep-funnel event counts as this many engagements
    parent_fallback: bool = True  # an item first seen in t+1 scores its parent's mean popularity (else 0: chance)


class Popularity:
    """score(item) = sum over train events on it of weight x 2^(-age / half-life), age from end(t)."""

    def __init__(self, config: PopularityConfig = PopularityConfig(), name: str = "popularity"):
        self.config, self.name = config, name
        self.popularity: np.ndarray | None = None  # (n_known,)
        self.ids: np.ndarray | None = None

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        w = event_weights(train.deep, self.config.deep_weight) * decay(train.end_us - train.ts, self.config.half_life_days)
        self.popularity = np.bincount(train.item, weights=w, minlength=train.n_items)
        self.ids = items.ids

    def item_scores(self, items: ItemSpace) -> np.ndarray:
        """(len(items),) the score every user gets."""
        if self.popularity is None or self.ids is None:
            raise RuntimeError(f"{self.name}: fit before score")
        n = len(self.popularity)
        if not np.array_equal(items.ids[:n], self.ids):
            raise ValueError(f"{self.name}: scored on another item space than it was fitted on")
        out = np.zeros(len(items))
        out[:n] = self.popularity
        if self.config.parent_fallback and len(items) > n:
            parent = items.parent[:n]
            has = parent >= 0
            total = np.bincount(parent[has], weights=self.popularity[has], minlength=len(items.parent_ids))
            count = np.bincount(parent[has], minlength=len(items.parent_ids))
            mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
            new_parent = items.parent[n:]
            out[n:] = np.where(new_parent >= 0, mean[np.maximum(new_parent, 0)], 0.0)
        return out

    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        return np.broadcast_to(self.item_scores(items).astype(np.float32), (len(queries), len(items))).copy()
