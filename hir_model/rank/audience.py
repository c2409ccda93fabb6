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

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


class Linker:
    """Which items stand for an entity: itself when it is an item, else the items the catalogue links to it."""

    def __init__(self, catalog: pa.Table, relations: pa.Table | None = None):
        """catalog: entity_id, entity_type, parent_id rows (window t's, plus the arrivals' own rows); relations: src_id,
        dst_id (either way links the two)."""
        ids = catalog.column("entity_id").to_pylist()
        self.types = dict(zip(ids, catalog.column("entity_type").to_pylist()))
        self.links: dict[str, set[str]] = {}
        for child, parent in zip(ids, catalog.column("parent_id").to_pylist()):
            if parent is not None:
                self.links.setdefault(parent, set()).add(child)
        if relations is not None and relations.num_rows:
            for a, b in zip(relations.column("src_id").to_pylist(), relations.column("dst_id").to_pylist()):
                self.links.setdefault(a, set()).add(b)
                self.links.setdefault(b, set()).add(a)

    def items_of(self, entity: str, item_row: dict[str, int]) -> list[str]:
        """The entity itself when it is a served item, else its linked served items, sorted."""
        if entity in item_row:
            return [entity]
        return sorted(e for e in self.links.get(entity, ()) if e in item_row)


class Membership:
    """The interest hierarchy's soft top-k assignments of window t: which primitives each entity is assigned to."""

    def __init__(self, assignments: pa.Table | None, tokens: pa.Table | None = None):
        """assignments: entity_id, level, rank, primitive, weight (interest_hierarchy); tokens: the arrivals' BoM tokens
        (entity_id, level, token `L<level>:<primitive>`, weight), their assignments."""
        parts = []
        if assignments is not None:
            parts.append(assignments.select(["entity_id", "level", "primitive", "weight"]).cast(
                pa.schema([("entity_id", pa.string()), ("level", pa.int64()), ("primitive", pa.int64()), ("weight", pa.float64())])))
        if tokens is not None and tokens.num_rows:
            prim = pc.cast(pc.list_element(pc.split_pattern(tokens.column("token"), ":"), 1), pa.int64())
            parts.append(pa.table({"entity_id": tokens.column("entity_id").cast(pa.string()),
                                   "level": tokens.column("level").cast(pa.int64()), "primitive": prim,
                                   "weight": tokens.column("weight").cast(pa.float64())}))
        self.table = pa.concat_tables(parts) if parts else None
        self.levels = sorted(set(self.table.column("level").to_pylist())) if self.table is not None else []
        self._members: dict[tuple[int, int], set[str]] = {}
        if self.table is not None:
            for e, lv, p in zip(*(self.table.column(c).to_pylist() for c in ("entity_id", "level", "primitive"))):
                self._members.setdefault((lv, p), set()).add(e)

    def members(self, level: int, primitive: int) -> set[str]:
        return self._members.get((level, primitive), set())

    def top_primitives(self, entities: list[str]) -> dict[int, tuple[int, float]]:
        """level -> (primitive, weight): the primitive the entities' assignments weigh most at each level."""
        if self.table is None or not entities:
            return {}
        rows = self.table.filter(pc.is_in(self.table.column("entity_id"), pa.array(entities, pa.string())))
        if not rows.num_rows:
            return {}
        grouped = rows.group_by(["level", "primitive"]).aggregate([("weight", "sum")]).to_pydict()
        out: dict[int, tuple[int, float]] = {}
        for lv, p, w in sorted(zip(grouped["level"], grouped["primitive"], grouped["weight_sum"]), key=lambda r: (r[0], -r[2], r[1])):
            out.setdefault(lv, (p, w / len(entities)))
        return out


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
           "UnknownEntity", "aggregate", "audience_config", "combine", "pair_scores", "served_content", "converted_users", "user_propensity"]
