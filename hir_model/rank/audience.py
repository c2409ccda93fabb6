"""Audiences: for a business entity of window t, the users most likely to convert with it, scored by the ranking head.

An audience is the head transposed: the head's score of (user u, item e) is the value the served ranking computes for
that pair (hir_model.rank.head.head_scores, the learned ranker's first stage), here taken down the column e for every
user of the window, in blocks of users so no users x items matrix is held. An item (product, service, an arrival of
window t's increments) is its own column; an advertiser, campaign or KG entity is the set of items the catalogue links to
it (`parent_id`, relations either way), a user's score the mean of their scores over those items (`aggregate`,
decided on decision world 1: docs/decisions.md). To the head's pair score the audience adds the head's own content
term (content_weight x the cosine of the user's content profile with the item's content) on window t's items too, where
the head adds it to arrivals only: across users, what content says directly ranked who converts better there
(`content_weight`). A user-propensity term (+ w x log(1 + their decayed engagements)) and a per-user normalisation
(log p(item | user)) were measured and are off.

Why not the learned ranker's score: LambdaRank orders items within one user's list (its scores are not calibrated across
users) and scores only each user's best `depth` items (-inf elsewhere), so a column of it ranks nobody outside them.

Options: users who already converted with the entity (a deep-funnel event on one of its items before end(t)) are left
out unless `include_converted`; `level` (and `primitive`) keep the users the interest hierarchy assigns to the entity's
top primitive at that level (or to `primitive`); every audience reports its size (the users that qualify) and the size
at each level. An audience of fewer than `min_audience` users (default 100) is refused (`AudienceTooSmall`): an audience
must never single out a person.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.rank.audience_links import Linker, Membership
from hir_model.rank.head import scores as score_terms
from hir_model.rank.audience_scores import (AGGREGATES, AudienceConfig, UserBlock, aggregate, audience_config, best, combine,
                                           converted_users, log_partition, norm_columns, pair_scores, served_content,
                                           user_block, user_propensity)


class AudienceTooSmall(ValueError):
    """Fewer users qualify for the audience (or were asked for) than the floor allows."""


class UnknownEntity(LookupError):
    """An entity the window cannot score: not an item, and no item linked to it."""


@dataclass(frozen=True)
class Audience:
    window: str
    entity_id: str
    entity_type: str
    items: tuple[str, ...]  # the items the users were scored on (the entity itself when it is an item)
    source: str  # "history" (window t's items) or "content" (arrivals only: placed from their content)
    level: int | None  # the hierarchy level the audience is restricted to (None: none)
    primitive: int | None  # the primitive it is restricted to (None: none)
    size: int  # users that qualify (after the exclusion and the restriction); the audience is their best k
    excluded: int  # users left out because they converted with the entity before end(t)
    levels: tuple[dict, ...]  # per level: the entity's top primitive, its weight and the audience's size restricted to it
    user_ids: np.ndarray  # (k,) object, best first
    scores: np.ndarray  # (k,) float32

    def as_dict(self) -> dict:
        return {"window": self.window, "entity": self.entity_id, "entity_type": self.entity_type, "items": list(self.items),
                "source": self.source, "level": self.level, "primitive": self.primitive, "size": self.size,
                "excluded": self.excluded, "levels": list(self.levels),
                "users": [{"user_id": str(u), "score": float(s)} for u, s in zip(self.user_ids, self.scores)]}


def _column_groups(plans: dict, cap: int) -> list[list[str]]:
    """The planned entities in order, grouped so that each group's items number at most `cap` (an entity with more
    items is a group of its own)."""
    groups, current, size = [], [], 0
    for e, (_, columns, _) in plans.items():
        if current and size + len(columns) > cap:
            groups.append(current)
            current, size = [], 0
        current.append(e)
        size += len(columns)
    return groups + ([current] if current else [])


class Audiences:
    """Window t's audiences, served from a `Recommender` (its items, arrivals included, its users and head): what
    `hir audience`, `GET /audience`, the `audiences` asset and the evaluation's `hir` audience row all call."""

    def __init__(self, rec, linker: Linker, membership: Membership, config: AudienceConfig = AudienceConfig()):
        self.rec, self.linker, self.membership, self.config = rec, linker, membership, config
        self.history = rec.state.history
        self.user_ids = self.history.user_ids  # (U,) sorted: the users an audience is drawn from (a history before end(t))
        self.propensity = user_propensity(self.history, config.propensity_half_life_days, rec.config.deep_weight)
        self._user_row = {u: i for i, u in enumerate(self.user_ids)}
        self.content = served_content(rec)  # (N, D) every served item's unit content (zeros: none), or None
        self._member_masks: dict[tuple[int, int], np.ndarray] = {}
        self._blocks: list | None = None  # per batch_users users: (rows, batch, UserBlock), made on first use

    @property
    def window(self) -> str:
        return self.rec.window

    @classmethod
    def load(cls, store, window: str, rec=None, config: AudienceConfig | None = None, increments: bool = True) -> Audiences:
        """From the store: the window's Recommender (with its increments unless `increments` is False; or `rec`), its
        entity_catalog (entities, parents, relations), the arrivals' own catalogue rows from later catalogue partitions,
        and its interest_hierarchy assignments (absent: no level can be asked for)."""
        from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, RELATIONS_FILE
        from hir_model.hierarchy.build import ASSIGNMENTS_FILE, HIERARCHY_ASSET
        from hir_model.rank.recommender import Recommender

        rec = rec if rec is not None else Recommender.load(store, window, increments=increments)
        columns = ["entity_id", "entity_type", "parent_id"]
        catalog = [store.read(CATALOG_ASSET, window, ENTITIES_FILE, columns=columns)]
        arrivals = pa.array([str(e) for e in rec.item_ids[rec.n_window:]], pa.string())
        for later in [p for p in store.partitions(CATALOG_ASSET) if p > window] if len(arrivals) else []:
            rows = store.read(CATALOG_ASSET, later, ENTITIES_FILE, columns=columns)
            catalog.append(rows.filter(pc.is_in(rows.column("entity_id"), arrivals)))  # the arrivals' rows only
        relations = None
        if store.exists(CATALOG_ASSET, window, RELATIONS_FILE):
            relations = store.read(CATALOG_ASSET, window, RELATIONS_FILE, columns=["src_id", "dst_id"])
        assignments = None
        if store.exists(HIERARCHY_ASSET, window, ASSIGNMENTS_FILE):
            assignments = store.read(HIERARCHY_ASSET, window, ASSIGNMENTS_FILE)
        tokens = pa.concat_tables([inc.tokens for inc in rec.increments if len(inc)]) if rec.arrived_items else None
        catalog = pa.concat_tables([t.cast(catalog[0].schema) for t in catalog])
        return cls(rec, Linker(catalog, relations), Membership(assignments, tokens), config or AudienceConfig())

    def scores(self, columns: np.ndarray, users: np.ndarray | None = None) -> np.ndarray:
        """(len(users),) float32 the audience scores of the history users at rows `users` (None: all) for the entity
        whose items are the served item rows `columns`: the head's pair scores (pair_scores), combined (`combine`;
        normalising over a sample of window t's own items), every user scored from their cached UserBlock."""
        everyone = np.zeros(len(self.user_ids), np.float32)
        rec, columns = self.rec, np.asarray(columns, np.int64)
        for idx, batch, block in self.blocks():  # every user: the per-user terms are made once per window
            partition = None
            if self.config.normalise:
                partition = log_partition(score_terms(block.terms, rec.items, rec.config, norm_columns(rec.n_window, self.config)),
                                          self.config)
            pairs = pair_scores(batch.queries, rec.items, rec.config, batch.rows, batch.warm, batch.cold_vectors, columns,
                                self.config, self.content, block)
            everyone[idx] = combine(pairs, self.config, self.propensity[idx], partition)
        return everyone if users is None else everyone[np.asarray(users, np.int64)]

    def blocks(self) -> list:
        """[(user rows, their Batch, their UserBlock)] over every history user, batch_users at a time: what scoring an
        entity needs of the users alone, made on first use and kept (memory: about 1 KB a user at 64 dims)."""
        if self._blocks is None:
            self._blocks = []
            for lo in range(0, len(self.user_ids), self.config.batch_users):
                idx = np.arange(lo, min(lo + self.config.batch_users, len(self.user_ids)))
                batch = self.rec.user_batch(list(self.user_ids[idx]))
                self._blocks.append((idx, batch, user_block(batch.queries, self.rec.items, self.rec.config, batch.rows,
                                                            batch.warm, batch.cold_vectors, self.config, self.content)))
        return self._blocks

    def audience(self, entity: str, k: int = 1000, level: int | None = None, primitive: int | None = None,
                 include_converted: bool = False) -> Audience:
        """The `k` users most likely to convert with `entity` (module docstring). UnknownEntity for an entity the window
        cannot score; ValueError for a level or primitive the hierarchy does not have; AudienceTooSmall when fewer than
        min_audience users qualify or k is below it."""
        floor = self.config.min_audience
        if k < floor:
            raise AudienceTooSmall(f"k={k} is below the minimum audience of {floor} users (min_audience): an audience "
                                   f"must never single out a person")
        rec = self.rec
        items = self.linker.items_of(entity, rec.item_row)
        if not items:
            raise UnknownEntity(f"window {self.window} has no item for {entity!r}: it is not a served item and the "
                                f"catalogue links no served item to it ({rec.n_items} items served)")
        columns = np.array([rec.item_row[e] for e in items], np.int64)
        kind = self.linker.types.get(entity) or str(rec.item_types[columns[0]])
        eligible = np.ones(len(self.user_ids), bool)
        if not include_converted:
            eligible &= ~converted_users(self.history, columns[columns < rec.n_window])
        excluded = int((~eligible).sum())
        own = [entity] if self.membership.top_primitives([entity]) else items
        top = self.membership.top_primitives(own)
        if level is not None and level not in self.membership.levels:
            raise ValueError(f"window {self.window}'s hierarchy has levels {self.membership.levels}, not {level}")
        if primitive is not None and level is None:
            raise ValueError("a primitive is asked for at a level: pass level too")
        levels = []
        for lv, (p, w) in sorted(top.items()):
            size = int((eligible & self._members(lv, p)).sum())
            levels.append({"level": lv, "primitive": int(p), "weight": round(float(w), 6), "size": size})
        if level is not None:
            if primitive is None:
                if level not in top:
                    raise ValueError(f"{entity!r} has no primitive at level {level} in window {self.window}")
                primitive = top[level][0]
            eligible &= self._members(level, primitive)
        size = int(eligible.sum())
        where = f" at level {level}, primitive {primitive}" if level is not None else ""
        if size < floor:
            raise AudienceTooSmall(f"the audience of {entity!r}{where} in window {self.window} has {size} users, below the "
                                   f"minimum of {floor} (min_audience): an audience must never single out a person")
        rows = np.flatnonzero(eligible)
        user_ids, scores = best(self.user_ids[rows], self.scores(columns, rows), k)
        source = "content" if (columns >= rec.n_window).all() else "history"
        return Audience(self.window, entity, kind, tuple(items), source, level, primitive, size, excluded, tuple(levels),
                        user_ids, scores)

    def many(self, entities: list[str], k: int = 1000, include_converted: bool = False) -> list[Audience | LookupError | ValueError]:
        """`audience(e, k)` of every entity (no level restriction), each user batch scored once over the union of their
        items (the same values); an entity the window cannot score or below the floor gets its exception instead."""
        floor, rec = self.config.min_audience, self.rec
        if k < floor:
            raise AudienceTooSmall(f"k={k} is below the minimum audience of {floor} users (min_audience)")
        plans, out = {}, {}
        for e in dict.fromkeys(entities):
            items = self.linker.items_of(e, rec.item_row)
            if not items:
                out[e] = UnknownEntity(f"window {self.window} has no item for {e!r}")
                continue
            columns = np.array([rec.item_row[i] for i in items], np.int64)
            eligible = np.ones(len(self.user_ids), bool) if include_converted else \
                ~converted_users(self.history, columns[columns < rec.n_window])
            if eligible.sum() < floor:
                out[e] = AudienceTooSmall(f"the audience of {e!r} in window {self.window} has {int(eligible.sum())} users, "
                                          f"below the minimum of {floor} (min_audience)")
                continue
            plans[e] = (items, columns, eligible)
        for group in _column_groups(plans, self.config.max_columns):  # bounded union of columns per pass over the users
            union = np.unique(np.concatenate([plans[e][1] for e in group]))
            at = {e: np.searchsorted(union, plans[e][1]) for e in group}
            best_ids = {e: np.zeros(0, np.int64) for e in group}
            best_scores = {e: np.zeros(0, np.float32) for e in group}
            for idx, batch, block in self.blocks():
                pairs = pair_scores(batch.queries, rec.items, rec.config, batch.rows, batch.warm, batch.cold_vectors, union,
                                    self.config, self.content, block)
                partition = None
                if self.config.normalise:
                    partition = log_partition(score_terms(block.terms, rec.items, rec.config,
                                                     norm_columns(rec.n_window, self.config)), self.config)
                for e in group:
                    keep = plans[e][2][idx]
                    s = combine(pairs[:, at[e]], self.config, self.propensity[idx], partition)[keep]
                    ids = np.concatenate([best_ids[e], idx[keep]])
                    sc = np.concatenate([best_scores[e], s])
                    order = np.lexsort((ids, -sc))[:k]  # ties: the lower user row, as `best`
                    best_ids[e], best_scores[e] = ids[order], sc[order]
            for e in group:
                items, columns, eligible = plans[e]
                kind = self.linker.types.get(e) or str(rec.item_types[columns[0]])
                top = self.membership.top_primitives([e] if self.membership.top_primitives([e]) else items)
                levels = tuple({"level": lv, "primitive": int(p), "weight": round(float(w), 6),
                                "size": int((eligible & self._members(lv, p)).sum())} for lv, (p, w) in sorted(top.items()))
                out[e] = Audience(self.window, e, kind, tuple(items),
                                  "content" if (columns >= rec.n_window).all() else "history", None, None,
                                  int(eligible.sum()), int((~eligible).sum()), levels, self.user_ids[best_ids[e]],
                                  best_scores[e])
        return [out[e] for e in entities]

    def _members(self, level: int, primitive: int) -> np.ndarray:
        """(U,) bool: the history users assigned to `primitive` at `level` (cached per primitive)."""
        key = (level, primitive)
        if key not in self._member_masks:
            mask = np.zeros(len(self.user_ids), bool)
            rows = [self._user_row[e] for e in self.membership.members(level, primitive) if e in self._user_row]
            mask[np.asarray(rows, np.int64)] = True
            self._member_masks[key] = mask
        return self._member_masks[key]


__all__ = ["AGGREGATES", "Audience", "AudienceConfig", "AudienceTooSmall", "Audiences", "Linker", "Membership",
           "UnknownEntity", "UserBlock", "aggregate", "audience_config", "best", "combine", "converted_users", "log_partition",
           "norm_columns", "pair_scores", "served_content", "user_block", "user_propensity"]
