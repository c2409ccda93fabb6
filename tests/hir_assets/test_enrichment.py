"""catalog_clip and content_embeddings, materialised with Dagster over consecutive windows."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import dagster as dg
import pyarrow.compute as pc
import pytest
import torch

from hir_assets.content_resources import ContentModels
from hir_assets.enrichment import build_enrichment_assets
from hir_model.content import CLIP_ASSET
from hir_assets.events import build_ingest_assets
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_model.config import HIRConfig
from hir_model.content import CONTENT_ASSET, CONTENT_FILE, content_schema, load_checkpoint
from hir_model.storage import PartitionStore
from tests.hir_model.content.conftest import TINY_CLIP

SMALL = {"n_windows": 2, "events_per_window": 400, "branching": [2, 2, 2], "n_advertisers": 16, "n_products": 120,
         "n_users": 20, "new_advertisers_per_window": 1, "new_products_per_window": 12, "new_users_per_window": 4}
KEYS = ("2024-01-07", "2024-01-14")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(config: HIRConfig, tmp_path: Path, keys, instance) -> dict[str, dg.ExecuteInProcessResult]:
    partitions = window_partitions(config.window_spec())
    assets = [a for a in build_ingest_assets(partitions) if a.key.to_user_string() == "entity_catalog"]
    assets += build_enrichment_assets(partitions)
    resources = {"storage": LocalPartitionStorage(root=str(tmp_path / "store")), "source": SourceResource.from_config(config),
                 "content": ContentModels(clip_json=json.dumps({**asdict(TINY_CLIP), "epochs": 4}))}
    return {key: dg.materialize(assets, partition_key=key, resources=resources, instance=instance, raise_on_error=False)
            for key in keys}


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    mat = next(e.event_specific_data.materialization for e in result.get_asset_materialization_events()
               if e.asset_key.to_user_string() == asset)
    return {k: v.value for k, v in mat.metadata.items()}


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations() if e.asset_key.to_user_string() == CONTENT_ASSET}


def test_two_synthetic_windows_embed_then_reuse(tmp_path):
    config = HIRConfig(source="synthetic", data_dir=tmp_path / "data", storage_uri=str(tmp_path / "store"), synthetic=SMALL)
    results = run(config, tmp_path, KEYS, dg.DagsterInstance.ephemeral())
    assert all(r.success for r in results.values())
    first, second = (metadata(results[k], CONTENT_ASSET) for k in KEYS)
    catalog = [metadata(results[k], "entity_catalog") for k in KEYS]
    assert first["new"] == catalog[0]["dagster/row_count"] and first["reused"] == 0
    assert second["new"] == catalog[1]["new_entities"] and second["reembedded_for_version"] == 0
    assert second["reused"] == catalog[1]["dagster/row_count"] - second["new"] - second["changed"]
    assert second["changed"] <= SMALL["n_advertisers"] + 1  # only advertisers whose product list grew
    new_ad_entities = sum(n for t, n in catalog[1]["new_entities_by_type"].items() if t not in ("user", "kg_entity"))
    assert second["texts_encoded"] == new_ad_entities + second["changed"]  # users are known by their edges, not text
    assert second["previous_partition"] == KEYS[0]
    clip = [metadata(results[k], CLIP_ASSET) for k in KEYS]
    assert clip[0]["action"] == "trained" and clip[0]["final_loss"] < clip[0]["initial_loss"]
    assert clip[1]["action"] == "reused" and clip[1]["version"] == clip[0]["version"] and clip[1]["trained_in"] == KEYS[0]
    assert "catalog_clip@" in second["weights"]["image"] and "all-MiniLM-L6-v2" in second["weights"]["text"]
    for key in KEYS:
        evaluations = checks(results[key])
        assert {n for n, e in evaluations.items() if not e.passed} <= {"interest_agreement"}, evaluations
    agreement = checks(results[KEYS[1]])["interest_agreement"].metadata
    assert agreement["fused"].value > agreement["chance"].value + 0.15  # tiny model, 4 epochs: already well above chance
    store = PartitionStore(tmp_path / "store")
    table = store.read(CONTENT_ASSET, KEYS[1], CONTENT_FILE)
    assert table.schema == content_schema(384, TINY_CLIP.embed_dim, 384 + TINY_CLIP.embed_dim)
    products = table.filter(pc.equal(table["entity_type"], "product"))
    assert pc.all(products["has_image"]).as_py() and pc.all(products["has_text"]).as_py()
    ckpt = load_checkpoint(store.partition_dir(CLIP_ASSET, KEYS[1]) / "checkpoint.pt")
    assert ckpt.version == clip[0]["version"]


def test_a_source_without_images_skips_the_image_tower(byo, tmp_path):
    config = HIRConfig(source="parquet", parquet_path=str(byo), data_dir=tmp_path / "data", storage_uri=str(tmp_path / "store"))
    results = run(config, tmp_path, KEYS[:1], dg.DagsterInstance.ephemeral())
    result = results[KEYS[0]]
    assert result.success
    clip = metadata(result, CLIP_ASSET)
    assert clip["action"] == "no_images" and "no images: image tower skipped" in clip["reason"]
    content = metadata(result, CONTENT_ASSET)
    assert content["weights"]["image"].startswith("none") and content["encoder_version"].count("image=none") == 1
    evaluations = checks(result)
    assert all(e.passed for e in evaluations.values()) and "skipped" in evaluations["interest_agreement"].description
    table = PartitionStore(tmp_path / "store").read(CONTENT_ASSET, KEYS[0], CONTENT_FILE)
    assert not pc.any(table["has_image"]).as_py() and table.schema.field("embedding").type.list_size == 384
