"""The learned ranker: LightGBM's LambdaRank over the head's candidates, the second stage of the one scoring path.

The head's hand-set score (hir_model.rank.head) is the first stage: over the items a query may be answered from (every
item, or the BoM index's candidates) it keeps the `depth` best the user has not engaged with, and with them the `depth`
best of the base stage (`base_scores`: prior + co-engagement, what ranker_base re-scores), so the ranker never misses a
candidate its ablation sees; the ranker re-scores those from their features (hir_model.rank.features) and they are ranked by its score, ties broken by the first
stage's. Items outside the kept ones score -inf. Without a ranker (the first windows, before earlier windows' outcomes
can train one) the first stage's score is the answer: today's head. Cold users (served from a context, no published
row) keep the first stage's score too: the ranker learns from warm users' outcomes, and applied to cold users it cost
0.055 of Recall@20 on MovieLens's decision windows (docs/decisions.md, 2026-12-07).

Two rankers per window, trained on the same examples (hir_model.rank.examples): `hir`, on HIR's features and the
collaborative / counting ones, over the head's candidates; `base`, on the collaborative / counting features alone over
the candidates of a first stage without HIR (co-engagement + the item prior, `base_scores`): the `ranker_base` row,
so `hir - ranker_base` is what HIR adds to a deep-funnel ranker.

Why LambdaRank in LightGBM: a standard learning-to-rank objective that optimises the listwise NDCG of graded labels
(deep funnel 2, engagement 1) directly; trees need no scaling of features whose units differ (cosines, log counts,
days), take NaN as a value of its own (an item without content, a user without a row), train in seconds on a CPU and
are deterministic at a fixed seed and thread count (`deterministic`, `force_col_wise`); the model is a text dump.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from hir_model.protocol.split import Queries
from hir_model.rank.coengagement import coengagement_scores
from hir_model.rank.features import ALL_FEATURES, BASE_FEATURES, FeatureItems, pair_features
from hir_model.rank.head import HeadConfig, ItemSide, head_scores

VARIANTS = ("hir", "base")  # the ranker on every feature over the head's candidates; on the base features over base_scores'
TIE_BREAK = 1e-5  # x the first stage's score: ranker ties (trees give steps) go to its order, visible in float32


@dataclass(frozen=True)
class RankerConfig:
    enabled: bool = True  # False: no ranker is trained, the head's hand-set score is the answer (today's head)
    depth: int = 100  # first-stage candidates per query the ranker re-scores (training and serving alike)
    max_users: int = 300  # users per judged window whose candidates become examples (a seeded sample)
    windows: int = 12  # the examples of at most this many most recent judged windows train a ranker
    min_queries: int = 50  # fewer training queries with a positive: no ranker (the head's score)
    num_leaves: int = 7  # LightGBM tree size (15 scored 0.026 less on MovieLens's decision windows, 3 tied: decisions.md)
    rounds: int = 100  # boosting rounds (50 scored 0.018 less, 200 tied)
    learning_rate: float = 0.05
    min_data_in_leaf: int = 100  # examples a leaf holds at least (a window gives ~30 judged users x ~150 candidates)
    label_gain: tuple[float, ...] = (0.0, 1.0, 3.0)  # gain of grade 0 (no event), 1 (engagement), 2 (deep funnel)
    truncation_level: int = 100  # LambdaRank weighs the pairs within a query's top this many (its cost grows with it)
    seed: int = 0
    num_threads: int = 1  # fixed: LightGBM's result depends on it; 1 on 2 shared cores

    def __post_init__(self) -> None:
        ints = {"depth": self.depth, "max_users": self.max_users, "windows": self.windows, "num_leaves": self.num_leaves,
                "rounds": self.rounds, "min_queries": self.min_queries, "num_threads": self.num_threads,
                "truncation_level": self.truncation_level}
        if any(v < 1 for v in ints.values()) or self.num_leaves < 2 or not 0 < self.learning_rate <= 1:
            raise ValueError(f"RankerConfig: {ints} must be >= 1 (num_leaves >= 2), learning_rate in (0, 1], got "
                             f"{self.learning_rate}")
        if len(self.label_gain) != 3:
            raise ValueError(f"RankerConfig.label_gain needs a gain per grade 0, 1, 2, got {self.label_gain}")

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, values: dict) -> RankerConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k in known})


def variant_features(variant: str) -> tuple[str, ...]:
    if variant not in VARIANTS:
        raise ValueError(f"ranker variants are {VARIANTS}, got {variant!r}")
    return ALL_FEATURES if variant == "hir" else BASE_FEATURES


@dataclass(frozen=True)
class Ranker:
    """A trained ranker: LightGBM's text dump and what it reads."""

    variant: str  # "hir" or "base"
    model: str  # lightgbm.Booster.model_to_string()
    features: tuple[str, ...]  # the columns it was trained on, in order
    depth: int  # first-stage candidates it re-scores per query
    importance: dict[str, float]  # total gain per feature
    trained: dict  # what it was trained on: windows, queries, rows, positives
    num_threads: int = 1
    _booster: list = field(default_factory=list, compare=False, repr=False)  # the loaded booster, once

    def booster(self):
        if not self._booster:
            import lightgbm as lgb

            self._booster.append(lgb.Booster(model_str=self.model))
        return self._booster[0]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(P,) float64 scores of feature rows x (P, len(features))."""
        if x.shape[1:] != (len(self.features),):
            raise ValueError(f"the {self.variant} ranker reads {len(self.features)} features, got {x.shape}")
        if not len(x):
            return np.zeros(0)
        return self.booster().predict(x, num_threads=self.num_threads)

    def summary(self) -> dict:
        """JSON-ready: everything but the model (written beside it)."""
        return {"variant": self.variant, "features": list(self.features), "depth": self.depth,
                "importance": {k: round(v, 6) for k, v in self.importance.items()}, "trained": self.trained,
                "num_threads": self.num_threads}

    @classmethod
    def from_summary(cls, summary: dict, model: str) -> Ranker:
        return cls(summary["variant"], model, tuple(summary["features"]), int(summary["depth"]),
                   {k: float(v) for k, v in summary["importance"].items()}, summary["trained"],
                   int(summary.get("num_threads", 1)))


def fit_ranker(variant: str, x: np.ndarray, label: np.ndarray, group: np.ndarray, config: RankerConfig,
               trained: dict | None = None) -> Ranker:
    """LambdaRank on rows x (R, F) of `variant`'s features, grades `label` (R,) in {0, 1, 2}, queries as consecutive
    runs of `group` (sizes summing to R). Deterministic at config.seed and config.num_threads."""
    import lightgbm as lgb

    names = variant_features(variant)
    if x.shape != (len(label), len(names)) or int(np.sum(group)) != len(label):
        raise ValueError(f"{variant} ranker: {x.shape} features for {len(label)} labels in groups of {int(np.sum(group))} "
                         f"rows; {len(names)} features expected")
    if np.isinf(x).any():
        raise ValueError(f"{variant} ranker: infinite feature values in columns "
                         f"{[n for n, bad in zip(names, np.isinf(x).any(0)) if bad]}")
    params = {"objective": "lambdarank", "num_leaves": config.num_leaves, "learning_rate": config.learning_rate,
              "min_data_in_leaf": config.min_data_in_leaf, "label_gain": list(config.label_gain), "seed": config.seed,
              "deterministic": True, "force_col_wise": True, "num_threads": config.num_threads, "verbosity": -1,
              "feature_pre_filter": False, "lambdarank_truncation_level": config.truncation_level}
    start = time.perf_counter()
    data = lgb.Dataset(x, label, group=group, feature_name=list(names), free_raw_data=True)
    booster = lgb.train(params, data, num_boost_round=config.rounds)
    gain = booster.feature_importance("gain")
    trained = {**(trained or {}), "fit_s": round(time.perf_counter() - start, 3)}  # a cost, not part of the model
    return Ranker(variant, booster.model_to_string(), names, config.depth,
                  {n: float(g) for n, g in zip(names, gain)}, trained, config.num_threads)


def base_scores(queries: Queries, items: ItemSide, feats: FeatureItems, co_weight: float, config: HeadConfig,
                warm: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) the first stage without HIR: the item prior (cold users: the new users' prior where the head has one) +
    co_weight x the co-engagement of the query's history or context (item2item_recent's similarity)."""
    cols = slice(None) if columns is None else columns
    n = len(items) if columns is None else len(columns)
    out = np.zeros((len(queries), n), np.float32)
    if items.prior is not None:
        out[warm] = items.prior[cols][None, :]
        cold = items.cold_prior if items.cold_prior is not None else items.prior
        out[~warm] = cold[cols][None, :]
    if feats.similarity is not None and co_weight:
        out += co_weight * coengagement_scores(queries, feats.similarity, config.coengagement_half_life_days,
                                               config.deep_weight, columns)
    return out


def first_stage(variant: str, queries: Queries, items: ItemSide, feats: FeatureItems, co_weight: float,
                config: HeadConfig, rows: np.ndarray, warm: np.ndarray, cold_vectors: np.ndarray | None,
                columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) the scores the variant's candidates are picked by: the head's (hir) or `base_scores` (base)."""
    if variant == "hir":
        return head_scores(queries, items, config, rows, warm, cold_vectors, columns)
    return base_scores(queries, items, feats, co_weight, config, warm, columns)


def top_pairs(first: np.ndarray, depth: int, seen: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """(q, j): each row's `depth` best columns of `first` (ties: lower column), skipping `seen[q]` (sorted columns)."""
    qs, js = [], []
    for q in range(len(first)):
        s = first[q].copy()
        if seen is not None and len(seen[q]):
            s[seen[q]] = -np.inf
        order = np.lexsort((np.arange(len(s)), -s))
        order = order[np.isfinite(s[order])][:depth]
        qs.append(np.full(len(order), q, np.int64))
        js.append(order)
    return (np.concatenate(qs) if qs else np.zeros(0, np.int64)), (np.concatenate(js) if js else np.zeros(0, np.int64))


def ranked_scores(variant: str, ranker: Ranker | None, queries: Queries, items: ItemSide, feats: FeatureItems,
                  co_weight: float, config: HeadConfig, rows: np.ndarray, warm: np.ndarray,
                  cold_vectors: np.ndarray | None, columns: np.ndarray | None = None, k: int = 0,
                  include_seen: bool = False, allowed: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) float32 the one scoring path over the item rows `columns` (None: every item): the variant's first stage,
    then, with a ranker, its score of the first stage's best max(depth, k) columns a query has not engaged with (unless
    `include_seen`; the hir variant: those of the base stage too), -inf elsewhere (module docstring). Without a ranker,
    and for cold queries (no published row: the ranker is trained on warm users' outcomes), the first stage's scores.
    `allowed`: (Q, C) bool, the columns each query may pick from (its own candidates when queries with different
    candidates are scored over their union in one call; None: all)."""
    first = first_stage(variant, queries, items, feats, co_weight, config, rows, warm, cold_vectors, columns)
    if ranker is None:
        return first
    if not warm.all():  # cold queries keep the first stage's scores: the ranker learned from warm users only
        out = first.copy()
        hot = np.flatnonzero(warm)
        if len(hot):
            sub = queries.take(hot)
            out[hot] = ranked_scores(variant, ranker, sub, items, feats, co_weight, config, rows[hot], warm[hot],
                                     None if cold_vectors is None else cold_vectors[hot], columns, k, include_seen,
                                     None if allowed is None else allowed[hot])
        return out
    cols = np.arange(len(items)) if columns is None else np.asarray(columns, np.int64)
    if not len(cols):  # nothing to rank (e.g. no arrival published yet at a past moment)
        return first
    seen = None
    if not include_seen:
        order = np.argsort(cols, kind="stable")
        seen = []
        for q in range(len(queries)):
            ctx = np.unique(queries.context.row(q))
            pos = np.searchsorted(cols[order], ctx)
            hit = (pos < len(cols)) & (cols[order][np.minimum(pos, len(cols) - 1)] == ctx)
            seen.append(np.sort(order[pos[hit]]))
    mask = (lambda x: x) if allowed is None else (lambda x: np.where(allowed, x, -np.inf))  # noqa: E731
    q, j = top_pairs(mask(first), max(ranker.depth, k), seen)
    if variant == "hir":  # the base stage's picks too: the ranker sees every candidate ranker_base sees, and HIR's
        base = base_scores(queries, items, feats, co_weight, config, warm, columns)
        bq, bj = top_pairs(mask(base), max(ranker.depth, k), seen)
        key = np.unique(np.concatenate([q * len(cols) + j, bq * len(cols) + bj]))  # (query, column) pairs, once each
        q, j = key // len(cols), key % len(cols)
    x = pair_features(ranker.features, queries, items, feats, config, rows, warm, cold_vectors, q, cols[j], first[q, j])
    out = np.full(first.shape, -np.inf, np.float32)
    out[q, j] = (ranker.predict(x) + TIE_BREAK * first[q, j]).astype(np.float32)
    return out
