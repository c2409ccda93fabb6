"""Stable primitive ids across windows: match this window's prototypes to the previous window's (Hungarian on cosine
similarity, scipy's `linear_sum_assignment`), and the adjusted Rand index of the two windows' assignments."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class Matching:
    ids: np.ndarray  # int64 [K]: the stable id of each current prototype row
    matched: np.ndarray  # bool [K]: inherited from a previous prototype (else a fresh id)
    similarity: np.ndarray  # float32 [K]: cosine similarity to the matched previous prototype (nan when fresh)

    @property
    def share_matched(self) -> float:
        return float(self.matched.mean()) if len(self.matched) else 0.0


def match_prototypes(current: np.ndarray, previous: np.ndarray | None = None, previous_ids: np.ndarray | None = None,
                     min_similarity: float = 0.5) -> Matching:
    """Each current prototype inherits the id of the previous one it is matched to (maximum total cosine similarity,
    one-to-one), when their similarity is at least `min_similarity`; the others get ids above every previous id."""
    current = np.asarray(current, np.float32)  # (K, W)
    k = len(current)
    if previous is None or len(previous) == 0:
        return Matching(np.arange(k, dtype=np.int64), np.zeros(k, bool), np.full(k, np.nan, np.float32))
    previous = np.asarray(previous, np.float32)  # (K', W)
    previous_ids = np.arange(len(previous), dtype=np.int64) if previous_ids is None else np.asarray(previous_ids, np.int64)
    sim = _unit(current) @ _unit(previous).T  # (K, K')
    rows, cols = linear_sum_assignment(-sim)
    ids, matched, similarity = np.full(k, -1, np.int64), np.zeros(k, bool), np.full(k, np.nan, np.float32)
    ok = sim[rows, cols] >= min_similarity
    ids[rows[ok]], matched[rows[ok]], similarity[rows[ok]] = previous_ids[cols[ok]], True, sim[rows[ok], cols[ok]]
    fresh = np.nonzero(~matched)[0]
    ids[fresh] = int(previous_ids.max(initial=-1)) + 1 + np.arange(len(fresh))
    return Matching(ids, matched, similarity)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """ARI of two labelings of the same items (Hubert & Arabie); 1.0 for identical partitions up to renaming."""
    a, b = np.asarray(a), np.asarray(b)
    n = len(a)
    if n < 2:
        return 1.0
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), np.int64)
    np.add.at(table, (ai, bi), 1)
    comb = lambda x: x * (x - 1) / 2.0  # noqa: E731
    index, rows, cols = comb(table).sum(), comb(table.sum(1)).sum(), comb(table.sum(0)).sum()
    expected = rows * cols / comb(n)
    top = (rows + cols) / 2.0
    return 1.0 if top == expected else float((index - expected) / (top - expected))
