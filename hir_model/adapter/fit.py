"""Objective adapters: a small map on top of the frozen encoder's published embeddings, fitted for one event type.

The encoder is trained once per window on every engagement; an objective (click, add_to_cart, purchase) only
reshapes its metric space, so a new objective needs no retraining of the encoder. Each side (users, items) gets
a low-rank residual map

    f(x) = normalize(x + up(down(x)))    down: W -> r, up: r -> W, up = 0 at init

so the adapter starts exactly at the base embeddings (their rows are unit norm), and weight decay pulls it back
towards them. The adapted space stays a cosine space like the published one.

Objective: user -> item sampled softmax over the objective's distinct (user, item) pairs, with the batch's other
items as negatives and the logQ correction (Yi et al., RecSys 2019: subtract log of each item's share of the
pairs, since in-batch negatives over-sample popular items); another pair of the same user or the same item is
not a negative. Measured on MovieLens with SVD stand-in base embeddings (see the asset's docs), this one-way
corrected loss beat the symmetric uncorrected InfoNCE of hir_model.train.loss.engagement_loss, which pushes
popular items down and lowered Recall@20 below the base embeddings.

The gain is Recall@K over the full item catalogue (every item with a row, no sampled negatives) on the next
window's events of the objective, for warm users, adapted vs base; items the user engaged with up to the window
end are never targets and rank last. Only the published `entity_embeddings` table and `raw_events` rows are
read: no encoder, no graph, no Dagster.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.protocol.metrics import Ragged, ranking_metrics

OBJECTIVES: tuple[str, ...] = ("click", "add_to_cart", "purchase")  # the funnel stages an adapter can be fitted for
ENGAGEMENT_TYPES: tuple[str, ...] = ("click", "add_to_cart", "purchase", "interested")  # "already engaged" (as protocol.split)
ITEM_TYPES: tuple[str, ...] = ("product", "service")  # entity types ranked as items (as protocol.split)
WEIGHTS_FILE, CONFIG_FILE = "adapter.pt", "adapter.json"


@dataclass(frozen=True)
class AdapterConfig:
    rank: int = 16  # r of each side's low-rank update (a larger r gained nothing on MovieLens)
    steps: int = 100  # AdamW steps, one batch each (more gained nothing on MovieLens)
    batch_size: int = 256  # pairs per step; the batch's other items are the negatives
    lr: float = 5e-3  # constant: few steps, and weight decay holds the map near the identity
    weight_decay: float = 1e-2  # pulls `up` (and `down`) towards 0, i.e. the adapter towards the base embeddings
    temp: float = 0.1  # softmax temperature on cosine similarities (the encoder's engagement_temp)
    k: int = 20  # Recall@K of the gain
    seed: int = 0  # init, batches and the ranking's tie order
    threads: int = 1  # torch threads while fitting: (256, 64) matmuls gain nothing from more, and on a busy 2-core
    # machine spinning intra-op threads made a fit many times slower; 0 keeps torch's setting

    def __post_init__(self) -> None:
        if self.rank < 1 or self.steps < 1 or self.batch_size < 2 or self.temp <= 0:
            raise ValueError(f"rank >= 1, steps >= 1, batch_size >= 2 and temp > 0 are required, got {self}")

    @classmethod
    def from_dict(cls, d: dict) -> AdapterConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class EmbeddingSpace:
    """One window's base embeddings, split into the user side and the item side (rows in table order)."""

    user_ids: np.ndarray  # (U,) object
    users: np.ndarray  # (U, W) float32, unit rows
    user_warm: np.ndarray  # (U,) bool: the user had an edge by the window end (not cold_start)
    item_ids: np.ndarray  # (I,) object, entity types in ITEM_TYPES
    items: np.ndarray  # (I, W) float32, unit rows

    @property
    def width(self) -> int:
        return self.users.shape[1]

    @classmethod
    def from_table(cls, table: pa.Table, item_types: tuple[str, ...] = ITEM_TYPES) -> EmbeddingSpace:
        """From the published `entity_embeddings` table (entity_id, entity_type, embedding, cold_start)."""
        col = table.column("embedding").combine_chunks()
        d = col.type.list_size
        flat = col.values.slice(col.offset * d, len(col) * d).to_numpy(zero_copy_only=False)
        vectors = np.asarray(flat, np.float32).reshape(len(col), d)  # (N, W)
        ids = np.asarray(table.column("entity_id").to_pylist(), object)
        types = np.asarray(table.column("entity_type").to_pylist(), object)
        cold = np.asarray(table.column("cold_start").to_pylist(), bool)
        u, i = types == "user", np.isin(types, list(item_types))
        return cls(ids[u], vectors[u], ~cold[u], ids[i], vectors[i])


@dataclass(frozen=True)
class EventRows:
    """Events mapped to the space's rows (duplicates kept)."""

    user: np.ndarray  # (E,) int64 user row
    item: np.ndarray  # (E,) int64 item row
    selected: int  # events of the wanted types inside the time range, before dropping ids without a row
    unknown_item: int  # of those, events whose user has a row but whose item has none (first seen later)


def event_rows(space: EmbeddingSpace, events: pa.Table, event_types: tuple[str, ...], lo_us: int | None, hi_us: int) -> EventRows:
    """The events of `event_types` with lo_us <= ts < hi_us (no lower bound when lo_us is None) as rows of `space`."""
    ts = events.column("ts").cast(pa.int64())
    keep = pc.and_(pc.is_in(events.column("event_type"), pa.array(event_types, pa.string())), pc.less(ts, hi_us))
    if lo_us is not None:
        keep = pc.and_(keep, pc.greater_equal(ts, lo_us))
    t = events.filter(keep)
    users, items = {e: r for r, e in enumerate(space.user_ids)}, {e: r for r, e in enumerate(space.item_ids)}
    u = np.array([users.get(x, -1) for x in t.column("user_id").to_pylist()], np.int64)
    i = np.array([items.get(x, -1) for x in t.column("entity_id").to_pylist()], np.int64)
    ok = (u >= 0) & (i >= 0)
    return EventRows(u[ok], i[ok], t.num_rows, int(((u >= 0) & (i < 0)).sum()))


def unique_pairs(user: np.ndarray, item: np.ndarray, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (user, item) pairs, sorted by (user, item)."""
    code = np.unique(np.asarray(user, np.int64) * n_items + np.asarray(item, np.int64))
    return code // n_items, code % n_items


class SideAdapter(nn.Module):
    """x -> normalize(x + up(down(x))): the identity at init (up = 0), a rank-r change of the metric after."""

    def __init__(self, width: int, rank: int, generator: torch.Generator):
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = nn.Linear(rank, width, bias=False)
        with torch.no_grad():
            self.down.weight.normal_(0.0, 1.0 / math.sqrt(width), generator=generator)  # (r, W)
            self.up.weight.zero_()  # (W, r)

    def forward(self, x: Tensor) -> Tensor:  # (N, W) unit rows -> (N, W) unit rows
        return F.normalize(x + self.up(self.down(x)), dim=-1)


class ObjectiveAdapter(nn.Module):
    """A user-side and an item-side adapter: score(u, i) = <user(x_u), item(x_i)>."""

    def __init__(self, width: int, cfg: AdapterConfig = AdapterConfig()):
        super().__init__()
        self.cfg, self.width = cfg, width
        g = torch.Generator().manual_seed(cfg.seed)
        self.user, self.item = SideAdapter(width, cfg.rank, g), SideAdapter(width, cfg.rank, g)

    @torch.no_grad()
    def embed(self, space: EmbeddingSpace) -> tuple[np.ndarray, np.ndarray]:
        """(adapted users (U, W), adapted items (I, W)), unit rows."""
        return self.user(torch.from_numpy(space.users)).numpy(), self.item(torch.from_numpy(space.items)).numpy()


def sampled_softmax(users: Tensor, items: Tensor, user_row: Tensor, item_row: Tensor, log_q: Tensor, temp: float) -> Tensor:
    """User -> item cross-entropy of B pairs over the batch's items, logQ-corrected.

    users, items: (B, W) pair b's two sides, unit rows; user_row, item_row: (B,) their rows in the space;
    log_q: (B,) log of item_row's share of the training pairs. Another pair of the same user or the same item is
    masked out (it is a positive of the row, or the row's own item).
    """
    logits = users @ items.T / temp - log_q[None, :]  # (B, B)
    same = (item_row[None, :] == item_row[:, None]) | (user_row[None, :] == user_row[:, None])  # (B, B)
    logits = logits.masked_fill(same & ~torch.eye(len(users), dtype=torch.bool), float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(users)))


def pair_loss(adapter: ObjectiveAdapter, space: EmbeddingSpace, user: np.ndarray, item: np.ndarray,
              log_q: np.ndarray) -> float:
    """The objective on given pairs (one batch: every pair's item is a negative of every other), without gradient."""
    with torch.no_grad():
        u, i = torch.from_numpy(user), torch.from_numpy(item)
        return float(sampled_softmax(adapter.user(torch.from_numpy(space.users[user])), adapter.item(torch.from_numpy(space.items[item])),
                                     u, i, torch.from_numpy(log_q[item]), adapter.cfg.temp))


@dataclass(frozen=True)
class AdapterFit:
    adapter: ObjectiveAdapter
    losses: list[float]  # one per step
    pairs: int  # distinct (user, item) training pairs
    seconds: float

    def loss_decreased(self, k: int = 10) -> tuple[bool, float, float]:
        """(finite, and the mean of the last k steps below that of the first k; first mean; last mean)."""
        k = max(1, min(k, len(self.losses) // 4))
        first, last = float(np.mean(self.losses[:k])), float(np.mean(self.losses[-k:]))
        return bool(np.isfinite(self.losses).all()) and last < first, first, last


def item_log_q(item: np.ndarray, n_items: int) -> np.ndarray:
    """(I,) float32 log of each item's share of the pairs (items without a pair: log of half a pair)."""
    counts = np.bincount(item, minlength=n_items).astype(np.float64)
    return np.log(np.maximum(counts, 0.5) / max(len(item), 1)).astype(np.float32)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n (n > 0) inside the block, restored after."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fit_adapter(space: EmbeddingSpace, user: np.ndarray, item: np.ndarray, cfg: AdapterConfig = AdapterConfig()) -> AdapterFit:
    """Fit an ObjectiveAdapter on (user row, item row) events; deterministic by cfg.seed. Stops on a non-finite loss."""
    with torch_threads(cfg.threads):
        return _fit(space, user, item, cfg)


def _fit(space: EmbeddingSpace, user: np.ndarray, item: np.ndarray, cfg: AdapterConfig) -> AdapterFit:
    start = time.perf_counter()
    pu, pi = unique_pairs(user, item, len(space.item_ids))
    if len(pu) < 2:
        raise ValueError(f"an adapter needs at least 2 distinct (user, item) pairs, got {len(pu)}")
    adapter = ObjectiveAdapter(space.width, cfg)
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    users, items = torch.from_numpy(space.users), torch.from_numpy(space.items)  # (U, W), (I, W)
    pu_t, pi_t = torch.from_numpy(pu), torch.from_numpy(pi)
    log_q = torch.from_numpy(item_log_q(pi, len(space.item_ids)))  # (I,)
    rng = np.random.default_rng(cfg.seed)
    b = min(cfg.batch_size, len(pu))
    losses = []
    for step in range(cfg.steps):
        idx = torch.from_numpy(rng.choice(len(pu), size=b, replace=False))  # (B,)
        u_row, i_row = pu_t[idx], pi_t[idx]
        loss = sampled_softmax(adapter.user(users[u_row]), adapter.item(items[i_row]), u_row, i_row, log_q[i_row], cfg.temp)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"adapter loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    adapter.eval()
    return AdapterFit(adapter, losses, len(pu), time.perf_counter() - start)


@dataclass(frozen=True)
class Gain:
    """Recall@K (and NDCG@K) of the adapted embeddings vs the base ones on the next window's objective events."""

    k: int
    users: int  # warm users with at least one target (the ones averaged over)
    targets: int  # their distinct (user, item) targets
    recall_base: float
    recall_adapted: float
    ndcg_base: float
    ndcg_adapted: float
    recall_popularity: float  # context: ranking by the objective's pair counts up to the window end
    next_events: int  # the objective's events in the next window (before dropping ids without a row)
    unranked_targets: int  # of those, events of a known user on an item with no row (first seen after the window end)

    @property
    def ratio(self) -> float:
        """recall_adapted / recall_base (nan when the base recall is 0 or nobody was evaluated)."""
        return self.recall_adapted / self.recall_base if self.recall_base > 0 else float("nan")

    def as_dict(self) -> dict:
        return asdict(self) | {"ratio": self.ratio}


def next_window_gain(adapter: ObjectiveAdapter, space: EmbeddingSpace, history: pa.Table, future: pa.Table, objective: str,
                     end_us: int, next_end_us: int, k: int = 20, seed: int = 0) -> Gain:
    """Gain on the objective's events of the next window [end_us, next_end_us), for warm users.

    history: events up to the window end (only ts < end_us is read): a user's items engaged with by then are
    never targets and rank last; its objective pairs give the popularity reference. future: the next window's
    events (rows outside [end_us, next_end_us) are ignored). Ties break by a seeded permutation of the items.
    """
    n_items = len(space.item_ids)
    nxt = event_rows(space, future, (objective,), end_us, next_end_us)
    seen = event_rows(space, history, ENGAGEMENT_TYPES, None, end_us)
    tu, ti = unique_pairs(nxt.user, nxt.item, n_items)
    seen_codes = np.unique(seen.user * n_items + seen.item)
    keep = space.user_warm[tu] & ~np.isin(tu * n_items + ti, seen_codes)
    tu, ti = tu[keep], ti[keep]
    rows = np.unique(tu)  # the evaluated users, (R,)
    nan = float("nan")
    if len(rows) == 0:
        return Gain(k, 0, 0, nan, nan, nan, nan, nan, nxt.selected, nxt.unknown_item)
    pos = np.full(len(space.user_ids), -1, np.int64)
    pos[rows] = np.arange(len(rows))
    targets = Ragged.from_pairs(pos[tu], ti, len(rows))
    ex = pos[seen.user] >= 0
    exclude = Ragged.from_pairs(pos[seen.user[ex]], seen.item[ex], len(rows))
    tie = np.random.default_rng(seed).permutation(n_items)

    def score(scores: np.ndarray) -> tuple[float, float]:  # scores: (R, I)
        m = ranking_metrics(scores, targets, exclude, recall_ks=(k,), ndcg_ks=(k,), tie_order=tie)
        return m.recall[k], m.ndcg[k]

    au, ai = adapter.embed(space)
    rb, nb = score(space.users[rows] @ space.items.T)
    ra, na = score(au[rows] @ ai.T)
    obj = event_rows(space, history, (objective,), None, end_us)
    pop = np.bincount(unique_pairs(obj.user, obj.item, n_items)[1], minlength=n_items).astype(np.float32)
    rp, _ = score(np.broadcast_to(pop, (len(rows), n_items)))
    return Gain(k, len(rows), len(tu), rb, ra, nb, na, rp, nxt.selected, nxt.unknown_item)


def save_adapter(folder: str | Path, adapter: ObjectiveAdapter, info: dict | None = None) -> tuple[Path, Path]:
    """`adapter.pt` (a plain state_dict: loads with torch.load(weights_only=True)) and `adapter.json` (config, width, info)."""
    folder = Path(folder)
    weights, config = folder / WEIGHTS_FILE, folder / CONFIG_FILE
    torch.save({k: v.detach().cpu().contiguous() for k, v in adapter.state_dict().items()}, weights)
    config.write_text(json.dumps({"config": asdict(adapter.cfg), "width": adapter.width, "info": info or {}},
                                 indent=1, sort_keys=True) + "\n")
    return weights, config


def load_adapter(folder: str | Path) -> ObjectiveAdapter:
    """The adapter saved in `folder` (a FileNotFoundError naming it when there is none: skipped or never materialised)."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} + {WEIGHTS_FILE} in {folder}: the adapter was skipped or never materialised")
    meta = json.loads((folder / CONFIG_FILE).read_text())
    adapter = ObjectiveAdapter(int(meta["width"]), AdapterConfig.from_dict(meta["config"]))
    adapter.load_state_dict(torch.load(folder / WEIGHTS_FILE, weights_only=True))
    return adapter.eval()
