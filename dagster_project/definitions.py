"""The Dagster entry point: read the config, derive window partitions from the source, bind resources."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from dagster_project.notify import AlertLogNotifier, Notifier, WebhookNotifier
from dagster_project.partitions import window_partitions
from dagster_project.resources import LocalPartitionStorage, SourceResource
from dagster_project.sensors import build_alert_sensor
from hir_assets.events import build_ingest_assets
from hir_model.config import HIRConfig, load_config


def build_definitions(config: HIRConfig) -> dg.Definitions:
    source = config.make_source()
    try:
        spec = config.window_spec(source)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the {config.source} source has no data yet ({exc}); run `make data` (or `hir prepare`) first") from exc
    partitions = window_partitions(spec)
    assets = build_ingest_assets(partitions)
    asset_keys = {key.to_user_string() for a in assets for key in a.keys}
    return dg.Definitions(
        assets=assets,
        sensors=[build_alert_sensor(asset_keys)],
        resources={
            "storage": LocalPartitionStorage(root=config.storage_uri),
            "source": SourceResource.from_config(config),
            "notifier": notifier(),
        },
    )


def notifier() -> Notifier:
    """The Slack-compatible webhook when HIR_ALERT_WEBHOOK_URL is set, else the local alert log."""
    if os.environ.get("HIR_ALERT_WEBHOOK_URL"):
        return WebhookNotifier(url=dg.EnvVar("HIR_ALERT_WEBHOOK_URL"))
    home = Path(os.environ.get("DAGSTER_HOME") or Path(__file__).resolve().parent.parent / ".hir")
    return AlertLogNotifier(path=str(home / "alerts.jsonl"))


defs = build_definitions(load_config())
