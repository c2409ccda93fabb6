"""Soft top-k assignments of entities to the interest primitives of each level (the primitives moved to their centroids
first: hir_model.train.centroids).

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
