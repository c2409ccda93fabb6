"""Image encoders: every configured source of weights either loads or is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from hir_model.content import ImageEncoderConfig, ModelNotFoundError, load_image_encoder


def test_none_and_catalog_clip_without_a_checkpoint_mean_no_image_tower():
    assert load_image_encoder(ImageEncoderConfig(model="none")) is None
    assert load_image_encoder(ImageEncoderConfig()) is None  # catalog_clip, no checkpoint: the catalogue has no images


def test_a_missing_catalog_clip_checkpoint_is_refused_by_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="missing/checkpoint.pt"):
        load_image_encoder(ImageEncoderConfig(), tmp_path / "missing" / "checkpoint.pt")


@pytest.mark.parametrize("config, message", [
    (ImageEncoderConfig(model="ViT-B-32", pretrained="/nowhere/vit.safetensors"), "/nowhere/vit.safetensors does not exist"),
    (ImageEncoderConfig(model="local-dir:/nowhere/clip"), "/nowhere/clip does not exist"),
    (ImageEncoderConfig(model="ViT-B-32"), "needs weights"),
    (ImageEncoderConfig(model="NotAModel-7"), "not an open_clip model name"),
])
def test_open_clip_weights_that_are_not_here_are_refused_by_name(config, message):
    with pytest.raises(ModelNotFoundError, match=message):
        load_image_encoder(config)


def test_an_open_clip_local_dir_loads_through_open_clip_and_matches_the_checkpoint(tiny_clip, tmp_path):
    from PIL import Image

    from hir_model.content import ImageEncoder, export_local_dir

    folder = export_local_dir(tiny_clip.checkpoint, tmp_path / "clip")
    via_open_clip = load_image_encoder(ImageEncoderConfig(model=f"local-dir:{folder}"))  # open_clip's own loader
    direct = ImageEncoder.from_checkpoint(tiny_clip.checkpoint)
    images = [Image.new("RGB", (32, 32), (200, 30, 30)), Image.new("RGB", (32, 32), (30, 30, 200))]
    np.testing.assert_allclose(via_open_clip.encode(images), direct.encode(images), atol=1e-5)
    assert via_open_clip.version.startswith("clip@") and via_open_clip.dim == direct.dim


def test_a_local_dir_without_weights_is_refused(tiny_clip, tmp_path):
    from hir_model.content import export_local_dir

    folder = export_local_dir(tiny_clip.checkpoint, tmp_path / "clip")
    (folder / "open_clip_pytorch_model.bin").unlink()
    with pytest.raises(ModelNotFoundError, match="holds no weights"):
        load_image_encoder(ImageEncoderConfig(model=f"local-dir:{folder}"))
