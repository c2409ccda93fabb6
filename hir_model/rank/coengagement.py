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

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.method import context_weights, decay
from hir_model.protocol.split import Interactions, Queries

# candidate weights the track record scores beside 0 (the head without it): a user's co-engagement with an item is a
# cosine averaged over their history, mostly well below 0.1, so the weights that matter are tens of logit units
COENGAGEMENT_WEIGHTS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


@dataclass(frozen=True)
class SimilarityConfig:
    """How item-to-item co-engagement is counted; hir_model.baselines.sequence's Item2ItemConfig extends it."""

    window: int | None = 10  # two items co-occur within this many positions of a user's sequence (None: anywhere)
    backward_weight: float = 1.0  # a later -> earlier pair, relative to earlier -> later (0: strictly "what comes next")
    fit_half_life_days: float | None = 28.0  # a pair's weight halves every this many days before end(t) (None: no decay)
    deep_weight: float = 2.0  # a converted item (fit) or a conversion event (context) counts this many times
    alpha: float = 0.5  # S[c, j] = C[c, j] / (n_c^alpha n_j^(1 - alpha)); 0.5: the cosine
    neighbours: int = 100  # most similar items kept per item


def _sequences(train: Interactions, deep_weight: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (user, item) pairs ordered by user then first engagement: user, item, weight, first ts."""
    key = train.user * np.int64(train.n_items) + train.item
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    converted = np.zeros(len(uniq), bool)
    np.logical_or.at(converted, inverse, train.deep)
    start = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(start, inverse, train.ts)
    user, item = uniq // train.n_items, uniq % train.n_items
    order = np.lexsort((item, start, user))
    return user[order], item[order], np.where(converted, deep_weight, 1.0)[order], start[order]


def _top_per_row(m: sp.csr_matrix, k: int) -> sp.csr_matrix:
    """Each row's k largest entries (ties: the lower column)."""
    m = m.tocsr()
    m.eliminate_zeros()
    row = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    order = np.lexsort((m.indices, -m.data, row))
    rank = np.arange(len(order)) - m.indptr[row[order]]
    keep = order[rank < k]
    return sp.csr_matrix((m.data[keep], (row[keep], m.indices[keep])), shape=m.shape)


def item_similarity(train: Interactions, config: SimilarityConfig) -> sp.csr_matrix:
    """(n_items, n_items) S[c, j], each row its `neighbours` largest entries (hir_model.baselines.sequence's docstring);
    no self-similarity. `config`: a SimilarityConfig (the baseline's Item2ItemConfig is one)."""
    user, item, w, start = _sequences(train, config.deep_weight)
    n = train.n_items
    if config.window is None:
        fresh = decay(train.end_us - start, config.fit_half_life_days)
        x = sp.csr_matrix((w * np.sqrt(fresh), (user, item)), shape=(train.n_users, n))
        co = (x.T @ x).tocsr()  # symmetric: order is not read
    else:
        rows, cols, vals = [], [], []
        for d in range(1, config.window + 1):  # pairs (p, p + d) of one user's sequence
            same = user[:-d] == user[d:]
            a, b = np.flatnonzero(same), np.flatnonzero(same) + d
            v = w[a] * w[b] * decay(train.end_us - start[b], config.fit_half_life_days)
            rows += [item[a], item[b]]
            cols += [item[b], item[a]]
            vals += [v, config.backward_weight * v]
        co = sp.csr_matrix((np.concatenate(vals or [np.zeros(0)]),
                            (np.concatenate(rows or [np.zeros(0, np.int64)]), np.concatenate(cols or [np.zeros(0, np.int64)]))),
                           shape=(n, n))
    co = (co - sp.diags(co.diagonal())).tocsr()  # no self-similarity
    norm = np.bincount(item, weights=w ** 2, minlength=n)
    left = np.power(norm, config.alpha, out=np.zeros(n), where=norm > 0)
    right = np.power(norm, 1 - config.alpha, out=np.zeros(n), where=norm > 0)
    inv = lambda x: np.divide(1.0, x, out=np.zeros(n), where=x > 0)  # noqa: E731
    sim = sp.diags(inv(left)) @ co @ sp.diags(inv(right))
    return _top_per_row(sim, config.neighbours).astype(np.float32)


def context_matrix(queries: Queries, n_known: int, half_life_days: float | None, deep_weight: float) -> sp.csr_matrix:
    """(Q, n_known) each query's context weight per known item: stage x 2^(-age / half-life), age from the query's own
    last event, rows summing to 1 (zero for a query without known context items)."""
    ctx, w = queries.context, context_weights(queries, half_life_days, deep_weight)
    keep = ctx.idx < n_known
    m = sp.csr_matrix((w[keep], (ctx.row_of[keep], ctx.idx[keep])), shape=(len(queries), n_known))
    total = np.asarray(m.sum(1)).ravel()
    return (sp.diags(np.divide(1.0, total, out=np.zeros(len(total)), where=total > 0)) @ m).tocsr()


def coengagement_similarity(train: Interactions, deep_weight: float) -> sp.csr_matrix:
    """(n_items, n_items) float32 S of window t's history (module docstring), each row its 100 largest entries."""
    return item_similarity(train, SimilarityConfig(deep_weight=deep_weight))


def coengagement_rows(queries: Queries, similarity: sp.csr_matrix, half_life_days: float | None,
                      deep_weight: float) -> sp.csr_matrix:
    """(Q, N) sparse: each query's recency-weighted co-engagement with every item; context items are rows of
    `similarity` (square); an empty row for a query without context."""
    return (context_matrix(queries, similarity.shape[0], half_life_days, deep_weight) @ similarity).tocsr()


def coengagement_scores(queries: Queries, similarity: sp.csr_matrix, half_life_days: float | None, deep_weight: float,
                        columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) float32 `coengagement_rows` at the item rows `columns` (None: all), dense."""
    m = coengagement_rows(queries, similarity, half_life_days, deep_weight)
    m = m if columns is None else m[:, columns]
    return m.toarray().astype(np.float32)


def coengagement_at(queries: Queries, similarity: sp.csr_matrix, half_life_days: float | None, deep_weight: float,
                    q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(P,) float32 coengagement_scores(...)[q, c] without the dense (Q, N) matrix."""
    return np.asarray(coengagement_rows(queries, similarity, half_life_days, deep_weight)[q, c], np.float32).ravel()


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
