"""Bad input, case by case: each gets an error or rejected rows naming the file, the rule and the count; valid rows survive."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import EVENTS, ContractError
from hir_model.data.parquet_source import ParquetSource
from hir_model.data.tables import (CATALOG_ASSET, CATALOG_REFERENCE, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE, REJECTED_FILE,
                                   build_catalog, build_events)
from hir_model.data.windows import WindowSpec
from hir_model.storage import PartitionStore
from tests.conftest import W0, W1, events_table


def run_window(byo: Path, tmp_path: Path, key: str = "2024-01-07"):
    source = ParquetSource(byo, "weekly")
    window = WindowSpec.covering("weekly", *source.span()).window(key)
    store = PartitionStore(tmp_path / "store")
    with store.writing() as staging:
        build_catalog(source, window, staging)
    catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=CATALOG_REFERENCE)
    with store.writing() as staging:
        report = build_events(source, window, catalog, staging)
    return report, store.read(EVENTS_ASSET, key, EVENTS_FILE), store.read(EVENTS_ASSET, key, REJECTED_FILE)


def write_events(byo: Path, table: pa.Table, name: str = "part-1.parquet", key: str = "2024-01-07") -> Path:
    path = byo / "events" / key / name
    pq.write_table(table, path)
    return path


def test_valid_input_is_accepted_whole(byo, tmp_path):
    report, events, rejected = run_window(byo, tmp_path)
    assert (report.rows_in, report.accepted, report.rejected) == (12, 12, 0)
    assert events.schema == EVENTS.schema and rejected.num_rows == 0


def test_missing_column_fails_the_file(byo, tmp_path):
    path = write_events(byo, events_table(W0, "x").drop_columns(["user_id"]))
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "schema.missing_columns" and err.value.rows == 12
    assert "user_id" in str(err.value) and str(path) in str(err.value)


def test_uncastable_type_fails_the_file_and_castable_ones_pass(byo, tmp_path):
    good = events_table(W0, "x")
    write_events(byo, good.set_column(6, "value", pa.array(range(12), pa.int64())), "ints.parquet")  # int -> float casts
    bad = good.set_column(5, "ts", pa.array(["yesterday"] * 12))
    path = write_events(byo, bad.set_column(0, "event_id", pa.array([f"y{i}" for i in range(12)])), "strings.parquet")
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "schema.column_type" and "'ts'" in str(err.value)
    path.unlink()
    report, events, _ = run_window(byo, tmp_path)
    assert report.accepted == 24 and events.column("value").type == pa.float64()


@pytest.mark.parametrize("column, value, rules", [
    ("user_id", None, ["keys_not_null"]),
    ("event_type", "bought", ["event_type_vocabulary"]),
    ("entity_id", "p999", ["entity_in_catalog"]),
    ("entity_type", "user", ["entity_type_vocabulary", "entity_type_matches_catalog"]),  # p1 is a product in the catalog
    ("entity_type", "campaign", ["entity_type_matches_catalog"]),
    ("user_id", "p1", ["user_in_catalog"]),  # a product where a user is expected
    ("entity_id", "u1", ["entity_type_matches_catalog"]),  # a user where a product is expected
])
def test_bad_rows_are_rejected_with_rule_and_file(byo, tmp_path, column, value, rules):
    table = events_table(W0, "x")
    idx = table.schema.get_field_index(column)
    values = table.column(column).to_pylist()
    values[2] = values[5] = value
    path = write_events(byo, table.set_column(idx, table.schema.field(idx).with_nullable(True), pa.array(values, table.schema.field(idx).type)))
    report, events, rejected = run_window(byo, tmp_path)
    assert report.rejected == 2 and report.accepted == 22  # 12 clean rows from part-0 + 10 from the bad file
    assert report.rejected_by_origin[str(path)] == {rule: 2 for rule in rules}
    assert rejected.column("rule").to_pylist() == [",".join(rules)] * 2 and set(rejected.column("origin").to_pylist()) == {str(path)}
    assert all(f"{path}: rule '{rule}' rejected 2 rows" in report.problems() for rule in rules)
    assert sorted(rejected.column("event_id").to_pylist()) == ["x2", "x5"]
    assert rejected.column(column).to_pylist() == [value, value]  # the original values, as the file held them


def test_timestamps_outside_the_window_are_rejected(byo, tmp_path):
    table = events_table(W0, "x")
    ts = table.column("ts").to_pylist()
    ts[0], ts[1] = W0 - timedelta(microseconds=1), W1  # just before start, exactly at end (exclusive)
    path = write_events(byo, table.set_column(5, table.schema.field(5), pa.array(ts, table.schema.field(5).type)))
    report, events, rejected = run_window(byo, tmp_path)
    assert report.rejected_by_origin[str(path)] == {"ts_in_window": 2} and events.num_rows == 22


def test_duplicate_ids_keep_the_first_copy_within_and_across_files(byo, tmp_path):
    table = events_table(W0, "x")
    ids = table.column("event_id").to_pylist()
    ids[3] = ids[1]  # a repeat inside the file
    ids[4] = "a0"  # a repeat of an id accepted from part-0.parquet
    path = write_events(byo, table.set_column(0, table.schema.field(0), pa.array(ids)), "zz.parquet")
    report, events, rejected = run_window(byo, tmp_path)
    assert report.rejected_by_origin[str(path)] == {"unique_event_id": 2}
    assert events.num_rows == 22 and len(set(events.column("event_id").to_pylist())) == 22
    assert sorted(rejected.column("event_id").to_pylist()) == ["a0", "x1"]


def test_empty_partition_publishes_an_empty_table(byo, tmp_path):
    for f in (byo / "events" / "2024-01-14").iterdir():
        f.unlink()
    pq.write_table(events_table(W1, "e").slice(0, 0), byo / "events" / "2024-01-14" / "empty.parquet")
    report, events, rejected = run_window(byo, tmp_path, "2024-01-14")
    assert (report.rows_in, events.num_rows, rejected.num_rows) == (0, 0, 0) and events.schema == EVENTS.schema


def test_non_parquet_file_fails_naming_it(byo, tmp_path):
    path = byo / "events" / "2024-01-07" / "notes.parquet"
    path.write_text("user_id,entity_id\nu1,p1\n")
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "file.parquet"


def test_misnamed_window_folder_fails_its_window_only(byo, tmp_path):
    (byo / "events" / "2024-01-08").mkdir()  # a Monday: not a weekly window start; its rows belong to 2024-01-07
    write_events(byo, events_table(W0 + timedelta(days=1), "m"), key="2024-01-08")
    assert ParquetSource(byo, "weekly").window_keys() == ["2024-01-07", "2024-01-14"]  # partitions still load
    with pytest.raises(ContractError, match="2024-01-08 is not the start of a weekly window.*events/2024-01-07/") as err:
        run_window(byo, tmp_path)
    assert err.value.rule == "layout.window_folder" and err.value.rows == 12 and err.value.origin.endswith("events/2024-01-08")
    report, events, _ = run_window(byo, tmp_path / "next", "2024-01-14")  # the other window is untouched
    assert report.accepted == events.num_rows == 12


def test_catalog_rows_break_rules_one_by_one(byo, tmp_path):
    cat = pq.read_table(byo / "catalog" / "entities.parquet")
    extra = cat.slice(0, 3).set_column(0, "entity_id", pa.array(["u1", None, "x9"]))  # duplicate, null key, bad parent below
    extra = extra.set_column(2, "parent_id", pa.array([None, None, "nobody"]))
    pq.write_table(extra, byo / "catalog" / "more.parquet")
    source = ParquetSource(byo, "weekly")
    window = WindowSpec.covering("weekly", *source.span()).window("2024-01-14")
    store = PartitionStore(tmp_path / "s")
    with store.writing() as staging:
        built = build_catalog(source, window, staging)
    assert built.entities.rejected_by_rule == {"unique_entity_id": 1, "keys_not_null": 1, "parent_in_catalog": 1}
    assert built.by_type == {"advertiser": 1, "campaign": 1, "product": 3, "user": 3}
    assert built.new_by_type == {"product": 1, "user": 1}
