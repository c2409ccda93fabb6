"""Evaluate window t from the published tables: what the `window_evaluation` asset computes.

Reads, and only reads: `raw_events` of every window <= t (the train history), `entity_catalog` of t (the
known items), window t+1's `raw_events` (the test events) and, from t+1's `entity_catalog`, only the
rows of items first seen inside t+1 (side information of cold-start items: id, type, parent, text; no
interaction). Content vectors come from the `content_embeddings` partitions of t (known items) and t+1
(new items only) when both exist, else from a hashed TF-IDF stand-in over the same catalogue rows. Nothing
of t+2 or later is opened. A window without a successor returns `WindowSkipped`, not an error.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.content import CONTENT_ASSET, CONTENT_FILE
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import Window, WindowSpec
from hir_model.eval.lift import LiftConfig, LiftResult, PairFeatures, conversion_lift, pair_features
from hir_model.eval.text_vectors import TextVectorConfig, entity_text, text_vectors
from hir_model.protocol.method import Method
from hir_model.protocol.metrics import Ragged, RankingMetrics, ranking_metrics
from hir_model.protocol.split import (CATALOG_COLUMNS, EVENT_COLUMNS, ITEM_GROUPS, TARGET_KINDS, ItemSpace, SplitConfig,
                                      SplitCounts, WindowSplit, build_split, warm_queries)

log = logging.getLogger("hir")

TEXT_COLUMNS = ["title", "description", "category"]
USER_METRICS = ("recall@20", "ndcg@20")  # the per-user values published beside the means (to_user_table)
USER_COLUMNS = ["window", "method", "users", "items", "target", "user_id", "metric", "value"]  # to_user_table's


@dataclass(frozen=True)
class EvalConfig:
    split: SplitConfig = SplitConfig()
    recall_ks: tuple[int, ...] = (10, 20, 50)
    ndcg_ks: tuple[int, ...] = (10, 20)
    content: str = "auto"  # "asset" (content_embeddings), "text" (hashed TF-IDF stand-in), "auto" (asset if there)
    text: TextVectorConfig = TextVectorConfig()
    lift: LiftConfig = LiftConfig()
    lift_method: str | None = "mf_als"  # whose warm-user pair score is the extra lift block (the asset: "hir")
    score_batch: int = 1024  # queries scored at once (fewer when a block would pass score_cells)
    score_cells: int = 64_000_000  # queries x items scored at once (256 MB of float32 scores)
    # judged users per slice (and users of the lift's pairs) above which a fixed, seeded sample of this many is
    # evaluated; larger than any window of MovieLens or the `small` synthetic preset (4,200 users), so those are never sampled
    max_users: int = 5_000
    seed: int = 0  # of the candidates' tie-break order (shared by every method) and of the user samples


@dataclass(frozen=True)
class SliceResult:
    method: str
    users: str  # "warm" | "cold"
    items: str  # "known" (known by end(t)) | "new" (first seen in t+1)
    target: str  # "deep_funnel" | "engagement"
    candidates: int  # items ranked for every user of the slice (the whole item group)
    metrics: RankingMetrics  # over metrics.n_users users: all judged users, or a seeded sample of max_users of them
    # (metrics.n_users,) object: the user behind each of metrics.per_user's values (None when read back without them)
    user_ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    judged: int | None = field(default=None, compare=False)  # users with a target before sampling (None: metrics.n_users)


@dataclass(frozen=True)
class MethodTiming:
    method: str
    fit_s: float
    score_s: float


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

    def read(self, asset: str, key: str, name: str, columns: list[str]) -> pa.Table:
        k = (asset, key, name)
        if k not in self._cache:
            self._cache[k] = self.store.read(asset, key, name, columns=columns)
            self.opened.append((asset, key))
        return self._cache[k]

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
    idx = pd.Index(table.column("entity_id").to_numpy()).get_indexer(ids)
    col = table.column("embedding").combine_chunks()
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    width = len(col[int(np.flatnonzero(valid)[0])]) if valid.any() else 1
    values = pc.list_flatten(col.filter(pa.array(valid))).to_numpy(zero_copy_only=False).reshape(-1, width)
    dense = np.zeros((len(col), width), np.float32)
    dense[valid] = values
    found = idx >= 0
    out = np.zeros((len(ids), width), np.float32)
    out[found] = dense[idx[found]]
    has = np.zeros(len(ids), bool)
    has[found] = valid[idx[found]]
    return out, has


def item_content(reader: TableReader, items: ItemSpace, window: Window, next_window: Window,
                 config: EvalConfig) -> tuple[ItemSpace, str]:
    """The item space with content vectors, and where they came from."""
    store, n = reader.store, items.n_known
    use_asset = config.content == "asset" or (config.content == "auto" and store.exists(CONTENT_ASSET, window.key, CONTENT_FILE)
                                              and store.exists(CONTENT_ASSET, next_window.key, CONTENT_FILE))
    if use_asset:
        cols = ["entity_id", "embedding"]
        known, has_k = _content_rows(reader.read(CONTENT_ASSET, window.key, CONTENT_FILE, cols), items.ids[:n])
        new, has_n = _content_rows(reader.read(CONTENT_ASSET, next_window.key, CONTENT_FILE, cols), items.ids[n:])
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


def _blocks(n: int, n_items: int, config: EvalConfig) -> list[tuple[int, int]]:
    """[lo, hi) query blocks of score_batch rows, fewer where a block would pass score_cells."""
    batch = max(1, min(config.score_batch, config.score_cells // max(n_items, 1)))
    return [(lo, min(lo + batch, n)) for lo in range(0, n, batch)]


def _tie_order(key: str, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, zlib.crc32(key.encode()), n]).permutation(n)


def _priority(user_ids: np.ndarray, key: str, seed: int) -> np.ndarray:
    """(U,) uint32 a user's fixed place in the window's samples: a seeded hash of the id (the same for every method,
    slice and run); a sample of k is the k lowest, so samples of nested populations are nested."""
    salt = zlib.crc32(f"{seed}:{key}".encode())
    return np.fromiter((zlib.crc32(str(u).encode(), salt) for u in user_ids), np.uint32, len(user_ids))


def sample_rows(rows: np.ndarray, priority: np.ndarray, cap: int) -> np.ndarray:
    """`rows` (ascending) when at most `cap`, else the `cap` of them with the lowest priority[rows], ascending."""
    if len(rows) <= cap:
        return rows
    return np.sort(rows[np.argsort(priority[rows], kind="stable")[:cap]])


def merge_metrics(parts: Sequence[RankingMetrics], offsets: Sequence[int]) -> RankingMetrics:
    """One RankingMetrics of consecutive row blocks (block i's rows start at offsets[i]): the per-user values in
    order and their means, as ranking_metrics over the stacked blocks would give them."""
    per_user = {name: np.concatenate([p.per_user[name] for p in parts]) for name in parts[0].per_user}
    rows = np.concatenate([p.rows + o for p, o in zip(parts, offsets)])
    recall = {k: float(np.mean(per_user[f"recall@{k}"])) for k in parts[0].recall}
    ndcg = {k: float(np.mean(per_user[f"ndcg@{k}"])) for k in parts[0].ndcg}
    return RankingMetrics(sum(p.n_users for p in parts), sum(p.n_targets for p in parts), recall, ndcg, per_user, rows)


@dataclass(frozen=True)
class _Slice:
    items: str
    target: str
    lo: int
    hi: int
    targets: Ragged  # (judged rows) the slice's targets, columns within [lo, hi)
    exclude: Ragged  # (judged rows) the context within [lo, hi)
    rows: np.ndarray  # (n,) the group's query rows evaluated (ascending): every judged row, or a sample of them
    judged: int  # rows with a target before sampling


def _slices(split: WindowSplit, group, config: EvalConfig) -> list[_Slice]:
    """The group's slices with at least one judged user, each with its (sampled) rows."""
    out, priority = [], None
    for items in ITEM_GROUPS:
        lo, hi = split.items.group(items)
        if hi == lo or len(group.queries) == 0:
            continue
        exclude = group.queries.context.within(lo, hi)
        for target in TARGET_KINDS:
            tg = group.targets(target).within(lo, hi)
            judged = np.flatnonzero(tg.sizes > 0)
            if len(judged) == 0:
                continue
            if len(judged) > config.max_users and priority is None:
                priority = _priority(group.queries.user_ids, split.window, config.seed)
            rows = sample_rows(judged, priority, config.max_users) if len(judged) > config.max_users else judged
            out.append(_Slice(items, target, lo, hi, tg.take(rows), exclude.take(rows), rows, len(judged)))
    return out


def evaluate_split(split: WindowSplit, methods: Sequence[Method], config: EvalConfig = EvalConfig()
                   ) -> tuple[tuple[SliceResult, ...], tuple[MethodTiming, ...]]:
    """Fit every method on the split's train set, score warm and cold users, compute every slice's metrics.

    Queries are scored in blocks and each block is ranked at once, so no users x items matrix is ever held. A slice
    with more than `max_users` judged users is evaluated on a seeded sample of that many (SliceResult.judged says of
    how many); only users some slice evaluates are scored. Without sampling the blocks are today's batches of every
    query of the group, so the values are those of scoring the whole matrix."""
    results, timings = [], []
    known_items = split.items.known()
    ties = {g: _tie_order(f"{split.window}:{g}", hi - lo, config.seed) for g in ITEM_GROUPS
            for lo, hi in [split.items.group(g)]}
    plans = [(group, _slices(split, group, config)) for group in (split.warm, split.cold)]
    for method in methods:
        t0 = time.perf_counter()
        method.fit(split.train, known_items)
        fit_s, score_s = time.perf_counter() - t0, 0.0
        for group, slices in plans:
            if not slices:
                continue
            sampled = any(len(sl.rows) < sl.judged for sl in slices)
            scored = (np.unique(np.concatenate([sl.rows for sl in slices])) if sampled
                      else np.arange(len(group.queries)))  # (S,) ascending query rows
            parts: list[list[tuple[RankingMetrics, int]]] = [[] for _ in slices]
            for a, b in _blocks(len(scored), len(split.items), config):
                t1 = time.perf_counter()
                block = method.score(group.queries.take(scored[a:b]), split.items)  # (b - a, N)
                score_s += time.perf_counter() - t1
                for sl, part in zip(slices, parts):
                    first, last = np.searchsorted(sl.rows, [scored[a], scored[b - 1] + 1])
                    if first == last:
                        continue
                    at = np.searchsorted(scored[a:b], sl.rows[first:last])  # their rows of the block
                    take = np.arange(first, last)
                    m = ranking_metrics(block[at, sl.lo:sl.hi], sl.targets.take(take), sl.exclude.take(take),
                                        config.recall_ks, config.ndcg_ks, ties[sl.items])
                    part.append((m, int(first)))
            for sl, part in zip(slices, parts):
                m = merge_metrics([p for p, _ in part], [o for _, o in part])
                results.append(SliceResult(method.name, group.name, sl.items, sl.target, sl.hi - sl.lo, m,
                                           group.queries.user_ids[sl.rows[m.rows]], sl.judged))
        timings.append(MethodTiming(method.name, round(fit_s, 4), round(score_s, 4)))
    return tuple(results), tuple(timings)


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
                                           _priority(users_all, split.window, config.seed), config.max_users)]
        pairs = pairs.take(np.flatnonzero(np.isin(pairs.user_ids, keep_users)))
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
            bounds = np.searchsorted(inverse[order], [b for _, b in _blocks(len(users), len(split.items), config)])
            start = 0
            for (a, b), stop in zip(_blocks(len(users), len(split.items), config), bounds):
                s = chosen[0].score(queries.take(np.arange(a, b)), split.items)  # (b - a, N)
                at = order[start:stop]
                score[pair_rows[at]] = s[inverse[at] - a, pair_items[at]]
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
        split = WindowSplit(split.window, split.next_window, split.train, items, split.warm, split.cold, split.counts)
    results, timings = evaluate_split(split, methods, config)
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
