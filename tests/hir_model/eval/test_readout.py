"""HIR's ranking head (hir_model.eval.readout): the recent-items readout by hand, the held-out split of window t's last
days, and the prior weight it fits (large where the held-out events follow popularity, 0 where they follow the space)."""

from __future__ import annotations

import numpy as np

from hir_model.eval.metrics import Ragged
from hir_model.eval.method import US_PER_DAY as DAY_US
from hir_model.eval.readout import WEIGHTS, fit_prior_weight, held_out_split, recent_items
from hir_model.eval.split import Interactions, Queries

END = 100 * DAY_US


def _train(events: list[tuple[int, int, float, bool]], n_items: int) -> Interactions:
    """(user, item, day, deep) events, sorted by user then time as the split sorts them."""
    events = sorted(events, key=lambda e: (e[0], e[2]))
    u, i, d, deep = (np.asarray(x) for x in zip(*events))
    n_users = int(u.max()) + 1
    return Interactions("w", END, np.array([f"u{k}" for k in range(n_users)], object), u.astype(np.int64), i.astype(np.int64),
                        (d * DAY_US).astype(np.int64), deep.astype(bool), n_items)


def test_recent_items_weigh_stage_and_age_from_the_users_own_last_event():
    vectors = np.eye(3, dtype=np.float32)
    day = DAY_US
    queries = Queries(np.array(["a", "b", "c"], object), np.array([0, 1, -1]),
                      Ragged(np.array([0, 3, 4, 4]), np.array([0, 1, 0, 2])),
                      np.array([10 * day, 12 * day, 12 * day, 50 * day]), np.array([False, True, False, False]))
    out = recent_items(queries, vectors, half_life_days=2.0, deep_weight=2.0)
    # a: item 0 two days before a's last event (x 1/2), item 1 converted then (x 2), item 0 again then (x 1)
    expected = np.array([0.5 + 1.0, 2.0, 0.0])
    np.testing.assert_allclose(out[0], expected / np.linalg.norm(expected), rtol=1e-6)
    # b's one event is 50 days old at end(t), but it is b's last: full weight
    np.testing.assert_allclose(out[1], [0, 0, 1], rtol=1e-6)
    assert not out[2].any()  # no context: zero


def test_the_held_out_split_is_the_warm_group_of_the_last_days():
    cut = END - 7 * DAY_US
    train = _train([(0, 0, 80, False), (0, 1, 95, True), (0, 0, 96, True),  # u0: item 1 is new after the cut, item 0 is not
                    (1, 2, 95, True),  # u1: no history before the cut
                    (2, 3, 50, True), (2, 4, 97, False)], 5)  # u2: only a click after the cut
    group = held_out_split(train, cut)
    queries, deep = group.queries, group.deep_funnel
    assert list(queries.user_ids) == ["u0", "u2"] and list(deep.row(0)) == [1] and list(deep.row(1)) == []
    assert list(group.engagement.row(1)) == [4]  # u2's click: a target of engagement, not of the deep funnel
    assert list(queries.context.idx) == [0, 3] and (queries.context_ts < cut).all()


def _popularity_world(targets_follow: str, n_users: int = 40):
    """Ten pairs of items (2k, 2k + 1) share a vector each; items 20 and 21 are popular. Before the cut every user
    clicked an item of their pair and one popular item; held out, they buy the other popular item (popularity) or
    their pair's other item (the space)."""
    n_items = 22
    vectors = np.zeros((n_items, 12), np.float32)
    vectors[np.arange(20), np.arange(20) // 2] = 1.0
    vectors[20, 10] = vectors[21, 11] = 1.0
    events = []
    for u in range(n_users):
        pair, popular = u % 10, 20 + u % 2
        events += [(u, 2 * pair, 60.0 + u % 20, False), (u, popular, 70.0, False)]
        events.append((u, 41 - popular if targets_follow == "popularity" else 2 * pair + 1, 96.0, True))
    train = _train(events, n_items)
    counts = np.bincount(train.item[train.ts < END - 7 * DAY_US], minlength=n_items).astype(float)
    calls = []

    def log_prior_at(cut):
        calls.append(cut)
        return np.log(np.where(counts > 0, counts, counts[counts > 0].min() / 2))

    return train, vectors, log_prior_at, calls


def test_the_fitted_prior_weight_follows_what_the_held_out_days_reward():
    train, vectors, log_prior_at, calls = _popularity_world("popularity")
    fitted = fit_prior_weight(train, vectors, log_prior_at, calibrate_days=7.0, half_life_days=2.0, deep_weight=2.0, k=1)
    assert calls == [END - 7 * DAY_US] and fitted.cut_us == END - 7 * DAY_US and fitted.users == 40
    assert set(fitted.recall) == set(WEIGHTS) and fitted.recall[0.0] == 0.0
    assert fitted.weight == 1.0 and fitted.recall[1.0] == 1.0 == max(fitted.recall.values())  # a tie keeps the unit weight
    space = fit_prior_weight(*_popularity_world("space")[:3], 7.0, 2.0, 2.0, k=1)
    assert space.weight == 0.0 and space.recall[0.0] == 1.0 and space.recall[1.0] == 0.0
    assert space.as_dict()["weight"] == 0.0 and space.as_dict()["recall"]["0.0"] == 1.0


def test_too_few_held_out_users_fit_nothing():
    train, vectors, log_prior_at, _ = _popularity_world("space", n_users=10)
    assert fit_prior_weight(train, vectors, log_prior_at, 7.0, 2.0, 2.0) is None
    assert fit_prior_weight(train, vectors, log_prior_at, 7.0, 2.0, 2.0, min_users=10) is not None
    assert fit_prior_weight(train, vectors, lambda cut: None, 7.0, 2.0, 2.0, min_users=10) is None  # nothing engaged by the cut
