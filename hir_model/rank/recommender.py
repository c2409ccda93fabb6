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
   exact top-100 (hir_model.rank.bom_index, hir_model.rank.tune). A cold user's candidates are every item: its structural
   readout and the new users' prior are terms the index cannot probe, and its encoder pass costs more than scoring them.
2. Scores: the one scoring path over the candidates (exact: over every item): the head's hand-set score picks the
   best `depth` of them, the window's learned ranker re-scores those (hir_model.rank.ranker; the head's score alone
   where no ranker was trained yet).
3. The items the user already engaged with by end(t) (a cold user: its context) are removed unless `include_seen`.

Items that arrived after end(t) (hir_model.rank.increment) are served once `with_increments` appends window t's published
increments: rows n_window .. n_items, at the priors' floors with their content for the head's content term, the BoM
postings and the faiss index extended in place. They have no prior and no co-engagement to reach them, so they get
their own candidates: the increment items nearest the query vector, each probed recent item and the user's content
profile (all of them when they are fewer than the budget). `scope` asks for all items,
the window's only (what was served before any increment) or the increments' only (the new arrivals); `upto` serves the
first `upto` rows only (the evaluation's view of what had been published at a past moment).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hir_model.protocol.metrics import Ragged, in_sorted
from hir_model.protocol.split import ItemSpace, Queries, warm_queries
from hir_model.rank.candidates import candidates
from hir_model.rank.head import HeadConfig, warm_query
from hir_model.rank.ranker import ranked_scores
from hir_model.rank.state import HEAD_ASSET, HeadState, read_head
from hir_model.retrieval.index import DEFAULT_PROBE_FACTOR, Hit

US_PER_SECOND = 1_000_000
SCOPES = ("all", "window", "new")  # every served item, window t's items only, the increments' items only


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

    def one(self, q: int) -> Batch:
        """Query `q` alone."""
        return _one(self, q)


class Recommender:
    """Window t's ranking head over its items, with the BoM index for candidates (module docstring)."""

    def __init__(self, state: HeadState, user_rows: np.ndarray, has_row: np.ndarray, retriever=None, inductive=None,
                 inductive_loader=None, probe_factor: float | None = None, config: HeadConfig | None = None,
                 budget_k: int = 100, variant: str = "hir"):
        """user_rows: (U, W) the published rows of state.history.user_ids (has_row: which exist); retriever: the window's
        BoM `Retriever` over the head's items in their order (None: exact only); inductive: an `InductiveEncoder` for
        cold users, or `inductive_loader()` making one on first use; config: other shares (e.g. embeddings_only);
        budget_k: a top-k query takes the candidates of a top-max(k, budget_k) one (the budget is tuned at that k);
        variant: the learned ranker that re-scores the first stage's candidates ("hir"; "base": the ranker without HIR's
        features over the base first stage, the evaluation's `ranker_base`), the first stage alone where none was trained."""
        self.state, self.user_rows, self.has_row = state, user_rows, has_row
        self.config = config or state.config
        self.items = state.items(self.config)
        self.variant, self.ranker = variant, state.ranker(variant)
        self.feats = state.feature_items()
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
        self.item_ids, self.item_types = state.item_ids, state.item_types  # the served items: window t's, then increments'
        self.n_window = self.n_items = state.n_items
        self.increments: tuple = ()  # hir_model.rank.increment.Increment, in the order their items were appended
        self.window_retriever = retriever  # the index over window t's items alone (what `scope="window"` probes)
        self._new_vectors = np.zeros((0, self.items.vectors.shape[1]), np.float32)  # (m, W) the increments' vectors
        self._new_content: np.ndarray | None = None  # (m, C) their content vectors (zeros where none)
        self._new_has = np.zeros(0, bool)  # (m,) which have content
        self._space: ItemSpace | None = None

    @property
    def window(self) -> str:
        return self.state.window

    def with_increments(self, increments: Sequence) -> Recommender:
        """This window plus `increments` (its published arrivals, hir_model.rank.increment.Increment) appended after the
        items it serves, as a new Recommender: this one is left serving exactly what it served (a request holding it
        never sees part of an increment). The faiss index grows in place and the postings of the new items' tokens are
        copied and extended (hir_model.retrieval.index.Retriever.extended); the head's item side is rebuilt with the new
        vectors at the priors' floors and their content (the head's content term). ValueError for an increment of
        another window or an id already served."""
        added = [inc for inc in increments if len(inc)]
        for inc in increments:
            if inc.window != self.window:
                raise ValueError(f"the increment of {inc.day} is placed in window {inc.window}'s space, not {self.window}'s")
        if not added:
            other = copy.copy(self)
            other.increments = self.increments + tuple(increments)
            return other
        ids = np.concatenate([inc.item_ids for inc in added]).astype(object)
        clash = [e for e in ids if e in self.item_row]
        repeated = len(set(ids)) < len(ids)
        if clash or repeated:
            raise ValueError(f"window {self.window} serves these ids already: {clash[:5]}" if clash else
                             f"an id appears in two increments of window {self.window}")
        types = np.concatenate([inc.item_types for inc in added]).astype(object)
        vectors = np.concatenate([inc.vectors for inc in added]).astype(np.float32)  # (m, W)
        tokens = pa.concat_tables([inc.tokens for inc in added])
        served = [inc for inc in self.increments + tuple(increments) if len(inc)]  # every increment with items, in order
        width = next((inc.content.shape[1] for inc in served if inc.content is not None), 0)
        fits = [inc.content is not None and inc.content.shape[1] == width for inc in served]  # another width: no content
        other = copy.copy(self)
        other.increments = self.increments + tuple(increments)
        other.item_ids = np.concatenate([self.item_ids, ids])
        other.item_types = np.concatenate([self.item_types, types])
        other.n_items = len(other.item_ids)
        other._new_vectors = np.concatenate([self._new_vectors, vectors])
        other._new_content = np.concatenate([inc.content if ok else np.zeros((len(inc), width), np.float32)
                                             for inc, ok in zip(served, fits)]) if width else None
        other._new_has = np.concatenate([inc.has_content & ok for inc, ok in zip(served, fits)])
        other.items = self.state.items(self.config, other._new_vectors, new_content=other._arrival_content())
        other.feats = self.state.feature_items(len(other._new_vectors), other._arrival_content())
        other.item_row = dict(self.item_row)
        other.item_row.update({e: self.n_items + i for i, e in enumerate(ids)})
        other.retriever = self.retriever.extended(ids, types, vectors, tokens) if self.retriever is not None else None
        other._space = None
        if self._inductive is not None:  # its per-item-space cache is its own: one per snapshot (the model is shared)
            other._inductive = copy.copy(self._inductive)
        elif self._inductive_loader is not None:
            other._inductive_loader = lambda: copy.copy(self.inductive)
        other._lock = threading.Lock()
        return other

    def _arrival_content(self) -> np.ndarray | None:
        """(m, C) the arrivals' content for the head's content term (zero rows: none), None where the head carries no
        content of that width (the term then stays off, as for any item without content)."""
        state_content = self.state.content
        if state_content is None or self._new_content is None or self._new_content.shape[1] != state_content.shape[1]:
            return None
        return np.where(self._new_has[:, None], self._new_content, 0.0).astype(np.float32)

    def scope_range(self, scope: str = "all", upto: int | None = None) -> tuple[int, int]:
        """[lo, hi) of the item rows `scope` serves, within the first `upto` (None: every served row)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
        hi = self.n_items if upto is None else max(0, min(int(upto), self.n_items))
        lo = self.n_window if scope == "new" else 0
        return lo, (min(hi, self.n_window) if scope == "window" else max(hi, lo))

    @property
    def arrived_items(self) -> int:
        """Items served from increments."""
        return self.n_items - self.n_window

    @classmethod
    def load(cls, store, window: str, config: HeadConfig | None = None, increments: bool = False) -> Recommender:
        """Window `window`'s ranking head, users' rows and BoM index from the store, with every increment of the window
        published so far when `increments` (what `hir serve` and `hir retrieve` serve); FileNotFoundError naming what is
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

        rec = cls(state, rows, has, retriever, inductive_loader=loader, probe_factor=load_probe_factor(store, window),
                  config=config)
        if increments:
            from hir_model.rank.increment import load_increments
            rec = rec.with_increments(load_increments(store, window, state.end_us))
        return rec

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

    def context_batch(self, contexts: list[list[ContextEvent]], user_ids: list[str] | None = None,
                      upto: int | Sequence[int] | np.ndarray | None = None) -> Batch:
        """Users served from their context (events on the served items, within the first `upto` rows, one bound for all
        or one per context; other ids are left out, see `unknown_items`)."""
        user_ids = user_ids or [f"context:{i}" for i in range(len(contexts))]
        limits = np.broadcast_to(np.asarray(self.n_items if upto is None else upto, np.int64), (len(contexts),))
        rows, items, ts, deep = [], [], [], []
        for q, events in enumerate(contexts):
            limit = int(limits[q])
            known = [e for e in events if self.item_row.get(e.entity_id, limit) < limit]
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
        """The served items as an item space: window t's known by end(t), then the increments' (with their content, so
        the encoder reads one in a context as a leaf from its content); one per snapshot (the encoder caches by it)."""
        if self._space is None:
            n = self.n_items
            content = None if self._new_content is None else _RowContent(self.n_window, self._new_content)
            has = None if self._new_content is None else np.concatenate([np.zeros(self.n_window, bool), self._new_has])
            self._space = ItemSpace(self.item_ids, self.n_window, np.full(n, -1, np.int64), np.zeros(0, object), content, has)
        return self._space

    # scores ----------------------------------------------------------------------------------------------------
    def scores(self, batch: Batch, columns: np.ndarray | None = None, k: int = 0, include_seen: bool = False,
               allowed: np.ndarray | None = None) -> np.ndarray:
        """(Q, C) the one scoring path over the item rows `columns` (None: every item): the first stage, re-scored by the
        learned ranker at its best max(depth, k) items the user has not engaged with (unless `include_seen`) and
        `allowed` (Q, C) to pick, -inf elsewhere (hir_model.rank.ranker); the head's scores where no ranker was trained."""
        return ranked_scores(self.variant, self.ranker, batch.queries, self.items, self.feats, self.state.base_co_weight,
                             self.config, batch.rows, batch.warm, batch.cold_vectors, columns, k, include_seen, allowed)

    def query_vectors(self, batch: Batch) -> np.ndarray:
        """(Q, W) the vector each query probes the index with: the warm query, or the encoder's vector."""
        out = np.array(batch.cold_vectors if batch.cold_vectors is not None else batch.rows, np.float32)
        hot = np.flatnonzero(batch.warm)
        if len(hot):
            out[hot] = warm_query(batch.queries.take(hot), self.items.vectors, batch.rows[hot], self.config)
        return out

    def candidates(self, batch: Batch, k: int, probe_factor: float | None = None, include_seen: bool = False,
                   scope: str = "all", upto: int | None = None) -> list[np.ndarray]:
        """Per query, the item rows the head scores (hir_model.rank.candidates) within `scope_range(scope, upto)`."""
        return candidates(self, batch, k, probe_factor, include_seen, scope, upto)

    def top(self, batch: Batch, k: int, exact: bool = False, include_seen: bool = False,
            probe_factor: float | None = None, candidates: list[np.ndarray] | None = None, scope: str = "all",
            upto: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (item rows, scores) of its top k within `scope_range(scope, upto)`, best first (ties: lower row
        first); `candidates`: what `candidates(batch, k, probe_factor, include_seen, scope, upto)` returned, when the
        caller has it already."""
        seen = batch.queries.context
        lo, hi = self.scope_range(scope, upto)
        if exact:
            every = (lo, hi) == (0, self.n_items)
            all_scores = self.scores(batch, None if every else np.arange(lo, hi), k, include_seen)
        out = []
        cands = None if exact else candidates or self.candidates(batch, k, probe_factor, include_seen, scope, upto)
        together = not exact and self.ranker is not None and len(cands) > 1  # one ranker call over the union of candidates
        if together:
            union = np.unique(np.concatenate(cands))
            at = [np.searchsorted(union, c) for c in cands]
            allowed = np.zeros((len(cands), len(union)), bool)
            for q, a in enumerate(at):
                allowed[q, a] = True
            union_scores = self.scores(batch, union, k, include_seen, allowed)
        for q in range(len(batch.queries)):
            if exact:
                rows, s = np.arange(lo, hi), all_scores[q]
            elif together:
                rows, s = cands[q], union_scores[q, at[q]]
            else:
                rows = cands[q]
                s = self.scores(_one(batch, q), rows, k, include_seen)[0]
            if not include_seen:
                keep = ~in_sorted(np.unique(seen.row(q)), rows)
                rows, s = rows[keep], s[keep]
            order = np.lexsort((rows, -s))[:k]
            out.append((rows[order], s[order]))
        return out

    def hits(self, rows: np.ndarray, scores: np.ndarray) -> list[Hit]:
        return [Hit(str(self.item_ids[r]), str(self.item_types[r]), float(s)) for r, s in zip(rows, scores)]

    def recommend(self, user: str | None = None, context: list[ContextEvent] | None = None, k: int = 20, exact: bool = False,
                  include_seen: bool = False, scope: str = "all") -> list[Hit]:
        """The top k items for `user` (a user with a history in the window) or for `context` (anyone else), best first,
        among `scope`'s items (all, the window's, or the increments')."""
        if user is not None and self.knows(user):
            batch = self.user_batch([user])
        elif context:
            batch = self.context_batch([context], [user or "context:0"])
        else:
            raise UnknownUser(f"user {user!r} has no history in window {self.window} (users known: {len(self.user_index)}); "
                              f"pass a context of their events to serve them")
        rows, scores = self.top(batch, k, exact, include_seen, scope=scope)[0]
        return self.hits(rows, scores)


class _RowContent:
    """Content vectors of the served items as the encoder indexes them (`content[rows]`, `content.shape`): zeros for
    window t's items (graph(t) carries theirs), the increments' own for theirs, without an (items x width) matrix."""

    def __init__(self, n_window: int, new: np.ndarray):
        self.n_window, self.new = n_window, new
        self.shape = (n_window + len(new), new.shape[1])

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        out = np.zeros((len(rows), self.shape[1]), np.float32)
        at = rows >= self.n_window
        out[at] = self.new[rows[at] - self.n_window]
        return out


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
