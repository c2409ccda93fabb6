"""Shared fixtures for the content tests: the real packaged MiniLM (loaded once), a tiny catalog_clip, a small catalogue."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from data_contracts.schemas import CATALOG_SCHEMA
from hir_model.content import CatalogClipConfig, TextEncoder, TextEncoderConfig, train
from hir_model.content.catalog_clip import make_pairs
from hir_model.data.synthetic_images import draw

T0 = datetime(2024, 1, 7, tzinfo=timezone.utc)
BRANCHING = (2, 2, 2)  # 8 fine interests
TINY_CLIP = CatalogClipConfig(embed_dim=16, patch_size=8, vision_width=32, vision_layers=1, vision_head_width=16, text_width=32,
                              text_heads=2, text_layers=1, context_length=16, epochs=2, warm_epochs=1, batch_size=16,
                              warmup_steps=2, lr=3e-3)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@pytest.fixture(scope="session", autouse=True)
def _offline(tmp_path_factory):
    """Nothing may be downloaded: every model comes from a local folder."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tests share two cores with other work; one thread is steadier there
    yield
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture(scope="session")
def text_encoder() -> TextEncoder:
    return TextEncoder(TextEncoderConfig())


def product_image(folder: Path, i: int, fine: int) -> str:
    """A synthetic product image for fine interest `fine`; returns its file:// URI."""
    path = folder / f"p{i:04d}.png"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draw(7, i, 32, (fine // 4, fine // 2, fine), BRANCHING).save(path)
    return path.as_uri()


def catalog(rows: list[dict]) -> pa.Table:
    """A catalogue table from partial rows (missing columns are null; first_seen_ts defaults to T0 + row index)."""
    full = [{"entity_type": "product", "parent_id": None, "first_seen_ts": T0 + timedelta(hours=i), "title": None,
             "description": None, "category": None, "image_uri": None, "video_uri": None, "features": None, **r}
            for i, r in enumerate(rows)]
    return pa.Table.from_pylist(full, schema=CATALOG_SCHEMA)


def products(folder: Path, n: int, start: int = 0) -> list[dict]:
    """n products over 8 fine interests, each with an image and text that carry its interest."""
    return [{"entity_id": f"p{i}", "parent_id": "a1", "title": f"{WORDS[i % 8]} item {i}", "category": WORDS[i % 8],
             "description": f"a {WORDS[i % 8]} thing, {WORDS[(i % 8) ^ 1]} style", "image_uri": product_image(folder, i, i % 8)}
            for i in range(start, start + n)]


@pytest.fixture(scope="session")
def clip_pairs(tmp_path_factory):
    from hir_model.content.entity_text import entity_texts
    from hir_model.content.media import decode_image, local_path

    folder = tmp_path_factory.mktemp("clip_images")
    table = catalog(products(folder, 64))
    texts = entity_texts(table)
    images = [decode_image(local_path(u).read_bytes()) for u in table.column("image_uri").to_pylist()]
    return make_pairs(images, texts, [f"d{i}" for i in range(len(images))], TINY_CLIP)


@pytest.fixture(scope="session")
def tiny_clip(clip_pairs):
    return train(clip_pairs, TINY_CLIP)
