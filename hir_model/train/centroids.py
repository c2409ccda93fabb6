"""Spherical k-means seeded by prototypes: the trainer refines a warm start's prototypes with it
(hir_model.train.prototypes) and the hierarchy moves each level's primitives to their centroids with it
(hir_model.hierarchy.assign explains why)."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment


def primitive_centroids(vectors: np.ndarray, prototypes: np.ndarray, iters: int, reseed: bool = False,
                        seed: int = 0) -> np.ndarray:
    """float32 [K, W] unit rows: `iters` spherical k-means steps over `vectors` [N, W] seeded by `prototypes` [K, W]
    (each step: every vector to its nearest centre by cosine, every centre with members to their normalised mean).
    A centre without members stays where it is, or with `reseed` moves to an entity drawn with probability proportional
    to 1 - cosine to its own centre (k-means++), the draws matched to the empty centres by similarity (Hungarian), so
    the result does not depend on the prototypes' row order."""
    centres = _unit(np.asarray(prototypes, np.float32))  # (K, W)
    vectors = np.asarray(vectors, np.float32)  # (N, W)
    n, k = len(vectors), len(centres)
    rng = np.random.default_rng(seed)
    for _ in range(iters if n else 0):
        sim = vectors @ centres.T  # (N, K)
        nearest = np.argmax(sim, axis=1)  # (N,)
        members = sparse.csr_matrix((np.ones(n, np.float32), (nearest, np.arange(n))), shape=(k, n))  # (K, N) one-hot
        used = np.bincount(nearest, minlength=k) > 0  # (K,)
        moved = np.where(used[:, None], _unit(np.asarray(members @ vectors)), centres)  # (K, W)
        dead = np.flatnonzero(~used)
        if reseed and len(dead):
            moved[dead] = _reseeded(vectors, 1.0 - sim[np.arange(n), nearest], centres[dead], rng)
        if np.array_equal(moved, centres):
            break
        centres = moved
    return centres


def _reseeded(vectors: np.ndarray, misfit: np.ndarray, dead: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """New positions for the `dead` centres [D, W]: entities drawn by `misfit` [N] (k-means++), matched one to one."""
    p = np.clip(misfit, 0, None).astype(np.float64) + 1e-12
    draws = rng.choice(len(vectors), size=min(len(dead), len(vectors)), replace=False, p=p / p.sum())  # (m,)
    rows, cols = linear_sum_assignment(-(dead @ vectors[draws].T))  # dead centre rows[i] <- draw cols[i]
    out = dead.copy()
    out[rows] = vectors[draws[cols]]
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)
