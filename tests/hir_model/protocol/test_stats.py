"""The paired bootstrap: it covers a known difference, separates a clear one from 0, and is fast."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hir_model.protocol.stats import bootstrap_mean, paired_bootstrap, pooled_bootstrap, verdict


def _draws(rng, n, gap, noise=0.3):
    """Per-user values of two methods: a shared user effect (what makes pairing pay) plus each method's noise."""
    user = rng.normal(0.3, 0.2, n)
    return user + gap + rng.normal(0, noise, n), user + rng.normal(0, noise, n)


def test_the_interval_covers_the_true_difference_about_as_often_as_its_level():
    rng = np.random.default_rng(0)
    covered = 0
    for seed in range(200):
        a, b = _draws(rng, 60, 0.05)
        ci = paired_bootstrap(a, b, n_boot=500, seed=seed)
        covered += ci.low <= 0.05 <= ci.high
    assert 0.88 <= covered / 200 <= 0.99  # 95% nominal; the percentile bootstrap runs a little narrow at n = 60


def test_a_clear_difference_excludes_zero_and_identical_methods_tie():
    rng = np.random.default_rng(1)
    a, b = _draws(rng, 400, 0.1)
    ci = paired_bootstrap(a, b)
    assert ci.diff == pytest.approx(np.mean(a - b)) and 0 < ci.low < ci.diff < ci.high and ci.n_users == 400
    assert verdict(ci.low, ci.high) == "lead" and verdict(*paired_bootstrap(b, a)[1:3]) == "behind"
    same = paired_bootstrap(a, a)
    assert (same.diff, same.low, same.high) == (0.0, 0.0, 0.0) and verdict(same.low, same.high) == "tie"
    noisy = paired_bootstrap(*_draws(rng, 400, 0.0))
    assert noisy.low < 0 < noisy.high and verdict(noisy.low, noisy.high) == "tie"


def test_pairing_is_what_makes_a_small_lead_visible():
    rng = np.random.default_rng(2)
    user = rng.normal(0.3, 0.3, 300)  # users differ a lot, the methods by a little, consistently
    a, b = user + 0.02 + rng.normal(0, 0.01, 300), user + rng.normal(0, 0.01, 300)
    assert paired_bootstrap(a, b).low > 0
    shuffled = paired_bootstrap(a, rng.permutation(b))  # same values, pairing broken: the user effect swamps the lead
    assert shuffled.low < 0 < shuffled.high


def test_pooled_averages_window_means_and_resamples_within_windows():
    rng = np.random.default_rng(3)
    windows = [_draws(rng, n, gap) for n, gap in ((200, 0.2), (400, 0.0), (150, 0.15))]
    ci = pooled_bootstrap(windows + [(np.zeros(0), np.zeros(0))])
    assert ci.n_users == (200, 400, 150)  # the empty window is left out
    assert ci.diff == pytest.approx(np.mean([np.mean(a - b) for a, b in windows]))  # each window counts once
    assert ci.low < ci.diff < ci.high and ci.low > 0
    one = pooled_bootstrap(windows[:1], seed=5)
    assert one == (paired_bootstrap(*windows[0], seed=5)[:3] + ((200,),))  # one window: the paired interval
    assert np.isnan(pooled_bootstrap([]).diff) and verdict(*pooled_bootstrap([])[1:3]) == "n/a"


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same users"):
        paired_bootstrap(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap(np.array([0.1, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap(np.zeros(3), np.ones(3), level=95)


def test_thousands_of_users_and_2000_resamples_take_well_under_a_second():
    rng = np.random.default_rng(4)
    a, b = _draws(rng, 5000, 0.01)
    t0 = time.process_time()  # CPU time: a wall clock fails on a machine busy with other jobs
    paired_bootstrap(a, b, n_boot=2000)
    assert time.process_time() - t0 < 1.0


def test_one_methods_band_is_wider_than_the_paired_difference():
    rng = np.random.default_rng(5)
    a, b = _draws(rng, 200, 0.05, noise=0.05)
    band = bootstrap_mean(a)
    assert band.diff == pytest.approx(a.mean()) and band.low < a.mean() < band.high and band.n_users == 200
    paired = paired_bootstrap(a, b)
    assert paired.high - paired.low < 0.5 * (band.high - band.low)  # the user effect cancels in the pair
