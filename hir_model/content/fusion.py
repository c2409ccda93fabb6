"""Fuse an entity's text and image vectors into one content vector; a missing modality is masked, not zeroed.

Each modality is mapped into the common space by a fixed orthogonal projection (seeded, not learned):
the columns of one random orthogonal (D, D) matrix are split between the modalities, so with the default
D = text_dim + image_dim their subspaces are disjoint and, for two entities that have both modalities,

    cos(fused_a, fused_b) = (wt^2 cos_text + wi^2 cos_image) / (wt^2 + wi^2)

exactly: no cross-modal noise, and the weights mean what they say. An entity with one modality gets that
modality's projected vector (unit norm: the weighted sum is renormalised over the modalities present),
so it stays comparable with everyone else at the same scale. An entity with none gets no vector.

Why fixed rather than learned: MovieLens has no images, so nothing could be learned there; the projection
stays the same across windows whatever the image tower does, so text-only entities keep their fused
vectors when catalog_clip is retrained; and the cosine above is exact. The cross-modal alignment that
learning would add is already in catalog_clip's image space, which is trained against the catalog's text.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class FusionConfig:
    dim: int = 0  # fused width; 0 = text_dim + image_dim (disjoint subspaces); smaller overlaps them (adds noise)
    text_weight: float = 1.0  # wt above
    image_weight: float = 1.0  # wi above
    seed: int = 0  # seeds the fixed orthogonal projections

    def __post_init__(self) -> None:
        if self.text_weight <= 0 or self.image_weight <= 0 or self.dim < 0:
            raise ValueError(f"FusionConfig needs positive weights and dim >= 0, got {self}")

    def version(self, text_dim: int, image_dim: int) -> str:
        key = f"{asdict(self)}|{text_dim}|{image_dim}".encode()
        return f"orth{self.width(text_dim, image_dim)}@{hashlib.sha256(key).hexdigest()[:12]}"

    def width(self, text_dim: int, image_dim: int) -> int:
        return self.dim or text_dim + image_dim


def projections(text_dim: int, image_dim: int, config: FusionConfig) -> tuple[np.ndarray, np.ndarray]:
    """(text_dim, D) and (image_dim, D) projections with orthonormal rows; row spaces disjoint when D >= sum."""
    d = config.width(text_dim, image_dim)
    if d < max(text_dim, image_dim):
        raise ValueError(f"FusionConfig.dim={d} is narrower than a modality ({text_dim}, {image_dim})")
    rng = np.random.default_rng([config.seed, text_dim, image_dim, d])
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))  # (D, D) orthogonal, uniquely defined by the seed
    text = q[:text_dim]  # (Dt, D)
    image = q[text_dim:text_dim + image_dim] if d >= text_dim + image_dim else q[d - image_dim:]  # (Di, D)
    return text.astype(np.float32), image.astype(np.float32)


def fuse(text: np.ndarray, has_text: np.ndarray, image: np.ndarray, has_image: np.ndarray,
         config: FusionConfig) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) fused unit vectors and (N,) bool `valid` (False: no modality; that row is NaN, never zeros).

    text: (N, Dt) unit rows where has_text; image: (N, Di) unit rows where has_image (other rows ignored).
    """
    n, text_dim, image_dim = len(text), text.shape[1], image.shape[1]
    d = config.width(text_dim, image_dim)
    valid = has_text | has_image
    out = np.full((n, d), np.nan, np.float32)
    if not valid.any():
        return out, valid
    p_text, p_image = projections(text_dim, image_dim, config)
    wt = np.where(has_text, config.text_weight, 0.0).astype(np.float32)[:, None]  # (N, 1) modality mask x weight
    wi = np.where(has_image, config.image_weight, 0.0).astype(np.float32)[:, None]
    mixed = wt * np.nan_to_num(text[:, :text_dim]) @ p_text  # (N, D)
    if image_dim:
        mixed += wi * np.nan_to_num(image) @ p_image
    norm = np.linalg.norm(mixed[valid], axis=1, keepdims=True)  # (V, 1)
    out[valid] = mixed[valid] / np.maximum(norm, 1e-12)
    return out, valid
