"""What HIR serves: top-k items for a user of window t (or for a context of events), scored by the ranking head.

`Recommender.load(store, window)` reads the window's `ranking_head` state, its `entity_embeddings` (the users' rows)
and its `bom_index`; the frozen encoder and graph(t) are loaded only when a context (a user unknown to the window) is
served. A query is answered in three steps:
1. Candidates (unless `exact`): the Bag-of-Meaning index probed with the head's query vector (a warm user's
   row-plus-recent-items query, a cold user's encoder vector), with each of the user's heaviest recent items (the
   interest kernel's terms: PinnerSage-style multi-query), for a warm user the items its co-engagement term scores
   highest (where the head has one), and the items with the largest prior (the head's bias
   term reaches them whatever the query); each source skips the items the user already engaged with, and the query
   vector's probe gives `probe_factor` x max(k, 100) of them, tuned per window so that the served top-100 matches the head's
   exact top-100 (hir_model.rank.bom_index, hir_model.rank.tune).
2. Scores: `head_scores` over the candidates (exact: over every item).
3. The items the user already engaged with by end(t) (a cold user: its context) are removed unless `include_seen`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from hir_model.protocol.metrics import Ragged, in_sorted
from hir_model.protocol.split import ItemSpace, Queries, warm_queries
from hir_model.rank.coengagement import coengagement_rows, top_of_row
from hir_model.rank.head import HeadConfig, head_scores, kernel_items, warm_query
from hir_model.rank.state import HEAD_ASSET, HeadState, read_head
from hir_model.retrieval.index import DEFAULT_PROBE_FACTOR, Hit

US_PER_SECOND = 1_000_000
KERNEL_PROBES = 3  # the heaviest recent items probed beside the query vector


@dataclass(frozen=True)
class ContextEvent:
    """One event of a context served for a user unknown to the window."""

    entity_id: str
    ts_us: int | None = None  # None: the events are taken in the order given, the last the most recent, ending at end(t)
    deep: bool = False  # a deep-funnel (conversion) event


class UnknownUser(LookupError):
    """A user with no history in the window and no context to serve them from."""


@dataclass
class Batch:
    """Queries the head scores together: users with a history (`warm`) and users served from a context."""

    queries: Queries  # context indices: rows of the head's items
    warm: np.ndarray  # (Q,) bool
    rows: np.ndarray  # (Q, W) published rows (zeros for the cold ones)
    cold_vectors: np.ndarray | None  # (Q, W) encoder vectors of the cold ones (zeros for the warm ones)


class Recommender:
    """Window t's ranking head over its items, with the BoM index for candidates (module docstring)."""

    def __init__(self, state: HeadState, user_rows: np.ndarray, has_row: np.ndarray, retriever=None, inductive=None,
                 inductive_loader=None, probe_factor: float | None = None, config: HeadConfig | None = None,
                 budget_k: int = 100):
        """user_rows: (U, W) the published rows of state.history.user_ids (has_row: which exist); retriever: the window's
        BoM `Retriever` over the head's items in their order (None: exact only); inductive: an `InductiveEncoder` for
        cold users, or `inductive_loader()` making one on first use; config: other shares (e.g. embeddings_only);
        budget_k: a top-k query takes the candidates of a top-max(k, budget_k) one (the budget is tuned at that k)."""
        self.state, self.user_rows, self.has_row = state, user_rows, has_row
        self.config = config or state.config
        self.items = state.items(self.config)
        self.retriever, self._inductive, self._inductive_loader = retriever, inductive, inductive_loader
        self._lock = threading.Lock()
        if retriever is not None and not np.array_equal(retriever.item_ids, state.item_ids):
            raise ValueError(f"window {state.window}: the BoM index's items are not the ranking head's (rebuild bom_index)")
        self.probe_factor = probe_factor if probe_factor is not None else DEFAULT_PROBE_FACTOR
        self.budget_k = budget_k
        self.user_index = {u: i for i, u in enumerate(state.history.user_ids)}
        self.item_row = {e: i for i, e in enumerate(state.item_ids)}
        prior = self.items.prior
        self.prior_order = np.argsort(-prior, kind="stable") if prior is not None else np.zeros(0, np.int64)

    @property
    def window(self) -> str:
        return self.state.window

    @classmethod
    def load(cls, store, window: str, config: HeadConfig | None = None) -> Recommender:
        """Window `window`'s ranking head, users' rows and BoM index from the store; FileNotFoundError naming what is
        missing (and which windows are materialised)."""
        from hir_model.embed.entity_embeddings import load_embeddings
        from hir_model.retrieval.index import BOM_ASSET
        from hir_model.retrieval.load_index import load_probe_factor, load_retriever

        for asset in (HEAD_ASSET, BOM_ASSET):
            if not store.exists(asset, window):
                done = ", ".join(store.partitions(asset)) or "none"
                raise FileNotFoundError(f"window {window} was never materialised: no {asset}/{window} under {store.root} "
                                        f"(materialised windows: {done})")
        state = read_head(store.partition_dir(HEAD_ASSET, window))
        emb = load_embeddings(store, window)
        rows, has = user_rows(emb, state.history.user_ids)
        retriever = load_retriever(store, window, emb)

        def loader():
            from hir_model.rank.artefacts import load_artefacts
            from hir_model.rank.inductive import InductiveEncoder
            return InductiveEncoder(load_artefacts(store, window, state.end_us))

        return cls(state, rows, has, retriever, inductive_loader=loader, probe_factor=load_probe_factor(store, window),
                   config=config)

    # queries ---------------------------------------------------------------------------------------------------
    def knows(self, user: str) -> bool:
        return user in self.user_index

    def user_batch(self, users: list[str]) -> Batch:
        """Users with a history in the window; UnknownUser for any other."""
        unknown = [u for u in users if u not in self.user_index]
        if unknown:
            raise UnknownUser(f"{len(unknown)} users have no history in window {self.window} (e.g. {unknown[:3]}); serve "
                              f"them from a context of their events")
        idx = np.array([self.user_index[u] for u in users], np.int64)
        queries = warm_queries(self.state.history, idx)
        warm = self.has_row[idx]
        cold_vectors = None
        if not warm.all():  # a user with a history but no published row: the encoder reads its history as a context
            cold_vectors = np.zeros_like(self.user_rows[idx])
            cold_vectors[~warm] = self.embed(queries.take(np.flatnonzero(~warm)))
        return Batch(queries, warm, self.user_rows[idx], cold_vectors)

    def context_batch(self, contexts: list[list[ContextEvent]], user_ids: list[str] | None = None) -> Batch:
        """Users served from their context (events on the window's items; other ids are left out, see `unknown_items`)."""
        user_ids = user_ids or [f"context:{i}" for i in range(len(contexts))]
        rows, items, ts, deep = [], [], [], []
        for q, events in enumerate(contexts):
            known = [e for e in events if e.entity_id in self.item_row]
            stamps = _stamps(known, self.state.end_us)
            order = np.argsort(stamps, kind="stable")
            for j in order:
                rows.append(q)
                items.append(self.item_row[known[j].entity_id])
                ts.append(stamps[j])
                deep.append(known[j].deep)
        ctx = Ragged.from_pairs(np.asarray(rows, np.int64), np.asarray(items, np.int64), len(contexts))
        queries = Queries(np.asarray(user_ids, object), np.full(len(contexts), -1, np.int64), ctx,
                          np.asarray(ts, np.int64), np.asarray(deep, bool))
        return Batch(queries, np.zeros(len(contexts), bool), np.zeros((len(contexts), self.items.vectors.shape[1]), np.float32),
                     self.embed(queries))

    def unknown_items(self, events: list[ContextEvent]) -> list[str]:
        return [e.entity_id for e in events if e.entity_id not in self.item_row]

    def embed(self, queries: Queries) -> np.ndarray:
        """(Q, W) the frozen encoder's vectors of users from their context (rows of the head's items)."""
        return self.inductive.embed_cold(queries, self.item_space())

    @property
    def inductive(self):
        with self._lock:
            if self._inductive is None:
                if self._inductive_loader is None:
                    raise RuntimeError(f"window {self.window}: no encoder to serve users from a context")
                self._inductive = self._inductive_loader()
            return self._inductive

    def item_space(self) -> ItemSpace:
        """The head's items as an item space (all known by end(t))."""
        n = self.state.n_items
        return ItemSpace(self.state.item_ids, n, np.full(n, -1, np.int64), np.zeros(0, object))

    # scores ----------------------------------------------------------------------------------------------------
    def scores(self, batch: Batch, columns: np.ndarray | None = None) -> np.ndarray:
        """(Q, C) the head's scores over the item rows `columns` (None: every item)."""
        return head_scores(batch.queries, self.items, self.config, batch.rows, batch.warm, batch.cold_vectors, columns)

    def query_vectors(self, batch: Batch) -> np.ndarray:
        """(Q, W) the vector each query probes the index with: the warm query, or the encoder's vector."""
        out = np.array(batch.cold_vectors if batch.cold_vectors is not None else batch.rows, np.float32)
        hot = np.flatnonzero(batch.warm)
        if len(hot):
            out[hot] = warm_query(batch.queries.take(hot), self.items.vectors, batch.rows[hot], self.config)
        return out

    def candidates(self, batch: Batch, k: int, probe_factor: float | None = None,
                   include_seen: bool = False) -> list[np.ndarray]:
        """Per query, the item rows the head scores (module docstring), sorted, the user's engaged items left out unless
        `include_seen`; every item without an index."""
        seen = batch.queries.context
        if self.retriever is None or not self.retriever.codebooks:
            every = np.arange(self.state.n_items)
            return [every if include_seen else np.setdiff1d(every, seen.row(q)) for q in range(len(batch.queries))]
        factor = self.probe_factor if probe_factor is None else probe_factor
        vectors = self.query_vectors(batch)
        recent = kernel_items(batch.queries, self.config.recent_half_life_days, self.config.deep_weight)
        co = None
        if self.items.coengagement is not None and batch.warm.any():
            co = coengagement_rows(batch.queries, self.items.coengagement, self.config.coengagement_half_life_days,
                                   self.config.deep_weight)
        out = []
        for q in range(len(batch.queries)):
            skip = np.zeros(0, np.int64) if include_seen else np.unique(seen.row(q))
            budget = min(math.ceil(factor * max(k, self.budget_k)), self.state.n_items)

            def fresh(rows: np.ndarray, n: int) -> np.ndarray:
                return rows[~in_sorted(skip, rows)][:n]  # np.isin's table grows with the catalogue

            parts = [fresh(self.retriever.probe_vector(vectors[q], budget + len(skip), floor=k + len(skip))[0], max(budget, k))]
            per_item = math.ceil(budget / KERNEL_PROBES)
            for item in recent[q][0][:KERNEL_PROBES]:
                parts.append(fresh(self.retriever.probe_vector(self.items.vectors[item], per_item + len(skip))[0], per_item))
            if co is not None and batch.warm[q]:  # the items the co-engagement term scores highest
                parts.append(fresh(top_of_row(co, q, budget + len(skip)), budget))
            parts.append(fresh(self.prior_order[:math.ceil(budget / 2) + len(skip)], math.ceil(budget / 2)))
            out.append(np.unique(np.concatenate(parts)))
        return out

    def top(self, batch: Batch, k: int, exact: bool = False, include_seen: bool = False,
            probe_factor: float | None = None, candidates: list[np.ndarray] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (item rows, scores) of its top k, best first (ties: lower row first); `candidates`: what
        `candidates(batch, k, probe_factor, include_seen)` returned, when the caller has it already."""
        seen = batch.queries.context
        if exact:
            all_scores = self.scores(batch)
        out = []
        cands = None if exact else candidates or self.candidates(batch, k, probe_factor, include_seen)
        for q in range(len(batch.queries)):
            if exact:
                rows, s = np.arange(self.state.n_items), all_scores[q]
            else:
                rows = cands[q]
                s = self.scores(_one(batch, q), rows)[0]
            if not include_seen:
                keep = ~in_sorted(np.unique(seen.row(q)), rows)
                rows, s = rows[keep], s[keep]
            order = np.lexsort((rows, -s))[:k]
            out.append((rows[order], s[order]))
        return out

    def hits(self, rows: np.ndarray, scores: np.ndarray) -> list[Hit]:
        return [Hit(str(self.state.item_ids[r]), str(self.state.item_types[r]), float(s)) for r, s in zip(rows, scores)]

    def recommend(self, user: str | None = None, context: list[ContextEvent] | None = None, k: int = 20, exact: bool = False,
                  include_seen: bool = False) -> list[Hit]:
        """The top k items for `user` (a user with a history in the window) or for `context` (anyone else), best first."""
        if user is not None and self.knows(user):
            batch = self.user_batch([user])
        elif context:
            batch = self.context_batch([context], [user or "context:0"])
        else:
            raise UnknownUser(f"user {user!r} has no history in window {self.window} (users known: {len(self.user_index)}); "
                              f"pass a context of their events to serve them")
        rows, scores = self.top(batch, k, exact, include_seen)[0]
        return self.hits(rows, scores)


def _stamps(events: list[ContextEvent], end_us: int) -> np.ndarray:
    """Each event's time; events without one are spaced a second apart in the order given, the last at end(t)."""
    n = len(events)
    return np.array([e.ts_us if e.ts_us is not None else end_us - (n - i) * US_PER_SECOND for i, e in enumerate(events)],
                    np.int64)


def _one(batch: Batch, q: int) -> Batch:
    idx = np.array([q])
    return Batch(batch.queries.take(idx), batch.warm[idx], batch.rows[idx],
                 None if batch.cold_vectors is None else batch.cold_vectors[idx])


def user_rows(emb, user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((U, W) the published rows of `user_ids`, zeros where missing; (U,) bool has a row)."""
    lookup = {e: i for i, e in enumerate(emb.entity_id)}
    idx = np.array([lookup.get(u, -1) for u in user_ids], np.int64)
    out = np.zeros((len(user_ids), emb.vectors.shape[1]), np.float32)
    out[idx >= 0] = emb.vectors[idx[idx >= 0]]
    return out, idx >= 0


__all__ = ["Batch", "ContextEvent", "Hit", "Recommender", "UnknownUser", "user_rows"]
