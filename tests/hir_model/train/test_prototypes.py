"""A warm start's prototypes: refined in place, or replaced by a fresh k-means run that fits clearly better."""

import numpy as np
import pytest

from hir_model.train.centroids import primitive_centroids
from hir_model.train.config import TrainConfig, set_fields
from hir_model.train.prototypes import fit, restarted


def four_clusters(per: int = 50, width: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z [4 * per, W] unit rows around 4 orthogonal directions, their cluster [4 * per], the directions [4, W])."""
    rng = np.random.default_rng(seed)
    axes = np.eye(width, dtype=np.float32)[:4]
    label = np.repeat(np.arange(4), per)
    z = axes[label] + 0.15 * rng.standard_normal((4 * per, width)).astype(np.float32)
    return z / np.linalg.norm(z, axis=1, keepdims=True), label, axes


def stuck_prototypes(axes: np.ndarray) -> np.ndarray:
    """A local optimum of spherical k-means: clusters 0 and 1 share row 0, cluster 2 is split over rows 1 and 2."""
    p = np.stack([axes[0] + axes[1], axes[2] + 0.3 * axes[3], axes[2] - 0.3 * axes[3], axes[3]])
    return (p / np.linalg.norm(p, axis=1, keepdims=True)).astype(np.float32)


def test_refinement_alone_stays_in_a_merged_and_split_local_optimum():
    z, label, axes = four_clusters()
    refined = primitive_centroids(z, stuck_prototypes(axes), 10, reseed=True)
    nearest = (z @ refined.T).argmax(1)
    assert nearest[label == 0][0] == nearest[label == 1][0]  # two interests under one prototype, as before


def test_a_clearly_better_fresh_run_replaces_the_refined_prototypes_rows_kept_where_they_can():
    z, label, axes = four_clusters()
    stuck = stuck_prototypes(axes)
    cfg = set_fields(TrainConfig(), levels=(4,), refine_iters=10, prototype_restarts=4, restart_gain=0.01)
    out = restarted(z, stuck, cfg, level=0)
    nearest = (z @ out.T).argmax(1)
    # one prototype per planted cluster, each cluster whole
    assert sorted({int(nearest[label == c][0]) for c in range(4)}) == [0, 1, 2, 3]
    assert all(len(set(nearest[label == c])) == 1 for c in range(4))
    assert fit(z, out) > fit(z, primitive_centroids(z, stuck, 10, reseed=True)) + 0.01
    assert nearest[label == 3][0] == 3  # the prototype that already held cluster 3 keeps its row


@pytest.mark.parametrize("kw", [{"prototype_restarts": 0}, {"restart_gain": 1.0}])
def test_without_restarts_or_below_the_gain_the_refined_prototypes_stay(kw):
    z, _, axes = four_clusters()
    stuck = stuck_prototypes(axes)
    cfg = set_fields(TrainConfig(), levels=(4,), refine_iters=10, **kw)
    np.testing.assert_array_equal(restarted(z, stuck, cfg, level=0), primitive_centroids(z, stuck, 10, reseed=True))
