"""evaluation_report materialised with Dagster: the source's page under its own storage, named in the metadata."""

from __future__ import annotations

import dagster as dg
import torch

from hir_assets.partitions import window_partitions
from hir_assets.report import REPORT_ASSET, build_report_assets, report_settings
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_model.config import HIRConfig
from hir_model.eval.run import evaluate_windows
from hir_model.eval.scoring import EvalConfig
from tests.hir_model.eval.test_report import SMALL, publish
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

torch.set_num_threads(1)


def test_the_report_asset_writes_the_sources_page_and_links_it(tmp_path, monkeypatch):
    from hir_model.baselines.registry import baselines

    results = evaluate_windows(tiny_store(tmp_path / "tiny"), SPEC, KEYS, baselines(SMALL), EvalConfig(recall_ks=(20,), ndcg_ks=(3,)))
    root = tmp_path / "storage" / "parquet"
    publish(root, results)
    config = HIRConfig(source="parquet", window="weekly", parquet_path="/data/byo", storage_uri=str(root), train={"steps": 3})
    assets = build_report_assets(window_partitions(SPEC), report_settings(config))
    source = SourceResource(source="parquet", window="weekly", data_dir=str(tmp_path), parquet_path="/data/byo")
    monkeypatch.setenv("HIR_REPORTS_URL", "http://reports.example:8080/hir/")
    result = dg.materialize(assets, instance=dg.DagsterInstance.ephemeral(),
                            resources={"storage": LocalPartitionStorage(root=str(root)), "source": source})
    (event,) = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert event.asset_key == dg.AssetKey(REPORT_ASSET)
    path = meta["report"].value
    assert path == str(root / "_reports" / "evaluation.html") and isinstance(meta["report"], dg.PathMetadataValue)
    assert meta["report_url"] == dg.MetadataValue.url("http://reports.example:8080/hir/evaluation.html")  # opens from the UI
    assert meta["evaluated_windows"] == dg.MetadataValue.int(2) and meta["first_window"].value == KEYS[0]
    page = open(path).read()
    assert "parquet" in meta["title"].value and "/data/byo" in page and '{&quot;steps&quot;: 3}' in page
