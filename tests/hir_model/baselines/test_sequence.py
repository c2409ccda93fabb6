"""The recency-weighted item-to-item baseline on hand-built sequences."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hir_model.baselines.sequence import Item2ItemConfig, Item2ItemRecent, item_similarity
from hir_model.protocol.method import Method
from hir_model.protocol.metrics import Ragged, ranking_metrics
from hir_model.protocol.split import Interactions, ItemSpace, Queries
from tests.hir_model.baselines.planted import DAY, END, planted

# items: 0 A, 1 B (what follows A), 2 C, 3 D (what follows C), 4 E (popular, follows nothing in particular), 5 F
N_ITEMS = 6


def _train(sequences: list[list[int]], deep: set[tuple[int, int]] = frozenset()) -> Interactions:
    """One user per sequence, an item a day, the last a day before end(t); (user, item) in `deep` converted."""
    user, item, ts = [], [], []
    for u, seq in enumerate(sequences):
        for p, i in enumerate(seq):
            user.append(u), item.append(i), ts.append(END - (len(seq) - p) * DAY)
    return Interactions("w", END, np.array([f"u{u:03d}" for u in range(len(sequences))], object), np.array(user), np.array(item),
                        np.array(ts, np.int64), np.array([(u, i) in deep for u, i in zip(user, item)]), N_ITEMS)


def _items(n_new: int = 0) -> ItemSpace:
    n = N_ITEMS + n_new
    return ItemSpace(np.array([f"p{i}" for i in range(n)], object), N_ITEMS, np.full(n, -1), np.array([], object))


def _queries(contexts: list[list[tuple[int, float]]], deep: list[list[bool]] | None = None) -> Queries:
    """Cold queries: (item, days before end(t)) per context event, in time order."""
    ctx = Ragged.from_lists([[i for i, _ in c] for c in contexts])
    ts = np.array([END - int(d * DAY) for c in contexts for _, d in c], np.int64)
    flags = np.array([f for c in (deep or [[False] * len(c) for c in contexts]) for f in c], bool)
    return Queries(np.array([f"q{i}" for i in range(len(contexts))], object), np.full(len(contexts), -1), ctx, ts, flags)


# A is followed by B, C by D, in many users' sequences; E is everywhere (popular) but follows nothing in particular
SEQUENCES = [[0, 1, 4]] * 20 + [[2, 3, 4]] * 20 + [[4, 5]] * 30 + [[0, 2]] * 3


def _rank(scores: np.ndarray, queries: Queries) -> np.ndarray:
    s = scores.copy()
    s[queries.context.row_of, queries.context.idx] = -np.inf
    return np.argsort(-s, axis=1, kind="stable")


def test_the_obvious_next_item_is_ranked_first():
    m = Item2ItemRecent(Item2ItemConfig(window=1, neighbours=5))
    assert isinstance(m, Method) and m.name == "item2item_recent"
    m.fit(_train(SEQUENCES), _items())
    q = _queries([[(0, 1.0)], [(2, 1.0)]])
    ranks = _rank(m.score(q, _items()), q)
    assert ranks[:, 0].tolist() == [1, 3]  # after A: B; after C: D (not the popular E)


def test_the_latest_context_item_weighs_most():
    m = Item2ItemRecent(Item2ItemConfig(window=1, half_life_days=1.0))
    m.fit(_train(SEQUENCES), _items())
    q = _queries([[(2, 10.0), (0, 1.0)], [(0, 10.0), (2, 1.0)]])  # C long ago then A yesterday; and the reverse
    ranks = _rank(m.score(q, _items()), q)
    assert ranks[:, 0].tolist() == [1, 3]
    flat = Item2ItemRecent(Item2ItemConfig(window=1, half_life_days=None))  # no recency: the two pulls are equal
    flat.fit(_train(SEQUENCES), _items())
    s = flat.score(q, _items())
    assert s[0, 1] == pytest.approx(s[0, 3]) and s[1, 1] == pytest.approx(s[1, 3])


def test_a_conversion_weighs_more_than_a_click():
    m = Item2ItemRecent(Item2ItemConfig(window=1, half_life_days=None, deep_weight=3.0))
    m.fit(_train(SEQUENCES), _items())
    q = _queries([[(0, 1.0), (2, 1.0)], [(0, 1.0), (2, 1.0)]], deep=[[True, False], [False, True]])
    ranks = _rank(m.score(q, _items()), q)
    assert ranks[:, 0].tolist() == [1, 3]


def test_order_is_read_when_backward_pairs_are_off():
    sim = item_similarity(_train(SEQUENCES), Item2ItemConfig(window=1, backward_weight=0.0)).toarray()
    assert sim[0, 1] > 0 and sim[1, 0] == 0  # A -> B, never B -> A
    both = item_similarity(_train(SEQUENCES), Item2ItemConfig(window=1)).toarray()
    assert both[1, 0] == pytest.approx(both[0, 1]) and np.diag(both).max() == 0
    anywhere = item_similarity(_train(SEQUENCES), Item2ItemConfig(window=None)).toarray()
    assert anywhere[0, 4] > 0 and both[0, 4] == 0  # A and E are two apart: only unwindowed co-occurrence links them
    top1 = item_similarity(_train(SEQUENCES), Item2ItemConfig(window=None, neighbours=1))
    assert (np.diff(top1.indptr) <= 1).all()


def test_new_items_score_a_constant_and_the_item_space_is_checked():
    m = Item2ItemRecent()
    m.fit(_train(SEQUENCES), _items())
    q = _queries([[(0, 1.0)], []])
    s = m.score(q, _items(n_new=3))
    assert s.shape == (2, N_ITEMS + 3) and np.isfinite(s).all() and len(np.unique(s[:, N_ITEMS:])) == 1
    assert np.argmax(s[1]) == 4  # no context: the popularity backfill (E)
    with pytest.raises(ValueError, match="another item space"):
        m.score(q, ItemSpace(np.array([f"x{i}" for i in range(N_ITEMS)], object), N_ITEMS, np.full(N_ITEMS, -1),
                             np.array([], object)))
    with pytest.raises(RuntimeError, match="fit before score"):
        Item2ItemRecent().score(q, _items())


def test_finds_planted_favourites_far_above_chance():
    p = planted(n_clusters=4, users_per=40, items_per=12, per_user=5, seed=1)
    m = Item2ItemRecent(Item2ItemConfig(window=None))
    m.fit(p.train, p.items)
    scores = m.score(p.queries, p.items)
    recall = ranking_metrics(scores, p.targets, p.queries.context, recall_ks=(10,), ndcg_ks=(10,)).recall[10]
    assert recall > 0.6  # chance: 10 of ~43 candidates, ~0.23


def test_a_large_sparse_catalogue_fits_and_scores_fast():
    rng = np.random.default_rng(0)
    n_users, n_items, per = 20_000, 40_000, 15
    user = np.repeat(np.arange(n_users), per)
    item = (rng.pareto(1.2, len(user)) * 50).astype(np.int64) % n_items
    ts = np.sort(END - rng.integers(1, 30 * DAY, len(user)))
    order = np.lexsort((ts, user))
    train = Interactions("w", END, np.array([f"u{u}" for u in range(n_users)], object), user, item[order], ts,
                         rng.random(len(user)) < 0.05, n_items)
    ids = np.array([f"p{i:05d}" for i in range(n_items)], object)
    items = ItemSpace(ids, n_items, np.full(n_items, -1), np.array([], object))
    t0 = time.perf_counter()
    m = Item2ItemRecent()
    m.fit(train, items)
    from hir_model.protocol.split import warm_queries
    m.score(warm_queries(train, np.arange(256)), items)
    assert time.perf_counter() - t0 < 10.0 and m.similarity.nnz <= n_items * m.config.neighbours
