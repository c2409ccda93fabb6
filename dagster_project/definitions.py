"""The Dagster entry point: read the config, derive window partitions from the source, bind resources."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

# Before the asset modules are imported: per-asset backfill policies, the window x objective mapping and reads of
# a successor partition are deliberate uses of beta / preview APIs.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from dagster_aws.s3 import S3Resource

from dagster_project.instance import claim
from dagster_project.arrival_sensor import build_arrival_sensor
from dagster_project.jobs import adapter_job, build_evaluation_job, build_increment_job, build_window_job, report_job
from dagster_project.notify import AlertLogNotifier, Notifier, WebhookNotifier
from dagster_project.schedules import build_window_schedule
from dagster_project.sensors import build_alert_sensor
from hir_assets.adapter import build_adapter_assets
from hir_assets.audiences import build_audience_assets
from hir_assets.content_resources import ContentModels
from hir_assets.enrichment import build_enrichment_assets
from hir_assets.evaluation import build_evaluation_assets
from hir_assets.events import build_ingest_assets
from hir_assets.graph import build_graph_assets
from hir_assets.hierarchy import build_hierarchy_assets
from hir_assets.increments import build_increment_assets, increment_partitions
from hir_assets.index import build_index_assets
from hir_assets.partitions import window_partitions
from hir_assets.report import build_report_assets, report_settings
from hir_assets.resources import LocalPartitionStorage, PartitionStorage, S3PartitionStorage, SourceResource
from hir_assets.training import build_training_assets
from hir_model.adapter.objective_adapter import ADAPTER_ASSET
from hir_model.config import PROJECT_ROOT, HIRConfig, load_config
from hir_model.train.checkpoint import ENCODER_ASSET

OWNER = "team:hir"  # who an alert or a stale asset is for (the catalogue's Owner column)
GPU_ASSETS = (ENCODER_ASSET, ADAPTER_ASSET)  # training steps: the `gpu` pool, one at a time on the local instance


def build_definitions(config: HIRConfig) -> dg.Definitions:
    source = config.make_source()
    try:
        spec = config.window_spec(source)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the {config.source} source has no data yet ({exc}); run `make data` (or `hir prepare`) first") from exc
    partitions = window_partitions(spec)
    assets = (build_ingest_assets(partitions) + build_enrichment_assets(partitions) + build_graph_assets(partitions)
              + build_training_assets(partitions, dict(config.train)) + build_hierarchy_assets(partitions, dict(config.embed))
              + build_index_assets(partitions) + build_audience_assets(partitions) + build_evaluation_assets(partitions) + build_adapter_assets(partitions)
              + build_report_assets(partitions, report_settings(config)) + build_increment_assets(spec))
    assets = dg.map_asset_specs(lambda spec: owned(spec, config.source), assets)
    asset_keys = {key.to_user_string() for a in assets for key in a.keys}
    window_job = build_window_job(partitions)
    days = increment_partitions(spec)
    increment_job = build_increment_job(days)
    return dg.Definitions(
        assets=assets,
        jobs=[window_job, build_evaluation_job(partitions), adapter_job(), report_job(), increment_job],
        schedules=[build_window_schedule(window_job)],
        sensors=[build_alert_sensor(asset_keys), build_arrival_sensor(increment_job, spec, days)],
        resources={
            "storage": storage(config),
            "source": SourceResource.from_config(config),
            "notifier": notifier(),
            "content": ContentModels.from_env(),
            "pipes_subprocess_client": dg.PipesSubprocessClient(),
        },
    )


def owned(spec: dg.AssetSpec, source: str) -> dg.AssetSpec:
    """Every asset: an owner to page and tags to filter the catalogue by (stage, source, compute)."""
    tags = {"hir/stage": spec.group_name or "default", "hir/source": source}
    if spec.key.to_user_string() in GPU_ASSETS:
        tags["hir/compute"] = "gpu"
    return spec.replace_attributes(owners=list(dict.fromkeys([*spec.owners, OWNER])), tags={**spec.tags, **tags})


def storage(config: HIRConfig) -> PartitionStorage:
    """A local folder, or S3 through dagster-aws when the storage URI is s3://bucket/prefix."""
    if not config.storage_uri.startswith("s3://"):
        return LocalPartitionStorage(root=config.storage_uri)
    endpoint = os.environ.get("HIR_S3_ENDPOINT_URL")
    s3 = S3Resource(endpoint_url=dg.EnvVar("HIR_S3_ENDPOINT_URL") if endpoint else None,
                    region_name=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")), max_attempts=5)
    return S3PartitionStorage(uri=config.storage_uri, s3=s3, cache_dir=str(PROJECT_ROOT / ".hir" / "cache"))


def notifier() -> Notifier:
    """The Slack-compatible webhook when HIR_ALERT_WEBHOOK_URL is set (it also keeps the alert log), else the log alone."""
    log = str(Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".hir") / "alerts.jsonl")
    if os.environ.get("HIR_ALERT_WEBHOOK_URL"):
        return WebhookNotifier(url=dg.EnvVar("HIR_ALERT_WEBHOOK_URL"), log_path=log)
    return AlertLogNotifier(path=log)


_config = load_config()
claim(os.environ.get("DAGSTER_HOME"), _config.label)  # one instance per source: refuse another source's instance
defs = build_definitions(_config)
