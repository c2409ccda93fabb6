"""The evaluation report: one HTML page per source over every evaluated window, kept under that source's storage."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import dagster as dg

from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.config import PROJECT_ROOT, HIRConfig
from hir_model.eval.publish import EVALUATION_ASSET
from hir_model.eval.pages import REPORT_FILE, git_commit, report_path, write_source_report

GROUP = "evaluation"
REPORT_ASSET = "evaluation_report"
REPORTS_URL_ENV = "HIR_REPORTS_URL"  # where the reports folder is served over HTTP (`make ui` serves it beside the UI)
DEFAULT_REPORTS_URL = "http://127.0.0.1:3001"


def report_url() -> str:
    """The report's address for a browser: the UI links it from the asset's metadata."""
    return f"{(os.environ.get(REPORTS_URL_ENV) or DEFAULT_REPORTS_URL).rstrip('/')}/{REPORT_FILE}"


def report_settings(config: HIRConfig) -> dict[str, str]:
    """What a reader needs to know about the run a report shows, beside its source and windows."""
    settings = {"window length": config.window, "storage": config.storage_uri}
    if config.source == "parquet":
        settings["data"] = config.parquet_path
    if config.source == "synthetic" and config.synthetic:
        settings["synthetic"] = json.dumps(dict(config.synthetic), default=str, sort_keys=True)
    if config.train:
        settings["training (hir.toml)"] = json.dumps(dict(config.train), default=str, sort_keys=True)
    if config.embed:
        settings["embedding (hir.toml)"] = json.dumps(dict(config.embed), default=str, sort_keys=True)
    return settings


def build_report_assets(partitions: dg.PartitionsDefinition, settings: Mapping[str, Any]) -> list[dg.AssetsDefinition]:
    @dg.asset(name=REPORT_ASSET, group_name=GROUP, kinds={"html"}, deps=[EVALUATION_ASSET])
    def evaluation_report(storage: PartitionStorage, source: SourceResource) -> dg.MaterializeResult:
        """One self-contained HTML page per source: every evaluated window's metrics, per-window plots, its commit and settings."""
        store = storage.store()
        keys = partitions.get_partition_keys()
        report = write_source_report(store, keys, report_path(store.root), source.source, dict(settings), git_commit(PROJECT_ROOT))
        return dg.MaterializeResult(metadata={
            "report": dg.MetadataValue.path(str(report.path)), "report_url": dg.MetadataValue.url(report_url()),
            "title": report.title, "source": source.source,
            "evaluated_windows": dg.MetadataValue.int(report.evaluated), "windows": dg.MetadataValue.int(len(keys)),
            "first_window": report.first or "none", "last_window": report.last or "none",
            "commit": report.header["commit"]})

    return [evaluation_report]
