"""embed_catalog: every entity gets a row; unchanged entities reuse the previous window's vectors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from hir_model.content import (ContentConfig, Encoders, ImageEncoder, content_schema, embed_catalog, embedding_report,
                               parse_version, to_matrix)
from hir_model.content.fusion import projections
from hir_model.content.media import has_pyav
from tests.hir_model.content.conftest import catalog, product_image, products


@pytest.fixture(scope="module")
def encoders(text_encoder, tiny_clip) -> Encoders:
    return Encoders(ContentConfig(), text_encoder, ImageEncoder.from_checkpoint(tiny_clip.checkpoint))


@pytest.fixture
def window0(tmp_path) -> pa.Table:
    frames = tmp_path / "video_p9"
    for i in range(3):
        product_image(frames, 100 + i, 3)
    rows = products(tmp_path, 6) + [
        {"entity_id": "a1", "entity_type": "advertiser", "title": "Acme"},
        {"entity_id": "p7", "parent_id": "a1", "title": "No picture product"},  # text only
        {"entity_id": "p8", "parent_id": "a1", "title": "Missing picture", "image_uri": (tmp_path / "gone.png").as_uri()},
        {"entity_id": "p9", "parent_id": "a1", "title": "Video product", "video_uri": str(frames)},
        {"entity_id": "u1", "entity_type": "user", "features": [("region", "north")]},
        {"entity_id": "u2", "entity_type": "user"},  # no content at all
    ]
    return catalog(rows)


def rows_by_id(table: pa.Table) -> dict[str, dict]:
    return {r["entity_id"]: r for r in table.to_pylist()}


def test_first_window_embeds_every_entity_with_explicit_missing_modalities(encoders, window0):
    build = embed_catalog(window0, encoders)
    table = build.table
    assert table.schema == content_schema(384, 16, 400) and table.num_rows == window0.num_rows
    # 10 texts (users are known by their edges: no text embedded); 6 images + p9's video frames (p8's image is gone)
    assert (build.new, build.reused, build.texts_encoded, build.visuals_encoded) == (12, 0, 10, 7)
    rows = rows_by_id(table)
    assert rows["p0"]["has_text"] and rows["p0"]["has_image"]
    assert rows["p7"]["has_text"] and not rows["p7"]["has_image"] and rows["p7"]["image_embedding"] is None
    assert not rows["p8"]["has_image"] and any("p8" in p and "gone.png" in p for p in build.problems)
    assert rows["p9"]["has_image"]  # a folder of frames, pooled by the image tower
    assert rows["u2"]["embedding"] is None and not rows["u2"]["has_text"] and build.no_content == 2  # u1 and u2
    p_text, _ = projections(384, 16, ContentConfig().fusion)  # text only: the projected text vector, unit norm
    np.testing.assert_allclose(np.array(rows["p7"]["embedding"]), np.array(rows["p7"]["text_embedding"]) @ p_text, atol=1e-5)
    report = embedding_report(table, window0.column("entity_id"))
    assert report.covered and report.nonfinite == 0 and report.max_norm_error < 1e-3 and report.versions == [build.version]
    assert set(parse_version(build.version)) == {"text", "image", "fusion"}


def test_next_window_embeds_only_new_and_changed_entities(encoders, window0, tmp_path):
    first = embed_catalog(window0, encoders).table
    titles = window0.column("title").to_pylist()
    titles[1] = "a renamed product"  # p1's text changed
    grown = pa.concat_tables([window0.set_column(4, "title", pa.array(titles)), catalog(products(tmp_path, 1, start=40))])
    build = embed_catalog(grown, encoders, previous=first)
    # changed: p1, and its advertiser a1, whose text lists its products' titles
    assert (build.new, build.changed, build.version_changed, build.reused) == (1, 2, 0, 10)
    assert (build.texts_encoded, build.visuals_encoded) == (3, 2)
    before, after = rows_by_id(first), rows_by_id(build.table)
    assert after["a1"]["content_hash"] != before["a1"]["content_hash"]
    for eid in ("p0", "p7", "p9", "u1", "u2"):  # reused byte for byte
        assert after[eid]["embedding"] == before[eid]["embedding"] and after[eid]["content_hash"] == before[eid]["content_hash"]
    assert after["p1"]["text_embedding"] != before["p1"]["text_embedding"]
    np.testing.assert_allclose(after["p1"]["image_embedding"], before["p1"]["image_embedding"], atol=1e-6)  # same image


def test_an_encoder_version_change_reembeds_that_modality_for_everyone(encoders, window0, tiny_clip):
    first = embed_catalog(window0, encoders).table
    old = parse_version(first.column("encoder_version")[0].as_py())
    stale = first.set_column(8, "encoder_version", pa.array([f"text={old['text']};image=clip@old;fusion=x"] * first.num_rows))
    build = embed_catalog(window0, encoders, previous=stale)  # same content, the image tower "changed"
    assert (build.new, build.changed, build.version_changed) == (0, 0, 7) and build.reused == 5
    assert (build.texts_encoded, build.visuals_encoded) == (0, 7)  # texts reused, every image re-embedded
    stale = first.set_column(8, "encoder_version", pa.array(["text=other@1;image=catalog_clip@old;fusion=x"] * first.num_rows))
    build = embed_catalog(window0, encoders, previous=stale)
    assert (build.texts_encoded, build.visuals_encoded, build.reused) == (10, 7, 2)  # only the users (no content) are untouched
    assert pc.all(pc.equal(build.table.column("encoder_version"), build.version)).as_py()
    forced = embed_catalog(window0, encoders, previous=first, force=True)
    assert (forced.version_changed, forced.reused, forced.texts_encoded) == (12, 0, 10)


def test_a_video_file_without_pyav_is_skipped_with_a_warning_naming_the_entity(encoders, tmp_path):
    if has_pyav():
        pytest.skip("PyAV is installed: video files are decoded")
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    table = catalog(products(tmp_path, 1) + [{"entity_id": "v1", "title": "Video only", "video_uri": str(tmp_path / "clip.mp4")}])
    table = table.set_column(8, "video_uri", pa.array([str(tmp_path / "clip.mp4"), str(tmp_path / "clip.mp4")]))
    build = embed_catalog(table, encoders)
    rows = rows_by_id(build.table)
    assert rows["p0"]["has_image"] and rows["p0"]["has_text"]  # its image still counts; only the video is skipped
    assert not rows["v1"]["has_image"] and rows["v1"]["has_text"]
    assert any(p.startswith("v1: video file") and "PyAV" in p for p in build.problems)


def test_to_matrix_reads_slices_and_nulls():
    values = pa.array(np.arange(8, dtype=np.float32))
    arr = pa.FixedSizeListArray.from_arrays(values, 2, mask=pa.array([False, True, False, False]))
    mat, valid = to_matrix(arr.slice(1, 3))
    assert valid.tolist() == [False, True, True] and mat[1].tolist() == [4, 5] and np.isnan(mat[0]).all()


def test_reuse_needs_only_the_reused_columns_of_the_previous_table(encoders, window0, tmp_path):
    from hir_model.content.embed import REUSED_COLUMNS

    first = embed_catalog(window0, encoders).table
    grown = pa.concat_tables([window0, catalog(products(tmp_path, 1, start=40))])
    whole, narrow = embed_catalog(grown, encoders, previous=first), embed_catalog(grown, encoders, previous=first.select(REUSED_COLUMNS))
    assert narrow.table.equals(whole.table) and (narrow.new, narrow.reused, narrow.texts_encoded) == (1, 11, 2)
