from __future__ import annotations

import math

import numpy as np
import pytest

from hir_model.protocol.metrics import Ragged, ranking_metrics, timed_ranking_metrics, top_k

L3, L5 = math.log2(3), math.log2(5)


def test_hand_computed_single_user():
    scores = np.array([[0.9, 0.1, 0.8, 0.3, 0.5]])  # ranking: 0, 2, 4, 3, 1
    m = ranking_metrics(scores, Ragged.from_lists([[2, 3]]), recall_ks=(1, 2, 4), ndcg_ks=(2, 4))
    assert m.recall == pytest.approx({1: 0.0, 2: 0.5, 4: 1.0})
    # DCG@2 = 1/log2(3); IDCG@2 = 1 + 1/log2(3); DCG@4 adds rank 4: 1/log2(5)
    assert m.ndcg[2] == pytest.approx((1 / L3) / (1 + 1 / L3))
    assert m.ndcg[4] == pytest.approx((1 / L3 + 1 / L5) / (1 + 1 / L3))
    assert (m.n_users, m.n_targets) == (1, 2)


def test_excluded_items_rank_last():
    scores = np.array([[0.9, 0.1, 0.8, 0.3, 0.5]])
    m = ranking_metrics(scores, Ragged.from_lists([[2, 3]]), Ragged.from_lists([[0]]), recall_ks=(1, 2), ndcg_ks=(2,))
    assert m.recall == pytest.approx({1: 0.5, 2: 0.5})  # ranking: 2, 4, 3, 1, then 0
    assert m.ndcg[2] == pytest.approx(1 / (1 + 1 / L3))
    assert top_k(scores, 5, np.array([[True, False, False, False, False]])).tolist() == [[2, 4, 3, 1, 0]]


def test_ties_follow_the_tie_order_not_the_ids():
    scores = np.zeros((1, 5))
    order = np.array([3, 1, 0, 2, 4])
    assert top_k(scores, 5, tie_order=order).tolist() == [order.tolist()]
    m = ranking_metrics(scores, Ragged.from_lists([[0]]), recall_ks=(2, 3), ndcg_ks=(3,), tie_order=order)
    assert m.recall == pytest.approx({2: 0.0, 3: 1.0}) and m.ndcg[3] == pytest.approx(0.5)


def test_users_without_targets_are_skipped_and_users_are_averaged():
    scores = np.array([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [5.0, 0.0, 0.0]])
    m = ranking_metrics(scores, Ragged.from_lists([[0], [0], []]), recall_ks=(1, 3), ndcg_ks=(1, 3))
    assert m.n_users == 2 and m.recall == pytest.approx({1: 0.5, 3: 1.0})
    assert m.ndcg[3] == pytest.approx((1 + 1 / 2) / 2)  # user 2 finds item 0 at rank 3: 1/log2(4)


def test_k_larger_than_the_candidates():
    m = ranking_metrics(np.array([[0.2, 0.1, 0.3]]), Ragged.from_lists([[1]]), recall_ks=(10,), ndcg_ks=(10,))
    assert m.recall[10] == 1.0 and m.ndcg[10] == pytest.approx(1 / 2)  # rank 3


def test_nan_scores_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        ranking_metrics(np.array([[np.nan, 1.0]]), Ragged.from_lists([[0]]))


def test_matches_a_per_user_loop_on_random_data():
    rng = np.random.default_rng(0)
    n_u, n_c = 37, 60
    scores = rng.integers(0, 8, (n_u, n_c)).astype(float)  # many ties
    order = rng.permutation(n_c)
    targets = [sorted(rng.choice(n_c, rng.integers(0, 6), replace=False).tolist()) for _ in range(n_u)]
    exclude = [sorted(rng.choice(n_c, 4, replace=False).tolist()) for _ in range(n_u)]
    m = ranking_metrics(scores, Ragged.from_lists(targets), Ragged.from_lists(exclude), (5, 10), (5, 10), order)
    rank_of = np.empty(n_c, int)
    rank_of[order] = np.arange(n_c)
    rec, nd = {5: [], 10: []}, {5: [], 10: []}
    for u in range(n_u):
        if not targets[u]:
            continue
        key = [(-(scores[u, c] if c not in exclude[u] else -np.inf), rank_of[c]) for c in range(n_c)]
        ranking = sorted(range(n_c), key=lambda c: key[c])
        for k in (5, 10):
            hits = [c in targets[u] for c in ranking[:k]]
            rec[k].append(sum(hits) / len(targets[u]))
            dcg = sum(h / math.log2(r + 2) for r, h in enumerate(hits))
            nd[k].append(dcg / sum(1 / math.log2(r + 2) for r in range(min(k, len(targets[u])))))
    assert m.recall == pytest.approx({k: np.mean(v) for k, v in rec.items()})
    assert m.ndcg == pytest.approx({k: np.mean(v) for k, v in nd.items()})


def test_ragged_helpers():
    r = Ragged.from_pairs(np.array([2, 0, 2, 1]), np.array([7, 3, 5, 4]), 4)
    assert [r.row(i).tolist() for i in range(4)] == [[3], [4], [7, 5], []]
    assert [r.take(np.array([2, 0])).row(i).tolist() for i in range(2)] == [[7, 5], [3]]
    w = r.within(4, 7)
    assert [w.row(i).tolist() for i in range(4)] == [[], [0], [1], []]
    assert r.to_mask(8)[2].nonzero()[0].tolist() == [5, 7]


def test_per_user_values_average_to_the_reported_means():
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(40, 30))
    targets = Ragged.from_lists([list(rng.choice(30, rng.integers(0, 4), replace=False)) for _ in range(40)])
    exclude = Ragged.from_lists([list(rng.choice(30, 2, replace=False)) for _ in range(40)])
    m = ranking_metrics(scores, targets, exclude, recall_ks=(5, 20), ndcg_ks=(10,))
    assert m.rows.tolist() == np.flatnonzero(targets.sizes > 0).tolist() and len(m.rows) == m.n_users < 40
    assert set(m.per_user) == {"recall@5", "recall@20", "ndcg@10"}
    for name, mean in m.as_dict().items():
        assert m.per_user[name].shape == (m.n_users,) and m.per_user[name].mean() == mean
    one = m.rows[0]  # each value is that user's own metric
    alone = ranking_metrics(scores[one:one + 1], targets.take([one]), exclude.take([one]), recall_ks=(5, 20), ndcg_ks=(10,))
    assert alone.recall[20] == pytest.approx(m.per_user["recall@20"][0])


def test_no_users_with_targets_gives_empty_per_user_values():
    m = ranking_metrics(np.zeros((2, 3)), Ragged.from_lists([[], []]), recall_ks=(1,), ndcg_ks=(1,))
    assert m.n_users == 0 and math.isnan(m.recall[1]) and m.per_user["recall@1"].shape == (0,)


@pytest.mark.parametrize("kind", ["distinct", "ties", "mostly_never", "constant"])
def test_top_k_fast_path_matches_the_dense_tie_order_ranking(kind):
    """_best sorts only a superset of each row's top k; _best_in_tie_order ranks every cell: the same columns."""
    from hir_model.protocol.metrics import _best, _best_in_tie_order

    rng = np.random.default_rng(7)
    n_rows, n_cols = 23, 5000  # wide enough that the bound comes from a strided subset of the columns
    s = {"distinct": lambda: rng.normal(size=(n_rows, n_cols)),
         "ties": lambda: rng.integers(0, 40, (n_rows, n_cols)).astype(float),
         "mostly_never": lambda: np.where(rng.random((n_rows, n_cols)) < 0.995, -np.inf, rng.normal(size=(n_rows, n_cols))),
         "constant": lambda: np.zeros((n_rows, n_cols))}[kind]().astype(np.float32)
    s[:, rng.choice(n_cols, 50, replace=False)] = -np.inf  # excluded columns
    order = rng.permutation(n_cols)
    for k in (1, 20, 50, 137):
        assert _best(s.copy(), k, order).tolist() == _best_in_tie_order(s.copy(), k, order).tolist()
        assert _best(s.copy(), k, None).tolist() == _best_in_tie_order(s.copy(), k, None).tolist()


def test_timed_metrics_with_one_answer_per_user_are_the_usual_metrics():
    """Every target judged on its user's one answer: the usual Recall and NDCG, ties, exclusions and all."""
    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=(40, 30)), 1)  # rounded: many ties, broken by the tie order
    targets = Ragged.from_lists([sorted(rng.choice(30, size=rng.integers(0, 6), replace=False).tolist()) for _ in range(40)])
    exclude = Ragged.from_lists([sorted(set(rng.choice(30, size=3).tolist()) - set(targets.row(u).tolist())) for u in range(40)])
    order = rng.permutation(30)
    usual = ranking_metrics(scores, targets, exclude, (1, 5, 10), (5, 10), order)
    timed = timed_ranking_metrics(scores, targets.row_of, targets, exclude, (1, 5, 10), (5, 10), order)
    assert (timed.n_users, timed.n_targets) == (usual.n_users, usual.n_targets) and timed.n_users > 30
    np.testing.assert_array_equal(timed.rows, usual.rows)
    for name in usual.per_user:
        np.testing.assert_allclose(timed.per_user[name], usual.per_user[name], err_msg=name)


def test_each_target_is_judged_in_the_answer_of_its_moment():
    """Two answers of one user: the first, before item 3 arrived, cannot hold it (-inf); the second can. Item 1 is
    judged on the first answer (rank 2 among the others), item 3 on the second (rank 1 there)."""
    early = np.array([[0.9, 0.5, 0.8, -np.inf]])  # item 3 not published yet
    late = np.array([[0.9, 0.5, 0.8, 1.0]])
    targets = Ragged.from_lists([[1, 3]])
    m = timed_ranking_metrics(np.vstack([early, late]), np.array([0, 1]), targets, recall_ks=(1, 2, 3), ndcg_ks=(3,))
    # places among the others (0, 2): item 3 first (nothing above it), item 1 third; merged: 3 at 1, 1 at 3 + 1 = 4
    assert m.recall == pytest.approx({1: 0.5, 2: 0.5, 3: 0.5})
    assert m.ndcg[3] == pytest.approx(1 / (1 + 1 / L3))
    # item 3 judged on the early answer instead: not in it, a miss however few items compete
    m = timed_ranking_metrics(np.vstack([early, late]), np.array([1, 0]), targets, recall_ks=(4,), ndcg_ks=(4,))
    assert m.recall[4] == pytest.approx(0.5)
