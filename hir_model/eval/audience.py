"""The audience slice: window t's audiences judged on window t+1's deep-funnel events, per entity.

Entities: every item (product, service) and every parent of items (an advertiser; on MovieLens a movie's advertiser-like
parent) with at least one converter in t+1: a user of window t (a history before end(t): the users an audience is drawn
from) with a deep-funnel event in t+1 on the item (on any of the parent's items) who had none on it before end(t). The
candidates are every user of window t but those who converted with the entity before end(t) (the served audience leaves
them out too). Entities are `known` (an item known by end(t), a parent with one) or `new` (first seen in t+1: only
content places them).

Per entity and method: Recall@K of its audience (the K best candidates; K = 100, 1,000 and 1% of the window's users,
`recall@1pct`) and the AUC of the converters against the other candidates (ties count half); ties in the top K are
broken in one fixed random order of the users shared by every method. Each entity is one draw of the paired bootstrap
(hir_model.eval.compare with users="audience", items known/new, target = the entity kind, the entity id in user_id).

Methods, each the ranking one transposed (a user's score for an item, down the item's column):
- `hir`: the served audience path (hir_model.rank.audience: the head's pair scores, aggregated over a parent's items,
  with the user propensity term), on the head's item side as `hir_exact` reads it (items first seen in t+1 placed in
  window t's space from their content);
- `popularity`: users by their engagements before end(t), most active first, the same for every entity;
- `item2item_recent`, `content`, `mf_als`, `lightgcn`: their user x item scores (co-engagement with the user's items,
  the user's content profile, factor dot products), a parent's the maximum over its items.
A parent's items are all its items in the item group (known or new) of the entity.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from hir_model.protocol.metrics import RankingMetrics
from hir_model.protocol.method import Method
from hir_model.protocol.split import WindowSplit, to_frame, warm_queries
from hir_model.rank.audience import (AudienceConfig, aggregate, combine, log_partition, norm_columns, pair_scores,
                                     user_propensity)

AUDIENCE_USERS = "audience"  # the slice's `users` value: its draws are entities, not users
KINDS = ("product", "advertiser")  # the slice's `target` values: items, parents of items
TRANSPOSED = ("item2item_recent", "content", "mf_als", "lightgcn")  # baselines whose user x item score is transposed


@dataclass(frozen=True)
class AudienceEvalConfig:
    ks: tuple[int, ...] = (100, 1000)  # Recall@K of the audience, besides 1% of the window's users
    share: float = 0.01  # recall@1pct: K = ceil(share x the window's users)
    max_entities: int = 2000  # judged entities per (group, kind) above which a seeded sample of this many is judged
    batch_users: int = 1024  # users scored at once
    audience: AudienceConfig = AudienceConfig()  # the served audience's scoring (its floor plays no part here)


@dataclass(frozen=True)
class AudienceMetrics(RankingMetrics):
    """RankingMetrics whose draws are entities (n_users: entities judged, n_targets: their converters)."""

    extra: dict = field(default_factory=dict)  # metric name -> mean, for the metrics that are not recall@K / ndcg@K

    def as_dict(self) -> dict[str, float]:
        return {f"recall@{k}": v for k, v in self.recall.items()} | dict(self.extra)


@dataclass(frozen=True)
class _Entities:
    """The judged entities of one (group, kind): their item columns, converters and already-converted users."""

    group: str  # "known" | "new"
    kind: str  # KINDS
    ids: np.ndarray  # (E,) object
    columns: list[np.ndarray]  # per entity, its item rows
    converters: list[np.ndarray]  # per entity, user rows (of train.user_ids) converting in t+1
    converted: list[np.ndarray]  # per entity, user rows that converted with it before end(t)
    judged: int  # entities before sampling


def _deep_pairs(frame: pd.DataFrame, user_ids: np.ndarray, item_ids: np.ndarray, deep_types) -> tuple[np.ndarray, np.ndarray]:
    """(user rows, item rows) of the frame's deep-funnel events by users and on items of the split."""
    frame = frame[frame.event_type.isin(list(deep_types))]
    u = pd.Index(user_ids).get_indexer(frame.user_id)
    i = pd.Index(item_ids).get_indexer(frame.entity_id)
    keep = (u >= 0) & (i >= 0)
    return u[keep], i[keep]


def judged_entities(split: WindowSplit, next_events: pa.Table, deep_types: Sequence[str], config: AudienceEvalConfig,
                    seed: int = 0) -> list[_Entities]:
    """The judged entities of every (group, kind) with at least one (module docstring)."""
    train, items = split.train, split.items
    future = _deep_pairs(to_frame(next_events, ["user_id", "entity_id", "event_type"]), train.user_ids, items.ids, deep_types)
    past = (train.user[train.deep], train.item[train.deep])
    out = []
    for group in ("known", "new"):
        lo, hi = items.group(group)
        for kind in KINDS:
            if kind == "product":
                key_of = np.full(len(items), -1, np.int64)
                key_of[lo:hi] = np.arange(lo, hi)
                names = items.ids
            else:
                key_of = np.full(len(items), -1, np.int64)
                key_of[lo:hi] = items.parent[lo:hi]
                if group == "new":  # a parent with an item known by end(t) is a known entity
                    known_parents = np.unique(items.parent[:items.n_known])
                    key_of[np.isin(key_of, known_parents)] = -1
                names = items.parent_ids
            fu, fi = future
            fk = key_of[fi]
            at = fk >= 0
            if not at.any():
                continue
            conv = pd.DataFrame({"e": fk[at], "u": fu[at]}).drop_duplicates()
            pu, pi = past
            pk = key_of[pi] if len(pi) else np.zeros(0, np.int64)
            before = pd.DataFrame({"e": pk[pk >= 0], "u": pu[pk >= 0]}).drop_duplicates()
            conv = conv.merge(before, how="left", indicator=True).query("_merge == 'left_only'").drop(columns="_merge")
            if not len(conv):
                continue
            keys = np.sort(conv.e.unique())
            judged = len(keys)
            if judged > config.max_entities:
                prio = np.fromiter((zlib.crc32(str(names[k]).encode(), seed) for k in keys), np.uint32, judged)
                keys = np.sort(keys[np.argsort(prio, kind="stable")[:config.max_entities]])
            conv_by = conv.groupby("e").u.apply(np.array)
            before_by = before.groupby("e").u.apply(np.array)
            cols = pd.Series(np.arange(len(items)), dtype=np.int64).groupby(key_of).apply(np.array)
            out.append(_Entities(group, kind, names[keys].astype(object), [cols[k] for k in keys],
                                 [np.unique(conv_by[k]) for k in keys],
                                 [np.unique(before_by[k]) if k in before_by.index else np.zeros(0, np.int64) for k in keys],
                                 judged))
    return out


def entity_metrics(scores: np.ndarray, converters: np.ndarray, converted: np.ndarray, ks: Sequence[int],
                   tie_rank: np.ndarray) -> dict[str, float]:
    """One entity's Recall@K (K in `ks`, named by ks' labels) and AUC over the candidates: every user row of `scores`
    (U,) but `converted`; `converters` its positives; tie_rank (U,) each user's place in the shared tie order."""
    keep = np.ones(len(scores), bool)
    keep[converted] = False
    cand = np.flatnonzero(keep)
    s = scores[cand]
    pos = np.zeros(len(scores), bool)
    pos[converters] = True
    pos = pos[cand]
    order = np.lexsort((tie_rank[cand], -s))
    hits = np.cumsum(pos[order])
    n_pos = int(pos.sum())
    out = {}
    for name, k in ks:
        out[name] = float(hits[min(k, len(order)) - 1] / n_pos) if len(order) else 0.0
    ranks = pd.Series(s).rank(method="average").to_numpy()  # ties count half
    n_neg = len(s) - n_pos
    out["auc"] = float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)) if n_neg and n_pos else 0.5
    return out


def audience_slice(split: WindowSplit, next_events: pa.Table, methods: Sequence[Method], deep_types: Sequence[str],
                   config: AudienceEvalConfig = AudienceEvalConfig(), seed: int = 0) -> list[dict]:
    """The slice's results, as SliceResult fields (users="audience"; hir_model.eval.run.audience_results makes them
    SliceResults), of `hir` (a fitted HeadMethod of the head's exact item side among `methods`), popularity of users and
    the transposed baselines among `methods` (already fitted on the split)."""
    train = split.train
    n_users = train.n_users
    entities = [e for e in judged_entities(split, next_events, deep_types, config, seed) if len(e.ids)]
    if not entities or not n_users:
        return []
    ks = [(f"recall@{k}", k) for k in config.ks] + [("recall@1pct", max(1, int(np.ceil(config.share * n_users))))]
    tie_rank = np.empty(n_users, np.int64)
    tie_rank[np.random.default_rng([seed, zlib.crc32(f"{split.window}:audience".encode())]).permutation(n_users)] = \
        np.arange(n_users)
    needed = np.unique(np.concatenate([c for e in entities for c in e.columns]))
    where = {int(c): i for i, c in enumerate(needed)}
    scorers = {}
    head = next((m for m in methods if getattr(m, "mode", None) == "exact"), None)
    partition = None
    if head is not None:
        scorers["hir"] = _hir_scorer(head, split, needed, config.audience)
        if config.audience.normalise:  # each user's log-sum-exp over the sampled items, as the served path takes it
            sample = norm_columns(split.items.n_known, config.audience)
            score = _hir_scorer(head, split, sample, config.audience)
            partition = np.concatenate([log_partition(score(np.arange(lo, min(lo + config.batch_users, n_users))),
                                                      config.audience) for lo in range(0, n_users, config.batch_users)])
    activity = np.bincount(train.user, minlength=n_users).astype(np.float32)
    scorers["popularity"] = lambda rows: np.repeat(activity[rows, None], len(needed), 1)
    for m in methods:
        if m.name in TRANSPOSED:
            scorers[m.name] = (lambda m: lambda rows: m.score(warm_queries(train, rows), split.items)[:, needed])(m)
    propensity = None if head is None else user_propensity(train, config.audience.propensity_half_life_days,
                                                           head.config.deep_weight)
    results = []
    for name, scorer in scorers.items():
        cols = np.zeros((n_users, len(needed)), np.float32)
        for lo in range(0, n_users, config.batch_users):
            rows = np.arange(lo, min(lo + config.batch_users, n_users))
            block = np.asarray(scorer(rows), np.float32)
            cols[lo:lo + len(rows)] = np.where(np.isfinite(block), block, np.float32(-1e30))
        for ent in entities:
            values: dict[str, list[float]] = {}
            for c, conv, before in zip(ent.columns, ent.converters, ent.converted):
                pairs = cols[:, [where[int(x)] for x in c]]
                s = combine(pairs, config.audience, propensity, partition) if name == "hir" else aggregate(pairs, "max", 1.0)
                for metric, v in entity_metrics(s, conv, before, ks, tie_rank).items():
                    values.setdefault(metric, []).append(v)
            per = {k: np.asarray(v) for k, v in values.items()}
            m = AudienceMetrics(len(ent.ids), int(sum(len(c) for c in ent.converters)),
                                {k: float(per[f"recall@{k}"].mean()) for k in config.ks}, {}, per,
                                np.arange(len(ent.ids)), extra={"recall@1pct": float(per["recall@1pct"].mean()),
                                                                "auc": float(per["auc"].mean())})
            results.append({"method": name, "users": AUDIENCE_USERS, "items": ent.group, "target": ent.kind,
                            "candidates": n_users, "metrics": m, "user_ids": ent.ids, "judged": ent.judged})
    return results


def _hir_scorer(head, split: WindowSplit, needed: np.ndarray, config: AudienceConfig):
    """(rows) -> (len(rows), len(needed)) the head's pair scores as the served audience computes them (audience_scores
    before `combine`: the slice combines them per entity)."""
    side = head.item_side(split.items)
    content = None
    state = head.rec.state
    if config.content_weight and state.content is not None:  # window t's items' content, the new items' as placed
        new = np.zeros((len(split.items) - split.items.n_known, state.content.shape[1]), np.float32)
        if side.content is not None:
            new = side.content[split.items.n_known:]
        content = np.concatenate([state.content, new]).astype(np.float32)

    def score(rows: np.ndarray) -> np.ndarray:
        queries = warm_queries(split.train, rows)
        return pair_scores(queries, side, head.config, *head._users(queries, split.items), needed, config, content)
    return score
