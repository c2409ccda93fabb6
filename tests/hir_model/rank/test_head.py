"""HIR's ranking head (hir_model.rank.head, .fit): the recent-items readout by hand, the held-out split of window t's last
days, and the prior weight it fits (large where the held-out events follow popularity, 0 where they follow the space)."""

from __future__ import annotations

import numpy as np

from hir_model.protocol.method import US_PER_DAY as DAY_US
from hir_model.protocol.metrics import Ragged
from hir_model.protocol.split import Interactions, Queries
from hir_model.rank.fit import WEIGHTS, decayed_engagement, fit_prior_weight, held_out_split, new_user_engagement
from hir_model.rank.head import HeadConfig, interest_kernel, recent_items

END = 100 * DAY_US
MEAN = HeadConfig(kernel_weight=0.0)  # calibration on the recent-items mean alone (7 days held out, 2-day half-life)


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


def test_the_new_users_prior_counts_engagements_in_their_users_first_days():
    train = _train([(0, 0, 10, False), (0, 1, 16, True), (0, 2, 17, False),  # u0 from day 10: days 10 and 16 are early
                    (1, 2, 90, False), (1, 1, 91, False),  # u1 from day 90: both early
                    (2, 3, 5, True), (2, 3, 99, True)], 4)  # u2 from day 5: day 99 is not
    out = new_user_engagement(train, days=7.0, half_life_days=None, deep_weight=2.0)
    np.testing.assert_allclose(out, [1.0, 2.0 + 1.0, 1.0, 2.0])  # u0's day-17 click on item 2 is a day too late
    decayed = new_user_engagement(train, days=7.0, half_life_days=10.0, deep_weight=2.0)  # END is day 100
    np.testing.assert_allclose(decayed, [2 ** -9.0, 2 * 2 ** -8.4 + 2 ** -0.9, 2 ** -1.0, 2 * 2 ** -9.5])


def test_the_decayed_prior_counts_only_events_before_its_cutoff_and_ages_them_from_it():
    train = _train([(0, 0, 90, False), (0, 1, 96, True), (1, 1, 99, False), (1, 2, 50, True)], 4)
    out = decayed_engagement(train, END, half_life_days=3.0, deep_weight=2.0)  # END is day 100
    np.testing.assert_allclose(out, [2 ** (-10 / 3), 2 * 2 ** (-4 / 3) + 2 ** (-1 / 3), 2 * 2 ** (-50 / 3), 0.0])
    at = decayed_engagement(train, END - 3 * DAY_US, half_life_days=3.0, deep_weight=2.0)  # day 97: day 99 is later
    np.testing.assert_allclose(at, [2 ** (-7 / 3), 2 * 2 ** (-1 / 3), 2 * 2 ** (-47 / 3), 0.0])


def test_the_head_takes_its_prior_from_the_history_when_given_a_half_life():
    from hir_model.rank.state import fit_head

    train = _train([(0, 0, 99, False), (1, 0, 98, False), (2, 1, 40, True), (3, 1, 41, True), (4, 1, 42, True)], 3)
    vectors = np.eye(3, dtype=np.float32)
    stale = lambda cut: np.array([1.0, 5.0, 0.0])  # noqa: E731  the graph's strength: item 1 (long ago) leads
    config = HeadConfig(calibrate_days=None, track_min_users=None)
    graph = fit_head(train, np.array(["a", "b", "c"], object), np.array(["product"] * 3, object), vectors, stale, 0.1,
                     None, config)
    recent = fit_head(train, np.array(["a", "b", "c"], object), np.array(["product"] * 3, object), vectors, stale, 0.1,
                      None, HeadConfig(calibrate_days=None, track_min_users=None, prior_half_life_days=3.0))
    assert graph.log_prior[1] > graph.log_prior[0] and recent.log_prior[0] > recent.log_prior[1]
    assert recent.log_prior[2] == recent.prior_floor < recent.log_prior[1]  # never engaged: the floor
    no_graph = fit_head(train, np.array(["a", "b", "c"], object), np.array(["product"] * 3, object), vectors, None, 0.1,
                        None, HeadConfig(calibrate_days=None, track_min_users=None, prior_half_life_days=3.0))
    np.testing.assert_array_equal(no_graph.log_prior, recent.log_prior)  # the history alone makes it


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
    fitted = fit_prior_weight(train, vectors, log_prior_at, MEAN, k=1)
    assert calls == [END - 7 * DAY_US] and fitted.cut_us == END - 7 * DAY_US and fitted.users == 40
    assert set(fitted.recall) == set(WEIGHTS) and fitted.recall[0.0] == 0.0
    assert fitted.weight == 1.0 and fitted.recall[1.0] == 1.0 == max(fitted.recall.values())  # a tie keeps the unit weight
    space = fit_prior_weight(*_popularity_world("space")[:3], MEAN, k=1)
    assert space.weight == 0.0 and space.recall[0.0] == 1.0 and space.recall[1.0] == 0.0
    assert space.as_dict()["weight"] == 0.0 and space.as_dict()["recall"]["0.0"] == 1.0


def test_the_fit_scores_a_bounded_block_of_users_at_a_time_and_at_most_max_users(monkeypatch):
    import hir_model.rank.fit as fit

    train, vectors, log_prior_at, _ = _popularity_world("space")
    whole = fit_prior_weight(train, vectors, log_prior_at, MEAN, k=1)
    monkeypatch.setattr(fit, "FIT_CELLS", 3 * len(vectors))  # three users a block, as at a 200k-item catalogue
    assert fit_prior_weight(train, vectors, log_prior_at, MEAN, k=1) == whole
    sampled = fit_prior_weight(train, vectors, log_prior_at, MEAN, k=1, max_users=25, min_users=20)
    assert sampled.users == 40 and sampled.weight == whole.weight  # the users it had; 25 of them ranked


def test_too_few_held_out_users_fit_nothing():
    train, vectors, log_prior_at, _ = _popularity_world("space", n_users=10)
    assert fit_prior_weight(train, vectors, log_prior_at, MEAN) is None
    assert fit_prior_weight(train, vectors, log_prior_at, MEAN, min_users=10) is not None
    assert fit_prior_weight(train, vectors, lambda cut: None, MEAN, min_users=10) is None  # nothing engaged by the cut


def _two_interests():
    """A query whose recent items are two orthogonal interests a, b (equal weight); candidates: x, close to a alone, and
    m, halfway between them."""
    a, b = np.array([1.0, 0, 0], np.float32), np.array([0, 1.0, 0], np.float32)
    x, m = np.array([0.9, 0, np.sqrt(0.19)], np.float32), (a + b) / np.sqrt(2)
    vectors = np.stack([a, b, x, m]).astype(np.float32)
    queries = Queries(np.array(["q", "empty"], object), np.array([0, 1]), Ragged(np.array([0, 2, 2]), np.array([0, 1])),
                      np.array([5 * DAY_US, 5 * DAY_US]), np.array([False, False]))
    return vectors, queries


def test_the_interest_kernel_is_a_soft_maximum_over_recent_items_by_hand():
    vectors, queries = _two_interests()
    out = interest_kernel(queries, vectors, half_life_days=2.0, deep_weight=2.0, temp=0.1)
    sims = vectors[:2] @ vectors.T  # (2, 4)
    np.testing.assert_allclose(out[0], 0.1 * np.log(0.5 * np.exp(sims[0] / 0.1) + 0.5 * np.exp(sims[1] / 0.1)), rtol=1e-5)
    assert not out[1].any()  # no context: zero
    # one mean of the two interests ranks m (halfway) first; the kernel ranks x (close to one interest) first
    mean = recent_items(queries, vectors, 2.0, 2.0)[0] @ vectors.T
    assert mean[3] > mean[2] and out[0, 2] > out[0, 3]
    # a high temperature tends to the weighted mean of the dot products
    np.testing.assert_allclose(interest_kernel(queries, vectors, 2.0, 2.0, temp=1e3)[0], sims.mean(0), atol=1e-3)


def test_the_interest_kernel_weighs_repeats_stage_and_age_and_drops_negligible_items():
    vectors = np.eye(3, dtype=np.float32)
    # item 0 clicked twice at the query's last event, item 1 bought 2 days before it, item 2 forty days before it
    queries = Queries(np.array(["q"], object), np.array([0]), Ragged(np.array([0, 4]), np.array([2, 1, 0, 0])),
                      np.array([10, 48, 50, 50]) * DAY_US, np.array([False, True, False, False]))
    w = np.array([2.0, 2.0 * 0.5, 2.0 ** -20])  # summed per item: 1 + 1, 2 x 2^-1, 2^-20
    out = interest_kernel(queries, vectors, half_life_days=2.0, deep_weight=2.0, temp=0.5)[0]
    kept = w[:2] / w[:2].sum()  # item 2 is below 1e-3 of the largest weight: left out
    np.testing.assert_allclose(out, 0.5 * np.log(kept @ np.exp(vectors[:2] / 0.5)), rtol=1e-5)
    kept_all = interest_kernel(queries, vectors, 2.0, 2.0, temp=0.5, min_share=0.0)[0]
    assert kept_all[2] > out[2]  # kept, item 2 raises its own score


def test_the_calibration_ranks_by_the_kernel_it_is_given():
    """Every user clicked both interests a and b before the cut and buys x (close to a) after it: the mean of a and b
    ranks m (halfway) first and misses, the kernel ranks x first."""
    vectors, _ = _two_interests()
    events = [e for u in range(30) for e in ((u, 0, 90.0, False), (u, 1, 91.0, False), (u, 2, 96.0, True))]
    train = _train(events, 4)
    flat = lambda cut: np.zeros(4)  # noqa: E731  (a prior that ranks nothing)
    mean = fit_prior_weight(train, vectors, flat, MEAN, k=1)
    kernel = fit_prior_weight(train, vectors, flat, HeadConfig(kernel_weight=1.0, kernel_temp=0.1), k=1)
    assert mean.users == kernel.users == 30 and mean.recall[1.0] == 0.0 and kernel.recall[1.0] == 1.0


def test_without_the_structural_readout_cold_users_are_scored_as_the_rows_are():
    """The head's prior weight is chosen for the warm users' full score; a cold user's score has the rows' form, so it takes
    the rows' weight: the served head and `hir_embeddings` agree on cold users, and warm users keep the head's weight."""
    from dataclasses import replace

    from hir_model.rank.head import head_scores
    from hir_model.rank.state import fit_head

    train = _train([(0, 0, 99, False), (1, 0, 98, False), (2, 1, 40, True), (3, 2, 41, True)], 3)
    vectors = np.eye(3, dtype=np.float32)
    state = fit_head(train, np.array(["a", "b", "c"], object), np.array(["product"] * 3, object), vectors,
                     lambda cut: np.array([4.0, 2.0, 1.0]), 0.1, None, HeadConfig(calibrate_days=None, track_min_users=None))
    state = replace(state, prior_weight=6.0, embeddings_prior_weight=0.5)
    queries = Queries(np.array(["new", "u0"], object), np.array([-1, 0]), Ragged(np.array([0, 1, 2]), np.array([2, 0])),
                      np.array([END, END]), np.array([False, False]))
    cold_vectors = np.array([[0.0, 0.6, 0.8], [0.0, 0.0, 0.0]], np.float32)
    rows, warm = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], np.float32), np.array([False, True])
    head = head_scores(queries, state.items(), state.config, rows, warm, cold_vectors)
    alone = state.config.embeddings_only()
    embeddings = head_scores(queries, state.items(alone, prior_weight=state.rows_prior_weight), alone, rows, warm, cold_vectors)
    np.testing.assert_allclose(head[0], embeddings[0], rtol=1e-6)
    np.testing.assert_allclose(head[0], cold_vectors[0] @ vectors.T + 0.5 * state.log_prior, rtol=1e-6)
    assert not np.allclose(head[1], embeddings[1])  # warm users: the head's own weight and parts


def test_items_first_seen_after_the_window_add_the_content_match_and_nothing_else_does(tmp_path):
    """The content term: content_weight x cosine(the user's stage-weighted content profile, the item's content), for the
    appended items only; the rows alone (embeddings_only) have none; the pairwise scores and a written state agree."""
    from hir_model.rank.head import head_scores, head_scores_at
    from hir_model.rank.state import fit_head, read_head, write_head

    train = _train([(0, 0, 99, False), (0, 1, 98, True), (1, 2, 97, False)], 3)
    vectors = np.eye(3, dtype=np.float32)
    content = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], np.float32)  # item 2: no content
    config = HeadConfig(calibrate_days=None, track_min_users=None, coengagement=False, content_weight=0.8)
    state = fit_head(train, np.array(["a", "b", "c"], object), np.array(["product"] * 3, object), vectors,
                     lambda cut: np.array([3.0, 2.0, 1.0]), 0.1, None, config, content=content)
    new_vectors = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    new_content = np.array([[3.0, 0.0], [1.0, 1.0]], np.float32)
    queries = Queries(np.array(["u0"], object), np.array([0]), Ragged(np.array([0, 2]), np.array([0, 1])),
                      np.array([99 * DAY_US, 98 * DAY_US]), np.array([False, True]))
    rows, warm = np.array([[0.6, 0.8, 0.0]], np.float32), np.array([True])
    with_term = head_scores(queries, state.items(None, new_vectors, new_content=new_content), config, rows, warm, None)
    without = head_scores(queries, state.items(None, new_vectors), config, rows, warm, None)
    profile = np.array([1.0, 2.0]) / np.sqrt(5.0)  # item 0 once, item 1 converted (deep_weight 2)
    np.testing.assert_allclose(with_term[0, :3], without[0, :3])  # known items: no term
    np.testing.assert_allclose(with_term[0, 3:] - without[0, 3:], 0.8 * profile @ np.array([[1.0, 0.0], [0.5 ** 0.5] * 2]).T,
                               rtol=1e-5)
    alone = config.embeddings_only()
    assert alone.content_weight == 0 and state.items(alone, new_vectors, new_content=new_content).content is None
    q, c = np.array([0, 0, 0]), np.array([1, 3, 4])
    at = head_scores_at(queries, state.items(None, new_vectors, new_content=new_content), config, rows, warm, None, q, c)
    np.testing.assert_allclose(at, with_term[0, c], rtol=1e-6)
    write_head(tmp_path, state)
    back = read_head(tmp_path)
    np.testing.assert_allclose(back.content, [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(head_scores(queries, back.items(None, new_vectors, new_content=new_content), config, rows,
                                           warm, None), with_term, rtol=1e-6)


def test_the_kernel_over_a_few_columns_is_the_kernel_of_the_loop():
    """An audience's few columns take the flat kernel (every query at once): the loop's values to float32 rounding."""
    from hir_model.protocol.metrics import Ragged
    from hir_model.rank.head import FLAT_COLUMNS, _flat_kernel, kernel_plan

    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(40, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = np.repeat(np.arange(6), [0, 1, 5, 9, 3, 12])  # a query without context, one with a single item
    items = rng.integers(0, 40, len(rows))
    queries = Queries(np.array([f"u{i}" for i in range(6)], object), np.arange(6), Ragged.from_pairs(rows, items, 6),
                      rng.integers(0, 10**12, len(rows)), rng.random(len(rows)) < 0.3)
    columns = np.array([3, 17, 5])
    assert len(columns) <= FLAT_COLUMNS
    loop = interest_kernel(queries, vectors, 2.0, 2.0, temp=0.1, min_share=0.05)[:, columns]
    flat = interest_kernel(queries, vectors, 2.0, 2.0, temp=0.1, min_share=0.05, columns=columns)
    np.testing.assert_allclose(flat, loop, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_flat_kernel(kernel_plan(queries, len(vectors), 2.0, 2.0, 0.05), vectors, vectors, 0.1), interest_kernel(
        queries, vectors, 2.0, 2.0, temp=0.1, min_share=0.05), rtol=1e-5, atol=1e-6)
    assert (flat[0] == 0).all()
