"""The causal split of window t: fit on everything before end(t), test on window t+1's events only.

Decisions (the same for every method, HIR included):
- Items are the catalogue entities of `item_types` (default product, service; advertisers and campaigns are
  not ranked). Engagements are `engagement_types` (click, add_to_cart, purchase, interested: impressions and
  not_interested are exposure or negative feedback, not engagement); the deep funnel is `purchase`.
- Train: engagement events with ts < end(t) on items of catalog(t). Test: window t+1's events only, with
  ts inside [start(t+1), end(t+1)) (a t+2 timestamp that slipped into the file is dropped).
- Item space: items known by end(t) (catalog(t), sorted by id: the `known` group) followed by items first
  seen inside t+1 (the `new` group, cold-start items). Each slice ranks the full candidate set of one item
  group: known-item slices rank every item known by end(t); the cold-start slice ranks every item first seen
  in t+1 (only methods that use content or parents can tell those apart). The groups are never mixed, so
  one method's inability to score new items does not leak into the known-item numbers.
- Warm users have an engagement with an item before end(t); their context is that history, their targets
  their t+1 engagements. Cold users have none: their distinct t+1 items, ordered by first engagement, are
  cut in half (the first n // 2 items are the context, with every event on them up to the cut time; the
  rest are targets), which keeps a funnel (click -> cart -> purchase on one item) on one side of the cut.
  Cold users with fewer than `cold_min_items` distinct items are not evaluated.
- Targets never contain a context item (for warm users: nothing engaged with up to t), and context items
  are excluded from the ranking. Deep-funnel targets are the target items with a deep-funnel event.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.vocab import CONVERSION_EVENT
from hir_model.data.windows import Window
from hir_model.protocol.metrics import Ragged

EVENT_COLUMNS = ["user_id", "entity_id", "event_type", "ts"]
CATALOG_COLUMNS = ["entity_id", "entity_type", "parent_id", "first_seen_ts"]
TARGET_KINDS = ("deep_funnel", "engagement")
USER_GROUPS = ("warm", "cold")
ITEM_GROUPS = ("known", "new")


@dataclass(frozen=True)
class SplitConfig:
    item_types: tuple[str, ...] = ("product", "service")  # entity types ranked as items
    engagement_types: tuple[str, ...] = ("click", "add_to_cart", "purchase", "interested")  # positive engagement
    deep_funnel_types: tuple[str, ...] = (CONVERSION_EVENT,)  # the conversion HIR exists for
    cold_min_items: int = 2  # a cold user needs this many distinct t+1 items (half context, half targets)


@dataclass(frozen=True)
class ItemSpace:
    """Items known by end(t) (rows [0, n_known), sorted by id), then items first seen in t+1."""

    ids: np.ndarray  # (N,) object
    n_known: int
    parent: np.ndarray  # (N,) int64 row of parent_ids (an advertiser), -1 for none
    parent_ids: np.ndarray  # (P,) object
    content: np.ndarray | None = None  # (N, d) float32 content vectors; rows without content are 0
    has_content: np.ndarray | None = None  # (N,) bool

    def __len__(self) -> int:
        return len(self.ids)

    def known(self) -> ItemSpace:
        """The part a method may be fitted on (nothing first seen after end(t))."""
        n = self.n_known
        return ItemSpace(self.ids[:n], n, self.parent[:n], self.parent_ids,
                         None if self.content is None else self.content[:n],
                         None if self.has_content is None else self.has_content[:n])

    def with_content(self, content: np.ndarray, has_content: np.ndarray) -> ItemSpace:
        if content.shape[0] != len(self.ids) or has_content.shape != (len(self.ids),):
            raise ValueError(f"content has {content.shape[0]} rows for {len(self.ids)} items")
        return replace(self, content=np.asarray(content, np.float32), has_content=np.asarray(has_content, bool))

    def group(self, name: str) -> tuple[int, int]:
        """[lo, hi) of an item group: `known` or `new`."""
        return {"known": (0, self.n_known), "new": (self.n_known, len(self.ids))}[name]


@dataclass(frozen=True)
class Interactions:
    """The train set: engagement events with ts < end(t) on known items, indexed."""

    window: str  # key of window t
    end_us: int  # end(t), µs since the epoch: nothing here is at or after it
    user_ids: np.ndarray  # (U,) object, sorted: row u of a method's user table
    user: np.ndarray  # (E,) int64
    item: np.ndarray  # (E,) int64 row of the ItemSpace (always < n_known)
    ts: np.ndarray  # (E,) int64 µs
    deep: np.ndarray  # (E,) bool: a deep-funnel event
    n_items: int  # known items

    @property
    def n_users(self) -> int:
        return len(self.user_ids)


@dataclass(frozen=True)
class Queries:
    """Users to score, each with the context every method gets (time-ordered events on items)."""

    user_ids: np.ndarray  # (Q,) object
    user_index: np.ndarray  # (Q,) int64 row in Interactions.user_ids, -1 for a cold user
    context: Ragged  # (Q rows) ItemSpace rows of the context events, in time order (may repeat an item)
    context_ts: np.ndarray  # (nnz,) int64 µs, aligned with context.idx
    context_deep: np.ndarray  # (nnz,) bool, aligned with context.idx
    as_of: np.ndarray | None = None  # (Q,) int64 µs: the moment each query is answered at (what a served method had
    # published by then is what it may serve); None: at end(t). Every method but HIR's served row ignores it

    def __len__(self) -> int:
        return len(self.user_ids)

    def take(self, rows: np.ndarray) -> Queries:
        ptr, pos = self.context.gather(rows)
        return Queries(self.user_ids[rows], self.user_index[rows], Ragged(ptr, self.context.idx[pos]),
                       self.context_ts[pos], self.context_deep[pos], None if self.as_of is None else self.as_of[rows])

    def at(self, as_of: np.ndarray) -> Queries:
        """The same queries answered at the moments `as_of` (Q,) int64 µs."""
        return replace(self, as_of=np.asarray(as_of, np.int64))


@dataclass(frozen=True)
class UserGroup:
    name: str  # "warm" | "cold"
    queries: Queries
    deep_funnel: Ragged  # per query: target items with a deep-funnel event (never a context item)
    engagement: Ragged  # per query: target items engaged with (never a context item)
    deep_funnel_ts: np.ndarray | None = None  # (nnz,) int64 µs aligned with deep_funnel.idx: the user's first t+1
    # engagement with the item (the answer that led to it was served before it)
    engagement_ts: np.ndarray | None = None  # the same, aligned with engagement.idx

    def targets(self, kind: str) -> Ragged:
        return getattr(self, kind)

    def target_times(self, kind: str) -> np.ndarray | None:
        """(nnz,) int64 µs when the user first engaged with each target of `kind` in t+1 (None: not recorded)."""
        return getattr(self, f"{kind}_ts")


@dataclass(frozen=True)
class SplitCounts:
    train_events: int
    train_users: int
    known_items: int
    new_items: int
    next_engagements: int  # window t+1's engagement events on items of the item space
    warm_users: int  # evaluated (at least one target)
    cold_users: int  # evaluated
    cold_users_too_few: int  # cold users in t+1 with fewer than cold_min_items items
    dropped_next_events: int  # t+1 rows outside the window or on items outside the item space


@dataclass(frozen=True)
class WindowSplit:
    window: str
    next_window: str
    train: Interactions
    items: ItemSpace
    warm: UserGroup
    cold: UserGroup
    counts: SplitCounts

    def group(self, name: str) -> UserGroup:
        return {"warm": self.warm, "cold": self.cold}[name]


def to_us(ts) -> int:
    return int(pd.Timestamp(ts).value // 1000)


def to_frame(table: pa.Table, columns: list[str]) -> pd.DataFrame:
    """Selected columns as a DataFrame; timestamps as int64 µs since the epoch."""
    cols = {}
    for name in columns:
        col = table.column(name)
        cols[name] = (pc.cast(col, pa.int64()) if pa.types.is_timestamp(col.type) else col).to_numpy()
    return pd.DataFrame(cols)


def of_types(table: pa.Table, types: tuple[str, ...], column: str = "event_type") -> pa.Table:
    """Rows whose `column` is one of `types` (filtered in Arrow, before any conversion to Python objects)."""
    return table.filter(pc.is_in(table.column(column), pa.array(types, pa.string())))


def item_space(known: pa.Table, new: pa.Table, window: Window, next_window: Window, config: SplitConfig) -> ItemSpace:
    """Known items from catalog(t); new items: catalog(t+1) rows of item types first seen inside t+1."""
    k = to_frame(known, CATALOG_COLUMNS)
    k = k[k.entity_type.isin(config.item_types) & (k.first_seen_ts < to_us(window.end))].sort_values("entity_id")
    n = to_frame(new, CATALOG_COLUMNS)
    n = n[n.entity_type.isin(config.item_types) & (n.first_seen_ts >= to_us(next_window.start))
          & (n.first_seen_ts < to_us(next_window.end)) & ~n.entity_id.isin(k.entity_id)].sort_values("entity_id")
    rows = pd.concat([k, n], ignore_index=True)
    parents = pd.Index(np.sort(rows.parent_id.dropna().unique()))
    parent = parents.get_indexer(rows.parent_id)
    return ItemSpace(rows.entity_id.to_numpy(object), len(k), parent.astype(np.int64), parents.to_numpy(object))


def build_split(history: pa.Table, known: pa.Table, next_events: pa.Table, new: pa.Table,
                window: Window, next_window: Window, config: SplitConfig = SplitConfig()) -> WindowSplit:
    """The split of window t. history: events with ts < end(t) (EVENT_COLUMNS); known: catalog(t);
    next_events: window t+1's events; new: catalog(t+1) (only its rows first seen inside t+1 are used)."""
    items = item_space(known, new, window, next_window, config)
    index = pd.Index(items.ids)
    lo_us, hi_us = to_us(next_window.start), to_us(next_window.end)
    train = _interactions(history, items, window, config)
    user_ids = train.user_ids

    n = to_frame(of_types(next_events, config.engagement_types), EVENT_COLUMNS)
    before = len(n)
    n_item = index.get_indexer(n.entity_id)
    n = n.assign(item=n_item, deep=n.event_type.isin(config.deep_funnel_types))
    n = n[(n_item >= 0) & (n.ts >= lo_us) & (n.ts < hi_us)].sort_values(["user_id", "ts", "item"], kind="stable")
    warm_rows = pd.Index(user_ids).get_indexer(n.user_id) >= 0

    warm = warm_group(train, n[warm_rows])
    cold, too_few = _cold_group(n[~warm_rows], config.cold_min_items)
    counts = SplitCounts(len(train.user), len(user_ids), items.n_known, len(items) - items.n_known, len(n), len(warm.queries),
                         len(cold.queries), too_few, before - len(n))
    return WindowSplit(window.key, next_window.key, train, items, warm, cold, counts)


def _interactions(history: pa.Table, items: ItemSpace, window: Window, config: SplitConfig) -> Interactions:
    """Engagement events with ts < end(t) on the known items of `items`, indexed and sorted by user, time, item."""
    index, end_us = pd.Index(items.ids), to_us(window.end)
    h = to_frame(of_types(history, config.engagement_types), EVENT_COLUMNS)
    h = h[h.ts < end_us]
    h_item = index.get_indexer(h.entity_id)
    h = h.assign(item=h_item)[(h_item >= 0) & (h_item < items.n_known)]
    user_ids = np.sort(h.user_id.unique()).astype(object)
    h = h.assign(user=pd.Index(user_ids).get_indexer(h.user_id), deep=h.event_type.isin(config.deep_funnel_types))
    h = h.sort_values(["user", "ts", "item"], kind="stable")
    return Interactions(window.key, end_us, user_ids, h.user.to_numpy(np.int64), h.item.to_numpy(np.int64),
                        h.ts.to_numpy(np.int64), h.deep.to_numpy(bool), items.n_known)


def build_train(history: pa.Table, known: pa.Table, window: Window,
                config: SplitConfig = SplitConfig()) -> tuple[Interactions, ItemSpace]:
    """Window t alone, as `build_split` sees it: the train interactions and the items known by end(t) (what the ranking
    head is fitted on at end(t), before t+1 exists). history: events with ts < end(t); known: catalog(t)."""
    items = item_space(known, known.slice(0, 0), window, window, config)
    return _interactions(history, items, window, config), items


def _targets(frame: pd.DataFrame, query_of: pd.Series, n_queries: int
             ) -> tuple[Ragged, Ragged, np.ndarray | None, np.ndarray | None]:
    """Distinct (query, item) target pairs, deep-funnel ones and all engagements, and each pair's first engagement time
    aligned with each Ragged's idx (None without a `ts` column)."""
    timed = "ts" in frame.columns
    pairs = frame.groupby(["user_id", "item"], sort=True).agg(deep=("deep", "any"), **({"ts": ("ts", "min")} if timed else {}))
    pairs = pairs.reset_index()
    q = query_of.reindex(pairs.user_id).to_numpy()
    items, deep = pairs.item.to_numpy(), pairs.deep.to_numpy(bool)
    engaged, deep_pairs = Ragged.from_pairs(q, items, n_queries), Ragged.from_pairs(q[deep], items[deep], n_queries)
    if not timed:
        return deep_pairs, engaged, None, None
    ts = pairs.ts.to_numpy(np.int64)
    return (deep_pairs, engaged, ts[deep][np.argsort(q[deep], kind="stable")],  # from_pairs' own order: stable by query
            ts[np.argsort(q, kind="stable")])


def warm_queries(train: Interactions, rows: np.ndarray) -> Queries:
    """Queries for train users (rows of train.user_ids), each with their whole history as context."""
    rows = np.asarray(rows, np.int64)
    history = Ragged.from_pairs(train.user, np.arange(len(train.user)), train.n_users)  # train is sorted by user, ts
    ptr, pos = history.gather(rows)
    return Queries(train.user_ids[rows], rows, Ragged(ptr, train.item[pos]), train.ts[pos], train.deep[pos])


def warm_group(train: Interactions, n: pd.DataFrame) -> UserGroup:
    """Train users' later events `n` (user_id, item, deep: every user a train user) as the warm group: each user's
    history is the context, their later items not engaged with before are the targets."""
    width = np.int64(max(train.n_items, int(n.item.max()) + 1 if len(n) else 1))  # (user, item) -> one int64 key
    row = pd.Index(train.user_ids).get_indexer(n.user_id)  # every user here is a train user
    repeat = np.isin(row * width + n.item.to_numpy(np.int64), train.user * width + train.item)
    n = n[~repeat]  # items engaged with up to t are neither targets nor rankable
    users = np.sort(n.user_id.unique()).astype(object)
    queries = warm_queries(train, pd.Index(train.user_ids).get_indexer(users))
    deep, engaged, deep_ts, engaged_ts = _targets(n, pd.Series(np.arange(len(users)), index=users), len(users))
    return UserGroup("warm", queries, deep, engaged, deep_ts, engaged_ts)


def _cold_group(n: pd.DataFrame, min_items: int) -> tuple[UserGroup, int]:
    first = n.groupby(["user_id", "item"], sort=False).ts.min().rename("first").reset_index()
    first = first.sort_values(["user_id", "first", "item"], kind="stable")
    first["rank"] = first.groupby("user_id", sort=False).cumcount()
    size = first.groupby("user_id", sort=False).item.transform("size")
    first = first[size >= min_items]
    too_few = int(n.user_id.nunique() - first.user_id.nunique())
    first["n_ctx"] = first.groupby("user_id", sort=False).item.transform("size") // 2
    cut = first[first["rank"] == first.n_ctx].set_index("user_id")["first"]  # first engagement of the first target
    users = np.sort(first.user_id.unique()).astype(object)
    query_of = pd.Series(np.arange(len(users)), index=users)

    is_ctx = first["rank"] < first.n_ctx
    ctx_items = first[is_ctx][["user_id", "item"]]
    ctx = n.merge(ctx_items, on=["user_id", "item"])
    ctx = ctx[ctx.ts.to_numpy() <= cut.reindex(ctx.user_id).to_numpy()]
    ctx = ctx.assign(q=query_of.reindex(ctx.user_id).to_numpy()).sort_values(["q", "ts", "item"], kind="stable")
    context = Ragged.from_pairs(ctx.q.to_numpy(), ctx.item.to_numpy(), len(users))
    queries = Queries(users, np.full(len(users), -1, np.int64), context, ctx.ts.to_numpy(np.int64), ctx.deep.to_numpy(bool))
    tgt = n.merge(first[~is_ctx][["user_id", "item"]], on=["user_id", "item"])
    deep, engaged, deep_ts, engaged_ts = _targets(tgt, query_of, len(users))
    return UserGroup("cold", queries, deep, engaged, deep_ts, engaged_ts), too_few
