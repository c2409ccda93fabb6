"""Content-only: rank items by the cosine of their content vectors to the user's context items' vectors.

The content vectors come with the item space (the `content_embeddings` asset, or a stand-in). Nothing is
fitted: the method scores known and new items alike, which makes it the cold-start reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.method import decay, event_weights
from hir_model.protocol.split import Interactions, ItemSpace, Queries

NO_CONTENT = -2.0  # score of an item without a content vector: after every cosine


@dataclass(frozen=True)
class ContentKNNConfig:
    deep_weight: float = 2.0  # a context event that converted weighs this much (others 1)
    half_life_days: float | None = None  # recency weighting of context events from the query's latest one (None: off)
    aggregate: str = "mean"  # "mean": cosine to the weighted mean of context vectors; "max": best cosine to any context item

    def __post_init__(self) -> None:
        if self.aggregate not in ("mean", "max"):
            raise ValueError(f"aggregate must be 'mean' or 'max', got {self.aggregate!r}")


def normalised(content: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(content, axis=1, keepdims=True)
    return np.divide(content, norm, out=np.zeros_like(content, dtype=np.float32), where=norm > 0).astype(np.float32)


class ContentKNN:
    def __init__(self, config: ContentKNNConfig = ContentKNNConfig(), name: str = "content"):
        self.config, self.name = config, name
        self._unit: tuple[np.ndarray, np.ndarray] | None = None  # (content, its unit rows) of the last item space scored

    def unit_rows(self, items: ItemSpace) -> np.ndarray:
        """(N, d) the item space's content vectors normalised, once per item space (not once per query block)."""
        if self._unit is None or self._unit[0] is not items.content:
            self._unit = (items.content, normalised(items.content))
        return self._unit[1]

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        if items.content is None:
            raise ValueError(f"{self.name} needs content vectors: build the ItemSpace with_content(...)")

    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        if items.content is None or items.has_content is None:
            raise ValueError(f"{self.name} needs content vectors on the item space it scores")
        v = self.unit_rows(items)  # (N, d)
        ctx = queries.context
        rows = ctx.row_of
        latest = np.zeros(len(queries), np.int64)
        np.maximum.at(latest, rows, queries.context_ts)
        w = event_weights(queries.context_deep, self.config.deep_weight) * decay(latest[rows] - queries.context_ts,
                                                                                    self.config.half_life_days)
        if self.config.aggregate == "mean":
            weights = sp.csr_matrix((w, (rows, ctx.idx)), shape=(len(queries), len(items)))  # duplicates sum
            scores = normalised(np.asarray(weights @ v)) @ v.T  # (Q, N)
        else:
            scores = np.zeros((len(queries), len(items)), np.float32)
            for q in range(len(queries)):
                own = np.unique(ctx.row(q))
                if len(own):
                    scores[q] = (v[own] @ v.T).max(axis=0)
        scores[:, ~items.has_content] = NO_CONTENT
        return scores.astype(np.float32)
