"""Evaluate window t from the published tables: what the `window_evaluation` asset computes (the scoring of the
split, its judged-user samples and query blocks, is hir_model.eval.scoring).

Reads, and only reads: `raw_events` of every window <= t (the train history), `entity_catalog` of t (the
known items), window t+1's `raw_events` (the test events) and, from t+1's `entity_catalog`, only the
rows of items first seen inside t+1 (side information of cold-start items: id, type, parent, text; no
interaction). Content vectors come from the `content_embeddings` partitions of t (known items) and t+1
(new items only) when both exist, else from a hashed TF-IDF stand-in over the same catalogue rows. Nothing
of t+2 or later is opened. A window without a successor returns `WindowSkipped`, not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.content import CONTENT_ASSET, CONTENT_FILE
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import Window, WindowSpec
from hir_model.eval.audience import audience_slice
from hir_model.eval.lift import LiftResult, PairFeatures, conversion_lift, pair_features
from hir_model.eval.scoring import (EvalConfig, MethodTiming, SliceResult, evaluate_split, query_blocks, sample_rows,
                                    user_priority)
from hir_model.eval.text_vectors import entity_text, text_vectors
from hir_model.protocol.method import Method
from hir_model.protocol.split import (CATALOG_COLUMNS, EVENT_COLUMNS, ItemSpace, SplitCounts, WindowSplit, build_split,
                                      warm_queries)

log = logging.getLogger("hir")

TEXT_COLUMNS = ["title", "description", "category"]
USER_METRICS = ("recall@20", "ndcg@20", "recall@1pct", "auc")  # the per-user (audience: per-entity) values published
# beside the means (to_user_table)
USER_COLUMNS = ["window", "method", "users", "items", "target", "user_id", "metric", "value"]  # to_user_table's


@dataclass(frozen=True)
class WindowEvaluation:
    window: str  # t: what the methods were fitted on
    next_window: str  # t+1: what they were tested on
    counts: SplitCounts
    content_source: str  # "asset" | "text" | "none"
    results: tuple[SliceResult, ...]
    timings: tuple[MethodTiming, ...]
    lift: LiftResult | None = None
    methods: tuple[str, ...] = field(default=())

    def to_table(self) -> pa.Table:
        """One row per (method, slice, metric): what the `window_evaluation` asset can publish as Parquet."""
        rows = [(self.window, self.next_window, r.method, r.users, r.items, r.target, name, value, r.metrics.n_users,
                 r.metrics.n_targets, r.candidates, r.metrics.n_users if r.judged is None else r.judged)
                for r in self.results for name, value in r.metrics.as_dict().items()]
        names = ["window", "next_window", "method", "users", "items", "target", "metric", "value", "n_users", "n_targets",
                 "candidates", "judged_users"]  # n_users < judged_users: the slice's metrics are over a sample
        types = [pa.string()] * 7 + [pa.float64(), pa.int64(), pa.int64(), pa.int64(), pa.int64()]
        return pa.table([pa.array([r[i] for r in rows], t) for i, t in enumerate(types)], names=names)

    def to_user_table(self, metrics: tuple[str, ...] | None = USER_METRICS) -> pa.Table:
        """One row per (method, slice, evaluated user, metric) of `metrics` (None: every metric): the per-user values
        a paired comparison resamples (`hir_model.eval.compare`). Slices without per-user values are left out."""
        parts = [(r, name, values) for r in self.results if r.user_ids is not None
                 for name, values in r.metrics.per_user.items() if metrics is None or name in metrics]
        n = [len(v) for _, _, v in parts]
        strings = lambda xs: pa.array(np.repeat(np.asarray(xs, object), n), pa.string())  # noqa: E731  one per part
        ids = [np.asarray(r.user_ids, object) for r, _, _ in parts]
        columns = {"window": strings([self.window] * len(parts)), "method": strings([r.method for r, _, _ in parts]),
                   "users": strings([r.users for r, _, _ in parts]), "items": strings([r.items for r, _, _ in parts]),
                   "target": strings([r.target for r, _, _ in parts]),
                   "user_id": pa.array(np.concatenate(ids) if ids else np.zeros(0, object), pa.string()),
                   "metric": strings([name for _, name, _ in parts]),
                   "value": pa.array(np.concatenate([v for _, _, v in parts]) if parts else np.zeros(0), pa.float64())}
        return pa.table(columns).combine_chunks()

    def value(self, method: str, users: str, items: str, target: str, metric: str) -> float:
        """e.g. value("lightgcn", "warm", "known", "deep_funnel", "recall@20"); nan where not evaluated."""
        for r in self.results:
            if (r.method, r.users, r.items, r.target) == (method, users, items, target):
                return r.metrics.as_dict()[metric]
        return float("nan")


@dataclass(frozen=True)
class WindowSkipped:
    window: str
    reason: str


class TableReader:
    """Reads each published partition once (a run over many windows re-reads nothing) and logs what it opened."""

    def __init__(self, store):
        self.store = store
        self._cache: dict[tuple[str, str, str], pa.Table] = {}
        self.opened: list[tuple[str, str]] = []  # (asset, partition) in read order

    def read(self, asset: str, key: str, name: str, columns: list[str], keep: bool = True) -> pa.Table:
        """The table (read once); keep=False: not held for later calls (a table read once per window, e.g. content:
        549k x 256 floats at large)."""
        k = (asset, key, name)
        if k in self._cache:
            return self._cache[k]
        table = self.store.read(asset, key, name, columns=columns)
        if (asset, key) not in self.opened or keep:
            self.opened.append((asset, key))
        if keep:
            self._cache[k] = table
        return table

    def events(self, key: str) -> pa.Table:
        return self.read(EVENTS_ASSET, key, EVENTS_FILE, EVENT_COLUMNS)

    def engagements(self, key: str, types: tuple[str, ...]) -> pa.Table:
        """The partition's events of `types` only (a window's history is rebuilt from these every window)."""
        k = (EVENTS_ASSET, key, "engagements:" + ",".join(types))
        if k not in self._cache:
            table = self.events(key)
            self._cache[k] = table.filter(pc.is_in(table.column("event_type"), pa.array(types, pa.string())))
        return self._cache[k]

    def catalog(self, key: str) -> pa.Table:
        return self.read(CATALOG_ASSET, key, ENTITIES_FILE, CATALOG_COLUMNS + TEXT_COLUMNS)

    def forget_before(self, key: str) -> None:
        """Drop cached tables older than `key` but the engagements (every later window's history needs them)."""
        for k in [k for k in self._cache if k[1] < key and (k[0] != EVENTS_ASSET or k[2] == EVENTS_FILE)]:
            del self._cache[k]


def _within(table: pa.Table, window: Window, before_only: bool = False) -> pa.Table:
    ts = table.column("ts")
    end = pa.scalar(window.end, ts.type)
    mask = pc.less(ts, end) if before_only else pc.and_(pc.greater_equal(ts, pa.scalar(window.start, ts.type)), pc.less(ts, end))
    return table.filter(mask)


def _content_rows(table: pa.Table, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(len(ids), width) float32 the content vectors of `ids` (zeros where missing or null), (len(ids),) has one. Only
    those rows are unpacked (the table holds every entity: users too)."""
    idx = pd.Index(table.column("entity_id").to_numpy()).get_indexer(ids)
    col = table.column("embedding").combine_chunks()
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    width = len(col[int(np.flatnonzero(valid)[0])]) if valid.any() else 1
    found = np.flatnonzero(idx >= 0)
    rows = idx[found]
    filled = valid[rows]
    out = np.zeros((len(ids), width), np.float32)
    if filled.any():
        values = pc.list_flatten(col.take(pa.array(rows[filled]))).to_numpy(zero_copy_only=False).reshape(-1, width)
        out[found[filled]] = values
    has = np.zeros(len(ids), bool)
    has[found] = filled
    return out, has


def item_content(reader: TableReader, items: ItemSpace, window: Window, next_window: Window,
                 config: EvalConfig) -> tuple[ItemSpace, str]:
    """The item space with content vectors, and where they came from."""
    store, n = reader.store, items.n_known
    use_asset = config.content == "asset" or (config.content == "auto" and store.exists(CONTENT_ASSET, window.key, CONTENT_FILE)
                                              and store.exists(CONTENT_ASSET, next_window.key, CONTENT_FILE))
    if use_asset:
        cols = ["entity_id", "embedding"]
        known, has_k = _content_rows(reader.read(CONTENT_ASSET, window.key, CONTENT_FILE, cols, keep=False), items.ids[:n])
        new, has_n = _content_rows(reader.read(CONTENT_ASSET, next_window.key, CONTENT_FILE, cols, keep=False), items.ids[n:])
        if new.shape[1] != known.shape[1] and len(new):
            raise ValueError(f"content widths differ between {window.key} ({known.shape[1]}) and {next_window.key} ({new.shape[1]})")
        return items.with_content(np.vstack([known, new.reshape(-1, known.shape[1])]), np.concatenate([has_k, has_n])), "asset"
    rows = pd.concat([reader.catalog(window.key).to_pandas(), reader.catalog(next_window.key).to_pandas()]).drop_duplicates("entity_id")
    rows = rows.set_index("entity_id").reindex(items.ids)
    texts = [entity_text(t, d, c) for t, d, c in zip(rows.title, rows.description, rows.category)]
    corpus = np.arange(len(items)) < n  # IDF from the items known by end(t)
    vectors, has = text_vectors(texts, corpus, config.text)
    return items.with_content(vectors, has), "text"


def load_split(reader: TableReader, spec: WindowSpec, window: Window, next_window: Window,
               config: EvalConfig) -> tuple[WindowSplit, pa.Table]:
    """The split of window t and window t+1's events (ts inside t+1 only)."""
    history = pa.concat_tables([_within(reader.engagements(w.key, config.split.engagement_types), window, before_only=True)
                                for w in spec.windows() if w.end <= window.end])
    next_events = reader.events(next_window.key)
    split = build_split(history, reader.catalog(window.key), next_events, reader.catalog(next_window.key),
                        window, next_window, config.split)  # drops (and counts) rows outside t+1 itself
    return split, _within(next_events, next_window)


LiftFeatures = Callable[[PairFeatures], tuple[np.ndarray, tuple[str, ...]]]  # (P, E) extra pair features, their names


def _lift(split: WindowSplit, next_events: pa.Table, methods: Sequence[Method], config: EvalConfig,
          lift_features: LiftFeatures | None = None) -> LiftResult:
    """Base features vs base + the extra block: `lift_method`'s warm-user pair score and `lift_features`' columns.

    With more than `max_users` users in t+1's pairs, the pairs of a seeded sample of that many users (LiftResult.users
    says of how many); the pair scores come from user blocks, one pair column kept of each row."""
    pairs = pair_features(split, next_events, config.split, config.lift)
    users_all = np.unique(pairs.user_ids)
    sampled = len(users_all) > config.max_users
    if sampled:
        keep_users = users_all[sample_rows(np.arange(len(users_all)),
                                           user_priority(users_all, split.window, config.seed), config.max_users)]
        # a hash lookup: np.isin sorts the object ids of every pair with the sample (33 s of medium's evaluation)
        pairs = pairs.take(np.flatnonzero(pd.Index(keep_users).get_indexer(pairs.user_ids) >= 0))
    blocks, names = [], []
    chosen = [m for m in methods if m.name == config.lift_method]
    if chosen:
        warm = pairs.user_index >= 0
        known = pairs.item_index < split.items.n_known
        score = np.zeros(len(pairs.y))
        users, inverse = np.unique(pairs.user_index[warm], return_inverse=True)
        if len(users):  # the method's score of the pair from the user's history only (nothing of t+1)
            queries, pair_rows, pair_items = warm_queries(split.train, users), np.flatnonzero(warm), pairs.item_index[warm]
            order = np.argsort(inverse, kind="stable")  # the warm pairs grouped by user block
            user_blocks = query_blocks(len(users), len(split.items), config)
            bounds = np.searchsorted(inverse[order], [b for _, b in user_blocks])
            start = 0
            at_pairs = getattr(chosen[0], "score_pairs", None)  # a method that can score a few cells a row (HIR's)
            for (a, b), stop in zip(user_blocks, bounds):
                block, at = queries.take(np.arange(a, b)), order[start:stop]
                if at_pairs is not None:
                    score[pair_rows[at]] = at_pairs(block, split.items, inverse[at] - a, pair_items[at])
                else:
                    score[pair_rows[at]] = chosen[0].score(block, split.items)[inverse[at] - a, pair_items[at]]  # (b - a, N)
                start = stop
        blocks.append(np.column_stack([np.where(warm & known, score, 0.0), (warm & known).astype(float)]))
        names += [f"{chosen[0].name}_score", f"{chosen[0].name}_scored"]
    if lift_features is not None:
        extra, extra_names = lift_features(pairs)
        blocks.append(np.asarray(extra, np.float64).reshape(len(pairs.y), -1))
        names += list(extra_names)
    if not blocks:
        result = conversion_lift(pairs, config=config.lift)
    else:
        result = conversion_lift(pairs, np.hstack(blocks), tuple(names), config.lift)
    return replace(result, users=len(np.unique(pairs.user_ids)), judged_users=len(users_all)) if sampled else result


def audience_results(split: WindowSplit, next_events: pa.Table, methods: Sequence[Method],
                     config: EvalConfig) -> tuple[SliceResult, ...]:
    """The audience slice (hir_model.eval.audience) of the fitted methods on the split."""
    return tuple(SliceResult(**r) for r in audience_slice(split, next_events, methods, config.split.deep_funnel_types,
                                                          config.audience, config.seed))


def evaluate_window(store, spec: WindowSpec, key: str, methods: Sequence[Method], config: EvalConfig = EvalConfig(),
                    reader: TableReader | None = None, lift_features: LiftFeatures | None = None) -> WindowEvaluation | WindowSkipped:
    """Metrics of every method fitted on windows <= `key`, tested on the next window's events."""
    window = spec.window(key)
    next_window = spec.next(window)
    if next_window is None:
        return WindowSkipped(key, f"window {key} has no successor (the last window ends {window.end:%Y-%m-%d}): "
                                  "there are no next-window events to test on yet")
    reader = reader or TableReader(store)
    split, next_events = load_split(reader, spec, window, next_window, config)
    content_source = "none"
    if len(split.items):
        items, content_source = item_content(reader, split.items, window, next_window, config)
        split = replace(split, items=items)
    results, timings = evaluate_split(split, methods, config)
    if config.audience is not None:  # the audience slice: the fitted methods transposed, one draw per entity
        results += audience_results(split, next_events, methods, config)
    lift = _lift(split, next_events, methods, config, lift_features) if config.lift_method is not None or lift_features else None
    log.info("evaluated %s on %s: %d warm, %d cold users", key, next_window.key, split.counts.warm_users, split.counts.cold_users)
    return WindowEvaluation(key, next_window.key, split.counts, content_source, results, timings, lift,
                            tuple(m.name for m in methods))


def evaluate_windows(store, spec: WindowSpec, keys: Sequence[str], methods: Sequence[Method],
                     config: EvalConfig = EvalConfig()) -> list[WindowEvaluation | WindowSkipped]:
    """Windows in time order with one reader (each partition read once); methods warm-start window to window."""
    reader, out = TableReader(store), []
    for key in sorted(keys):
        out.append(evaluate_window(store, spec, key, methods, config, reader))
        reader.forget_before(key)
    return out
