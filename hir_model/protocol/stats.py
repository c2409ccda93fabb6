"""Paired bootstrap confidence intervals over users: is method A's lead over method B more than noise?

Both methods rank the same users of a window (the evaluation's split is shared), so the comparison is paired: each
user's difference a_u - b_u is one draw, and resampling users with replacement gives the spread of the mean difference
(the percentile bootstrap). Pairing removes the between-user variance that dominates a ranking metric (some users
are easy for every method), so a paired interval is far tighter than two unpaired ones.

Over several windows (`pooled_bootstrap`) the statistic is the report's: the mean over windows of each window's mean
(`hir_model.eval.report` averages "over the last 4 windows" that way, every window counting once). Users are
resampled within their own window (stratified: each window keeps its user count), and every resample averages the
windows' resampled means. A window without users is left out, as the report leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

CHUNK = 2_000_000  # resampled user indices drawn at once (bounds memory: 16 MB of int64)


class PairedCI(NamedTuple):
    diff: float  # mean of a - b over the users
    low: float  # the interval's bounds (percentile bootstrap)
    high: float
    n_users: int


class PooledCI(NamedTuple):
    diff: float  # mean over windows of each window's mean a - b
    low: float
    high: float
    n_users: tuple[int, ...]  # users per window (windows without users left out)


def _check(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need two 1-d arrays of one length (the same users), got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired values must be finite (a user without a value is not an evaluated user)")
    return a - b


def boot_means(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot,) means of `d` over users resampled with replacement (len(d) each)."""
    n = len(d)
    out = np.empty(n_boot)
    step = max(1, CHUNK // max(n, 1))
    for lo in range(0, n_boot, step):
        hi = min(n_boot, lo + step)
        out[lo:hi] = d[rng.integers(0, n, (hi - lo, n))].mean(1)
    return out


def _bounds(draws: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_bootstrap(a, b, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> PairedCI:
    """Mean of a - b over users and its `level` percentile-bootstrap interval; a[i], b[i] are one user's values of
    the two methods. No users: nan everywhere."""
    d = _check(a, b)
    if len(d) == 0:
        return PairedCI(float("nan"), float("nan"), float("nan"), 0)
    draws = boot_means(d, n_boot, np.random.default_rng(seed))
    return PairedCI(float(d.mean()), *_bounds(draws, level), len(d))


def pooled_bootstrap(pairs: Sequence[tuple[np.ndarray, np.ndarray]], n_boot: int = 2000, seed: int = 0,
                     level: float = 0.95) -> PooledCI:
    """Mean over windows of each window's mean a - b, and its interval with users resampled within each window
    (module docstring). pairs: per window, (a, b) of its users. No window with users: nan."""
    ds = [d for d in (_check(a, b) for a, b in pairs) if len(d)]
    if not ds:
        return PooledCI(float("nan"), float("nan"), float("nan"), ())
    rng = np.random.default_rng(seed)
    draws = np.mean([boot_means(d, n_boot, rng) for d in ds], axis=0)  # (n_boot,) mean over windows of each resample
    return PooledCI(float(np.mean([d.mean() for d in ds])), *_bounds(draws, level), tuple(len(d) for d in ds))


def bootstrap_mean(a, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> PairedCI:
    """One method's mean over users and its percentile-bootstrap interval (a band around a plotted value; comparing
    two methods needs `paired_bootstrap`, not two of these)."""
    a = np.asarray(a, np.float64)
    return paired_bootstrap(a, np.zeros_like(a), n_boot, seed, level)


def verdict(low: float, high: float) -> str:
    """"lead" when the interval lies above 0, "behind" below it, "tie" when it holds 0, "n/a" without an interval."""
    if np.isnan(low) or np.isnan(high):
        return "n/a"
    return "lead" if low > 0 else "behind" if high < 0 else "tie"
