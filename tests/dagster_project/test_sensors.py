"""The alert sensor against a real webhook receiver on 127.0.0.1, on every event-log storage the project runs on
(run-sharded SQLite, consolidated SQLite, Postgres): one alert per failure, none repeated, none lost."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.notify import AlertLogNotifier, WebhookNotifier
from dagster_project.sensors import parse_cursor
from hir_model.config import HIRConfig
from tests.conftest import W0, events_table
from tests.dagster_project.instances import STORAGES, pg_bin, postgres_cluster, write_home

KEY, NEXT = "2024-01-07", "2024-01-14"
INGEST = ("entity_catalog", "raw_events")
STORAGE_CLASS = {"run_sharded_sqlite": "SqliteEventLogStorage", "consolidated_sqlite": "ConsolidatedSqliteEventLogStorage",
                 "postgres": "PostgresEventLogStorage"}


class Receiver:
    """A Slack-compatible webhook endpoint that records what it receives."""

    def __init__(self):
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                outer.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def postgres():
    if pg_bin() is None:
        pytest.skip("PostgreSQL server binaries are absent (apt-get install postgresql; .ci/run installs it)")
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed (pip install -e '.[dev]' brings it)")
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture(params=STORAGES)
def instance(request, tmp_path, monkeypatch):
    """An on-disk instance on each storage (not DagsterInstance.ephemeral(), whose storage is none of these)."""
    port = None
    if request.param == "postgres":
        cluster = request.getfixturevalue("postgres")
        port = cluster.port
        for name, value in (("HOST", "127.0.0.1"), ("DB", cluster.new_database()), ("USERNAME", "postgres"),
                            ("PASSWORD", "unused-trust-auth")):
            monkeypatch.setenv(f"DAGSTER_PG_{name}", value)
    with dg.DagsterInstance.from_config(str(write_home(tmp_path / "home", request.param, port))) as inst:
        assert type(inst.event_log_storage).__name__ == STORAGE_CLASS[request.param]
        yield inst


@pytest.fixture
def sqlite_instance(tmp_path):
    """The run-sharded on-disk instance alone (what `dagster dev` uses), for the cases that do not vary by storage."""
    with dg.DagsterInstance.from_config(str(write_home(tmp_path / "home", "run_sharded_sqlite"))) as inst:
        yield inst


def setup(byo: Path, tmp_path: Path):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store"))
    defs = build_definitions(config)
    return defs.resolve_job_def("hir_window"), defs.resolve_sensor_def("hir_alerts")


def subset(job, *assets: str):
    return job.get_subset(asset_selection={dg.AssetKey(a) for a in assets})


def tick(sensor, instance, notifier, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"notifier": notifier})
    result = sensor(context)
    return context.cursor, result


def plant_rejected_row(byo: Path, key: str = KEY) -> Path:
    """A second events file in window `key` with one row of an unknown event type (rejected: a WARN check fails)."""
    bad = events_table(W0 if key == KEY else W0 + timedelta(weeks=1), "x")
    types = bad.column("event_type").to_pylist()
    types[3] = "bought"
    path = byo / "events" / key / "bad.parquet"
    pq.write_table(bad.set_column(4, "event_type", pa.array(types)), path)
    return path


@pytest.mark.slow  # three storages, four runs each (~30 s); the cases below run on the run-sharded one alone
def test_checks_and_runs_alert_once_on_each_storage(instance, byo, tmp_path, receiver):
    job, sensor = setup(byo, tmp_path)
    ingest = subset(job, *INGEST)
    notifier = WebhookNotifier(url=receiver.url, log_path=str(tmp_path / "alerts.jsonl"))
    (byo / "events" / NEXT / "broken.parquet").write_bytes(b"not parquet")
    assert not ingest.execute_in_process(partition_key=NEXT, instance=instance, raise_on_error=False).success
    cursor, result = tick(sensor, instance, notifier, None)  # the first tick: history before alerting is not replayed
    assert "alerting starts now" in result.skip_message and receiver.received == [] and parse_cursor(cursor)["failure"] > 0

    path = plant_rejected_row(byo)
    assert ingest.execute_in_process(partition_key=KEY, instance=instance).success  # a WARN check fails, the run succeeds
    assert not ingest.execute_in_process(partition_key=NEXT, instance=instance, raise_on_error=False).success
    cursor, result = tick(sensor, instance, notifier, cursor)
    assert "sent 2 alerts for 2 ended runs" in result.skip_message
    check, run = [r["hir_alert"] for r in receiver.received]
    assert (check["kind"], check["asset"], check["partition"], check["check"]) == ("check", "raw_events", KEY, "no_rejected_rows")
    assert str(path) in check["description"] and check["metadata"]["rejected"] == "1"
    assert (run["kind"], run["partition"]) == ("run", NEXT) and "broken.parquet" in run["description"]
    assert "no_rejected_rows" in receiver.received[0]["text"]
    logged = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert logged == [check, run]  # the webhook keeps the local record of what it delivered
    cursor2, _ = tick(sensor, instance, notifier, cursor)  # a restarted sensor resumes from its cursor
    assert len(receiver.received) == 2 and cursor2 == cursor


def test_a_down_webhook_is_retried_on_the_next_tick(sqlite_instance, byo, tmp_path, receiver):
    job, sensor = setup(byo, tmp_path)
    cursor, _ = tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), None)
    (byo / "events" / KEY / "broken.parquet").write_bytes(b"not parquet")
    assert not subset(job, *INGEST).execute_in_process(partition_key=KEY, instance=sqlite_instance, raise_on_error=False).success
    down = WebhookNotifier(url="http://127.0.0.1:9/hook", attempts=1, timeout_s=1)
    cursor, result = tick(sensor, sqlite_instance, down, cursor)
    assert "notifier failed after 0 alerts" in result.skip_message and receiver.received == []
    cursor, _ = tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), cursor)
    assert [a["hir_alert"]["kind"] for a in receiver.received] == ["run"] and "broken.parquet" in receiver.received[0]["text"]
    tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), cursor)
    assert len(receiver.received) == 1


def test_an_alert_that_went_out_before_a_failure_is_not_sent_again(sqlite_instance, byo, tmp_path):
    """One run, two alerts (a failed check, then the run's failure), the notifier failing after the first: the next
    tick sends the second alone."""
    job, sensor = setup(byo, tmp_path)
    log = tmp_path / "alerts.jsonl"
    cursor, _ = tick(sensor, sqlite_instance, AlertLogNotifier(path=str(log)), None)
    plant_rejected_row(byo, NEXT)
    # window NEXT without graph(KEY): raw_events publishes (its rejected-rows check fails), engagement_graph fails
    run = subset(job, *INGEST, "engagement_graph").execute_in_process(partition_key=NEXT, instance=sqlite_instance,
                                                                      raise_on_error=False)
    assert not run.success

    class OneThenDown(AlertLogNotifier):
        def send(self, alert):
            if log.exists():
                raise RuntimeError("disk full")
            super().send(alert)

    cursor, result = tick(sensor, sqlite_instance, OneThenDown(path=str(log)), cursor)
    assert "notifier failed after 1 alerts" in result.skip_message
    for _ in range(2):
        cursor, _ = tick(sensor, sqlite_instance, AlertLogNotifier(path=str(log)), cursor)
    alerts = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(a["kind"], a["check"], a["partition"]) for a in alerts] == [("check", "no_rejected_rows", NEXT), ("run", "", NEXT)]
    assert "needs graph(t-1)" in alerts[1]["description"]


def test_a_leaked_timestamp_blocks_and_alerts_exactly_once(sqlite_instance, byo, tmp_path, receiver):
    """An event stamped after its window in a published file: the blocking leak guard fails, the run stops,
    and one alert (the check's; the run failure it caused is not alerted twice) reaches the webhook."""
    instance = sqlite_instance
    job, sensor = setup(byo, tmp_path)
    notifier = WebhookNotifier(url=receiver.url)
    cursor, _ = tick(sensor, instance, notifier, None)
    assert subset(job, *INGEST).execute_in_process(partition_key=KEY, instance=instance).success
    path = tmp_path / "store" / "raw_events" / KEY / "events.parquet"
    events = pq.read_table(path)
    ts = events.schema.field("ts")
    late = events.slice(0, 1).set_column(5, ts, pa.array([W0 + timedelta(days=8)], ts.type))
    pq.write_table(pa.concat_tables([events, late.set_column(0, events.schema.field(0), pa.array(["leak"]))]), path)
    downstream = subset(job, "engagement_graph", "hir_encoder")
    result = downstream.execute_in_process(partition_key=KEY, instance=instance, raise_on_error=False)
    assert not result.success
    leak = [e for e in result.get_asset_check_evaluations() if e.check_name == "no_future_edges"]
    assert len(leak) == 1 and not leak[0].passed and leak[0].blocking
    # the graph's blocking check failed: the graph was not published, and the encoder downstream never ran
    assert not result.get_asset_materialization_events() and not (tmp_path / "store" / "engagement_graph" / KEY).exists()
    assert not [e for e in result.all_events if e.is_step_start and "hir_encoder" in (e.step_key or "")]
    assert not (tmp_path / "store" / "hir_encoder" / KEY).exists()
    cursor, _ = tick(sensor, instance, notifier, cursor)
    assert [(a["hir_alert"]["asset"], a["hir_alert"]["check"], a["hir_alert"]["partition"]) for a in receiver.received] == [
        ("engagement_graph", "no_future_edges", KEY)]
    assert receiver.received[0]["hir_alert"]["metadata"]["input_rows_after_end"] == "1"
    tick(sensor, instance, notifier, cursor)
    assert len(receiver.received) == 1


def test_an_old_cursor_restarts_from_now_instead_of_failing(sqlite_instance, byo, tmp_path, receiver):
    job, sensor = setup(byo, tmp_path)
    plant_rejected_row(byo)
    assert subset(job, *INGEST).execute_in_process(partition_key=KEY, instance=sqlite_instance).success
    cursor, result = tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), json.dumps({"check": 0, "run": 0}))
    assert "alerting starts now" in result.skip_message and parse_cursor(cursor)["success"] > 0 and receiver.received == []


def test_a_step_out_of_retries_alerts_with_its_last_error(sqlite_instance, receiver):
    from dagster_project.sensors import build_alert_sensor

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=1))
    def flaky():
        raise RuntimeError("the object store answered 503")

    sensor = build_alert_sensor({"flaky"})
    cursor, _ = tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), None)
    assert not dg.materialize([flaky], instance=sqlite_instance, raise_on_error=False).success
    tick(sensor, sqlite_instance, WebhookNotifier(url=receiver.url), cursor)
    (alert,) = [r["hir_alert"] for r in receiver.received]
    assert alert["kind"] == "run" and alert["asset"] == "flaky" and alert["description"] == "flaky: RuntimeError: the object store answered 503"
