from __future__ import annotations

import numpy as np

from hir_model.eval.lift import PairFeatures, conversion_lift, held_out


def _pairs(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 3))
    signal = rng.normal(size=n)  # what the extra block knows
    logit = -1.5 + 0.8 * base[:, 0] + 2.0 * signal
    y = rng.random(n) < 1 / (1 + np.exp(-logit))
    users = np.array([f"u{i % 1500}" for i in range(n)], object)
    pairs = PairFeatures(users, np.array([f"p{i}" for i in range(n)], object), np.zeros(n, np.int64), np.arange(n), base,
                         ("b0", "b1", "b2"), y)
    return pairs, signal, rng


def test_an_informative_extra_feature_lifts_auc_and_log_loss():
    pairs, signal, _ = _pairs()
    r = conversion_lift(pairs, signal[:, None], ("signal",))
    assert r.auc_lift > 0.1 and r.log_loss_lift > 0.1
    assert r.base.auc > 0.55  # the base block carries some signal of its own
    assert r.n_train + r.n_test == len(pairs.y) and r.extra_names == ("signal",)


def test_a_noise_feature_does_not():
    pairs, _, rng = _pairs()
    r = conversion_lift(pairs, rng.normal(size=(len(pairs.y), 2)), ("noise_a", "noise_b"))
    assert abs(r.auc_lift) < 0.01 and abs(r.log_loss_lift) < 0.01


def test_base_only_and_degenerate_labels():
    pairs, _, _ = _pairs(n=500)
    r = conversion_lift(pairs)
    assert r.extended is None and np.isnan(r.auc_lift) and 0.5 < r.base.auc < 1
    flat = PairFeatures(pairs.user_ids, pairs.item_ids, pairs.user_index, pairs.item_index, pairs.X, pairs.names,
                        np.zeros(len(pairs.y), bool))
    r = conversion_lift(flat, pairs.X[:, :1], ("x",))
    assert np.isnan(r.base.auc) and "one class" in r.note


def test_users_are_held_out_whole_and_stably():
    users = np.array([f"u{i % 50}" for i in range(1000)], object)
    test = held_out(users, 0.3)
    assert np.array_equal(test, held_out(users, 0.3))
    for u in np.unique(users):
        assert len(set(test[users == u])) == 1
    assert 0.15 < test.mean() < 0.45
