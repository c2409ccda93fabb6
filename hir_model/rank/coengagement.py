"""Co-engagement in the ranking head: what the users who engaged with a warm user's recent items engaged with beside them.

The learned vectors place items by the graph's neighbourhoods; what one user did right before or after an item (the
sequence) they carry only in part, and recency-weighted item-to-item (hir_model.baselines.sequence, the evaluation's
`item2item_recent`) reads it directly. The head adds it as one more term of a warm user's score:
coengagement_weight x sum_c w_c S[c, j] / sum_c w_c over the user's history c (stage x 2^(-age / half-life), age from
the user's last event), S the item-to-item similarity of window t's history (`item_similarity`: sequence windows of 10,
a 28-day pair decay, the cosine, 100 neighbours per item). S is part of the head's state (`coengagement.parquet`), its
weight chosen like the prior's: by the earlier heads' track record (hir_model.rank.track), HeadConfig's until it has
one.
Nothing after end(t) is read.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from hir_model.baselines.sequence import Item2ItemConfig, context_matrix, item_similarity
from hir_model.protocol.split import Interactions, Queries

# candidate weights the track record scores beside 0 (the head without it): a user's co-engagement with an item is a
# cosine averaged over their history, mostly well below 0.1, so the weights that matter are tens of logit units
COENGAGEMENT_WEIGHTS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


def coengagement_similarity(train: Interactions, deep_weight: float) -> sp.csr_matrix:
    """(n_items, n_items) float32 S of window t's history (module docstring), each row its 100 largest entries."""
    return item_similarity(train, Item2ItemConfig(deep_weight=deep_weight))


def coengagement_scores(queries: Queries, similarity: sp.csr_matrix, half_life_days: float | None, deep_weight: float,
                        columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) float32 each query's recency-weighted co-engagement with the item rows `columns` (None: all); context items
    and columns are rows of `similarity` (square); zero for a query without context."""
    n = similarity.shape[0]
    m = context_matrix(queries, n, half_life_days, deep_weight) @ similarity
    m = m if columns is None else m[:, columns]
    return m.toarray().astype(np.float32)


def coengagement_at(queries: Queries, similarity: sp.csr_matrix, half_life_days: float | None, deep_weight: float,
                    q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(P,) float32 coengagement_scores(...)[q, c] without the dense (Q, N) matrix."""
    m = (context_matrix(queries, similarity.shape[0], half_life_days, deep_weight) @ similarity).tocsr()
    return np.asarray(m[q, c], np.float32).ravel()


def top_of_row(m: sp.csr_matrix, row: int, n: int) -> np.ndarray:
    """The columns of row `row`'s `n` largest entries of `m`, largest first (ties: lower column): an item's most
    co-engaged items (m the similarity), or a user's (m their co-engagement scores)."""
    lo, hi = m.indptr[row], m.indptr[row + 1]
    cols, vals = m.indices[lo:hi], m.data[lo:hi]
    return cols[np.lexsort((cols, -vals))[:n]].astype(np.int64)


def padded(similarity: sp.csr_matrix, n: int) -> sp.csr_matrix:
    """`similarity` as (n, n) (n >= its size): the rows and columns of items it never saw are empty."""
    m = similarity.tocsr().copy()
    m.resize((n, n))
    return m
