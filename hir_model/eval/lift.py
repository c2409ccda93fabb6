"""Downstream lift: does a feature block make a conversion model better?

The conversion model is a standardised L2 logistic regression on (user, item) pair features of window t+1:
every pair with any funnel event in t+1 (impressions included), labelled 1 when it has a deep-funnel event.
Base features are the counting features a production model would have at end(t) (activity, conversion
rates, popularity; nothing from t+1). `conversion_lift` fits it twice, on the base block and on base + an
extra block (HIR's features later: embedding similarity, shared BoM tokens, primitive affinities; today a
baseline's pair score), and reports held-out AUC and log-loss of both and the lift. Train and test pairs
are split by a stable hash of the user id, so no user is on both sides.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hir_model.protocol.method import decay
from hir_model.protocol.split import SplitConfig, WindowSplit

BASE_FEATURES = ("user_log_engagements", "user_log_conversions", "user_conversion_rate", "user_cold",
                 "item_log_popularity", "item_conversion_rate", "item_new", "parent_log_popularity")


@dataclass(frozen=True)
class LiftConfig:
    C: float = 1.0  # inverse L2 strength of the logistic regression (on standardised features)
    max_iter: int = 2000  # lbfgs iterations
    test_share: float = 0.3  # share of users held out (stable crc32 hash of the user id)
    prior_strength: float = 10.0  # pseudo-counts shrinking conversion rates to the global rate
    half_life_days: float = 14.0  # decay of the item popularity feature


@dataclass(frozen=True)
class PairFeatures:
    user_ids: np.ndarray  # (P,) object
    item_ids: np.ndarray  # (P,) object
    user_index: np.ndarray  # (P,) int64 row in the train users, -1 for a user without history
    item_index: np.ndarray  # (P,) int64 row in the ItemSpace
    X: np.ndarray  # (P, F) float64
    names: tuple[str, ...]  # (F,)
    y: np.ndarray  # (P,) bool: the pair converted in t+1

    def take(self, rows: np.ndarray) -> PairFeatures:
        """The pairs `rows` (P',)."""
        return PairFeatures(self.user_ids[rows], self.item_ids[rows], self.user_index[rows], self.item_index[rows],
                            self.X[rows], self.names, self.y[rows])


@dataclass(frozen=True)
class ModelScore:
    auc: float  # held-out ROC AUC (nan when the test side has one class)
    log_loss: float  # held-out mean log-loss


@dataclass(frozen=True)
class LiftResult:
    n_train: int
    n_test: int
    positives_train: int
    positives_test: int
    extra_names: tuple[str, ...]
    base: ModelScore
    extended: ModelScore | None  # None without an extra block
    note: str = ""  # why a number is missing
    users: int | None = None  # users of the pairs fitted on when a sample of them (None: every user of t+1's pairs)
    judged_users: int | None = None  # users of t+1's pairs the sample was drawn from (None: not sampled)

    @property
    def auc_lift(self) -> float:
        """extended AUC - base AUC (> 0: the extra block helps)."""
        return self.extended.auc - self.base.auc if self.extended else float("nan")

    @property
    def log_loss_lift(self) -> float:
        """Relative log-loss reduction (base - extended) / base (> 0: the extra block helps)."""
        return (self.base.log_loss - self.extended.log_loss) / self.base.log_loss if self.extended else float("nan")


def held_out(user_ids: np.ndarray, share: float) -> np.ndarray:
    """(P,) True for pairs whose user falls in the test share (stable across runs and machines)."""
    h = np.fromiter((zlib.crc32(str(u).encode()) for u in user_ids), np.uint32, len(user_ids))
    return (h % 10_000) < share * 10_000


def _fit_score(X_train, y_train, X_test, y_test, config: LiftConfig) -> ModelScore:
    model = make_pipeline(StandardScaler(), LogisticRegression(C=config.C, max_iter=config.max_iter))
    model.fit(X_train, y_train)
    p = np.clip(model.predict_proba(X_test)[:, 1], 1e-7, 1 - 1e-7)
    auc = roc_auc_score(y_test, p) if 0 < y_test.sum() < len(y_test) else float("nan")
    return ModelScore(float(auc), float(log_loss(y_test, p, labels=[0, 1])))


def conversion_lift(pairs: PairFeatures, extra: np.ndarray | None = None, extra_names: tuple[str, ...] = (),
                    config: LiftConfig = LiftConfig()) -> LiftResult:
    """Held-out AUC and log-loss of the conversion model on `pairs.X`, and on `pairs.X` + `extra` (P, E)."""
    if extra is not None and extra.shape[0] != len(pairs.y):
        raise ValueError(f"extra has {extra.shape[0]} rows for {len(pairs.y)} pairs")
    test = held_out(pairs.user_ids, config.test_share)
    y = pairs.y.astype(int)
    n_tr, n_te = int((~test).sum()), int(test.sum())
    pos_tr, pos_te = int(y[~test].sum()), int(y[test].sum())
    names = tuple(extra_names) if extra is not None else ()
    if pos_tr == 0 or pos_tr == n_tr or n_te == 0:
        nan = ModelScore(math.nan, math.nan)
        return LiftResult(n_tr, n_te, pos_tr, pos_te, names, nan, nan if extra is not None else None,
                          "train side has one class or the test side is empty")
    base = _fit_score(pairs.X[~test], y[~test], pairs.X[test], y[test], config)
    extended = None
    if extra is not None:
        X = np.hstack([pairs.X, np.asarray(extra, np.float64)])
        extended = _fit_score(X[~test], y[~test], X[test], y[test], config)
    return LiftResult(n_tr, n_te, pos_tr, pos_te, names, base, extended)


def _codes(column: pa.ChunkedArray, ids: np.ndarray) -> np.ndarray:
    """(rows,) position of each value in `ids`, -1 where absent (through the dictionary: no per-row Python objects)."""
    encoded = pc.dictionary_encode(column.combine_chunks())
    lookup = pd.Index(ids).get_indexer(encoded.dictionary.to_numpy(zero_copy_only=False))
    return lookup[encoded.indices.to_numpy(zero_copy_only=False)] if len(lookup) else np.full(len(column), -1)


def pair_features(split: WindowSplit, next_events: pa.Table, split_config: SplitConfig = SplitConfig(),
                  config: LiftConfig = LiftConfig()) -> PairFeatures:
    """Window t+1's (user, item) pairs with their label and base features as of end(t)."""
    items, train = split.items, split.train
    deep = pc.is_in(next_events.column("event_type"), pa.array(split_config.deep_funnel_types, pa.string()))
    n = pd.DataFrame({"user_id": next_events.column("user_id").to_numpy(), "deep": deep.to_numpy(),
                      "item": _codes(next_events.column("entity_id"), items.ids)})
    pairs = n[n.item >= 0].groupby(["user_id", "item"], sort=True).deep.any().reset_index()
    users = pairs.user_id.to_numpy(object)
    user_index = np.full(len(users), -1, np.int64)
    if train.n_users:
        pos = np.minimum(np.searchsorted(train.user_ids, users), train.n_users - 1)
        user_index = np.where(train.user_ids[pos] == users, pos, -1)
    item_index = pairs.item.to_numpy(np.int64)

    prior = (train.deep.sum() + 1.0) / (len(train.deep) + 2.0)  # global conversion rate of the history
    k = config.prior_strength
    # per-user counts with a trailing 0, so index -1 (no history) reads 0
    u_eng = np.append(np.bincount(train.user, minlength=train.n_users), 0).astype(float)[user_index]
    u_conv = np.append(np.bincount(train.user, weights=train.deep, minlength=train.n_users), 0)[user_index]
    i_eng = np.bincount(train.item, minlength=len(items)).astype(float)
    i_conv = np.bincount(train.item, weights=train.deep, minlength=len(items))
    i_pop = np.bincount(train.item, weights=decay(train.end_us - train.ts, config.half_life_days), minlength=len(items))
    parent = items.parent
    known_with_parent = np.flatnonzero(parent[:items.n_known] >= 0)
    p_pop = np.append(np.bincount(parent[known_with_parent], weights=i_pop[known_with_parent],
                                  minlength=len(items.parent_ids)), 0.0)  # trailing 0 for parent -1
    X = np.column_stack([
        np.log1p(u_eng), np.log1p(u_conv), (u_conv + k * prior) / (u_eng + k), (user_index < 0).astype(float),
        np.log1p(i_pop[item_index]), (i_conv[item_index] + k * prior) / (i_eng[item_index] + k),
        (item_index >= items.n_known).astype(float), np.log1p(p_pop[parent[item_index]]),
    ])
    return PairFeatures(users, items.ids[item_index], user_index.astype(np.int64), item_index, X, BASE_FEATURES,
                        pairs.deep.to_numpy(bool))
