"""Soft top-k assignments of entities to the interest primitives of each level, and the primitives' centroids.

A level's trained prototypes need not lie among the embeddings: they only have to rank the level's primitives for each
entity (on a trained synthetic window the mean cosine of an item to its nearest fine prototype was 0.25, while two
items average 0.68), and a collapsed model leaves most of them unused (a MovieLens window: 14 of 128 fine prototypes
nearest to any entity, one of them to 58% of all). Assigning to them gives lopsided primitives whose members are spread
far apart, which is what BoM retrieval pays for. So each primitive is first moved to its centroid: a few steps of
spherical k-means over the window's embeddings, seeded by the prototypes (step 1 gives each primitive the mean of the
entities nearest its prototype), a primitive nobody is nearest to being re-seeded among the worst-fitted entities
(k-means++), as the trainer re-seeds dead prototypes. A primitive keeps its identity: stable ids still come from
matching the prototypes, and the hierarchy reports how many prototypes the model itself uses, so collapse stays visible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class AssignConfig:
    temperature: float = 0.1  # softmax temperature over cosine similarity to the primitives (their sharpness)
    top_k: int = 3  # primitives kept per entity per level; their weights are renormalised to sum to 1
    batch_rows: int = 65_536  # entities per matrix product (bounds memory at N x K_l floats per chunk)

    def __post_init__(self) -> None:
        if self.temperature <= 0 or self.top_k < 1:
            raise ValueError("temperature > 0 and top_k >= 1 are required")


@dataclass(frozen=True)
class LevelAssignment:
    """One level's soft assignments. k = min(top_k, K) columns, sorted by weight, descending."""

    primitive: np.ndarray  # int64 [N, k], prototype row (not yet the stable id)
    weight: np.ndarray  # float32 [N, k], > 0, each row sums to 1
    num_primitives: int  # K

    @property
    def top(self) -> np.ndarray:
        return self.primitive[:, 0]  # int64 [N]: the hard assignment

    def sizes(self) -> np.ndarray:
        """int64 [K]: entities whose top primitive it is."""
        return np.bincount(self.top, minlength=self.num_primitives)

    def mass(self) -> np.ndarray:
        """float64 [K]: summed soft weight."""
        return np.bincount(self.primitive.reshape(-1), self.weight.reshape(-1).astype(np.float64), minlength=self.num_primitives)


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


def soft_assign(vectors: np.ndarray, prototypes: np.ndarray, config: AssignConfig = AssignConfig()) -> LevelAssignment:
    """softmax(vectors @ prototypes.T / temperature), top-k kept and renormalised (ties broken by the lower row)."""
    vectors = np.asarray(vectors, np.float32)  # (N, W)
    prototypes = np.asarray(prototypes, np.float32)  # (K, W)
    n, kk = len(vectors), len(prototypes)
    k = min(config.top_k, kk)
    primitive, weight = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    for lo in range(0, n, config.batch_rows):
        logits = vectors[lo:lo + config.batch_rows] @ prototypes.T / config.temperature  # (b, K)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        order = np.argsort(-p, axis=1, kind="stable")[:, :k]  # (b, k)
        w = np.take_along_axis(p, order, axis=1)
        primitive[lo:lo + len(p)] = order
        weight[lo:lo + len(p)] = w / w.sum(axis=1, keepdims=True)
    return LevelAssignment(primitive, weight, kk)
