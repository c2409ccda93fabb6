"""A synthetic ad ecosystem with planted ground truth (DESIGN.md section 4), streamed window by window.

A 3-level interest tree (coarse -> mid -> fine); advertisers focused on one or two fine interests, their
campaigns and products (text from per-interest vocabularies, procedurally drawn images); users with
sparse interest mixtures that drift with the window index; funnel events with steeply falling stage
rates, Zipf-like popularity and affinity-driven engagement; new entities every window.

The source generates in its own windows of `window_days` from `start`. Entities for all windows are
small and built once; events are generated batch by batch from an RNG seeded by (seed, window, batch),
so memory stays flat however many events a window holds, and any window can be read without the
others. A requested window that cuts across the source's windows gets the matching slice of events.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA
from data_contracts.vocab import EVENT_TYPES
from hir_model.data import synthetic_images
from hir_model.data.source import Batch, Source
from hir_model.data.synthetic_sampling import Picker
from hir_model.data.synthetic_world import (AGE_BUCKETS, REGIONS, US_PER_DAY, World, brand_names, build_hierarchy,
                                            build_world, texts)
from hir_model.data.windows import Window, utc

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
KINDS = ("advertiser", "campaign", "product")  # engageable entity types, in global index order
_EVENTS_TAG = 10


@dataclass(frozen=True)
class SyntheticConfig:
    seed: int = 7  # same seed, same data
    start: datetime = datetime(2024, 1, 7, tzinfo=timezone.utc)  # a Sunday: weekly windows line up
    n_windows: int = 8  # windows of events
    window_days: int = 7  # length of one window
    events_per_window: int = 20_000  # rows per window; 1_250_000 gives 10M over 8 windows
    branching: tuple[int, int, int] = (4, 3, 3)  # coarse -> mid -> fine: 36 fine interests
    n_advertisers: int = 60  # present at `start`
    n_products: int = 2_000
    n_users: int = 3_000
    campaigns_per_advertiser: int = 2
    new_advertisers_per_window: int = 4  # first seen inside each window
    new_products_per_window: int = 150
    new_users_per_window: int = 150
    interests_per_user: int = 3  # each user has 1..this many fine interests
    drift: float = 0.8  # amplitude of the oscillation of a user's log interest weights
    drift_period: float = 6.0  # windows per oscillation
    zipf_exponent: float = 1.0  # popularity weight = U^-s: Zipf's law at s = 1
    targeted_share: float = 0.7  # impressions drawn from the user's interests; the rest by popularity alone
    campaign_share: float = 0.08  # impressions on campaigns
    advertiser_share: float = 0.04  # impressions on advertisers (the rest: products)
    click_rate: tuple[float, float] = (0.004, 0.08)  # P(click | impression) at affinity 0 and 1
    cart_rate: float = 0.3  # P(add_to_cart | click) at affinity 1 (half that at 0); products only
    purchase_rate: float = 0.3  # P(purchase | add_to_cart) at affinity 1 (half that at 0)
    feedback_rate: float = 0.01  # P(interested or not_interested | impression)
    mean_gap_s: float = 600.0  # mean seconds between a pair's consecutive funnel events
    batch_rows: int = 65_536  # at most this many rows per yielded batch
    image_size: int = 32  # product images are image_size x image_size PNGs
    vocab_words: int = 12  # pseudo-words per fine interest (mid and coarse get fewer)
    filler_words: int = 60  # shared words that carry no interest

    def __post_init__(self) -> None:
        for name in ("branching", "click_rate"):  # lists from TOML/JSON overrides
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.branching) != 3 or min(self.branching) < 1:
            raise ValueError(f"branching must be three positive ints, got {self.branching}")
        for name in ("n_windows", "window_days", "n_advertisers", "n_products", "n_users", "interests_per_user",
                     "batch_rows", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SyntheticConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.campaign_share + self.advertiser_share >= 1:
            raise ValueError("campaign_share + advertiser_share must leave room for product impressions")


@dataclass(frozen=True)
class GroundTruth:
    entities: pa.Table  # entity_id, entity_type, interest_l0, interest_l1, interest_l2 (users: dominant, first window)
    hierarchy: pa.Table  # level, interest_id, name, parent_id, path


@dataclass(frozen=True)
class _Engageable:
    """Advertisers, campaigns and products in one index space: [advertisers | campaigns | products]."""

    fs: np.ndarray  # (n,) int64 µs first seen
    fine: np.ndarray  # (n,) planted fine interest
    pop: np.ndarray  # (n,) popularity weight
    kind: np.ndarray  # (n,) index into KINDS
    price: np.ndarray  # (n,) products' price, NaN for the others


@dataclass(frozen=True)
class _Pool:
    """Users and entities that impressions may draw from."""

    users: np.ndarray  # (n,) user indices
    user_cdf: np.ndarray  # (n,) cumulative activity
    pickers: tuple[Picker | None, ...]  # per KINDS
    kind_cdf: np.ndarray  # (3,) cumulative share of impressions per KINDS


@dataclass(frozen=True)
class _Plan:
    """What one window's event batches sample from."""

    w: int
    lo: int  # window start, µs
    hi: int  # window end (exclusive), µs
    weights: np.ndarray  # (n_users, K) interest mixture at this window
    cum_weights: np.ndarray  # (n_users, K)
    alive: _Pool  # first seen before the window end
    settled: _Pool  # first seen by the window start: present at any time of the window


def _us(ts: datetime) -> int:
    return (utc(ts) - EPOCH) // timedelta(microseconds=1)


class SyntheticSource(Source):
    """The synthetic ecosystem as a Source, plus its ground truth (`ground_truth`, `user_mixture`).

    Ids: advertisers a000000, campaigns c000000, products p000000, users u000000; events e<window>-<n>.
    Images are drawn lazily into data_dir/images (by `catalog` for the products it returns, or all of
    them by `prepare`); ground truth goes to data_dir/ground_truth.
    """

    name = "synthetic"

    def __init__(self, config: SyntheticConfig, data_dir: Path):
        self.config = config
        self.data_dir = Path(data_dir).resolve()
        self._start = _us(config.start)
        self._wus = config.window_days * US_PER_DAY
        self._plan_cache: _Plan | None = None
        self._drawn: set[int] = set()  # product indices whose image is known to be on disk

    @cached_property
    def world(self) -> World:
        """Every entity of every window with its planted interests (numpy columns)."""
        return build_world(self.config, build_hierarchy(self.config), self._start)

    @cached_property
    def _entities(self) -> _Engageable:
        parts = (self.world.advertisers, self.world.campaigns, self.world.products)
        kind = np.concatenate([np.full(len(p.fs), k) for k, p in enumerate(parts)])
        price = np.concatenate([np.full(len(parts[0].fs) + len(parts[1].fs), np.nan), parts[2].extra])
        return _Engageable(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("fs", "fine", "pop")), kind, price)

    @cached_property
    def _ids(self) -> tuple[pa.Array, pa.Array]:
        """Entity ids in the global index order, and user ids."""
        world = self.world
        ids = [f"{k[0]}{i:06d}" for k, p in zip(KINDS, (world.advertisers, world.campaigns, world.products)) for i in range(len(p.fs))]
        return pa.array(ids, pa.string()), pa.array([f"u{i:06d}" for i in range(len(world.users.fs))], pa.string())

    def span(self) -> tuple[datetime, datetime]:
        start = utc(self.config.start)
        return start, start + timedelta(days=self.config.n_windows * self.config.window_days) - timedelta(microseconds=1)

    def prepare(self) -> None:
        self.write_ground_truth()
        self._ensure_images(np.arange(len(self.world.products.fs)))

    def image_path(self, product: int) -> Path:
        return self.data_dir / "images" / f"p{product:06d}.png"

    def _ensure_images(self, products: np.ndarray) -> None:
        h, cfg = self.world.hierarchy, self.config
        fine = self.world.products.fine
        for i in (int(i) for i in products if int(i) not in self._drawn):
            path = (int(h.coarse_of(fine[i])), int(h.mid_of(fine[i])), int(fine[i]))
            synthetic_images.ensure(self.image_path(i), cfg.seed, i, cfg.image_size, path, cfg.branching)
            self._drawn.add(i)

    @cached_property
    def _catalog(self) -> pa.Table:
        """Every entity of every window, in CATALOG_SCHEMA (filtered by first_seen_ts per request)."""
        world, h, cfg = self.world, self.world.hierarchy, self.config
        adv, camp, prod, users = world.advertisers, world.campaigns, world.products, world.users
        ids, user_ids = (a.to_pylist() for a in self._ids)
        n_adv, n_camp, n_prod = len(adv.fs), len(camp.fs), len(prod.fs)
        brands = brand_names(cfg, h, n_adv)
        fine = np.concatenate([adv.fine, camp.fine, prod.fine])
        parents = np.concatenate([adv.parent, camp.parent, prod.parent])
        owner = [brands[p] for p in parents[n_adv:]]
        win = [np.maximum(0, (e.fs - self._start) // self._wus) for e in (adv, camp, prod)]  # creation window
        title = (brands + [f"{o} {t} campaign" for o, t in zip(owner, texts(cfg, h, camp.fine, win[1], 2, 1))]
                 + [f"{o} {t}" for o, t in zip(owner[n_camp:], texts(cfg, h, prod.fine, win[2], 3, 2))])
        desc = [d for e, w, words, tag in zip((adv, camp, prod), win, (10, 8, 16), (3, 4, 5))
                for d in texts(cfg, h, e.fine, w, words, tag)]
        n_u = len(users.fs)
        return pa.Table.from_pydict({
            "entity_id": ids + user_ids,
            "entity_type": [k for k, n in zip(KINDS, (n_adv, n_camp, n_prod)) for _ in range(n)] + ["user"] * n_u,
            "parent_id": [None if p < 0 else ids[p] for p in parents] + [None] * n_u,
            "first_seen_ts": np.concatenate([self._entities.fs, users.fs]),
            "title": title + [None] * n_u,
            "description": desc + [None] * n_u,
            "category": [h.names[1][m] for m in h.mid_of(fine)] + [None] * n_u,
            "image_uri": [None] * (n_adv + n_camp) + [self.image_path(i).as_uri() for i in range(n_prod)] + [None] * n_u,
            "video_uri": [None] * (n_adv + n_camp + n_prod + n_u),
            "features": [None] * (n_adv + n_camp) + [[("price", f"{p:.2f}")] for p in prod.extra]
            + [[("age_bucket", AGE_BUCKETS[a]), ("region", REGIONS[r])] for a, r in zip(users.age, users.region)],
        }, schema=CATALOG_SCHEMA)

    @cached_property
    def _relations(self) -> pa.Table:
        world = self.world
        ids = self._ids[0]
        n_adv, n_camp = len(world.advertisers.fs), len(world.campaigns.fs)
        prod, camp = np.arange(len(world.products.fs)), np.arange(n_camp)
        promoted = prod[world.promotes >= 0]
        src = np.concatenate([n_adv + n_camp + prod, n_adv + camp, n_adv + world.promotes[promoted]])
        dst = np.concatenate([world.products.parent, world.campaigns.parent, n_adv + n_camp + promoted])
        fs = np.concatenate([world.products.fs, world.campaigns.fs,
                             np.maximum(world.products.fs[promoted], world.campaigns.fs[world.promotes[promoted]])])
        rel = ["sold_by"] * len(prod) + ["run_by"] * n_camp + ["promotes"] * len(promoted)
        ts = pa.array(fs, RELATIONS_SCHEMA.field("first_seen_ts").type)
        return pa.Table.from_arrays([ids.take(src), pa.array(rel, pa.string()), ids.take(dst), ts], schema=RELATIONS_SCHEMA)

    def _slices(self, table: pa.Table, end: datetime, what: str) -> Iterator[Batch]:
        keep = table.filter(pc.less(table["first_seen_ts"], pa.scalar(utc(end), CATALOG_SCHEMA.field("first_seen_ts").type)))
        for i, start in enumerate(range(0, max(keep.num_rows, 1), self.config.batch_rows)):  # at least one batch
            yield Batch(f"synthetic:seed={self.config.seed}/{what}/{utc(end):%Y-%m-%dT%H:%M:%S}#{i}",
                        keep.slice(start, self.config.batch_rows))

    def catalog(self, end: datetime) -> Iterator[Batch]:
        self._ensure_images(np.flatnonzero(self.world.products.fs < _us(end)))
        yield from self._slices(self._catalog, end, "catalog")

    def relations(self, end: datetime) -> Iterator[Batch]:
        yield from self._slices(self._relations, end, "relations")

    def events(self, window: Window) -> Iterator[Batch]:
        lo, hi = _us(window.start), _us(window.end)
        first = max(0, (lo - self._start) // self._wus)
        last = min(self.config.n_windows, -(-(hi - self._start) // self._wus))
        n_batches = -(-self.config.events_per_window // self.config.batch_rows)
        i = 0
        for w in range(first, last):
            whole = lo <= self._start + w * self._wus and self._start + (w + 1) * self._wus <= hi
            for b in range(n_batches):
                table = self.event_batch(w, b)
                if not whole:  # the requested window cuts this one: keep its part
                    ts = table["ts"].to_numpy().view(np.int64)
                    table = table.filter(pa.array((ts >= lo) & (ts < hi)))
                if table.num_rows:
                    yield Batch(f"synthetic:seed={self.config.seed}/events/{window.key}#{i}", table)
                    i += 1

    def _plan(self, w: int) -> _Plan:
        if self._plan_cache is not None and self._plan_cache.w == w:
            return self._plan_cache
        lo, hi = self._start + w * self._wus, self._start + (w + 1) * self._wus
        weights = self.world.user_weights(w)
        self._plan_cache = _Plan(w, lo, hi, weights, np.cumsum(weights, axis=1),
                                 self._pool(self.world.users.fs < hi, self._entities.fs < hi),
                                 self._pool(self.world.users.fs <= lo, self._entities.fs <= lo))
        return self._plan_cache

    def _pool(self, user_mask: np.ndarray, entity_mask: np.ndarray) -> _Pool:
        cfg, e = self.config, self._entities
        users = np.flatnonzero(user_mask)
        pickers = tuple(Picker.build(idx, e.fine, e.pop, self.world.hierarchy.n_fine) if len(idx) else None
                        for idx in (np.flatnonzero(entity_mask & (e.kind == k)) for k in range(len(KINDS))))
        share = np.array([cfg.advertiser_share, cfg.campaign_share, 1 - cfg.advertiser_share - cfg.campaign_share])
        share = share * np.array([p is not None for p in pickers])
        return _Pool(users, np.cumsum(self.world.users.activity[users]), pickers, np.cumsum(share / share.sum()))

    def event_batch(self, w: int, b: int) -> pa.Table:
        """Batch b of source window w (0-based), in EVENTS_SCHEMA; a pure function of (config, w, b)."""
        cfg = self.config
        n = min(cfg.batch_rows, cfg.events_per_window - b * cfg.batch_rows)
        plan = self._plan(w)
        rng = np.random.default_rng([cfg.seed, _EVENTS_TAG, w, b])
        parts, total = [], 0
        while total < n:  # impressions expand to funnel chains; draw until there are enough rows
            parts.append(self._chains(rng, plan, int((n - total) / 1.02) + 16))
            total += len(parts[-1][0])
        user, ent, code, ts = (np.concatenate(c)[:n] for c in zip(*parts))  # cuts only the last chain's tail
        value = self._entities.price[ent]
        uid, eid = self._ids[1].take(user), self._ids[0].take(ent)
        number = pa.array(np.arange(b * cfg.batch_rows, b * cfg.batch_rows + n)).cast(pa.string())
        event_id = pc.binary_join_element_wise(f"e{w}-", number, "")  # e<window>-<n>: unique across windows
        return pa.Table.from_arrays([
            event_id, uid, eid,
            pa.array(KINDS).take(pa.array(self._entities.kind[ent])),
            pa.array(EVENT_TYPES).take(pa.array(code)),
            pa.array(ts, EVENTS_SCHEMA.field("ts").type),
            pa.array(value, pa.float64(), mask=(code != 3) | np.isnan(value)),
        ], schema=EVENTS_SCHEMA)

    def _chains(self, rng: np.random.Generator, plan: _Plan, m: int) -> tuple[np.ndarray, ...]:
        """m impressions and the deeper events they lead to, chain by chain: (user, entity, code, ts) per row."""
        cfg, world, fs = self.config, self.world, self._entities.fs
        t0 = plan.lo + np.floor(rng.random(m) * (plan.hi - plan.lo)).astype(np.int64)
        user, kind, ent = self._impressions(rng, plan, plan.alive, m)
        late = (world.users.fs[user] > t0) | (fs[ent] > t0)  # not there yet: draw from those present all along
        if late.any() and len(plan.settled.users):
            user[late], kind[late], ent[late] = self._impressions(rng, plan, plan.settled, int(late.sum()))
        t0 = np.maximum(t0, np.maximum(world.users.fs[user], fs[ent]))  # (only bites where nothing was settled)
        affinity = (plan.weights[user] * self._match[world.users.slots[user], self._entities.fine[ent][:, None]]).sum(1)

        c0, c1 = cfg.click_rate  # affinity in [0, 1] drives every stage
        click = rng.random(m) < c0 + (c1 - c0) * affinity
        cart = click & (kind == 2) & (rng.random(m) < cfg.cart_rate * (0.5 + 0.5 * affinity))
        purchase = cart & (rng.random(m) < cfg.purchase_rate * (0.5 + 0.5 * affinity))
        feedback = rng.random(m) < cfg.feedback_rate
        liked = rng.random(m) < 0.1 + 0.8 * affinity
        depth = click.astype(np.int64) + cart + purchase
        length = 1 + depth + feedback  # impression, deeper stages, then explicit feedback
        row = np.repeat(np.arange(m), length)
        starts = np.cumsum(length) - length
        pos = np.arange(len(row)) - starts[row]
        code = np.where(pos <= depth[row], pos, np.where(liked[row], 4, 5))
        gap = np.where(pos > 0, 1 + rng.exponential(cfg.mean_gap_s * 1e6, len(row)).astype(np.int64), 0)
        after = np.cumsum(gap)
        ts = np.minimum(t0[row] + after - after[starts][row], plan.hi - 1)
        return user[row], ent[row], code, ts

    def _impressions(self, rng: np.random.Generator, plan: _Plan, pool: _Pool, m: int) -> tuple[np.ndarray, ...]:
        """m (user, kind, entity) draws: users by activity, entities by popularity, mostly within the user's interests."""
        user = np.searchsorted(pool.user_cdf, rng.random(m) * pool.user_cdf[-1], side="right")
        user = pool.users[np.minimum(user, len(pool.users) - 1)]
        kind = np.searchsorted(pool.kind_cdf, rng.random(m), side="right").clip(0, len(KINDS) - 1)
        slots = self.world.users.slots[user]  # (m, K)
        slot = np.minimum((rng.random(m)[:, None] > plan.cum_weights[user]).sum(1), slots.shape[1] - 1)
        want = slots[np.arange(m), slot]  # (m,) an interest drawn from the user's mixture
        targeted = rng.random(m) < self.config.targeted_share
        ent = np.zeros(m, np.int64)
        for k, picker in enumerate(pool.pickers):
            if picker is not None and (sel := kind == k).any():
                ent[sel] = picker.pick(rng, want[sel], targeted[sel])
        return user, kind, ent

    @cached_property
    def _match(self) -> np.ndarray:
        return self.world.hierarchy.match()

    def user_mixture(self, window: int) -> pa.Table:
        """Planted interests of the users alive at the end of source window `window`: user_id, interest_l2, weight."""
        world, n_fine = self.world, self.world.hierarchy.n_fine
        users = np.flatnonzero(world.users.fs < self._start + (window + 1) * self._wus)
        weights = world.user_weights(window)[users]  # (n, K)
        keep = weights > 1e-9
        pair = np.repeat(users, keep.sum(1)) * n_fine + world.users.slots[users][keep]
        pairs, inverse = np.unique(pair, return_inverse=True)  # a user may hold an interest in two slots
        return pa.table({"user_id": self._ids[1].take(pa.array(pairs // n_fine)),
                         "interest_l2": pa.array(pairs % n_fine, pa.int32()),
                         "weight": pa.array(np.bincount(inverse, weights=weights[keep]))})

    @cached_property
    def ground_truth(self) -> GroundTruth:
        """Planted interests of every entity of every window, and the interest tree."""
        world, h = self.world, self.world.hierarchy
        fine = np.concatenate([self._entities.fine, world.user_dominant()])
        ids, user_ids = self._ids
        kinds = [k for k, p in zip(KINDS, (world.advertisers, world.campaigns, world.products)) for _ in range(len(p.fs))]
        entities = pa.table({
            "entity_id": pa.concat_arrays([ids, user_ids]), "entity_type": kinds + ["user"] * len(user_ids),
            "interest_l0": pa.array(h.coarse_of(fine), pa.int32()), "interest_l1": pa.array(h.mid_of(fine), pa.int32()),
            "interest_l2": pa.array(fine, pa.int32())})
        return GroundTruth(entities, h.table())

    def write_ground_truth(self) -> None:
        """data_dir/ground_truth/{entities,hierarchy}.parquet (rewritten atomically; a temporary name per process, so two
        processes preparing the same folder do not take each other's file)."""
        out = self.data_dir / "ground_truth"
        out.mkdir(parents=True, exist_ok=True)
        for name, table in (("entities", self.ground_truth.entities), ("hierarchy", self.ground_truth.hierarchy)):
            tmp = out / f".{name}.parquet.{os.getpid()}.tmp"
            pq.write_table(table, tmp)
            tmp.replace(out / f"{name}.parquet")
