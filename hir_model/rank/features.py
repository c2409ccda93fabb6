"""The learned ranker's features of (user, item) pairs, from window t's ranking-head state (hir_model.rank.ranker).

Two kinds, so HIR's lift can be measured by ablation (the `ranker_base` row is the same ranker without the first kind):

- HIR's (`HIR_FEATURES`): the head's hand-set score (`head`: row + recent items + kernel + prior + co-engagement, the
  first stage that picks the candidates), the user's vector against the item (`vector`: a warm user's published row, a
  cold user's encoder vector), the recent-items query against it (`query`), the interest kernel (`kernel`), the
  structural readout where the encoder reads structural encodings (`structure`), and the cosine between the user's
  content profile and the item's content (`content`).
- Collaborative and counting (`BASE_FEATURES`): the co-engagement score (`coengagement`: item2item_recent's similarity
  read through the user's recency-weighted history), the item prior in graph(t) (`prior_graph`) and from the history
  at several half-lives (`prior_3d`, `prior_14d`, `prior_60d`), the new users' prior (`prior_new_users`), the item's
  engagements, deep-funnel share, days since its last and its first engagement, the user's events, deep-funnel share
  and days since its last event.

A value that does not exist for a pair is NaN (LightGBM sends it down the branch learned for missing values): an item
without content, a user without a content profile, an item first seen after end(t) for everything its history would
give, a source without structural encodings. Nothing after end(t) is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.method import US_PER_DAY, decay, event_weights
from hir_model.protocol.split import Interactions, Queries
from hir_model.rank.coengagement import coengagement_at, padded
from hir_model.rank.head import HeadConfig, ItemSide, interest_kernel_at, recent_items, warm_query

HIR_FEATURES = ("head", "vector", "query", "kernel", "structure", "content")
ITEM_STATS = ("prior_graph", "prior_new_users", "prior_3d", "prior_14d", "prior_60d", "item_events", "item_deep_share",
              "item_last_days", "item_age_days")
USER_STATS = ("user_events", "user_deep_share", "user_last_days")
BASE_FEATURES = ("coengagement",) + ITEM_STATS + USER_STATS
ALL_FEATURES = HIR_FEATURES + BASE_FEATURES
PRIOR_HALF_LIVES = (3.0, 14.0, 60.0)  # days: the history's item prior at a short, a medium and a long memory


@dataclass(frozen=True)
class FeatureItems:
    """What the features read of the items beyond the head's item side (rows aligned with it)."""

    stats: np.ndarray  # (N, len(ITEM_STATS)) float32, NaN where unknown (items first seen after end(t))
    similarity: sp.csr_matrix | None  # (N, N) float32 co-engagement at weight 1 (None: the head has none)
    content: np.ndarray | None  # (N, C) float32 unit content vectors, zero rows for none (None: no content)
    end_us: int  # end(t): the user's recency is counted back from it

    def __len__(self) -> int:
        return len(self.stats)


def item_stats(history: Interactions, log_prior: np.ndarray | None, cold_log_prior: np.ndarray | None,
               deep_weight: float) -> np.ndarray:
    """(n_items, len(ITEM_STATS)) float32 each item's counting features at end(t) from the history before it."""
    n, end = history.n_items, history.end_us
    w = event_weights(history.deep, deep_weight)
    out = np.full((n, len(ITEM_STATS)), np.nan, np.float32)
    out[:, 0] = np.nan if log_prior is None else log_prior
    out[:, 1] = np.nan if cold_log_prior is None else cold_log_prior
    for j, half_life in enumerate(PRIOR_HALF_LIVES):
        out[:, 2 + j] = np.log1p(np.bincount(history.item, weights=w * decay(end - history.ts, half_life), minlength=n))
    count = np.bincount(history.item, minlength=n).astype(np.float64)
    out[:, 5] = np.log1p(count)
    deep = np.bincount(history.item, weights=history.deep.astype(np.float64), minlength=n)
    out[:, 6] = np.divide(deep, count, out=np.full(n, np.nan), where=count > 0)
    last = np.full(n, np.iinfo(np.int64).min, np.int64)
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.maximum.at(last, history.item, history.ts)
    np.minimum.at(first, history.item, history.ts)
    out[:, 7] = np.where(count > 0, (end - last) / US_PER_DAY, np.nan)
    out[:, 8] = np.where(count > 0, (end - first) / US_PER_DAY, np.nan)
    return out


def feature_items(history: Interactions, log_prior, cold_log_prior, similarity: sp.csr_matrix | None,
                  content: np.ndarray | None, deep_weight: float, new_items: int = 0,
                  new_content: np.ndarray | None = None) -> FeatureItems:
    """The head's items (then `new_items` first seen after end(t), NaN stats, `new_content` their content) as the
    features read them."""
    stats = item_stats(history, log_prior, cold_log_prior, deep_weight)
    n = history.n_items + new_items
    if new_items:
        stats = np.concatenate([stats, np.full((new_items, stats.shape[1]), np.nan, np.float32)])
        stats[history.n_items:, ITEM_STATS.index("item_events")] = 0.0  # none yet: known, not missing
    sim = None if similarity is None else padded(similarity, n).astype(np.float32)
    if content is not None and new_items:
        extra = new_content if new_content is not None else np.zeros((new_items, content.shape[1]), np.float32)
        content = np.concatenate([content, _unit(extra)])
    return FeatureItems(stats, sim, content, history.end_us)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.nan_to_num(np.asarray(x, np.float32))
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def user_stats(queries: Queries, end_us: int) -> np.ndarray:
    """(Q, len(USER_STATS)) float32 each query's events, deep-funnel share and days from its last event to end(t)
    (0 when it is later: a context served after end(t)); NaN without context."""
    ctx = queries.context
    n = np.diff(ctx.ptr).astype(np.float64)
    deep = np.bincount(ctx.row_of, weights=queries.context_deep.astype(np.float64), minlength=len(queries))
    last = np.full(len(queries), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last, ctx.row_of, queries.context_ts)
    out = np.full((len(queries), len(USER_STATS)), np.nan, np.float32)
    out[:, 0] = np.log1p(n)
    out[:, 1] = np.divide(deep, n, out=np.full(len(n), np.nan), where=n > 0)
    out[:, 2] = np.where(n > 0, np.maximum(end_us - last, 0) / US_PER_DAY, np.nan)
    return out


def _rowdot(a: np.ndarray, b: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(P,) a[q] . b[c], pair by pair."""
    return np.einsum("pw,pw->p", a[q], b[c]).astype(np.float32)


def pair_features(names: tuple[str, ...], queries: Queries, items: ItemSide, feats: FeatureItems, config: HeadConfig,
                  rows: np.ndarray, warm: np.ndarray, cold_vectors: np.ndarray | None, q: np.ndarray, c: np.ndarray,
                  head: np.ndarray | None = None) -> np.ndarray:
    """(P, len(names)) float32 the features `names` of the pairs (query q[p], item row c[p]) (module docstring).
    rows / warm / cold_vectors as head_scores takes them; head: (P,) the head's score of the pairs (needed for `head`)."""
    q, c = np.asarray(q, np.int64), np.asarray(c, np.int64)
    out = np.full((len(q), len(names)), np.nan, np.float32)
    col = {name: i for i, name in enumerate(names)}
    if not len(q):
        return out
    if "head" in col:
        if head is None:
            raise ValueError("the `head` feature needs the head's scores of the pairs")
        out[:, col["head"]] = head
    if "vector" in col or "query" in col:
        vectors = np.array(rows, np.float32)
        if cold_vectors is not None:
            vectors[~warm] = cold_vectors[~warm]
        if "vector" in col:
            out[:, col["vector"]] = _rowdot(vectors, items.vectors, q, c)
        if "query" in col:
            query = recent_items(queries, items.vectors, config.recent_half_life_days, config.deep_weight)  # cold: recent
            hot = np.flatnonzero(warm)
            if len(hot):
                query[hot] = warm_query(queries.take(hot), items.vectors, rows[hot], config)
            out[:, col["query"]] = _rowdot(query, items.vectors, q, c)
    if "kernel" in col:
        out[:, col["kernel"]] = interest_kernel_at(queries, items.vectors, config.recent_half_life_days, config.deep_weight,
                                                   config.kernel_temp, config.kernel_min_share, q, c)
    if "structure" in col and items.structure is not None:
        placed = recent_items(queries, items.structure, None, config.deep_weight)
        out[:, col["structure"]] = _rowdot(placed, items.structure, q, c)
    if "content" in col and feats.content is not None:
        profile = recent_items(queries, feats.content, None, config.deep_weight)
        has = (np.abs(profile).sum(1) > 0)[q] & (np.abs(feats.content).sum(1) > 0)[c]
        out[:, col["content"]] = np.where(has, _rowdot(profile, feats.content, q, c), np.nan)
    if "coengagement" in col and feats.similarity is not None:
        out[:, col["coengagement"]] = coengagement_at(queries, feats.similarity, config.coengagement_half_life_days,
                                                      config.deep_weight, q, c)
    for j, name in enumerate(ITEM_STATS):
        if name in col:
            out[:, col[name]] = feats.stats[c, j]
    users = [n for n in USER_STATS if n in col]
    if users:
        stats = user_stats(queries, feats.end_us)
        for name in users:
            out[:, col[name]] = stats[q, USER_STATS.index(name)]
    return out
