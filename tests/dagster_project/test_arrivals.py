"""New items served from the day they arrive, end to end: a bring-your-own world (two interests, trail running shoes and
espresso coffee) whose first window is materialised by the real window job; `hir serve` running on it; a new catalogue
file lands; the arrival sensor asks for the day it touches; the increment runs through the definitions' job; the running
server answers with the new items, no restart, each to the users of its interest. Also: a planted row dated after the
day fails the increment's blocking check and leaves the published day byte for byte; the sensor's cursor repeats nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.arrival_sensor import arrival_requests
from dagster_project.definitions import build_definitions
from dagster_project.jobs import INCREMENT_JOB, WINDOW_JOB
from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA
from hir_assets import increments as increment_assets
from hir_assets.publication import PublicationBlocked
from hir_model.config import HIRConfig
from hir_model.data.parquet_source import ParquetSource
from hir_model.rank.increment import INCREMENT_ASSET, WITHIN_DAY_CHECK, read_increment
from hir_model.storage import PartitionStore
from tests.hir_model.rank.test_serve import server

pytestmark = pytest.mark.slow  # the real window job on one window (~20-40 s on 2 cores), then hir serve (~5-10 s)

UTC = timezone.utc
W0 = datetime(2024, 1, 7, tzinfo=UTC)  # a Sunday: windows 2024-01-07 and 2024-01-14
W1 = W0 + timedelta(weeks=1)
TS = CATALOG_SCHEMA.field("first_seen_ts").type
TOPICS = {"run": ("Trail running shoe", "grippy sole, cushioned, for mountain trails and long runs", "running"),
          "coffee": ("Espresso coffee beans", "dark roast, rich crema, for the espresso machine at home", "coffee")}
PER_TOPIC, FANS = 24, 10
RUN_CONFIG = {"ops": {"hir_encoder": {"config": {"launch": "in_process", "steps": 8}},
                      "bom_index": {"config": {"max_posting_share": 1.0}}}}
LANDED = W1 + timedelta(days=1, hours=9)  # the new items' first_seen_ts: 2024-01-15 09:00
DAY = "2024-01-15"


def catalog_rows(rows: list[tuple]) -> pa.Table:
    """(id, type, parent, first seen, title, description, category) rows in CATALOG_SCHEMA."""
    cols = list(zip(*rows))
    n = len(rows)
    return pa.table({"entity_id": cols[0], "entity_type": cols[1], "parent_id": pa.array(cols[2], pa.string()),
                     "first_seen_ts": pa.array(cols[3], TS), "title": pa.array(cols[4], pa.string()),
                     "description": pa.array(cols[5], pa.string()), "category": pa.array(cols[6], pa.string()),
                     "image_uri": pa.nulls(n, pa.string()), "video_uri": pa.nulls(n, pa.string()),
                     "features": pa.nulls(n, CATALOG_SCHEMA.field("features").type)}, schema=CATALOG_SCHEMA)


def world(root: Path) -> Path:
    """Two advertisers, PER_TOPIC products each, FANS users per topic; in W0 each user views, clicks and buys products
    of their topic; W1 holds a few more of those events (so the windows are W0 and W1)."""
    rng = np.random.default_rng(0)
    rows, events = [], {W0: [], W1: []}
    for topic, (title, desc, cat) in TOPICS.items():
        rows.append((f"adv-{topic}", "advertiser", None, W0, f"{cat.title()} House", f"Everything {cat}", cat))
        for i in range(PER_TOPIC):
            rows.append((f"{topic}-{i:02d}", "product", f"adv-{topic}", W0, f"{title} no. {i}", desc, cat))
        for u in range(FANS):
            rows.append((f"user-{topic}-{u}", "user", None, W0, None, None, None))
            for start, picks in ((W0, 6), (W1, 1)):
                for j, item in enumerate(rng.choice(PER_TOPIC, picks, replace=False)):
                    at = start + timedelta(hours=6 * j + u % 5 + 1)
                    for k, kind in enumerate(("impression", "click", "purchase" if j % 2 else "add_to_cart")):
                        events[start].append((f"user-{topic}-{u}", f"{topic}-{item:02d}", kind, at + timedelta(minutes=k)))
    (root / "catalog").mkdir(parents=True)
    pq.write_table(catalog_rows(rows), root / "catalog" / "entities.parquet")
    for start, evs in events.items():
        folder = root / "events" / start.strftime("%Y-%m-%d")
        folder.mkdir(parents=True)
        cols = list(zip(*evs))
        pq.write_table(pa.table({"event_id": [f"e{start:%d}-{i}" for i in range(len(evs))], "user_id": cols[0],
                                 "entity_id": cols[1], "entity_type": ["product"] * len(evs), "event_type": cols[2],
                                 "ts": pa.array(cols[3], EVENTS_SCHEMA.field("ts").type),
                                 "value": pa.nulls(len(evs), pa.float64())}, schema=EVENTS_SCHEMA), folder / "part-0.parquet")
    return root


def land(byo: Path, name: str, rows: list[tuple]) -> Path:
    """A catalogue file landing whole: written under a hidden name (the source ignores it), then renamed."""
    tmp, final = byo / "catalog" / f"_{name}", byo / "catalog" / name
    pq.write_table(catalog_rows(rows), tmp)
    tmp.rename(final)
    return final


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("arrivals")
    byo, store = world(root / "byo"), root / "store"
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(store),
                       data_dir=root / "data")
    defs = build_definitions(config)
    with dg.DagsterInstance.ephemeral() as instance:
        assert defs.resolve_job_def(WINDOW_JOB).execute_in_process(partition_key="2024-01-07", instance=instance,
                                                                    run_config=RUN_CONFIG).success
        yield root, byo, store, defs, instance


def tick(defs: dg.Definitions, store: Path, byo: Path, cursor: dict) -> tuple[list[dg.RunRequest], dict]:
    """One evaluation of the arrival sensor's logic, as its tick runs it (now: long after the bundled days)."""
    job = defs.resolve_job_def(INCREMENT_JOB)
    spec = HIRConfig(source="parquet", parquet_path=str(byo)).window_spec()
    requests, cursor, _ = arrival_requests(spec, job.partitions_def.get_partition_keys(), PartitionStore(store),
                                           ParquetSource(byo), cursor, datetime.now(UTC))
    return requests, cursor


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_landed_catalogue_file_is_served_by_a_running_server_without_restart(pipeline, tmp_path):
    root, byo, store, defs, instance = pipeline
    started = time.perf_counter()
    requests, cursor = tick(defs, store, byo, {})
    assert [r.partition_key for r in requests] == [f"2024-01-{d}" for d in range(14, 21)]  # the served window's days
    assert tick(defs, store, byo, cursor)[0] == []  # asked once: a second tick repeats nothing
    with server(store, tmp_path / "serve.log", "--poll-seconds", "1") as (proc, url), httpx.Client(base_url=url, timeout=30) as client:
        health = client.get("/health").json()
        assert health["window"] == "2024-01-07" and health["increments"] == [] and health["arrived_items"] == 0
        fan = {t: f"user-{t}-0" for t in TOPICS}
        assert client.get("/recommend", params={"user": fan["run"], "scope": "new"}).json()["items"] == []

        landed = land(byo, "arrivals-2024-01-15.parquet", [
            ("run-new", "product", "adv-run", LANDED, "Trail running shoe no. 99", TOPICS["run"][1], "running"),
            ("coffee-new", "product", "adv-coffee", LANDED, "Espresso coffee beans no. 99", TOPICS["coffee"][1], "coffee")])
        requests, cursor = tick(defs, store, byo, cursor)
        assert [r.partition_key for r in requests] == [DAY]  # the file touches that day only
        result = defs.resolve_job_def(INCREMENT_JOB).execute_in_process(partition_key=DAY, instance=instance,
                                                                       tags=requests[0].tags)
        assert result.success
        inc = read_increment(PartitionStore(store).partition_dir(INCREMENT_ASSET, DAY))
        assert sorted(inc.item_ids) == ["coffee-new", "run-new"] and inc.single_token == 0  # both placed by the content map

        deadline = time.monotonic() + 30
        while not (health := client.get("/health").json())["increments"]:  # the server's next poll, no restart
            assert time.monotonic() < deadline and proc.poll() is None, "hir serve did not pick the increment up"
            time.sleep(0.2)
        served_after = time.perf_counter() - started
        assert health["increments"] == [{"day": DAY, "items": 2, "digest": inc.digest}] and health["arrived_items"] == 2
        assert health["switches"] == 0 and health["window"] == "2024-01-07"
        for topic, other in (("run", "coffee"), ("coffee", "run")):
            body = client.get("/recommend", params={"user": fan[topic], "scope": "new"}).json()
            assert [i["entity_id"] for i in body["items"]] == [f"{topic}-new", f"{other}-new"], body
            assert body["increments"] == [DAY]
            every = client.get("/recommend", params={"user": fan[topic], "k": 100}).json()["items"]
            ranked = [i["entity_id"] for i in every]
            assert ranked.index(f"{topic}-new") < ranked.index(f"{other}-new")  # among every item too
        assert tick(defs, store, byo, cursor)[0] == []  # nothing landed since
    assert landed.is_file() and served_after < 120


def test_a_row_dated_after_the_day_blocks_the_increment_and_leaves_it_as_it_was(pipeline, monkeypatch):
    root, byo, store, defs, instance = pipeline
    job = defs.resolve_job_def(INCREMENT_JOB)
    day = "2024-01-16"
    land(byo, "arrivals-2024-01-16.parquet",
         [("coffee-late", "product", "adv-coffee", W1 + timedelta(days=2, hours=8), "Espresso coffee beans no. 77",
           TOPICS["coffee"][1], "coffee")])
    assert job.execute_in_process(partition_key=day, instance=instance).success
    folder = PartitionStore(store).partition_dir(INCREMENT_ASSET, day)
    before = digest(folder)

    def plant(real):  # a writer bug: the staged items file gains a row first seen an hour after the day's end
        def write(path, inc):
            real(path, inc)
            items = pq.read_table(Path(path) / "items.parquet")
            late = items.slice(0, 1).set_column(2, "first_seen_ts",
                                                 pa.array([W1 + timedelta(days=3, hours=1)], items.schema.field(2).type))
            late = late.set_column(0, "entity_id", pa.array(["future"])).cast(items.schema)
            pq.write_table(pa.concat_tables([items, late]), Path(path) / "items.parquet")
        return write

    monkeypatch.setattr(increment_assets, "write_increment", plant(increment_assets.write_increment))
    result = job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert [e.event_specific_data.error.cls_name for e in failures] == [PublicationBlocked.__name__]
    evaluations = {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
                   if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION}
    within = evaluations[WITHIN_DAY_CHECK]
    assert not within.passed and within.partition == day and "future (row 1" in within.description
    assert digest(folder) == before  # nothing published: the day's files byte for byte
    assert json.loads((folder / "increment.json").read_text())["items"] == 1
