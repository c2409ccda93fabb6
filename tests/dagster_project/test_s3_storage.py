"""HIR_STORAGE_URI=s3://... stores every asset on S3 through dagster-aws; tested against moto's server on 127.0.0.1."""

from __future__ import annotations

import io
import socket

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from dagster_project.definitions import build_definitions
from hir_model.config import HIRConfig
from hir_model.storage import S3PartitionStore

KEY = "2024-01-07"


@pytest.fixture
def s3(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                        "HIR_S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="hir-test")
    yield client
    server.stop()


def test_assets_materialise_to_s3_and_read_back_with_boto3(byo, tmp_path, s3):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri="s3://hir-test/runs/demo")
    defs = build_definitions(config)
    job = defs.resolve_job_def("hir_window")
    import dagster as dg

    result = job.execute_in_process(partition_key=KEY, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    version = s3.get_object(Bucket="hir-test", Key=f"runs/demo/raw_events/{KEY}/_CURRENT")["Body"].read().decode()
    body = s3.get_object(Bucket="hir-test", Key=f"runs/demo/raw_events/{KEY}/{version}/events.parquet")["Body"].read()
    events = pq.read_table(io.BytesIO(body))
    assert events.num_rows == 12 and set(events.column("event_type").to_pylist()) == {"impression", "click", "purchase"}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="hir-test", Prefix="runs/demo/")["Contents"]]
    assert any(k.startswith(f"runs/demo/entity_catalog/{KEY}/") and k.endswith("entities.parquet") for k in keys)
    # a re-run replaces the partition: one version left, the old one's objects deleted
    assert job.execute_in_process(partition_key=KEY, instance=dg.DagsterInstance.ephemeral()).success
    versions = {k.split("/")[4] for k in [o["Key"] for o in s3.list_objects_v2(Bucket="hir-test", Prefix=f"runs/demo/raw_events/{KEY}/")["Contents"]]
                if not k.endswith("_CURRENT")}
    assert len(versions) == 1 and versions != {version}


def test_failed_write_leaves_the_current_version(tmp_path, s3):
    store = S3PartitionStore("s3://hir-test/p", s3, tmp_path / "cache")
    with store.writing() as staging:
        staging.write_table("a", KEY, "t", pa.table({"x": [1, 2, 3]}))
    with pytest.raises(RuntimeError):
        with store.writing() as staging:
            staging.write_table("a", KEY, "t", pa.table({"x": [9]}))
            raise RuntimeError("validation failed")
    assert store.read("a", KEY, "t").column("x").to_pylist() == [1, 2, 3]
    assert store.partitions("a") == [KEY] and store.uri("a", KEY) == f"s3://hir-test/p/a/{KEY}"


def test_permanent_s3_failure_fails_with_the_s3_error(tmp_path, s3):
    store = S3PartitionStore("s3://no-such-bucket/p", s3, tmp_path / "cache")
    with pytest.raises(Exception, match="NoSuchBucket|does not exist"):
        with store.writing() as staging:
            staging.write_table("a", KEY, "t", pa.table({"x": [1]}))


def test_a_failed_blocking_check_leaves_the_s3_partition_and_its_current_pointer(byo, tmp_path, s3, monkeypatch):
    """Write, audit, publish on S3: a catalogue whose staged table breaks a blocking contract check (a writer bug: one
    entity twice) uploads nothing; `_CURRENT` and every object of the published version stay as they were."""
    import dagster as dg

    from hir_assets import events
    from tests.hir_assets.test_publication import duplicate_staged_row

    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri="s3://hir-test/runs/demo")
    job = build_definitions(config).resolve_job_def("hir_window").get_subset(asset_selection={dg.AssetKey("entity_catalog")})
    assert job.execute_in_process(partition_key=KEY, instance=dg.DagsterInstance.ephemeral()).success
    prefix = f"runs/demo/entity_catalog/{KEY}/"

    def published() -> dict[str, bytes]:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="hir-test", Prefix=prefix)["Contents"]]
        return {k: s3.get_object(Bucket="hir-test", Key=k)["Body"].read() for k in keys}

    before = published()

    duplicate_staged_row(monkeypatch, "build_catalog", events.CATALOG_ASSET, "entities")
    result = job.execute_in_process(partition_key=KEY, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    assert [e.check_name for e in result.get_asset_check_evaluations() if not e.passed] == ["unique_entity_id"]
    assert published() == before and f"{prefix}_CURRENT" in before
