"""Popularity-weighted sampling for the synthetic source: one entity type's alive entities, overall or per interest."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def search(a: np.ndarray, v: np.ndarray, side: str = "right") -> np.ndarray:
    """a.searchsorted(v, side), the same values, with v searched in sorted order: numpy then starts each search where
    the last one ended, which at millions of entries is several times faster than random probes (cache misses)."""
    order = np.argsort(v, kind="stable")
    out = np.empty(len(v), np.intp)
    out[order] = a.searchsorted(v[order], side=side)
    return out


@dataclass(frozen=True)
class Picker:
    """Popularity-weighted sampling of one entity type's alive entities, overall or within an interest."""

    ids: np.ndarray  # (n,) global entity indices grouped by fine interest
    cdf: np.ndarray  # (n,) within interest f the values rise from f to f + 1
    seg: np.ndarray  # (n_fine + 1,) segment bounds of each interest in ids
    gcdf: np.ndarray  # (n,) cumulative popularity over ids

    @classmethod
    def build(cls, idx: np.ndarray, fine: np.ndarray, pop: np.ndarray, n_fine: int) -> Picker:
        ids = idx[np.argsort(fine[idx], kind="stable")]
        f, p = fine[ids], pop[ids]
        seg = np.concatenate([[0], np.cumsum(np.bincount(f, minlength=n_fine))])
        cs = np.cumsum(p)
        before = np.concatenate([[0.0], cs])[seg[:-1]]
        return cls(ids, f + (cs - before[f]) / np.bincount(f, weights=p, minlength=n_fine)[f], seg, cs)

    def pick(self, rng: np.random.Generator, fine: np.ndarray, targeted: np.ndarray) -> np.ndarray:
        u = rng.random(len(fine))
        lo, hi = self.seg[fine], self.seg[fine + 1]
        ok = targeted & (hi > lo)  # an interest without alive entities falls back to popularity
        pos = np.where(ok, search(self.cdf, fine + u), search(self.gcdf, u * self.gcdf[-1]))
        pos = np.where(ok, np.clip(pos, lo, hi - 1), np.minimum(pos, len(self.ids) - 1))
        return self.ids[pos]
