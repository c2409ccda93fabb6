"""catalog_clip: training lowers the contrastive loss; checkpoints round-trip; retraining only when the images changed enough."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from PIL import Image

from hir_model.content import ImageEncoder, load_checkpoint, refresh, save_checkpoint, train
from hir_model.content.catalog_clip import refresh_decision, sample_pairs
from tests.hir_model.content.conftest import TINY_CLIP, catalog, products


def test_training_lowers_the_contrastive_loss(tiny_clip):
    assert tiny_clip.final_loss < tiny_clip.initial_loss - 0.1
    assert tiny_clip.checkpoint.step == tiny_clip.steps == 2 * (64 // 16)
    assert tiny_clip.checkpoint.version.startswith("catalog_clip@") and not tiny_clip.warm_started


def test_checkpoint_round_trips_with_weights_only(tiny_clip, tmp_path, clip_pairs):
    path = save_checkpoint(tiny_clip.checkpoint, tmp_path / "clip.pt")
    loaded = load_checkpoint(path)  # torch.load(weights_only=True) inside
    assert loaded.version == tiny_clip.checkpoint.version and loaded.step == tiny_clip.checkpoint.step
    assert loaded.model_config == TINY_CLIP.model_config() and loaded.train_config["epochs"] == TINY_CLIP.epochs
    for k, v in tiny_clip.checkpoint.state_dict.items():
        torch.testing.assert_close(loaded.state_dict[k], v)
    encoder = ImageEncoder.from_checkpoint(loaded)
    assert encoder.dim == TINY_CLIP.embed_dim and encoder.version == loaded.version


def test_warm_start_continues_from_the_previous_checkpoint(tiny_clip, clip_pairs):
    again = train(clip_pairs, TINY_CLIP, previous=tiny_clip.checkpoint)
    assert again.warm_started and again.checkpoint.step == tiny_clip.checkpoint.step + TINY_CLIP.warm_epochs * 4
    assert again.initial_loss == pytest.approx(tiny_clip.final_loss, abs=1e-4)  # it starts where the last one ended
    assert again.checkpoint.version != tiny_clip.checkpoint.version


def test_same_data_same_version(clip_pairs, tiny_clip):
    assert train(clip_pairs, TINY_CLIP).checkpoint.version == tiny_clip.checkpoint.version  # deterministic by seed


def test_retrain_only_when_enough_images_are_new(tiny_clip):
    seen = tiny_clip.checkpoint.image_digests
    assert refresh_decision(seen + ["new1"], tiny_clip.checkpoint, TINY_CLIP)[0] == "reuse"
    action, reason, novelty = refresh_decision(seen[:10] + [f"n{i}" for i in range(20)], tiny_clip.checkpoint, TINY_CLIP)
    assert action == "warm_start" and novelty == pytest.approx(20 / 30)
    assert refresh_decision(seen, tiny_clip.checkpoint, TINY_CLIP, force=True)[0] == "warm_start"
    assert refresh_decision(seen, tiny_clip.checkpoint, replace(TINY_CLIP, embed_dim=8))[0] == "train"
    assert refresh_decision(seen, None, TINY_CLIP)[0] == "train"


def test_refresh_on_a_catalogue_without_images_skips_the_image_tower():
    result = refresh(catalog([{"entity_id": "m1", "title": "A movie"}, {"entity_id": "m2", "title": "Another"}]), None, TINY_CLIP)
    assert result.action == "no_images" and result.checkpoint is None and "no images: image tower skipped" in result.reason


def test_refresh_trains_then_reuses(tmp_path):
    table = catalog(products(tmp_path, 32))
    first = refresh(table, None, replace(TINY_CLIP, epochs=1))
    assert first.action == "trained" and first.pairs == 32 and first.checkpoint is not None
    second = refresh(table, first.checkpoint, TINY_CLIP)
    assert second.action == "reused" and second.checkpoint is first.checkpoint and second.novelty == 0.0
    image = ImageEncoder.from_checkpoint(first.checkpoint).encode([Image.new("RGB", (32, 32))])
    assert image.shape == (1, TINY_CLIP.embed_dim)


def test_a_catalogue_above_max_pairs_is_fitted_on_a_sample_and_judged_whole(tmp_path):
    table = catalog(products(tmp_path, 48))
    capped = replace(TINY_CLIP, epochs=1, max_pairs=32)
    result = refresh(table, None, capped)
    assert result.action == "trained" and result.pairs == 48 and result.fitted_pairs == 32
    assert result.training.steps == 32 // capped.batch_size  # the steps follow the sample, not the catalogue
    assert len(result.checkpoint.image_digests) == 48  # novelty is judged against every image it was drawn from
    assert refresh(table, result.checkpoint, capped).action == "reused"
    assert sample_pairs(48, capped).tolist() == sample_pairs(48, capped).tolist() != list(range(32))  # seeded, spread
    assert sample_pairs(20, capped).tolist() == list(range(20))  # at or under the cap: every pair, in order
