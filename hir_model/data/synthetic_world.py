"""The entities of the synthetic ad ecosystem and their planted interests (numpy columns, held in memory).

Everything here is a deterministic function of the config. Entities created in window w come from an
RNG seeded by (seed, tag, w), so a shorter run is a prefix of a longer one. Times are int64
microseconds since the epoch (UTC). Events are generated elsewhere (`synthetic.py`), batch by batch;
entity text is drawn lazily, block by block (`TextColumn`), so no column of strings is held whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.data.synthetic_config import SyntheticConfig

US_PER_DAY = 86_400_000_000
AGE_BUCKETS = ("18-24", "25-34", "35-44", "45-54", "55+")
REGIONS = ("north", "south", "east", "west", "central")
_TAGS = {"vocab": 1, "advertisers": 2, "products": 3, "users": 4, "brands": 6}  # RNG stream tags (events use 10)
# Text is drawn from one RNG stream per (window, block of this many rows of the window); block 0's stream is the one
# a whole window used before blocks existed, so every window of the small preset (far fewer rows) is unchanged.
TEXT_BLOCK_ROWS = 65_536

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "kl", "st", "tr", "sh", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "l", "x", "m")


def _pseudo_words(rng: np.random.Generator, n: int, taken: set[str]) -> list[str]:
    """n new pronounceable pseudo-words, none of them in `taken` (which grows)."""
    out: list[str] = []
    while len(out) < n:
        syllables = int(rng.integers(2, 4))
        word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables))
        word += _CODAS[rng.integers(len(_CODAS))]
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


@dataclass(frozen=True)
class Hierarchy:
    """The planted coarse -> mid -> fine interest tree. Ids are global per level (fine: 0..n_fine-1)."""

    branching: tuple[int, int, int]
    names: tuple[list[str], list[str], list[str]]  # per level, indexed by id
    words: tuple[list[list[str]], list[list[str]], list[list[str]]]  # per level: each interest's vocabulary
    filler: list[str]  # shared words that carry no interest

    @property
    def n_fine(self) -> int:
        return int(np.prod(self.branching))

    @cached_property
    def flat_words(self) -> pa.Array:
        """Every interest word, fine then mid then coarse (each interest's vocabulary in a row), then the filler."""
        return pa.array([w for level in (2, 1, 0) for vocab in self.words[level] for w in vocab] + self.filler, pa.string())

    def mid_of(self, fine: np.ndarray) -> np.ndarray:
        return np.asarray(fine) // self.branching[2]

    def coarse_of(self, fine: np.ndarray) -> np.ndarray:
        return np.asarray(fine) // (self.branching[1] * self.branching[2])

    def table(self) -> pa.Table:
        """The tree: level, interest_id (per level), name, parent_id (null at level 0), path (names joined by '/')."""
        sizes = [len(n) for n in self.names]
        parent = [None] * sizes[0] + [i // self.branching[1] for i in range(sizes[1])]
        parent += [i // self.branching[2] for i in range(sizes[2])]
        paths = list(self.names[0])
        paths += [f"{paths[i // self.branching[1]]}/{self.names[1][i]}" for i in range(sizes[1])]
        paths += [f"{paths[sizes[0] + i // self.branching[2]]}/{self.names[2][i]}" for i in range(sizes[2])]
        return pa.table({"level": pa.array([lv for lv, n in enumerate(sizes) for _ in range(n)], pa.int32()),
                         "interest_id": pa.array([i for n in sizes for i in range(n)], pa.int32()),
                         "name": [n for names in self.names for n in names], "parent_id": pa.array(parent, pa.int32()),
                         "path": paths})

    def match(self, same_mid: float = 0.3, same_coarse: float = 0.1) -> np.ndarray:
        """(n_fine, n_fine) affinity between two fine interests: 1 same, then by shared ancestor."""
        f = np.arange(self.n_fine)
        mid, coarse = self.mid_of(f), self.coarse_of(f)
        m = np.where(coarse[:, None] == coarse[None, :], same_coarse, 0.0)
        m = np.where(mid[:, None] == mid[None, :], same_mid, m)
        return np.where(f[:, None] == f[None, :], 1.0, m)


def build_hierarchy(cfg: SyntheticConfig) -> Hierarchy:
    rng = np.random.default_rng([cfg.seed, _TAGS["vocab"]])
    b0, b1, b2 = cfg.branching
    sizes = (b0, b0 * b1, b0 * b1 * b2)
    vocab = (max(2, cfg.vocab_words // 2), max(2, 2 * cfg.vocab_words // 3), cfg.vocab_words)
    taken: set[str] = set()
    names = tuple(_pseudo_words(rng, n, taken) for n in sizes)
    names = ([w.capitalize() for w in names[0]], names[1], names[2])
    words = tuple([_pseudo_words(rng, v, taken) for _ in range(n)] for n, v in zip(sizes, vocab))
    return Hierarchy(cfg.branching, names, words, _pseudo_words(rng, cfg.filler_words, taken))


@dataclass
class Entities:
    """One engageable entity type's columns, in creation order (first_seen non-decreasing)."""

    fs: np.ndarray  # (n,) int64 µs, first_seen_ts
    fine: np.ndarray  # (n,) int64 planted fine interest
    parent: np.ndarray  # (n,) int64 advertiser index, -1 for none
    pop: np.ndarray  # (n,) float64 popularity weight (Pareto tail)
    extra: np.ndarray  # (n,) products: price; advertisers: second focus interest; campaigns: unused


@dataclass
class Users:
    fs: np.ndarray  # (n,) int64 µs
    slots: np.ndarray  # (n, K) int64 fine interests (inactive slots have weight 0)
    base: np.ndarray  # (n, K) float64 base mixture weights
    phase: np.ndarray  # (n, K) float64 drift phase
    activity: np.ndarray  # (n,) float64 relative event rate
    age: np.ndarray  # (n,) int64 index into AGE_BUCKETS
    region: np.ndarray  # (n,) int64 index into REGIONS
    first_window: np.ndarray  # (n,) int64 window the user first appears in


@dataclass
class World:
    hierarchy: Hierarchy
    advertisers: Entities
    campaigns: Entities  # campaign i belongs to advertiser i // campaigns_per_advertiser
    products: Entities
    users: Users
    promotes: np.ndarray  # (n_products,) int64 campaign promoting the product, -1 for none
    drift: float
    drift_period: float

    def user_weights(self, window: int) -> np.ndarray:
        """(n_users, K) interest mixture at a window: a function of (seed, user, window) only."""
        w = self.users.base * np.exp(self.drift * np.sin(2 * np.pi * window / self.drift_period + self.users.phase))
        return w / w.sum(axis=1, keepdims=True)

    def user_dominant(self) -> np.ndarray:
        """(n_users,) each user's dominant fine interest in the first window they appear in."""
        out = np.empty(len(self.users.fs), dtype=np.int64)
        for w in np.unique(self.users.first_window):
            rows = np.flatnonzero(self.users.first_window == w)
            top = self.user_weights(int(w))[rows].argmax(axis=1)
            out[rows] = self.users.slots[rows, top]
        return out


def _times(rng: np.random.Generator, n: int, lo: int, span: int) -> np.ndarray:
    return np.sort(lo + np.floor(rng.random(n) * span).astype(np.int64))


def _pareto(rng: np.random.Generator, n: int, s: float) -> np.ndarray:
    return np.maximum(1.0 - rng.random(n), 1e-3) ** -s  # Zipf-like: rank r of n has weight ~ (r/n)^-s, capped


def _concat(parts: list[Entities]) -> Entities:
    return Entities(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("fs", "fine", "parent", "pop", "extra")))


def _siblings(rng: np.random.Generator, h: Hierarchy, fine: np.ndarray, level: int) -> np.ndarray:
    """A random fine interest sharing `fine`'s ancestor at `level` (1: same mid, 0: same coarse)."""
    width = h.branching[2] if level == 1 else h.branching[1] * h.branching[2]
    return (fine // width) * width + rng.integers(width, size=len(fine))


def build_world(cfg: SyntheticConfig, h: Hierarchy, start_us: int) -> World:
    wus = cfg.window_days * US_PER_DAY
    adv_parts, camp_parts, prod_parts, promo_parts, user_parts = [], [], [], [], []
    n_adv = n_camp = 0
    C = cfg.campaigns_per_advertiser
    for w in range(-1, cfg.n_windows):  # -1: the population present at the start
        lo = start_us + max(w, 0) * wus
        rng = np.random.default_rng([cfg.seed, _TAGS["advertisers"], w + 1])
        k = cfg.n_advertisers if w < 0 else cfg.new_advertisers_per_window
        fs = np.full(k, start_us, np.int64) if w < 0 else _times(rng, k, lo, wus)
        first = rng.integers(h.n_fine, size=k)
        second = np.where(rng.random(k) < 0.5, _siblings(rng, h, first, 1), first)
        adv = Entities(fs, first, np.full(k, -1), _pareto(rng, k, cfg.zipf_exponent), second)
        focus = np.stack([first, second], axis=1)
        owner = np.repeat(np.arange(n_adv, n_adv + k), C)
        slot = np.tile(np.arange(C), k)
        camp_parts.append(Entities(np.repeat(fs, C), focus[owner - n_adv, slot % 2], owner,
                                   _pareto(rng, k * C, cfg.zipf_exponent), np.zeros(k * C)))
        adv_parts.append(adv)
        n_adv, n_camp = n_adv + k, n_camp + k * C
        adv_fs, adv_cdf = np.concatenate([a.fs for a in adv_parts]), np.cumsum(np.concatenate([a.pop for a in adv_parts]))
        all_focus = np.concatenate([np.stack([a.fine, a.extra], axis=1) for a in adv_parts]).astype(np.int64)

        rng = np.random.default_rng([cfg.seed, _TAGS["products"], w + 1])
        n = cfg.n_products if w < 0 else cfg.new_products_per_window
        if w < 0:
            fs = np.full(n, start_us, np.int64)
            owner = np.minimum(np.searchsorted(adv_cdf, rng.random(n) * adv_cdf[-1], side="right"), n_adv - 1)
        else:  # each new advertiser launches with one product; the rest go to advertisers already there
            bound = min(k, n)
            fs_b = adv.fs[:bound] + np.floor(rng.random(bound) * (lo + wus - adv.fs[:bound])).astype(np.int64)
            fs_r = lo + np.floor(rng.random(n - bound) * wus).astype(np.int64)
            alive = np.searchsorted(adv_fs, fs_r, side="right")  # advertisers first seen by then (prefix)
            owner_r = np.minimum(np.searchsorted(adv_cdf, rng.random(n - bound) * adv_cdf[alive - 1], side="right"), alive - 1)
            fs, owner = np.concatenate([fs_b, fs_r]), np.concatenate([np.arange(n_adv - k, n_adv - k + bound), owner_r])
            order = np.argsort(fs, kind="stable")
            fs, owner = fs[order], owner[order]
        which = rng.integers(2, size=n)
        fine = all_focus[owner, which]
        price = np.round(np.exp(rng.normal(2.5 + 0.4 * (h.coarse_of(fine) % 3), 0.5)), 2)
        prod_parts.append(Entities(fs, fine, owner, _pareto(rng, n, cfg.zipf_exponent), price))
        promo_parts.append(np.where((rng.random(n) < 0.5) & (C > 0), owner * C + which % max(C, 1), -1))

        rng = np.random.default_rng([cfg.seed, _TAGS["users"], w + 1])
        n = cfg.n_users if w < 0 else cfg.new_users_per_window
        user_parts.append(_users(rng, cfg, h, n, np.full(n, start_us, np.int64) if w < 0 else _times(rng, n, lo, wus), max(w, 0)))
    users = Users(*(np.concatenate([getattr(u, k) for u in user_parts]) for k in Users.__dataclass_fields__))
    return World(h, _concat(adv_parts), _concat(camp_parts), _concat(prod_parts), users,
                 np.concatenate(promo_parts), cfg.drift, cfg.drift_period)


def _users(rng: np.random.Generator, cfg: SyntheticConfig, h: Hierarchy, n: int, fs: np.ndarray, window: int) -> Users:
    K = cfg.interests_per_user
    slots = np.empty((n, K), np.int64)
    slots[:, 0] = rng.integers(h.n_fine, size=n)
    for j in range(1, K):  # later interests are mostly near the first one in the tree
        r = rng.random(n)
        slots[:, j] = np.where(r < 0.5, _siblings(rng, h, slots[:, 0], 1),
                               np.where(r < 0.8, _siblings(rng, h, slots[:, 0], 0), rng.integers(h.n_fine, size=n)))
    active = np.arange(K)[None, :] < rng.integers(1, K + 1, size=n)[:, None]  # 1..K interests each
    base = rng.dirichlet(np.ones(K), size=n) * active + 1e-12 * active
    coarse = h.coarse_of(slots[:, 0])
    age = np.where(rng.random(n) < 0.5, (coarse + rng.integers(-1, 2, size=n)) % len(AGE_BUCKETS),
                   rng.integers(len(AGE_BUCKETS), size=n))
    return Users(fs, slots, base, rng.random((n, K)) * 2 * np.pi, np.exp(rng.normal(0, 1, n)), age,
                 rng.integers(len(REGIONS), size=n), np.full(n, window, np.int64))


def brand_names(cfg: SyntheticConfig, h: Hierarchy, n: int) -> list[str]:
    """Advertisers' names, in creation order (a longer run extends the list; no clash with interest words)."""
    taken = {w.lower() for names in h.names for w in names} | set(h.filler)
    taken |= {w for level in h.words for vocab in level for w in vocab}
    rng = np.random.default_rng([cfg.seed, _TAGS["brands"]])
    return [w.capitalize() for w in _pseudo_words(rng, n, taken)]


def _text_block(cfg: SyntheticConfig, h: Hierarchy, fine: np.ndarray, n_words: int, tag: int, window: int,
                block: int) -> pa.Array:
    """Space-separated words for each interest in `fine` (the rows of one block of one creation window): the
    interest's own, its ancestors', filler and noise."""
    rng = np.random.default_rng([cfg.seed, _TAGS["vocab"], tag, window] + ([block] if block else []))
    n = len(fine)
    kind = rng.choice(5, size=(n, n_words), p=[0.3, 0.15, 0.1, 0.35, 0.1])  # fine, mid, coarse, filler, other fine
    pick = rng.random((n, n_words))
    other = rng.integers(h.n_fine, size=(n, n_words))
    v2, v1, v0 = (len(h.words[level][0]) for level in (2, 1, 0))
    mid_at = h.n_fine * v2  # where each level's words start in h.flat_words
    coarse_at = mid_at + len(h.words[1]) * v1
    filler_at = coarse_at + len(h.words[0]) * v0
    f = np.asarray(fine)[:, None]
    start = np.choose(kind, [f * v2, mid_at + h.mid_of(f) * v1, coarse_at + h.coarse_of(f) * v0,
                             np.full_like(f, filler_at), other * v2])  # (n, n_words) first word of the vocabulary
    size = np.array([v2, v1, v0, len(h.filler), v2])[kind]
    words = h.flat_words.take(pa.array((start + (pick * size).astype(np.int64)).ravel()))
    return pc.binary_join(pa.ListArray.from_arrays(pa.array(np.arange(0, n * n_words + 1, n_words, dtype=np.int32)), words), " ")


@dataclass
class TextColumn:
    """One text field of one entity type, drawn block by block on request (memory: a block, not the column).

    Rows are the type's entities in creation order; `window` is non-decreasing. Entities created in the same window
    draw from that window's streams, so adding windows keeps earlier text.
    """

    cfg: SyntheticConfig
    h: Hierarchy
    fine: np.ndarray  # (n,) planted fine interest per row
    window: np.ndarray  # (n,) creation window per row, non-decreasing
    n_words: int
    tag: int
    _cache: dict = field(default_factory=dict, repr=False)  # the last blocks drawn

    def take(self, rows: np.ndarray) -> pa.Array:
        """The text of `rows` (sorted row indices)."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return pa.array([], pa.string())
        w = self.window[rows]
        pos = rows - np.searchsorted(self.window, w, side="left")  # row within its window
        key = w * (1 << 32) + pos // TEXT_BLOCK_ROWS
        cuts = np.flatnonzero(np.diff(key)) + 1
        parts = [self._block(int(w[a]), int(pos[a] // TEXT_BLOCK_ROWS)).take(pa.array(pos[a:b] % TEXT_BLOCK_ROWS))
                 for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]]))]
        return pa.concat_arrays(parts)

    def _block(self, w: int, block: int) -> pa.Array:
        if (w, block) not in self._cache:
            first = int(np.searchsorted(self.window, w, side="left")) + block * TEXT_BLOCK_ROWS
            last = min(first + TEXT_BLOCK_ROWS, int(np.searchsorted(self.window, w, side="right")))
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[w, block] = _text_block(self.cfg, self.h, self.fine[first:last], self.n_words, self.tag, w, block)
        return self._cache[w, block]


def texts(cfg: SyntheticConfig, h: Hierarchy, fine: np.ndarray, window: np.ndarray, n_words: int, tag: int) -> pa.Array:
    """Every row's text at once (rows in creation order): `TextColumn.take` of all rows."""
    return TextColumn(cfg, h, np.asarray(fine), np.asarray(window), n_words, tag).take(np.arange(len(fine)))
