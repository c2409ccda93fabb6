from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hir_model.baselines.als import ALSConfig, ImplicitALS
from hir_model.baselines.content_knn import NO_CONTENT, ContentKNN
from hir_model.baselines.popularity import Popularity, PopularityConfig
from hir_model.baselines.registry import baselines
from hir_model.protocol.method import Method, context_matrix
from hir_model.protocol.metrics import Ragged
from hir_model.protocol.split import Interactions, ItemSpace, Queries
from tests.hir_model.baselines.planted import DAY, END, as_cold, planted, top1

torch.set_num_threads(1)


def test_every_baseline_is_a_method():
    assert all(isinstance(m, Method) for m in baselines())
    assert [m.name for m in baselines()] == ["popularity", "content", "mf_als", "lightgcn", "item2item_recent"]


def _tiny(user, item, ts_days_ago, deep=None, n_items=4) -> Interactions:
    user, item = np.array(user), np.array(item)
    return Interactions("w", END, np.array([f"u{u}" for u in range(user.max() + 1)], object), user, item,
                        END - (np.array(ts_days_ago) * DAY).astype(np.int64),
                        np.zeros(len(user), bool) if deep is None else np.array(deep), n_items)


def _items(n_known, parents=None, n_new=0) -> ItemSpace:
    n = n_known + n_new
    parent = np.array(parents if parents is not None else [-1] * n)
    return ItemSpace(np.array([f"p{i}" for i in range(n)], object), n_known, parent, np.array(["a0", "a1"], object))


def _queries(contexts: list[list[int]], warm_rows=None) -> Queries:
    ctx = Ragged.from_lists(contexts)
    rows = np.full(len(contexts), -1) if warm_rows is None else np.array(warm_rows)
    return Queries(np.array([f"q{i}" for i in range(len(contexts))], object), rows, ctx,
                   np.full(len(ctx.idx), END - DAY), np.zeros(len(ctx.idx), bool))


def test_popularity_ranks_the_planted_hit_first_and_decays():
    # item 2: three engagements 30 days ago; item 1: two engagements today; item 0: one purchase today
    train = _tiny([0, 1, 2, 0, 1, 2], [2, 2, 2, 1, 1, 0], [30, 30, 30, 0, 0, 0], [0, 0, 0, 0, 0, 1])
    pop = Popularity(PopularityConfig(half_life_days=None, deep_weight=2.0))
    pop.fit(train, _items(4))
    assert pop.item_scores(_items(4)).tolist() == [2.0, 2.0, 3.0, 0.0]  # a purchase counts twice
    decayed = Popularity(PopularityConfig(half_life_days=7.0, deep_weight=2.0))
    decayed.fit(train, _items(4))
    scores = decayed.item_scores(_items(4))
    assert scores[1] == pytest.approx(2.0) and scores[0] == pytest.approx(2.0) and scores[2] == pytest.approx(3 * 2 ** (-30 / 7))
    assert decayed.score(_queries([[1], []]), _items(4)).shape == (2, 4)


def test_popularity_scores_new_items_by_their_parent():
    train = _tiny([0, 1, 2, 0], [0, 0, 0, 2], [0, 0, 0, 0], n_items=3)
    items = _items(3, parents=[0, 0, 1, 1, 0, -1], n_new=3)  # new items 3 (parent a1), 4 (a0), 5 (none)
    pop = Popularity()
    pop.fit(train, items.known())
    s = pop.item_scores(items)
    assert s[4] > s[3] > s[5] == 0.0  # a0's known items average 1.5 engagements, a1's 0.5


def test_content_ranks_the_nearest_item_first_and_unknown_content_last():
    content = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [1, 0.05]], np.float32)
    items = ItemSpace(np.array([f"p{i}" for i in range(5)], object), 4, np.full(5, -1), np.array([], object), content,
                      np.array([True, True, True, True, False]))
    knn = ContentKNN()
    knn.fit(_tiny([0], [0], [0]), items.known())
    scores = knn.score(_queries([[0], [2]]), items)
    assert top1(scores, _queries([[0], [2]])).tolist() == [1, 3]
    assert np.all(scores[:, 4] == NO_CONTENT)


def test_content_needs_vectors():
    with pytest.raises(ValueError, match="content vectors"):
        ContentKNN().fit(_tiny([0], [0], [0]), _items(4))


@pytest.mark.parametrize("make", [lambda: ContentKNN(), lambda: ImplicitALS(ALSConfig(factors=4)),
                                  lambda: ImplicitALS(ALSConfig(factors=16, reg=5.0, iterations=30))])
def test_favourites_are_found_in_the_users_own_cluster(make):
    data = planted(seed=1)
    method = make()
    method.fit(data.train, data.items)
    for queries in (data.queries, as_cold(data.queries)):  # warm users, then the same contexts as cold users
        best = top1(method.score(queries, data.items), queries)
        assert np.mean(data.item_cluster[best] == data.user_cluster) > 0.95


def test_als_fold_in_is_the_exact_least_squares_solve():
    data = planted(seed=2)
    cfg = ALSConfig(factors=6, fold_in_steps=30)
    als = ImplicitALS(cfg)
    als.fit(data.train, data.items)
    queries = as_cold(data.queries.take(np.arange(5)))
    y = als.items
    conf = context_matrix(queries, len(y), cfg.deep_weight)
    for q in range(len(queries)):
        row = conf.getrow(q)
        c = np.zeros(len(y))
        c[row.indices] = cfg.alpha * row.data  # c - 1
        a = y.T @ y + cfg.reg * np.eye(cfg.factors) + (y.T * c) @ y
        b = ((1 + c) * (c > 0)) @ y
        np.testing.assert_allclose(als.fold_in(queries)[q], np.linalg.solve(a, b), rtol=1e-5, atol=1e-7)


def test_als_warm_start_only_from_an_earlier_window():
    data = planted(n_clusters=2, users_per=6, items_per=4)
    als = ImplicitALS(ALSConfig(factors=4, iterations=9, warm_iterations=2))
    late = dataclasses.replace(data.train, end_us=data.train.end_us + 1)
    als.fit(late, data.items)
    als.fit(data.train, data.items)  # earlier than the last fit: from scratch
    assert als.sweeps == 9
    als.fit(late, data.items)
    assert als.sweeps == 2
