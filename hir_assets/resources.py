"""Resources: where tables live (storage) and where data comes from (source). Chosen by type hint."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource

from hir_model.config import HIRConfig
from hir_model.data.source import Source
from hir_model.storage import PartitionStore, S3PartitionStore


class PartitionStorage(dg.ConfigurableResource):
    """Base: a store of `<asset>/<partition>/<file>.parquet` with all-or-nothing partition writes."""

    def store(self) -> PartitionStore:
        raise NotImplementedError


class LocalPartitionStorage(PartitionStorage):
    """Tables in a local folder (the default, and what tests use with a tmp folder)."""

    root: str

    def store(self) -> PartitionStore:
        return PartitionStore(self.root)


class S3PartitionStorage(PartitionStorage):
    """Tables on S3 or an S3-compatible store (`HIR_STORAGE_URI=s3://bucket/prefix`), through dagster-aws.

    The S3Resource carries the endpoint (`HIR_S3_ENDPOINT_URL` for MinIO, moto, ...), credentials from the
    usual AWS environment, and botocore's retries with backoff (`max_attempts`).
    """

    uri: str  # s3://bucket/prefix
    s3: S3Resource
    cache_dir: str  # local staging and read cache

    def store(self) -> PartitionStore:
        return S3PartitionStore(self.uri, self.s3.get_client(), self.cache_dir)


class SourceResource(dg.ConfigurableResource):
    """The configured data source. Fields mirror hir.toml so the UI shows what a run read."""

    source: str
    window: str
    data_dir: str
    parquet_path: str = ""
    synthetic_json: str = "{}"  # overrides of SyntheticConfig, as JSON

    @classmethod
    def from_config(cls, config: HIRConfig) -> SourceResource:
        return cls(source=config.source, window=config.window, data_dir=str(config.data_dir),
                   parquet_path=config.parquet_path, synthetic_json=json.dumps(dict(config.synthetic), default=str))

    def config(self) -> HIRConfig:
        from pathlib import Path

        synthetic: dict[str, Any] = json.loads(self.synthetic_json)
        return HIRConfig(source=self.source, window=self.window, data_dir=Path(self.data_dir),
                         parquet_path=self.parquet_path, synthetic=synthetic)

    def get(self) -> Source:
        return self.config().make_source()
