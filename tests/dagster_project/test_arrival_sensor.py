"""The arrival sensor (dagster_project.arrival_sensor) through `build_sensor_context`, on a bring-your-own folder and a
store whose newest window with ranking_head and bom_index is 2024-01-07: the days after it as they begin, a landed
catalogue file's days only, a file still being written looked at again, a closed day once more; the cursor repeats
nothing."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.arrival_sensor import arrival_requests
from dagster_project.definitions import build_definitions
from dagster_project.jobs import INCREMENT_JOB
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_model.config import HIRConfig
from hir_model.data.parquet_source import ParquetSource
from hir_model.storage import PartitionStore
from tests.conftest import W1, catalog_table, write_byo

UTC = timezone.utc
WEEK1 = [f"2024-01-{d}" for d in range(14, 21)]


@pytest.fixture
def setup(tmp_path):
    byo, root = write_byo(tmp_path / "byo"), tmp_path / "store"
    for asset in ("ranking_head", "bom_index"):  # what `hir serve` takes for a materialised window
        (root / asset / "2024-01-07").mkdir(parents=True)
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(root), data_dir=tmp_path / "d")
    defs = build_definitions(config)
    resources = {"storage": LocalPartitionStorage(root=str(root)), "source": SourceResource.from_config(config)}
    return byo, root, defs, resources


def tick(defs, resources, cursor=None):
    sensor = defs.resolve_sensor_def("hir_catalog_arrivals")
    with dg.build_sensor_context(cursor=cursor, resources=resources) as context:
        result = sensor(context)
        return result, context.cursor


def land(byo: Path, name: str, ids: list[str], first_seen: datetime) -> Path:
    """Products `ids` (p1's other columns) first seen at `first_seen`, in catalog/`name`."""
    base = catalog_table()
    p1 = base.filter(pa.array([e == "p1" for e in base["entity_id"].to_pylist()]))
    table = pa.concat_tables([p1] * len(ids)).set_column(0, "entity_id", pa.array(ids, pa.string()))
    table = table.set_column(3, "first_seen_ts", pa.array([first_seen] * len(ids), base.schema.field("first_seen_ts").type))
    pq.write_table(table.cast(base.schema), byo / "catalog" / name)
    return byo / "catalog" / name


def test_days_are_asked_as_they_begin_then_only_what_a_landed_file_touches(setup):
    byo, root, defs, resources = setup
    result, cursor = tick(defs, resources)
    assert [r.partition_key for r in result] == WEEK1 and all(r.job_name in (None, INCREMENT_JOB) for r in result)
    assert len({r.run_key for r in result}) == 7
    result, cursor = tick(defs, resources, cursor)
    assert isinstance(result, dg.SkipReason) and "nothing new" in result.skip_message
    for day in WEEK1:  # the runs happened
        (root / "catalog_increment" / day).mkdir(parents=True)
    land(byo, "late.parquet", ["p7", "p8"], W1 + timedelta(days=2, hours=9))  # both first seen on 2024-01-16
    result, cursor = tick(defs, resources, cursor)
    assert [r.partition_key for r in result] == ["2024-01-16"]
    assert isinstance(tick(defs, resources, cursor)[0], dg.SkipReason)
    (byo / "catalog" / "half.parquet").write_bytes(b"PAR1 not yet a whole file")  # being written: looked at next tick
    result, cursor2 = tick(defs, resources, cursor)
    assert isinstance(result, dg.SkipReason) and "half.parquet" not in json.loads(cursor2)["files"]
    land(byo, "half.parquet", ["p9"], W1 + timedelta(days=5))  # now whole: 2024-01-19
    result, _ = tick(defs, resources, cursor2)
    assert [r.partition_key for r in result] == ["2024-01-19"]


def test_an_open_day_is_asked_again_once_it_has_closed(setup):
    byo, root, defs, _ = setup
    spec = HIRConfig(source="parquet", parquet_path=str(byo)).window_spec()
    keys = defs.resolve_job_def(INCREMENT_JOB).partitions_def.get_partition_keys()
    store, source = PartitionStore(root), ParquetSource(byo)
    noon = W1 + timedelta(days=1, hours=12)  # 2024-01-15 12:00: two days have begun
    requests, cursor, _ = arrival_requests(spec, keys, store, source, {}, noon)
    assert [r.partition_key for r in requests] == WEEK1[:2]
    for day in WEEK1[:2]:
        (root / "catalog_increment" / day).mkdir(parents=True)
    requests, cursor, _ = arrival_requests(spec, keys, store, source, cursor, noon + timedelta(hours=1))
    assert requests == []
    requests, cursor, _ = arrival_requests(spec, keys, store, source, cursor, noon + timedelta(hours=13))  # 01:00 next day
    assert [r.partition_key for r in requests] == ["2024-01-15", "2024-01-16"]  # 15: closed since; 16: begun
    assert requests[0].run_key.endswith(":closed") and not requests[1].run_key.endswith(":closed")
    assert arrival_requests(spec, keys, store, source, cursor, noon + timedelta(hours=14))[0] == []


def test_nothing_is_asked_before_a_window_is_served(setup):
    byo, root, defs, resources = setup
    for asset in ("ranking_head", "bom_index"):
        (root / asset / "2024-01-07").rmdir()
    result, cursor = tick(defs, resources)
    assert isinstance(result, dg.SkipReason) and "no window has both ranking_head and bom_index" in result.skip_message
    assert json.loads(cursor)["files"]  # the catalogue's files are remembered: a later tick sees only what changes
