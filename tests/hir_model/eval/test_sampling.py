"""Evaluation at scale: query blocks ranked one at a time equal the whole matrix; above `max_users` a seeded sample."""

from __future__ import annotations

import numpy as np

from hir_model.baselines.als import ALSConfig, ImplicitALS
from hir_model.baselines.content_knn import ContentKNN
from hir_model.baselines.popularity import Popularity
from hir_model.eval.scoring import EvalConfig, _tie_order, evaluate_split, sample_rows
from hir_model.protocol.metrics import Ragged, ranking_metrics
from hir_model.protocol.split import ITEM_GROUPS, TARGET_KINDS, SplitCounts, UserGroup, WindowSplit
from tests.hir_model.baselines.planted import planted

CONFIG = EvalConfig(recall_ks=(1, 5, 20), ndcg_ks=(5,))


def planted_split() -> WindowSplit:
    p = planted(users_per=30, items_per=10)
    n = len(p.queries)
    deep = p.targets.take(np.arange(n)[np.arange(n) % 3 == 0])  # a third of the users also convert on their target
    deep = Ragged.from_pairs(np.arange(n)[np.arange(n) % 3 == 0][deep.row_of], deep.idx, n)
    warm = UserGroup("warm", p.queries, deep, p.targets)
    cold = UserGroup("cold", p.queries.take(np.arange(0)), Ragged.from_lists([]), Ragged.from_lists([]))
    counts = SplitCounts(len(p.train.user), n, len(p.items), 0, n, n, 0, 0, 0)
    return WindowSplit("w", "w2", p.train, p.items, warm, cold, counts)


def methods():
    return [Popularity(), ContentKNN(), ImplicitALS(ALSConfig(factors=4, iterations=3))]


def full_matrix(split: WindowSplit, config: EvalConfig) -> dict:
    """The evaluation as it was: every query scored into one users x items matrix, each slice ranked from it."""
    out = {}
    for method in methods():
        method.fit(split.train, split.items.known())
        group = split.warm
        scores = method.score(group.queries, split.items)  # (Q, N)
        for items in ITEM_GROUPS:
            lo, hi = split.items.group(items)
            if hi == lo:
                continue
            ties = _tie_order(f"{split.window}:{items}", hi - lo, config.seed)
            for target in TARGET_KINDS:
                tg = group.targets(target).within(lo, hi)
                rows = np.flatnonzero(tg.sizes > 0)
                out[(method.name, items, target)] = ranking_metrics(
                    scores[rows, lo:hi], tg.take(rows), group.queries.context.within(lo, hi).take(rows),
                    config.recall_ks, config.ndcg_ks, ties)
    return out


def test_blocks_of_queries_equal_the_whole_matrix():
    split = planted_split()
    reference = full_matrix(split, CONFIG)
    results, _ = evaluate_split(split, methods(), EvalConfig(recall_ks=(1, 5, 20), ndcg_ks=(5,), score_batch=7))
    assert {(r.method, r.items, r.target) for r in results} == set(reference)
    for r in results:
        ref = reference[(r.method, r.items, r.target)]
        assert r.metrics.as_dict() == ref.as_dict()
        assert (r.metrics.n_users, r.metrics.n_targets, r.judged) == (ref.n_users, ref.n_targets, ref.n_users)
        for name, values in ref.per_user.items():
            np.testing.assert_array_equal(r.metrics.per_user[name], values)


def test_the_cap_samples_the_same_users_every_time_and_keeps_their_values():
    split = planted_split()
    full, _ = evaluate_split(split, methods(), CONFIG)
    capped = EvalConfig(recall_ks=(1, 5, 20), ndcg_ks=(5,), max_users=25, score_batch=8)
    first, _ = evaluate_split(split, methods(), capped)
    again, _ = evaluate_split(split, methods(), capped)
    by_slice = {(r.method, r.items, r.target): r for r in full}
    for a, b in zip(first, again):
        assert list(a.user_ids) == list(b.user_ids) and a.metrics.as_dict() == b.metrics.as_dict()
    for r in first:
        whole = by_slice[(r.method, r.items, r.target)]
        assert r.judged == whole.metrics.n_users and r.metrics.n_users == min(25, whole.metrics.n_users)
        # the sample is a subset in the original order, each user with the value the whole evaluation gave them
        pos = np.searchsorted(whole.user_ids, r.user_ids)
        assert np.array_equal(whole.user_ids[pos], r.user_ids) and np.all(np.diff(pos) > 0)
        for name, values in r.metrics.per_user.items():
            np.testing.assert_array_equal(values, whole.metrics.per_user[name][pos])
        assert r.metrics.recall[20] == float(np.mean(r.metrics.per_user["recall@20"]))
    # every method is judged on the same users; the engagement sample's converters are in the deep-funnel sample
    samples = {(r.items, r.target): list(r.user_ids) for r in first}
    assert all(list(r.user_ids) == samples[(r.items, r.target)] for r in first)
    deep, engaged = set(samples[("known", "deep_funnel")]), samples[("known", "engagement")]
    converters = {u for u in engaged if int(u[1:]) % 3 == 0}
    assert converters and converters <= deep
    assert [r.judged for r in first[:2]] == [40, 120]


def test_the_metrics_table_says_how_many_users_were_judged():
    from hir_model.eval.run import WindowEvaluation

    split = planted_split()
    results, timings = evaluate_split(split, [Popularity()], EvalConfig(max_users=25))
    table = WindowEvaluation("w", "w2", split.counts, "none", results, timings).to_table().to_pandas()
    assert set(zip(table.n_users, table.judged_users)) == {(25, 40), (25, 120)}
    results, timings = evaluate_split(split, [Popularity()], EvalConfig())
    table = WindowEvaluation("w", "w2", split.counts, "none", results, timings).to_table().to_pandas()
    assert (table.n_users == table.judged_users).all()


def test_sample_rows_is_the_lowest_priorities_in_order_and_nested():
    rows, priority = np.arange(10), np.array([9, 3, 7, 1, 8, 0, 6, 2, 5, 4], np.uint32)
    assert sample_rows(rows, priority, 20) is rows
    assert sample_rows(rows, priority, 3).tolist() == [3, 5, 7]
    assert set(sample_rows(rows[::2], priority, 3)) <= set(sample_rows(rows, priority, 8))


def test_the_lift_fits_on_a_fixed_sample_of_users_above_the_cap(tmp_path):
    from hir_model.eval.run import evaluate_window
    from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

    store = tiny_store(tmp_path)
    whole = evaluate_window(store, SPEC, KEYS[0], [Popularity()], EvalConfig(lift_method="popularity")).lift
    assert (whole.users, whole.judged_users) == (None, None)
    capped = [evaluate_window(store, SPEC, KEYS[0], [Popularity()], EvalConfig(lift_method="popularity", max_users=2)).lift
              for _ in range(2)]
    assert capped[0] == capped[1] and capped[0].users == 2 and capped[0].judged_users > 2
    assert capped[0].n_train + capped[0].n_test < whole.n_train + whole.n_test
