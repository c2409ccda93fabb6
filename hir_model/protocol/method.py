"""What every ranked method implements (the baselines today, HIR later), and helpers they share.

A method is fitted once per window on the train interactions (engagements before end(t)) and the known
part of the item space (ids, parents, content vectors of items known by end(t)); it then scores query users
over the whole item space. Warm queries carry their row in the train users and their history as context;
cold queries carry only their t+1 context (the same for every method). A method that cannot score some
items (transductive methods and items first seen in t+1) returns a constant for them: the evaluation breaks
ties in one fixed random order, so that is chance level, never an accident of id order.

HIR plugs in as one more `Method`: `fit` loads window t's `entity_embeddings` (and the frozen encoder) rather
than training; `score` looks warm users up, embeds cold users from `queries.context` (item rows, timestamps,
deep-funnel flags: the same context every baseline gets) with the frozen window-t encoder, and scores items
first seen in t+1 from their content (`items.content`, or their ids against the content asset of t+1).

Stateful methods may warm-start from the previous window they were fitted on, but only from a strictly
earlier one (`may_warm_start`), so running windows out of order can never leak the future backwards.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.split import Interactions, ItemSpace, Queries

US_PER_DAY = 86_400_000_000


@runtime_checkable
class Method(Protocol):
    name: str  # column name in the report

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        """Fit on engagements before end(t); `items` holds only the items known by end(t)."""

    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        """(len(queries), len(items)) float scores, higher is better, finite or -inf."""


def event_weights(deep: np.ndarray, deep_weight: float) -> np.ndarray:
    """1 per engagement event, `deep_weight` for a deep-funnel one."""
    return np.where(deep, deep_weight, 1.0)


def decay(age_us: np.ndarray, half_life_days: float | None) -> np.ndarray:
    """2^(-age / half-life); 1 everywhere when half_life_days is None."""
    if half_life_days is None:
        return np.ones(len(age_us))
    return np.exp2(-np.maximum(age_us, 0) / (half_life_days * US_PER_DAY))


def context_weights(queries: Queries, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(nnz,) weight of each context event: its stage x 2^(-age / half-life), age from the query's own last event."""
    row = queries.context.row_of
    last = np.full(len(queries), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last, row, queries.context_ts)
    return event_weights(queries.context_deep, deep_weight) * decay(last[row] - queries.context_ts, half_life_days)


def pair_matrix(rows: np.ndarray, cols: np.ndarray, deep: np.ndarray, shape: tuple[int, int], deep_weight: float,
                recency: np.ndarray | None = None) -> sp.csr_matrix:
    """(R, C) one entry per distinct (row, col) pair: 1 for an engagement, deep_weight when one of its events
    converted; times the largest `recency` (per event, e.g. a time decay) of the pair's events when given."""
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    key = rows * shape[1] + cols
    uniq, inverse = np.unique(key, return_inverse=True)
    converted = np.zeros(len(uniq), bool)
    np.logical_or.at(converted, inverse, deep)
    values = np.where(converted, deep_weight, 1.0)
    if recency is not None:
        latest = np.zeros(len(uniq))
        np.maximum.at(latest, inverse, recency)
        values = values * latest
    return sp.csr_matrix((values.astype(np.float32), (uniq // shape[1], uniq % shape[1])), shape=shape)


def train_matrix(train: Interactions, deep_weight: float, half_life_days: float | None = None) -> sp.csr_matrix:
    """(U, known items) pair weights of the train interactions, optionally decayed by the age of the pair's last event."""
    recency = None if half_life_days is None else decay(train.end_us - train.ts, half_life_days)
    return pair_matrix(train.user, train.item, train.deep, (train.n_users, train.n_items), deep_weight, recency)


def context_matrix(queries: Queries, n_items: int, deep_weight: float) -> sp.csr_matrix:
    """(Q, n_items) pair weights of the queries' context restricted to item rows < n_items."""
    rows, cols = queries.context.row_of, queries.context.idx
    keep = cols < n_items
    return pair_matrix(rows[keep], cols[keep], queries.context_deep[keep], (len(queries), n_items), deep_weight)


def carry_rows(old_ids: np.ndarray | None, old: np.ndarray | None, new_ids: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Rows of `fresh` (len(new_ids), d), replaced by `old`'s row wherever the id was there before (warm start)."""
    if old_ids is None or old is None or len(old_ids) == 0:
        return fresh
    out = fresh.copy()
    order = np.argsort(old_ids)
    pos = np.searchsorted(old_ids[order], new_ids)
    pos = np.minimum(pos, len(old_ids) - 1)
    found = old_ids[order][pos] == new_ids
    out[found] = old[order[pos[found]]]
    return out


def may_warm_start(fitted_end_us: int | None, train: Interactions) -> bool:
    """Warm-start only from a fit on a strictly earlier window (never from the future)."""
    return fitted_end_us is not None and fitted_end_us < train.end_us


def known_columns(scores_known: np.ndarray, n_total: int, fill: float = 0.0) -> np.ndarray:
    """(Q, n_known) scores padded to (Q, n_total) with a constant for the items first seen in t+1."""
    out = np.full((scores_known.shape[0], n_total), fill, np.float32)
    out[:, :scores_known.shape[1]] = scores_known
    return out
