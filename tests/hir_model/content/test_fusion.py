"""Fusion: the fused cosine is the weighted mix of the modalities' cosines; a missing modality is masked."""

from __future__ import annotations

import numpy as np
import pytest

from hir_model.content import FusionConfig, fuse
from hir_model.content.fusion import projections


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_disjoint_orthogonal_subspaces_make_the_fused_cosine_exact():
    rng = np.random.default_rng(0)
    text, image = unit(rng, 5, 12), unit(rng, 5, 4)
    both = np.ones(5, bool)
    config = FusionConfig(text_weight=2.0, image_weight=1.0)
    fused, valid = fuse(text, both, image, both, config)
    assert fused.shape == (5, 16) and valid.all()
    expected = (4 * text @ text.T + image @ image.T) / 5
    np.testing.assert_allclose(fused @ fused.T, expected, atol=1e-5)
    p_text, p_image = projections(12, 4, config)
    np.testing.assert_allclose(p_text @ p_image.T, 0, atol=1e-6)  # (12, 4): no cross-modal term


def test_a_missing_image_is_masked_not_zeroed_and_no_content_gives_no_vector():
    rng = np.random.default_rng(1)
    text, image = unit(rng, 3, 12), unit(rng, 3, 4)
    image[1] = np.nan  # whatever sits in a missing row is never read
    has_text, has_image = np.array([True, True, False]), np.array([True, False, False])
    fused, valid = fuse(text, has_text, image, has_image, FusionConfig())
    assert valid.tolist() == [True, True, False]
    p_text, _ = projections(12, 4, FusionConfig())
    np.testing.assert_allclose(fused[1], text[1] @ p_text, atol=1e-6)  # text only: its own direction, unit norm
    np.testing.assert_allclose(np.linalg.norm(fused[:2], axis=1), 1, atol=1e-6)
    assert np.isnan(fused[2]).all()  # no modality: NaN behind valid=False (published as null), never zeros
    image[1] = unit(rng, 1, 4)[0]
    with_image = fuse(text, has_text, image, np.ones(3, bool), FusionConfig())[0]
    assert not np.allclose(with_image[1], fused[1])  # an image, when present, moves the vector


def test_weights_must_be_positive():
    with pytest.raises(ValueError):
        FusionConfig(image_weight=0)
