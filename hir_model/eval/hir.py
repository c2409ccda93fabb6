"""HIR in the evaluation: three rows, all scored by the one ranking head (hir_model.rank) from window t's published state.

- `hir`: what is served. Warm users are asked by id and cold users by their context (the events on items the window
  knows) through `Recommender.top`: BoM candidates, the head's scores, already engaged items removed. Its top `depth`
  items are the ranking; the rest rank after them. On items known by end(t) it is window t's answer (`scope="window"`).
  On items first seen in t+1 it is the answer the served path gave among the increments of window t published by the
  moment of each judged engagement (`scope="new"`, `Queries.as_of`; `timed`: the evaluation judges each target in the
  answer of its own moment, hir_model.protocol.metrics.timed_ranking_metrics): an item is servable only from the
  increment that carries it, as the cadence places it in time (hir_model.rank.increment: from its arrival or from its
  day's end, plus the lag). Without increments, items first seen in t+1 are never served.
- `hir_exact`: the head over every item (items first seen in t+1 placed by their content among window t's warm products,
  at the priors' floor, with the head's content term): what the served path approximates. The learned ranker re-scores
  the first stage's best items of each group apart, the known ones and the new ones, as the served scopes do.
- `hir_embeddings`: the published rows (encoder vectors for cold users) plus the item prior at its own weight
  (HeadState.rows_prior_weight), no recent items, no kernel, no structural readout, no content term: what the learned
  representation carries on its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hir_model.protocol.split import Interactions, ItemSpace, Queries
from hir_model.rank.features import pair_features
from hir_model.rank.head import head_scores, head_scores_at
from hir_model.rank.ranker import first_stage, ranked_scores
from hir_model.rank.inductive import InductiveEncoder
from hir_model.rank.recommender import ContextEvent, Recommender

MODES = {"hir": "served", "hir_exact": "exact", "hir_embeddings": "embeddings", "ranker_base": "base"}


class HeadMethod:
    """One of HIR's rows (module docstring) as an evaluation `Method`."""

    def __init__(self, rec: Recommender, inductive: InductiveEncoder, name: str = "hir", depth: int = 50,
                 arrivals: Recommender | None = None, available_us: np.ndarray | None = None):
        """arrivals: `rec` with window t's increments appended (the served row's answers on items first seen in t+1;
        None: none served); available_us: (m,) when each appended item became servable, non-decreasing."""
        if name not in MODES:
            raise ValueError(f"HIR's rows are {sorted(MODES)}, got {name!r}")
        self.rec, self.inductive, self.name, self.mode, self.depth = rec, inductive, name, MODES[name], depth
        self.config = rec.config.embeddings_only() if self.mode == "embeddings" else rec.config
        self._items: tuple[np.ndarray, object, object] | None = None  # (ids, ItemSide, FeatureItems) of the last item space
        self.variant = "base" if self.mode == "base" else "hir"  # the learned ranker that re-scores (exact and base)
        self.warm_served = 0  # warm users answered through the served path (a count for the report)
        if arrivals is not None and (available_us is None or len(available_us) != arrivals.arrived_items
                                     or np.any(np.diff(available_us) < 0)):
            raise ValueError(f"{name}: each appended item needs its servable time, in the order they were appended")
        self.arrivals, self.available_us = arrivals, available_us
        self.timed = self.mode == "served" and arrivals is not None  # items first seen in t+1: judged at each moment

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        state = self.rec.state
        if train.window != state.window or train.end_us != state.end_us:
            raise ValueError(f"{self.name}: the ranking head of window {state.window} cannot be evaluated on the split of "
                             f"{train.window}")
        if not np.array_equal(items.ids[:items.n_known], state.item_ids):
            raise ValueError(f"{self.name}: the ranking head of {state.window} ranks other items than the split's known items")

    def item_side(self, items: ItemSpace):
        """The head's items plus the item space's items first seen in t+1 (cached per item space)."""
        if self._items is None or self._items[0] is not items.ids:
            new = self.inductive.item_vectors(items)[items.n_known:] if len(items) > items.n_known else None
            state = self.rec.state
            weight = state.rows_prior_weight if self.mode == "embeddings" else None  # each score's own fitted weight
            content = None
            if new is not None and items.content is not None and state.content is not None \
                    and items.content.shape[1] == state.content.shape[1]:
                content = np.where(items.has_content[items.n_known:, None], items.content[items.n_known:], 0.0)
            feats = state.feature_items(0 if new is None else len(new), content)
            self._items = (items.ids, state.items(self.config, new, prior_weight=weight, new_content=content), feats)
        return self._items[1]

    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        if self.mode == "served":
            return self._served(queries, items)
        side = self.item_side(items)
        if self.mode == "embeddings":
            return head_scores(queries, side, self.config, *self._users(queries, items))
        ranker, users = self.rec.state.ranker(self.variant), self._users(queries, items)

        def ranked(cols: np.ndarray | None) -> np.ndarray:
            return ranked_scores(self.variant, ranker, queries, side, self._items[2], self.rec.state.base_co_weight,
                                 self.config, *users, cols)

        if ranker is None or len(items) == items.n_known:
            return ranked(None)
        known, new = np.arange(items.n_known), np.arange(items.n_known, len(items))  # the served scopes: window, new
        return np.concatenate([ranked(known), ranked(new)], axis=1)

    def score_pairs(self, queries: Queries, items: ItemSpace, q: np.ndarray, c: np.ndarray) -> np.ndarray:
        """(P,) score(queries, items)[q, c], the same values, without the interest kernel's soft maximum over every item
        (the lift reads a few items of each user)."""
        if self.mode == "served":
            return self.score(queries, items)[q, c]
        ranker = None if self.mode == "embeddings" else self.rec.state.ranker(self.variant)
        if ranker is not None:  # the ranker's own score of each pair (the lift reads a few items per user)
            side, users = self.item_side(items), self._users(queries, items)
            first = first_stage(self.variant, queries, side, self._items[2], self.rec.state.base_co_weight, self.config,
                                *users)[q, c]
            return ranker.predict(pair_features(ranker.features, queries, side, self._items[2], self.config, *users,
                                                q, c, first)).astype(np.float32)
        return head_scores_at(queries, self.item_side(items), self.config, *self._users(queries, items), q, c)

    def _users(self, queries: Queries, items: ItemSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(Q, W) the published rows, (Q,) which queries are warm (a row), (Q, W) encoder vectors of the others (or None)."""
        side = self.item_side(items)
        known = np.array([self.rec.knows(u) for u in queries.user_ids], bool)
        rows = np.zeros((len(queries), side.vectors.shape[1]), np.float32)
        warm = np.zeros(len(queries), bool)
        if known.any():
            idx = np.array([self.rec.user_index[u] for u in queries.user_ids[known]], np.int64)
            rows[known], warm[known] = self.rec.user_rows[idx], self.rec.has_row[idx]
        cold = np.flatnonzero(~warm)
        vectors = None
        if len(cold):
            vectors = np.zeros_like(rows)
            vectors[cold] = self.inductive.embed_cold(queries.take(cold), items)
        return rows, warm, vectors

    def _served(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        if queries.as_of is not None:
            return self._served_at(queries, items)
        out = np.full((len(queries), len(items)), -np.inf, np.float32)
        known = np.flatnonzero([self.rec.knows(u) for u in queries.user_ids])
        others = np.setdiff1d(np.arange(len(queries)), known)
        answered = []
        if len(known):
            answered += zip(known, self.rec.top(self.rec.user_batch(list(queries.user_ids[known])), self.depth))
            self.warm_served += len(known)
        if len(others):
            sub = queries.take(others)
            ctx = sub.context
            contexts = [[ContextEvent(str(items.ids[i]), int(t), bool(d)) for i, t, d in
                         zip(ctx.row(q), sub.context_ts[ctx.ptr[q]:ctx.ptr[q + 1]], sub.context_deep[ctx.ptr[q]:ctx.ptr[q + 1]])]
                        for q in range(len(sub))]
            batch = self.rec.context_batch(contexts, list(sub.user_ids))
            answered += zip(others, self.rec.top(batch, self.depth))
        for q, (rows, scores) in answered:  # head rows are the item space's known rows (checked in fit)
            out[q, rows] = scores
        return out

    def _served_at(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        """(Q, N): each query's served answer among the increments' items published by its `as_of` (scope "new"), its
        top `depth` on the item space's new group; -inf elsewhere (the known items are judged on `_served`'s answers)."""
        out = np.full((len(queries), len(items)), -np.inf, np.float32)
        rec = self.arrivals
        if rec is None:
            return out
        column = pd.Index(items.ids).get_indexer(rec.item_ids[rec.n_window:])  # (m,) item-space column of each arrival
        column[column < items.n_known] = -1  # an arrival the split counts as known (never: ids are new to window t)
        upto = rec.n_window + np.searchsorted(self.available_us, queries.as_of, side="right")  # (Q,) rows served then
        known = np.array([rec.knows(u) for u in queries.user_ids], bool)
        warm_batch = rec.user_batch(list(queries.user_ids[known])) if known.any() else None
        warm_at = np.cumsum(known) - 1  # each known query's row in warm_batch
        ctx, cold = queries.context, np.flatnonzero(~known)
        cold_batch = None
        if len(cold):  # one encoder pass for every cold query, each context within what was published at its as_of
            contexts = [[ContextEvent(str(items.ids[i]), int(t), bool(d)) for i, t, d in
                         zip(ctx.idx[ctx.ptr[q]:ctx.ptr[q + 1]], queries.context_ts[ctx.ptr[q]:ctx.ptr[q + 1]],
                             queries.context_deep[ctx.ptr[q]:ctx.ptr[q + 1]])] for q in cold]
            cold_batch = rec.context_batch(contexts, [str(u) for u in queries.user_ids[cold]], upto=upto[cold])
        cold_at = np.cumsum(~known) - 1  # each cold query's row in cold_batch
        for q in range(len(queries)):
            batch = warm_batch.one(int(warm_at[q])) if known[q] else cold_batch.one(int(cold_at[q]))
            rows, scores = rec.top(batch, self.depth, scope="new", upto=int(upto[q]))[0]
            col = column[rows - rec.n_window]
            out[q, col[col >= 0]] = scores[col >= 0]
        return out
