"""The alert sensor against a real webhook receiver on 127.0.0.1: one alert per failure, none repeated."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.notify import AlertLogNotifier, WebhookNotifier
from hir_model.config import HIRConfig
from tests.conftest import W0, events_table

KEY = "2024-01-07"


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


def setup(byo: Path, tmp_path: Path):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store"))
    defs = build_definitions(config)
    return defs.resolve_job_def("hir_window"), defs.resolve_sensor_def("hir_alerts"), dg.DagsterInstance.ephemeral()


def tick(sensor, instance, notifier, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"notifier": notifier})
    result = sensor(context)
    return context.cursor, result


def test_one_alert_per_failed_check_and_none_twice(byo, tmp_path, receiver):
    bad = events_table(W0, "x")
    types = bad.column("event_type").to_pylist()
    types[3] = "bought"
    path = byo / "events" / KEY / "bad.parquet"
    pq.write_table(bad.set_column(4, "event_type", pa.array(types)), path)
    job, sensor, instance = setup(byo, tmp_path)
    assert job.execute_in_process(partition_key=KEY, instance=instance).success
    notifier = WebhookNotifier(url=receiver.url)
    cursor, _ = tick(sensor, instance, notifier, None)
    assert len(receiver.received) == 1
    alert = receiver.received[0]["hir_alert"]
    assert (alert["asset"], alert["partition"], alert["check"]) == ("raw_events", KEY, "no_rejected_rows")
    assert str(path) in alert["description"] and alert["metadata"]["rejected"] == "1"
    assert "no_rejected_rows" in receiver.received[0]["text"]
    cursor2, _ = tick(sensor, instance, notifier, cursor)  # a restarted sensor resumes from its cursor
    assert len(receiver.received) == 1 and cursor2 == cursor


def test_failed_run_alerts_once_and_a_down_webhook_is_retried(byo, tmp_path, receiver):
    (byo / "events" / KEY / "broken.parquet").write_bytes(b"not parquet")
    job, sensor, instance = setup(byo, tmp_path)
    assert not job.execute_in_process(partition_key=KEY, instance=instance, raise_on_error=False).success
    down = WebhookNotifier(url="http://127.0.0.1:9/hook", attempts=1, timeout_s=1)
    cursor, result = tick(sensor, instance, down, None)
    assert "notifier failed after 0 alerts" in result.skip_message and receiver.received == []
    cursor, _ = tick(sensor, instance, WebhookNotifier(url=receiver.url), cursor)
    assert [a["hir_alert"]["kind"] for a in receiver.received] == ["run"]
    assert "broken.parquet" in receiver.received[0]["hir_alert"]["description"]
    tick(sensor, instance, WebhookNotifier(url=receiver.url), cursor)
    assert len(receiver.received) == 1


def test_alert_log_is_the_default_sink(byo, tmp_path):
    (byo / "events" / "2024-01-14").joinpath("part-0.parquet").unlink()
    job, sensor, instance = setup(byo, tmp_path)
    for key in ("2024-01-07", "2024-01-14"):  # in order: the graph of a window reads the previous one
        assert job.execute_in_process(partition_key=key, instance=instance).success
    log = tmp_path / "alerts.jsonl"
    tick(sensor, instance, AlertLogNotifier(path=str(log)), None)
    alerts = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(a["check"], a["partition"]) for a in alerts] == [("not_empty", "2024-01-14")]


def test_a_leaked_timestamp_blocks_and_alerts_exactly_once(byo, tmp_path, receiver):
    """An event stamped after its window in a published file: the blocking leak guard fails, the run stops,
    and one alert (the check's; the run failure it caused is not alerted twice) reaches the webhook."""
    from datetime import timedelta

    job, sensor, instance = setup(byo, tmp_path)
    ingest = job.get_subset(asset_selection={dg.AssetKey(k) for k in ("entity_catalog", "raw_events")})
    assert ingest.execute_in_process(partition_key=KEY, instance=instance).success
    path = tmp_path / "store" / "raw_events" / KEY / "events.parquet"
    events = pq.read_table(path)
    ts = events.schema.field("ts")
    late = events.slice(0, 1).set_column(5, ts, pa.array([W0 + timedelta(days=8)], ts.type))
    pq.write_table(pa.concat_tables([events, late.set_column(0, events.schema.field(0), pa.array(["leak"]))]), path)
    downstream = job.get_subset(asset_selection={dg.AssetKey("engagement_graph"), dg.AssetKey("hir_encoder")})
    result = downstream.execute_in_process(partition_key=KEY, instance=instance, raise_on_error=False)
    assert not result.success
    leak = [e for e in result.get_asset_check_evaluations() if e.check_name == "no_future_edges"]
    assert len(leak) == 1 and not leak[0].passed and leak[0].blocking
    # the graph's blocking check failed: the encoder downstream of it never ran (no step start, no materialisation)
    assert {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()} == {"engagement_graph"}
    assert not [e for e in result.all_events if e.is_step_start and "hir_encoder" in (e.step_key or "")]
    assert not (tmp_path / "store" / "hir_encoder" / KEY).exists()
    notifier = WebhookNotifier(url=receiver.url)
    cursor, _ = tick(sensor, instance, notifier, None)
    assert [(a["hir_alert"]["asset"], a["hir_alert"]["check"], a["hir_alert"]["partition"]) for a in receiver.received] == [
        ("engagement_graph", "no_future_edges", KEY)]
    assert receiver.received[0]["hir_alert"]["metadata"]["input_rows_after_end"] == "1"
    tick(sensor, instance, notifier, cursor)
    assert len(receiver.received) == 1
