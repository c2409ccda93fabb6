"""How an audience scores users: the head's pair scores transposed (hir_model.rank.head), plus the audience's own
content term and propensity, combined over an entity's items (hir_model.rank.audience's docstring); its settings."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from hir_model.protocol.method import decay, event_weights
from hir_model.protocol.split import Interactions, Queries
from hir_model.rank.head import HeadConfig, ItemSide, UserTerms, recent_items, user_terms
from hir_model.rank.head import scores as score_terms

AGGREGATES = ("max", "lse", "mean")  # a user's score over an entity's items: the best, a soft maximum, the mean


@dataclass(frozen=True)
class AudienceConfig:
    min_audience: int = 100  # fewer users than this qualify (or are asked for): refused, never exported
    aggregate: str = "mean"  # a user's score over an entity's items (AGGREGATES; decisions.md, 2026-12-07 "Audiences")
    temp: float = 0.1  # the soft maximum's temperature ("lse") in the head's score units
    normalise: bool = False  # score log p(item | user): the head's score / temp minus the user's log-sum-exp over items
    norm_items: int = 2048  # the log-sum-exp over a fixed seeded sample of this many of the window's items (all if fewer)
    norm_temp: float = 0.05  # the temperature turning the head's scores into logits (used when normalising)
    content_weight: float = 1.0  # + this x cosine(user's content profile, item's content) on the window's own items
    # (the head adds its content term, at its content_weight 1, to arrivals only; decisions.md "Audiences"); 0: off
    propensity_weight: float = 0.0  # + this x log(1 + the user's decayed activity); 0: the head's score alone
    propensity_half_life_days: float = 14.0  # the activity's events weigh 2^(-age / this), age from end(t)
    batch_users: int = 4096  # users scored at once (bounds memory: batch x the entity's items)
    max_columns: int = 2048  # Audiences.many scores entities in groups whose items' union is at most this (memory: batch x
    # it); wide groups take the kernel's cache-tiled loop, 1.7x faster a column at 300k users than the flat kernel's 64

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        if self.min_audience < 1 or self.batch_users < 1 or self.temp <= 0 or self.propensity_half_life_days <= 0:
            raise ValueError(f"min_audience, batch_users must be >= 1 and temp, propensity_half_life_days > 0: {self}")
        if self.propensity_weight < 0:
            raise ValueError(f"propensity_weight must be >= 0, got {self.propensity_weight}")

    @classmethod
    def from_dict(cls, values: dict) -> AudienceConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def audience_config(values: dict) -> AudienceConfig:
    """hir.toml's [audience] table (HIRConfig.audience) over the defaults; an unknown key is refused."""
    unknown = sorted(set(values) - {f.name for f in fields(AudienceConfig)})
    if unknown:
        raise ValueError(f"[audience] has unknown keys {unknown}; AudienceConfig's fields are "
                         f"{[f.name for f in fields(AudienceConfig)]}")
    return AudienceConfig.from_dict(dict(values))


def aggregate(scores: np.ndarray, how: str, temp: float) -> np.ndarray:
    """(Q,) each row's score over its columns (Q, C): the maximum, temp x log mean exp(s / temp), or the mean."""
    if scores.shape[1] == 1:
        return scores[:, 0]
    if how == "max":
        return scores.max(1)
    if how == "mean":
        return scores.mean(1)
    top = scores.max(1, keepdims=True)
    return (temp * np.log(np.exp((scores - top) / temp).mean(1)) + top[:, 0]).astype(np.float32)


def user_propensity(history: Interactions, half_life_days: float, deep_weight: float) -> np.ndarray:
    """(U,) log(1 + each history user's engagements before end(t), a conversion counting deep_weight, decayed from end(t))."""
    w = event_weights(history.deep, deep_weight) * decay(history.end_us - history.ts, half_life_days)
    return np.log1p(np.bincount(history.user, weights=w, minlength=history.n_users)).astype(np.float32)


def pair_scores(queries: Queries, items: ItemSide, head: HeadConfig, rows: np.ndarray, warm: np.ndarray,
                cold_vectors: np.ndarray | None, columns: np.ndarray, config: AudienceConfig,
                content: np.ndarray | None = None, users: UserBlock | None = None) -> np.ndarray:
    """(Q, C) the head's scores of each query user with the item rows `columns` (head_scores), plus content_weight x the
    cosine of the user's content profile with each item's `content` (N, D unit rows, zeros: none) on the columns the head
    gives no content term (not `items.fresh`). `users`: these queries' per-user terms, when already made (the same
    values)."""
    columns = np.asarray(columns, np.int64)
    users = users or user_block(queries, items, head, rows, warm, cold_vectors, config, content)
    out = score_terms(users.terms, items, head, columns)
    if users.profile is not None:
        plain = np.ones(len(columns), bool) if items.fresh is None else ~items.fresh[columns]
        if plain.any():
            out[:, plain] += config.content_weight * (users.profile @ content[columns[plain]].T)
    return out


@dataclass(frozen=True)
class UserBlock:
    """A batch of users' terms, whatever the entity: the head's (UserTerms) and the audience's content profile."""

    terms: UserTerms
    profile: np.ndarray | None  # (Q, D) unit, zero without content; None when the content term is off


def user_block(queries: Queries, items: ItemSide, head: HeadConfig, rows: np.ndarray, warm: np.ndarray,
               cold_vectors: np.ndarray | None, config: AudienceConfig, content: np.ndarray | None) -> UserBlock:
    profile = None
    if config.content_weight and content is not None:
        profile = recent_items(queries, content, None, head.deep_weight)
    return UserBlock(user_terms(queries, items, head, rows, warm, cold_vectors), profile)


def norm_columns(n_items: int, config: AudienceConfig) -> np.ndarray:
    """The item rows a user's log-sum-exp is taken over: a fixed seeded sample of norm_items (all when fewer)."""
    if n_items <= config.norm_items:
        return np.arange(n_items)
    return np.sort(np.random.default_rng(0).choice(n_items, config.norm_items, replace=False))


def log_partition(scores: np.ndarray, config: AudienceConfig) -> np.ndarray:
    """(Q,) log sum exp(score / norm_temp) of each row of the head's scores over norm_columns (Q, S)."""
    z = scores / config.norm_temp
    top = z.max(1, keepdims=True)
    return (np.log(np.exp(z - top).sum(1)) + top[:, 0]).astype(np.float32)


def combine(pairs: np.ndarray, config: AudienceConfig, propensity: np.ndarray | None,
            partition: np.ndarray | None = None) -> np.ndarray:
    """(Q,) float32 an entity's audience score from the head's pair scores (Q, C) over its items: aggregated (with
    `normalise`: as logits minus the user's log_partition (Q,)), plus propensity_weight x `propensity` (Q,)."""
    if config.normalise and partition is not None:
        pairs = pairs / config.norm_temp - partition[:, None]
    s = aggregate(pairs, config.aggregate, config.temp)
    if propensity is not None and config.propensity_weight:
        s = s + config.propensity_weight * propensity
    return np.asarray(s, np.float32)


def converted_users(history: Interactions, columns: np.ndarray) -> np.ndarray:
    """(U,) bool: history users with a deep-funnel event on any of the item rows `columns` before end(t)."""
    hit = history.deep & np.isin(history.item, columns)
    out = np.zeros(history.n_users, bool)
    out[history.user[hit]] = True
    return out


def best(user_ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (ids, scores), best first; ties go to the lower id (user_ids sorted)."""
    order = np.lexsort((np.arange(len(scores)), -scores))[:k]
    return user_ids[order], scores[order]


def served_content(rec) -> np.ndarray | None:
    """(N, D) unit content of a Recommender's served items: window t's (the head's state) then the arrivals' (zeros
    where none); None when the head carries no content."""
    if rec.state.content is None:
        return None
    arrivals = rec._arrival_content() if rec.arrived_items else None
    if arrivals is None:
        arrivals = np.zeros((rec.arrived_items, rec.state.content.shape[1]), np.float32)
    norm = np.linalg.norm(arrivals, axis=1, keepdims=True)
    arrivals = np.divide(arrivals, norm, out=np.zeros_like(arrivals), where=norm > 0)
    return np.concatenate([rec.state.content, arrivals]).astype(np.float32)
