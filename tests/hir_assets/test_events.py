"""The ingest assets, materialised with Dagster on a bring-your-own folder."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.definitions import build_definitions
from data_contracts import EVENTS
from hir_model.config import HIRConfig
from hir_model.storage import PartitionStore
from tests.conftest import W0, events_table

KEY = "2024-01-07"
INGEST = {dg.AssetKey(k) for k in ("entity_catalog", "raw_events", "rejected_events")}


def materialize(byo: Path, tmp_path: Path, key: str = KEY) -> dg.ExecuteInProcessResult:
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store"), data_dir=tmp_path / "data")
    defs = build_definitions(config)
    job = defs.resolve_job_def("hir_window").get_subset(asset_selection=INGEST)  # this module tests ingestion alone
    return job.execute_in_process(partition_key=key, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def checks(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def test_partitions_come_from_the_source(byo, tmp_path):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path))
    job = build_definitions(config).resolve_job_def("hir_window")
    assert job.partitions_def.get_partition_keys() == ["2024-01-07", "2024-01-14"]


def test_materialise_a_window_publishes_tables_and_passes_checks(byo, tmp_path):
    result = materialize(byo, tmp_path)
    assert result.success
    evaluations = checks(result)
    assert evaluations and all(e.passed for e in evaluations.values()), [k for k, e in evaluations.items() if not e.passed]
    assert ("raw_events", "ts_in_window") in evaluations and ("entity_catalog", "relations_ends_in_catalog") in evaluations
    store = PartitionStore(tmp_path / "store")
    events = store.read("raw_events", KEY, "events")
    assert events.schema == EVENTS.schema and events.num_rows == 12
    mats = {m.asset_key.to_user_string(): m.metadata for m in result.get_asset_materialization_events() and
            [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]}
    assert mats["raw_events"]["conversions"].value == 4
    assert mats["entity_catalog"]["new_entities_by_type"].value == {"advertiser": 1, "campaign": 1, "product": 2, "user": 2}


def test_bad_rows_land_in_rejected_events_and_warn(byo, tmp_path):
    bad = events_table(W0, "x")
    types = bad.column("event_type").to_pylist()
    types[0] = "bought"
    path = byo / "events" / KEY / "bad.parquet"
    pq.write_table(bad.set_column(4, "event_type", pa.array(types)), path)
    result = materialize(byo, tmp_path)
    assert result.success  # row-level problems do not stop the pipeline ...
    evaluation = checks(result)[("raw_events", "no_rejected_rows")]
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN  # ... but they alert
    assert f"{path}: rule 'event_type_vocabulary' rejected 1 rows" in evaluation.description
    assert all(e.passed for k, e in checks(result).items() if k[1] != "no_rejected_rows")  # published data is clean
    rejected = PartitionStore(tmp_path / "store").read("rejected_events", KEY, "rejected")
    assert rejected.column("rule").to_pylist() == ["event_type_vocabulary"] and rejected.column("origin").to_pylist() == [str(path)]
    assert PartitionStore(tmp_path / "store").read("raw_events", KEY, "events").num_rows == 23


def test_failed_run_leaves_the_previous_partition_intact(byo, tmp_path):
    assert materialize(byo, tmp_path).success
    store = PartitionStore(tmp_path / "store")
    before = {f: f.read_bytes() for a in ("raw_events", "rejected_events", "entity_catalog") for f in store.files(a, KEY)}
    (byo / "events" / KEY / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    result = materialize(byo, tmp_path)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "broken.parquet" in str(failure.event_specific_data.error) and "file.parquet" in str(failure.event_specific_data.error)
    assert {f: f.read_bytes() for f in before} == before


def test_empty_window_materialises_and_warns(byo, tmp_path):
    for f in (byo / "events" / "2024-01-14").iterdir():
        f.unlink()
    result = materialize(byo, tmp_path, "2024-01-14")
    assert result.success
    evaluation = checks(result)[("raw_events", "not_empty")]
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN


def step_failure(result: dg.ExecuteInProcessResult) -> str:
    return str(next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").event_specific_data.error)


def test_a_corrupt_page_fails_at_once_naming_the_file_without_retries(byo, tmp_path):
    """A read error inside a file whose footer reads is a contract error: the window job's RetryPolicy does not rerun it."""
    from tests.hir_model.data.test_byo_cases import big_events, corrupt_a_page

    path = byo / "events" / KEY / "big.parquet"
    pq.write_table(big_events(20_000, "c"), path, compression="snappy")
    corrupt_a_page(path)
    result = materialize(byo, tmp_path)
    error = step_failure(result)
    assert str(path) in error and "rule 'file.parquet'" in error and "Corrupt snappy" in error
    assert not [e for e in result.all_events if e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED")]
    assert not PartitionStore(tmp_path / "store").files("raw_events", KEY)  # nothing half-published


def test_stray_entries_under_events_do_not_stop_the_code_location(byo, tmp_path):
    (byo / "events" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (byo / "events" / "2024-1-14").mkdir()  # a second spelling of a window: that window's run fails, naming it
    pq.write_table(events_table(W0 + timedelta(weeks=1), "s"), byo / "events" / "2024-1-14" / "part.parquet")
    assert materialize(byo, tmp_path).success  # window 2024-01-07 is untouched
    result = materialize(byo, tmp_path, "2024-01-14")
    assert not result.success
    error = step_failure(result)
    assert "2024-1-14" in error and "layout.window_folder" in error and "rename it to 2024-01-14" in error and "(12 rows)" in error


def test_check_metadata_carries_numbers_an_operator_can_chart(byo, tmp_path):
    bad = events_table(W0, "x")
    users = bad.column("user_id").to_pylist()
    users[0] = "p1"  # a product where a user is expected
    pq.write_table(bad.set_column(1, "user_id", pa.array(users)), byo / "events" / KEY / "bad.parquet")
    result = materialize(byo, tmp_path)
    assert result.success
    meta = checks(result)[("raw_events", "no_rejected_rows")].metadata
    assert meta["rejected"].value == 1 and meta["rejected.user_in_catalog"].value == 1 and meta["files_with_rejects"].value == 1
    assert isinstance(meta["rejected_fraction"], dg.FloatMetadataValue) and meta["rejected_fraction"].value == pytest.approx(1 / 24)
    mats = {e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert mats["raw_events"]["published.ts_after_first_seen"].value == 12  # the fixture's p2 before its first_seen, twice
    assert isinstance(mats["raw_events"]["rejected_fraction"], dg.FloatMetadataValue)
    assert mats["entity_catalog"]["rejected_entities"].value == 0
