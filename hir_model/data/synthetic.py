"""A synthetic ad ecosystem with planted ground truth (DESIGN.md section 4), streamed window by window.

A 3-level interest tree (coarse -> mid -> fine); advertisers focused on one or two fine interests, their
campaigns and products (text from per-interest vocabularies, procedurally drawn images); users with
sparse interest mixtures that drift with the window index; funnel events with steeply falling stage
rates, Zipf-like popularity and affinity-driven engagement; new entities every window.

The source generates in its own windows of `window_days` from `start`. Entities for all windows are
numpy columns built once; their catalog rows (ids, text, features) are built batch by batch, and events
are generated batch by batch from an RNG seeded by (seed, window, batch), so memory stays flat however
many events a window holds, and any window can be read without the others. A requested window that cuts
across the source's windows gets the matching slice of events. Sizes: `synthetic_config.preset`.
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
from hir_model.data.synthetic_config import SyntheticConfig
from hir_model.data.synthetic_sampling import Picker, search
from hir_model.data.synthetic_world import (AGE_BUCKETS, REGIONS, US_PER_DAY, TextColumn, World, brand_names,
                                            build_hierarchy, build_world)
from hir_model.data.windows import Window, utc

__all__ = ["GroundTruth", "SyntheticConfig", "SyntheticSource"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
KINDS = ("advertiser", "campaign", "product")  # engageable entity types, in global index order
_EVENTS_TAG = 10


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


def _numbered(prefix: str, n: int) -> pa.Array:
    """prefix + 0..n-1 with at least six digits: a000000, a000001, ..."""
    return pc.binary_join_element_wise(prefix, pc.utf8_lpad(pa.array(np.arange(n)).cast(pa.string()), 6, "0"), "")


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
        ids = pa.concat_arrays([_numbered(k[0], len(p.fs)) for k, p in zip(KINDS, (world.advertisers, world.campaigns, world.products))])
        return ids, _numbered("u", len(world.users.fs))

    def span(self) -> tuple[datetime, datetime]:
        start = utc(self.config.start)
        return start, start + timedelta(days=self.config.n_windows * self.config.window_days) - timedelta(microseconds=1)

    def prepare(self) -> None:
        self.write_ground_truth()
        self._ensure_images(np.arange(len(self.world.products.fs)))

    def image_path(self, product: int) -> Path:
        return self.data_dir / "images" / f"p{product:06d}.png"

    @cached_property
    def _drawn(self) -> np.ndarray:
        """(n_products,) bool: the product's image is known to be on disk."""
        return np.zeros(len(self.world.products.fs), bool)

    def _ensure_images(self, products: np.ndarray) -> None:
        """Draw the products' images that are not on disk yet (one folder listing, not a stat per product)."""
        products = np.asarray(products, np.int64)
        todo = products[~self._drawn[products]]
        if not len(todo):
            return
        folder = self.data_dir / "images"
        on_disk = set(os.listdir(folder)) if folder.is_dir() else set()
        h, cfg, fine = self.world.hierarchy, self.config, self.world.products.fine
        for i in [i for i in todo.tolist() if f"p{i:06d}.png" not in on_disk]:  # image_path's file name
            interest = (int(h.coarse_of(fine[i])), int(h.mid_of(fine[i])), int(fine[i]))
            synthetic_images.ensure(self.image_path(i), cfg.seed, i, cfg.image_size, interest, cfg.branching)
        self._drawn[todo] = True

    @cached_property
    def _text(self) -> dict[str, tuple[TextColumn, ...]]:
        """Titles' and descriptions' words per KINDS (advertisers' titles are their brand names: None)."""
        world, h, cfg = self.world, self.world.hierarchy, self.config
        parts = (world.advertisers, world.campaigns, world.products)
        win = [np.maximum(0, (e.fs - self._start) // self._wus) for e in parts]  # creation window
        title = (None, TextColumn(cfg, h, parts[1].fine, win[1], 2, 1), TextColumn(cfg, h, parts[2].fine, win[2], 3, 2))
        desc = tuple(TextColumn(cfg, h, e.fine, w, words, tag) for e, w, words, tag in zip(parts, win, (10, 8, 16), (3, 4, 5)))
        return {"title": title, "description": desc}

    @cached_property
    def _brands(self) -> pa.Array:
        return pa.array(brand_names(self.config, self.world.hierarchy, len(self.world.advertisers.fs)), pa.string())

    def _catalog_rows(self, rows: np.ndarray) -> pa.Table:
        """CATALOG_SCHEMA rows of global indices `rows` (sorted): [advertisers | campaigns | products], then users."""
        world = self.world
        parts = (world.advertisers, world.campaigns, world.products)
        bounds = np.cumsum([0] + [len(p.fs) for p in parts] + [len(world.users.fs)])
        cuts = np.searchsorted(rows, bounds)
        tables = [self._kind_rows(k, rows[cuts[k]:cuts[k + 1]] - bounds[k]) for k in range(len(KINDS) + 1)
                  if cuts[k + 1] > cuts[k]]
        return pa.concat_tables(tables).combine_chunks() if tables else CATALOG_SCHEMA.empty_table()

    def _kind_rows(self, k: int, local: np.ndarray) -> pa.Table:
        """CATALOG_SCHEMA rows of one kind (KINDS index, len(KINDS) for users) at indices `local` within the kind."""
        world, h, n = self.world, self.world.hierarchy, len(local)
        ids, user_ids = self._ids
        none = pa.nulls(n, pa.string())
        ts_type = CATALOG_SCHEMA.field("first_seen_ts").type
        if k == len(KINDS):
            users = world.users
            features = [[("age_bucket", AGE_BUCKETS[a]), ("region", REGIONS[r])] for a, r in zip(users.age[local], users.region[local])]
            return pa.table([user_ids.take(local), pa.array(["user"] * n, pa.string()), none, pa.array(users.fs[local], ts_type),
                             none, none, none, none, none, pa.array(features, CATALOG_SCHEMA.field("features").type)],
                            schema=CATALOG_SCHEMA)
        e = (world.advertisers, world.campaigns, world.products)[k]
        offset = sum(len(p.fs) for p in (world.advertisers, world.campaigns)[:k])
        parent = e.parent[local]
        owner = self._brands.take(pa.array(parent, mask=parent < 0))
        title, desc = (self._text[name][k] for name in ("title", "description"))
        if k == 0:
            title = self._brands.take(pa.array(local))
        else:  # "<brand> <words> campaign", "<brand> <words>"
            title = pc.binary_join_element_wise(owner, title.take(local), *(["campaign"] if k == 1 else []), " ")
        images, features = none, pa.nulls(n, CATALOG_SCHEMA.field("features").type)
        if KINDS[k] == "product":
            images = pc.binary_join_element_wise(self._image_prefix, pc.utf8_lpad(pa.array(local).cast(pa.string()), 6, "0"), ".png", "")
            features = pa.array([[("price", f"{p:.2f}")] for p in e.extra[local]], CATALOG_SCHEMA.field("features").type)
        return pa.table([ids.take(pa.array(offset + local)), pa.array([KINDS[k]] * n, pa.string()),
                         ids.take(pa.array(parent, mask=parent < 0)), pa.array(e.fs[local], ts_type), title, desc.take(local),
                         pa.array(h.names[1], pa.string()).take(pa.array(h.mid_of(e.fine[local]))), images, none, features],
                        schema=CATALOG_SCHEMA)

    @cached_property
    def _image_prefix(self) -> str:
        """image_path(i).as_uri() up to the product's number."""
        uri = self.image_path(0).as_uri()
        return uri[:uri.rindex("/") + 2]

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
        """Every entity first seen before `end`, built batch_rows rows at a time (never the whole catalog at once)."""
        self._ensure_images(np.flatnonzero(self.world.products.fs < _us(end)))
        keep = np.flatnonzero(np.concatenate([self._entities.fs, self.world.users.fs]) < _us(end))
        for i, start in enumerate(range(0, max(len(keep), 1), self.config.batch_rows)):  # at least one batch
            yield Batch(f"synthetic:seed={self.config.seed}/catalog/{utc(end):%Y-%m-%dT%H:%M:%S}#{i}",
                        self._catalog_rows(keep[start:start + self.config.batch_rows]))

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
        user = search(pool.user_cdf, rng.random(m) * pool.user_cdf[-1])
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
        kinds = pa.array(KINDS + ("user",), pa.string()).take(pa.array(np.append(self._entities.kind, np.full(len(user_ids), len(KINDS)))))
        entities = pa.table({
            "entity_id": pa.concat_arrays([ids, user_ids]), "entity_type": kinds,
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
