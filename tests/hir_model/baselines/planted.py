"""A planted dataset for the methods: users and items in clusters, each user engaging with items of their own
cluster, with one more own-cluster item held out per user as the target (the 'planted favourite')."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir_model.protocol.metrics import Ragged
from hir_model.protocol.split import Interactions, ItemSpace, Queries, warm_queries

DAY = 86_400_000_000
END = 1_700_000_000_000_000  # end(t), µs


@dataclass(frozen=True)
class Planted:
    train: Interactions
    items: ItemSpace  # with content: the item's cluster one-hot plus noise
    queries: Queries  # every user, warm, with their history as context
    targets: Ragged  # the held-out own-cluster item per user
    user_cluster: np.ndarray  # (U,)
    item_cluster: np.ndarray  # (I,)


def planted(n_clusters: int = 4, users_per: int = 30, items_per: int = 10, per_user: int = 5, noise: int = 1,
            seed: int = 0) -> Planted:
    rng = np.random.default_rng(seed)
    per_user = min(per_user, items_per - 1)
    n_users, n_items = n_clusters * users_per, n_clusters * items_per
    user_cluster = np.repeat(np.arange(n_clusters), users_per)
    item_cluster = np.repeat(np.arange(n_clusters), items_per)
    pop = rng.pareto(1.5, n_items) + 1  # popularity skew inside clusters
    users, items, targets = [], [], []
    for u in range(n_users):
        own = np.flatnonzero(item_cluster == user_cluster[u])
        p = pop[own] / pop[own].sum()
        picked = rng.choice(own, per_user + 1, replace=False, p=p)
        users += [u] * (per_user + noise)
        items += picked[:per_user].tolist() + rng.choice(n_items, noise).tolist()
        targets.append([int(picked[-1])])
    users, items = np.array(users), np.array(items)
    ts = END - rng.integers(1, 7 * DAY, len(users))
    order = np.lexsort((items, ts, users))
    user_ids = np.array([f"u{u:04d}" for u in range(n_users)], object)
    train = Interactions("w", END, user_ids, users[order], items[order], ts[order], rng.random(len(users))[order] < 0.3, n_items)
    content = np.eye(n_clusters)[item_cluster] + 0.3 * rng.normal(size=(n_items, n_clusters))
    space = ItemSpace(np.array([f"p{i:04d}" for i in range(n_items)], object), n_items, np.full(n_items, -1), np.array([], object),
                      content.astype(np.float32), np.ones(n_items, bool))
    return Planted(train, space, warm_queries(train, np.arange(n_users)), Ragged.from_lists(targets), user_cluster, item_cluster)


def as_cold(queries: Queries) -> Queries:
    """The same users and contexts, as cold users (no train row)."""
    return Queries(queries.user_ids, np.full(len(queries), -1), queries.context, queries.context_ts, queries.context_deep)


def top1(scores: np.ndarray, queries: Queries) -> np.ndarray:
    s = scores.copy()
    s[queries.context.row_of, queries.context.idx] = -np.inf
    return s.argmax(1)
