"""The learned ranker (hir_model.rank.ranker, features, examples) on hand-built head states: features computed by hand,
a planted world where one feature decides and the ranker must learn it, determinism, the published state round trip,
and the served path scoring as the evaluation does."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from hir_model.eval.hir import HeadMethod
from hir_model.protocol.method import US_PER_DAY
from hir_model.protocol.split import Interactions, warm_queries
from hir_model.rank.examples import EXAMPLES_SCHEMA, check_examples, ranker_problems, train_rankers, window_examples
from hir_model.rank.features import BASE_FEATURES, ITEM_STATS, USER_STATS, item_stats, pair_features, user_stats
from hir_model.rank.head import HeadConfig, head_scores
from hir_model.rank.ranker import RankerConfig, base_scores, fit_ranker, ranked_scores
from hir_model.rank.recommender import Recommender
from hir_model.rank.state import fit_head, read_head, write_head

END = 1_000 * US_PER_DAY  # end(t) of the hand-built windows
HEAD = HeadConfig(calibrate_days=None, track_min_users=None)  # no held-out fit, no track: a head of set weights


def interactions(user: list[int], item: list[int], days_before_end: list[float], deep: list[bool], n_users: int,
                 n_items: int) -> Interactions:
    """An Interactions sorted by (user, ts), as build_train makes them."""
    ts = (END - np.asarray(days_before_end) * US_PER_DAY).astype(np.int64)
    order = np.lexsort((ts, np.asarray(user)))
    return Interactions("w", END, np.array([f"u{i:03d}" for i in range(n_users)], object),
                        np.asarray(user, np.int64)[order], np.asarray(item, np.int64)[order], ts[order],
                        np.asarray(deep, bool)[order], n_items)


def test_item_and_user_counting_features_by_hand():
    # item 0: two events 1 and 3 days before the end, one deep; item 1: one event 10 days before; item 2: none
    h = interactions([0, 0, 1], [0, 1, 0], [1.0, 10.0, 3.0], [True, False, False], 2, 3)
    s = item_stats(h, None, None, deep_weight=2.0)
    col = {n: i for i, n in enumerate(ITEM_STATS)}
    np.testing.assert_allclose(s[:, col["item_events"]], np.log1p([2, 1, 0]), rtol=1e-6)
    np.testing.assert_allclose(s[:2, col["item_deep_share"]], [0.5, 0.0])
    np.testing.assert_allclose(s[:2, col["item_last_days"]], [1.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(s[:2, col["item_age_days"]], [3.0, 10.0], rtol=1e-6)
    # prior at 3 days: 2 (deep) x 2^(-1/3) + 1 x 2^(-3/3)
    np.testing.assert_allclose(s[0, col["prior_3d"]], np.log1p(2 * 2 ** (-1 / 3) + 0.5), rtol=1e-5)
    assert np.isnan(s[2, col["item_deep_share"]]) and np.isnan(s[2, col["item_last_days"]])  # never engaged: missing
    assert s[2, col["prior_3d"]] == 0 and np.isnan(s[:, col["prior_graph"]]).all()  # no graph prior given
    u = user_stats(warm_queries(h, np.array([0, 1])), END)
    np.testing.assert_allclose(u, [[np.log1p(2), 0.5, 1.0], [np.log1p(1), 0.0, 3.0]], rtol=1e-6)
    assert len(USER_STATS) == u.shape[1]


def test_base_first_stage_is_the_prior_plus_weighted_coengagement():
    rng = np.random.default_rng(0)
    h = interactions(list(np.repeat(np.arange(6), 4)), list(rng.integers(0, 5, 24)), list(rng.uniform(0, 5, 24)),
                     [False] * 24, 6, 5)
    state = fit_head(h, np.array([f"i{j}" for j in range(5)], object), np.array(["product"] * 5, object),
                     _unit(rng.normal(size=(5, 4))), None, 0.0, None, HEAD)
    q = warm_queries(h, np.arange(6))
    feats = state.feature_items()
    got = base_scores(q, state.items(), feats, 3.0, HEAD, np.ones(6, bool))
    co = pair_features(("coengagement",), q, state.items(), feats, HEAD, np.zeros((6, 4)), np.ones(6, bool), None,
                       np.repeat(np.arange(6), 5), np.tile(np.arange(5), 6)).reshape(6, 5)
    np.testing.assert_allclose(got, 3.0 * co, rtol=1e-5, atol=1e-7)  # no prior (temp 0): co-engagement alone
    assert (co > 0).any()


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def planted_world(seed: int, n_users: int = 240, n_items: int = 60):
    """A window whose next window engages, deep, with items of a planted set the vectors know nothing about; only
    the history's deep-funnel share marks them (converted 90% of the time against 5%). Returns the head state, the
    users' rows and a draw of the next window's engagements (user_id, item, deep)."""
    rng = np.random.default_rng(seed)
    good = np.arange(0, n_items, 4)  # the planted items
    user, item, days, deep = [], [], [], []
    for u in range(n_users):
        seen = rng.choice(n_items, 8, replace=False)
        user += [u] * 8
        item += list(seen)
        days += list(rng.uniform(0, 20, 8))
        deep += [bool(rng.random() < (0.9 if i in good else 0.05)) for i in seen]
    h = interactions(user, item, days, deep, n_users, n_items)
    state = fit_head(h, np.array([f"i{j:03d}" for j in range(n_items)], object), np.array(["product"] * n_items, object),
                     _unit(rng.normal(size=(n_items, 8))), None, 0.0, None, HEAD)
    rows = _unit(rng.normal(size=(n_users, 8)))
    return state, rows, lambda draw: _later(h, good, n_items, np.random.default_rng([seed, draw]))


def _later(h: Interactions, good: np.ndarray, n_items: int, rng) -> pd.DataFrame:
    out = []
    for u in range(h.n_users):
        seen = set(h.item[h.user == u].tolist())
        fresh_good = [i for i in good if i not in seen]
        fresh_other = [i for i in range(n_items) if i not in seen and i not in good]
        out += [(h.user_ids[u], int(i), True) for i in rng.choice(fresh_good, 2, replace=False)]
        out += [(h.user_ids[u], int(i), False) for i in rng.choice(fresh_other, 2, replace=False)]
    return pd.DataFrame(out, columns=["user_id", "item", "deep"])


CONFIG = RankerConfig(depth=60, min_queries=20, rounds=40, min_data_in_leaf=20)


@lru_cache(maxsize=None)  # the state is immutable: one fit for the tests that only read it
def trained(seed: int = 0):
    state, rows, later = planted_world(seed)
    examples = window_examples(state, rows, np.ones(len(rows), bool), later(0), CONFIG)
    rankers, note = train_rankers([examples], CONFIG)
    return replace(state, rankers=tuple(rankers.values()), ranker_config=CONFIG, ranker_note=note,
                   examples=examples), rows, later


def deep_recall(rec: Recommender, later: pd.DataFrame, k: int = 10) -> float:
    users = sorted(later.user_id.unique())
    tops = rec.top(rec.user_batch(users), k, exact=True)
    targets = later[later.deep].groupby("user_id").item.apply(set)
    return float(np.mean([len(set(rows.tolist()) & targets[u]) / len(targets[u]) for u, (rows, _) in zip(users, tops)]))


def test_the_ranker_learns_a_planted_feature_the_head_cannot_see():
    state, rows, later = trained()
    examples = state.examples
    check_examples(examples, "planted")
    assert examples.schema.equals(EXAMPLES_SCHEMA)
    labels = examples["label"].to_numpy()
    assert set(np.unique(labels)) == {0, 1, 2}
    hir, base = state.ranker("hir"), state.ranker("base")
    assert hir is not None and base is not None
    assert max(hir.importance, key=hir.importance.get) == "item_deep_share"  # the planted signal is the one it uses
    assert "head" not in base.features and set(base.features) == set(BASE_FEATURES)
    has = np.ones(len(rows), bool)
    test = later(1)  # another draw of the next window: not what it was trained on
    learned = deep_recall(Recommender(state, rows, has), test)
    head_only = deep_recall(Recommender(replace(state, rankers=()), rows, has), test)
    assert learned > head_only + 0.3, (learned, head_only)  # the head's score alone is blind to the planted set
    assert learned > 0.7  # the ceiling: 10 of the ~13 planted items a user has not seen fit a top 10


def test_two_fits_give_the_same_model_and_scores():
    a, rows, later = trained()
    b, _, _ = trained.__wrapped__()  # a second fit, not the cached one
    assert a.ranker("hir").model == b.ranker("hir").model
    batch = Recommender(a, rows, np.ones(len(rows), bool)).user_batch(list(a.history.user_ids[:20]))
    sa = Recommender(a, rows, np.ones(len(rows), bool)).scores(batch)
    sb = Recommender(b, rows, np.ones(len(rows), bool)).scores(batch)
    np.testing.assert_array_equal(sa, sb)


def test_fit_refuses_infinite_features_and_misaligned_groups():
    x = np.zeros((4, len(BASE_FEATURES)), np.float32)
    with pytest.raises(ValueError, match="groups"):
        fit_ranker("base", x, np.zeros(4), np.array([3]), CONFIG)
    x[1, 2] = np.inf
    with pytest.raises(ValueError, match=BASE_FEATURES[2]):
        fit_ranker("base", x, np.array([0, 1, 0, 2]), np.array([4]), CONFIG)


def test_too_few_queries_fall_back_to_the_head_and_say_so():
    state, rows, later = planted_world(0, n_users=30)
    examples = window_examples(state, rows, np.ones(len(rows), bool), later(0), RankerConfig(min_queries=50))
    rankers, note = train_rankers([examples], RankerConfig(min_queries=50))
    assert rankers == {"hir": None, "base": None} and "30 training queries < 50" in note
    assert "no earlier window" in train_rankers([None], RankerConfig())[1]
    rec = Recommender(state, rows, np.ones(len(rows), bool))
    batch = rec.user_batch(list(state.history.user_ids[:5]))
    np.testing.assert_array_equal(rec.scores(batch), head_scores(batch.queries, rec.items, HEAD, batch.rows, batch.warm, None))


def test_the_published_state_round_trips_with_its_rankers(tmp_path):
    state, rows, _ = trained()
    write_head(tmp_path, state)
    back = read_head(tmp_path)
    assert [r.summary() for r in back.rankers] == [r.summary() for r in state.rankers]
    assert back.examples.to_pandas().equals(state.examples.to_pandas()) and back.ranker_note == state.ranker_note
    assert back.ranker_config == state.ranker_config
    has = np.ones(len(rows), bool)
    users = list(state.history.user_ids[:30])
    a, b = Recommender(state, rows, has), Recommender(back, rows, has)
    np.testing.assert_array_equal(a.scores(a.user_batch(users)), b.scores(b.user_batch(users)))
    (tmp_path / "ranker_hir.txt").unlink()
    with pytest.raises(FileNotFoundError, match="ranker_hir.txt"):
        read_head(tmp_path)


def test_served_candidates_score_as_the_exact_head_and_the_evaluation_do():
    state, rows, _ = trained()
    has = np.ones(len(rows), bool)
    rec = Recommender(state, rows, has)
    users = list(state.history.user_ids[:25])
    batch = rec.user_batch(users)
    exact = rec.top(batch, 20, exact=True)
    every = [np.setdiff1d(np.arange(state.n_items), batch.queries.context.row(q)) for q in range(len(users))]
    served = rec.top(batch, 20, candidates=every)
    for (er, es), (sr, ss) in zip(exact, served):
        np.testing.assert_array_equal(er, sr)
        np.testing.assert_array_equal(es, ss)
    for name, variant in (("hir_exact", "hir"), ("ranker_base", "base")):
        method = HeadMethod(rec, None, name)
        matrix = method.score(batch.queries, rec.item_space())
        direct = ranked_scores(variant, state.ranker(variant), batch.queries, rec.items, rec.feats, state.base_co_weight,
                               HEAD, batch.rows, batch.warm, None)
        np.testing.assert_array_equal(matrix, direct)
    matrix = HeadMethod(rec, None, "hir_exact").score(batch.queries, rec.item_space())
    for q, (rows_q, scores_q) in enumerate(exact):  # what is served is what the evaluation ranks
        np.testing.assert_array_equal(matrix[q, rows_q], scores_q)
        assert np.isfinite(matrix[q]).sum() <= 2 * CONFIG.depth  # the depth best of the head and of the base stage
        assert not np.isfinite(matrix[q, batch.queries.context.row(q)]).any()  # engaged items are never re-scored


def test_the_ranker_check_passes_a_sound_head_and_names_what_is_wrong():
    state, _, _ = trained()
    assert ranker_problems(state.rankers, state.examples) == []
    hir = state.ranker("hir")
    unrecorded = replace(hir, importance={})
    assert "importance is not recorded" in " ".join(ranker_problems((unrecorded,), None))
    swapped = replace(state.ranker("base"), features=hir.features)
    assert "not its variant's features" in " ".join(ranker_problems((swapped,), None))
    table = state.examples
    bad = table.set_column(table.schema.get_field_index("kernel"), "kernel",
                           pa.array(np.r_[np.inf, table["kernel"].to_numpy(zero_copy_only=False)[1:]], pa.float32()))
    assert "feature kernel is infinite in rows [0]" in " ".join(ranker_problems(state.rankers, bad))


def test_cold_queries_keep_the_heads_score_and_warm_ones_are_unchanged_beside_them():
    state, rows, _ = trained()
    q = warm_queries(state.history, np.arange(12))
    feats, items, ranker = state.feature_items(), state.items(), state.ranker("hir")
    warm = np.arange(12) % 3 != 0  # every third query served as a cold user (its row as the encoder's vector)
    mixed = ranked_scores("hir", ranker, q, items, feats, state.base_co_weight, HEAD, rows[:12], warm, rows[:12])
    first = head_scores(q, items, HEAD, rows[:12], warm, rows[:12])
    np.testing.assert_array_equal(mixed[~warm], first[~warm])
    alone = ranked_scores("hir", ranker, q.take(np.flatnonzero(warm)), items, feats, state.base_co_weight, HEAD,
                          rows[:12][warm], np.ones(warm.sum(), bool), None)
    np.testing.assert_array_equal(mixed[warm], alone)
    assert np.isinf(mixed[warm]).any() and not np.isinf(mixed[~warm]).any()  # re-scored best ones only where warm
    none = ranked_scores("hir", ranker, q, items, feats, state.base_co_weight, HEAD, rows[:12], np.ones(12, bool), None,
                         np.zeros(0, np.int64), 20)
    assert none.shape == (12, 0)  # no columns (no arrival published yet): an empty answer, not an error


def test_examples_are_the_unseen_candidates_graded_by_the_next_window():
    # u0 engaged items 0, 1; u1 item 0. Next window: u0 converts on 2 and clicks 3 (and 0 again: not a target);
    # u1 clicks 1. u2 is unknown to the head (no example).
    h = interactions([0, 0, 1], [0, 1, 0], [2.0, 1.0, 1.0], [False, False, False], 2, 5)
    state = fit_head(h, np.array([f"i{j}" for j in range(5)], object), np.array(["product"] * 5, object),
                     _unit(np.random.default_rng(1).normal(size=(5, 4))), None, 0.0, None, HEAD)
    later = pd.DataFrame({"user_id": ["u000", "u000", "u000", "u001", "u002"], "item": [2, 3, 0, 1, 4],
                          "deep": [True, False, True, False, True]})
    ex = window_examples(state, _unit(np.ones((2, 4))), np.ones(2, bool), later, RankerConfig(depth=10)).to_pandas()
    got = {(u, int(i)): int(g) for u, i, g in zip(ex.user_id, ex["item"], ex.label)}
    assert got == {("u000", 2): 2, ("u000", 3): 1, ("u000", 4): 0,  # item 0 and 1 already engaged: never candidates
                   ("u001", 1): 1, ("u001", 2): 0, ("u001", 3): 0, ("u001", 4): 0}
    assert ex.in_hir.all() and ex.in_base.all()  # depth 10 > the 5 items: every unseen item from both stages
    assert (ex.window == "w").all()


def test_served_queries_ranked_together_answer_as_each_alone():
    state, rows, _ = trained()
    rec = Recommender(state, rows, np.ones(len(rows), bool))
    batch = rec.user_batch(list(state.history.user_ids[:15]))
    rng = np.random.default_rng(3)
    cands = [np.sort(rng.choice(np.setdiff1d(np.arange(state.n_items), batch.queries.context.row(q)), 30, replace=False))
             for q in range(15)]  # each user's own candidates, as the index would give them
    together = rec.top(batch, 10, candidates=cands)
    for q in range(15):
        rows_q, scores_q = rec.top(batch.one(q), 10, candidates=[cands[q]])[0]
        np.testing.assert_array_equal(together[q][0], rows_q)
        np.testing.assert_allclose(together[q][1], scores_q, rtol=1e-6)
        assert set(rows_q) <= set(cands[q])


class _PlacedItems:
    """The new items' placement the evaluation asks the encoder for, fixed here: the head's vectors, then given ones."""

    def __init__(self, vectors: np.ndarray, new: np.ndarray):
        self.vectors, self.new = vectors, new

    def item_vectors(self, items) -> np.ndarray:
        return np.vstack([self.vectors, self.new]).astype(np.float32)


def test_the_exact_row_ranks_new_items_among_themselves_as_the_served_scope_does():
    """hir_exact over known + new items: the ranker's top-depth pick is made in each group, so a new item is not left
    unscored because the known items' first-stage scores are higher."""
    from hir_model.protocol.split import ItemSpace

    state, rows, _ = trained()
    rec = Recommender(state, rows, np.ones(len(rows), bool))
    rng = np.random.default_rng(3)
    new = rng.normal(size=(150, state.vectors.shape[1]))
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    n, m = state.n_items, len(new)
    ids = np.concatenate([state.item_ids, np.array([f"zz{j:03d}" for j in range(m)], object)])
    items = ItemSpace(ids, n, np.full(n + m, -1, np.int64), np.zeros(0, object))
    method = HeadMethod(rec, _PlacedItems(state.vectors, new), "hir_exact")
    users = list(state.history.user_ids[:10])
    queries = rec.user_batch(users).queries
    scores = method.score(queries, items)
    side, feats = method.item_side(items), method._items[2]
    q_rows = rec.user_batch(users).rows
    alone = ranked_scores("hir", state.ranker("hir"), queries, side, feats, state.base_co_weight, method.config, q_rows,
                          np.ones(10, bool), None, np.arange(n, n + m))
    np.testing.assert_array_equal(scores[:, n:], alone)  # the new group ranked as scope "new" ranks it
    assert (np.isfinite(scores[:, n:]).sum(axis=1) >= CONFIG.depth).all()  # at least depth new items scored per user
