"""ContentModels: environment overrides and catalog_clip overrides become the model configs."""

from __future__ import annotations

import pytest

from hir_assets.content_resources import ContentModels


def test_defaults_are_the_offline_models():
    config = ContentModels().content_config()
    assert (config.text.model, config.image.model, config.fusion.dim) == ("", "catalog_clip", 0)


def test_environment_overrides():
    models = ContentModels.from_env({"HIR_TEXT_MODEL": "/models/minilm", "HIR_IMAGE_MODEL": "ViT-B-32",
                                     "HIR_IMAGE_PRETRAINED": "/models/vit.bin", "HIR_CLIP_JSON": '{"epochs": 2}'})
    config = models.content_config()
    assert (config.text.model, config.image.model, config.image.pretrained) == ("/models/minilm", "ViT-B-32", "/models/vit.bin")
    assert models.clip_config().epochs == 2


def test_unknown_clip_overrides_are_refused():
    with pytest.raises(ValueError, match="epochz"):
        ContentModels(clip_json='{"epochz": 2}').clip_config()
