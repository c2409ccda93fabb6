"""The Dagster entry point: read the config, derive window partitions from the source, bind resources."""

from __future__ import annotations

import dagster as dg

from dagster_project.partitions import window_partitions
from dagster_project.resources import LocalPartitionStorage, SourceResource
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
    return dg.Definitions(
        assets=assets,
        resources={
            "storage": LocalPartitionStorage(root=config.storage_uri),
            "source": SourceResource.from_config(config),
        },
    )


defs = build_definitions(load_config())
