"""The alert path end to end, as `make ui` runs it: `dagster dev` (webserver + daemon) on an on-disk instance made from
deploy/dagster.local.yaml, a planted failing check, and exactly one alert at a webhook receiver on 127.0.0.1 and in the
alert log; then the failed check in the UI, in headless Chromium where Debian's package is installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_byo
from tests.dagster_project.instances import free_port
from dagster._core.execution.backfill import BulkActionStatus  # not re-exported by dagster

from dagster_project.backfill import launch_backfill
from tests.dagster_project.test_sensors import KEY, NEXT, Receiver, plant_rejected_row

REPO = Path(__file__).resolve().parents[2]
TICK_S = 5  # the sensor's interval here (HIR_ALERT_INTERVAL_S); 30 s by default
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


def sensor_state(instance: dg.DagsterInstance):
    from dagster._core.scheduler.instigation import InstigatorType  # not re-exported by dagster

    return next((s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR) if s.name == "hir_alerts"), None)


def wait_for(what: str, predicate, timeout: float, proc: subprocess.Popen, log: Path):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {proc.returncode} while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    raise TimeoutError(f"no {what} within {timeout:.0f} s; dagster dev said:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """dagster dev up, the sensor past its first tick, then one run whose rejected-rows check fails; what came of it."""
    tmp = tmp_path_factory.mktemp("alerts_e2e")
    byo, home, receiver = write_byo(tmp / "byo"), tmp / "home", Receiver()
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.local.yaml", home / "dagster.yaml")  # what `make ui` gets
    env = {**os.environ, "DAGSTER_HOME": str(home), "HIR_SOURCE": "parquet", "HIR_PARQUET_PATH": str(byo), "HIR_WINDOW": "weekly",
           "HIR_STORAGE_URI": str(tmp / "store"), "HIR_ALERT_WEBHOOK_URL": receiver.url, "HIR_ALERT_INTERVAL_S": str(TICK_S),
           "DAGSTER_DISABLE_TELEMETRY": "1"}
    port, log = free_port(), tmp / "dagster_dev.log"
    with dg.DagsterInstance.from_config(str(home)):  # its storage made before dagster dev starts (two makers race)
        pass
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "dev", "-h", "127.0.0.1", "-p", str(port),
                                 "-w", "workspace.yaml"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/server_info", timeout=2).status == 200
        except OSError:
            return False

    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"  # run-sharded, as `make ui` uses
            wait_for("webserver", up, 240, proc, log)
            wait_for("first sensor tick", lambda: (s := sensor_state(instance)) and s.instigator_data and s.instigator_data.cursor,
                     180, proc, log)
            from dagster_project.definitions import build_definitions
            from hir_model.config import HIRConfig

            path = plant_rejected_row(byo)
            defs = build_definitions(HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp / "store")))
            ingest = defs.resolve_job_def("hir_window").get_subset(asset_selection={dg.AssetKey("entity_catalog"), dg.AssetKey("raw_events")})
            assert ingest.execute_in_process(partition_key=KEY, instance=instance).success  # a WARN check fails
            ended = time.time()
            wait_for("alert at the webhook", lambda: receiver.received, 4 * TICK_S + 30, proc, log)
            delay = time.time() - ended
            time.sleep(3 * TICK_S)  # further ticks: nothing more may arrive
            state = sensor_state(instance)
            ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100)
            received = list(receiver.received)
            # a range backfill as the UI launches it (one window per run, each tagged with a one-window range), a
            # rejected row in both windows: each run's check result must belong to its window, and so must its alert
            plant_rejected_row(byo, NEXT)
            backfill_id = launch_backfill(url, ["entity_catalog", "raw_events"], [KEY, NEXT])
            wait_for("the backfill", lambda: instance.get_backfill(backfill_id).status != BulkActionStatus.REQUESTED, 600, proc, log)
            wait_for("an alert per window", lambda: len(receiver.received) >= len(received) + 2, 4 * TICK_S + 60, proc, log)
            backfill_runs = [r for r in instance.get_runs() if r.tags.get("dagster/backfill") == backfill_id]
            # a blocking check failing on one window, backfilled from the UI's path: the graph's leak guard on NEXT
            graph = defs.resolve_job_def("hir_window").get_subset(asset_selection={dg.AssetKey("engagement_graph")})
            assert graph.execute_in_process(partition_key=KEY, instance=instance).success
            plant_late_row(tmp / "store" / "raw_events" / NEXT / "events.parquet")
            blocked_id = launch_backfill(url, ["engagement_graph"], [NEXT])
            wait_for("the blocked backfill", lambda: instance.get_backfill(blocked_id).status != BulkActionStatus.REQUESTED,
                     600, proc, log)
            (blocked,) = [r for r in instance.get_runs() if r.tags.get("dagster/backfill") == blocked_id]
            wait_for("the blocked window's alert", lambda: len(receiver.received) >= len(received) + 3, 4 * TICK_S + 60, proc, log)
        yield {"url": url, "home": home, "received": received, "delay": delay, "ticks": ticks,
               "log": log.read_text(errors="replace"), "bad_file": path, "tmp": tmp,
               "backfill": instance.get_backfill(backfill_id), "backfill_runs": backfill_runs, "blocked": blocked,
               "blocked_backfill": instance.get_backfill(blocked_id),
               "later": list(receiver.received[len(received):]),
               "partitions": defs.resolve_asset_graph().get(dg.AssetKey("engagement_graph")).partitions_def}
    finally:
        receiver.close()
        stop(proc)


def plant_late_row(path: Path) -> None:
    """One more event in a published events file, dated at its window's end (a broken upstream writer)."""
    events = pq.read_table(path)
    ts = events.schema.field("ts")
    end = max(events.column("ts").to_pylist()) + timedelta(weeks=1)
    late = events.slice(0, 1).set_column(5, ts, pa.array([end], ts.type))
    pq.write_table(pa.concat_tables([events, late.set_column(0, events.schema.field(0), pa.array(["leak"]))]), path)


def stop(proc: subprocess.Popen) -> None:
    """dagster dev and its webserver, daemon and code server (one process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_a_planted_failing_check_alerts_exactly_once_within_two_ticks(planted):
    (message,) = planted["received"]
    alert = message["hir_alert"]
    assert (alert["kind"], alert["asset"], alert["check"], alert["partition"]) == ("check", "raw_events", "no_rejected_rows", KEY)
    assert str(planted["bad_file"]) in alert["description"]
    assert planted["delay"] <= 2 * TICK_S + 5, f"the alert took {planted['delay']:.1f} s, more than two ticks"
    logged = [json.loads(line) for line in (planted["home"] / "alerts.jsonl").read_text().splitlines()]
    assert logged == [alert] + [m["hir_alert"] for m in planted["later"]]  # the log records what the webhook got
    from dagster._core.scheduler.instigation import TickStatus  # not re-exported by dagster

    statuses = [t.status for t in planted["ticks"]]
    assert len(statuses) >= 3 and TickStatus.FAILURE not in statuses, statuses
    errors = [line for line in planted["log"].splitlines() if "hir_alerts" in line and ("Error" in line or "error" in line)]
    assert not errors, errors


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
def test_the_ui_shows_the_failed_check(planted):
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.add_locator_handler(page.get_by_text("Join the Dagster community"), lambda: page.get_by_role("button", name="Skip").click())
        page.goto(f"{planted['url']}/assets/raw_events?view=checks", wait_until="networkidle")
        page.get_by_text("no_rejected_rows", exact=True).first.wait_for(timeout=60_000)
        artifacts = REPO / ".hir" / "test-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = artifacts / "ui_failed_check.png"
        try:
            page.get_by_text("no_rejected_rows", exact=True).first.click()  # the check's page: its latest evaluation
            page.get_by_text("rejected_share", exact=True).first.wait_for(timeout=60_000)  # numeric metadata, plotted
            failed = page.get_by_text("Failed", exact=True)
            failed.nth(1).wait_for(timeout=30_000)  # in the check list and as the latest evaluation's result
            # the check's Partitions tab: its status per window, both windows failed by the backfill
            page.get_by_text("Partitions", exact=True).nth(1).click()
            page.get_by_text("Failed (2)", exact=True).wait_for(timeout=60_000)
            for window in (KEY, NEXT):
                page.get_by_text(window, exact=True).first.wait_for(timeout=30_000)
            # the blocked window: the graph's Partitions tab counts it failed, the other one materialised
            page.goto(f"{planted['url']}/assets/engagement_graph?view=partitions", wait_until="networkidle")
            page.get_by_text("Failed (1)", exact=True).wait_for(timeout=60_000)
            page.get_by_text("Materialized (1)", exact=True).wait_for(timeout=30_000)
        finally:
            page.screenshot(path=str(shot), full_page=True)
            browser.close()


def test_a_range_backfill_records_each_windows_check_and_alerts_it(planted):
    """Each backfill run is tagged with a one-window range (no dagster/partition tag); its check result belongs to its
    window, readable per window through Dagster's API, and each window's alert names it and links the run."""
    runs = planted["backfill_runs"]
    assert planted["backfill"].status == BulkActionStatus.COMPLETED_SUCCESS  # warnings fail checks, not windows
    assert sorted(r.tags["dagster/asset_partition_range_start"] for r in runs) == [KEY, NEXT]
    assert not any("dagster/partition" in r.tags for r in runs)
    key = dg.AssetCheckKey(dg.AssetKey("raw_events"), "no_rejected_rows")
    with dg.DagsterInstance.from_config(str(planted["home"])) as instance:
        for window in (KEY, NEXT):
            (run,) = [r for r in runs if r.tags["dagster/asset_partition_range_start"] == window]
            records = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
            (record,) = [r for r in records if r.run_id == run.run_id]
            assert record.partition == window and record.status.value == "FAILED"
    backfill_alerts = {a["hir_alert"]["partition"]: a["hir_alert"] for a in planted["later"][:2]}
    assert set(backfill_alerts) == {KEY, NEXT}
    for window, alert in backfill_alerts.items():
        assert alert["check"] == "no_rejected_rows" and window in alert["title"] and "[unpartitioned]" not in alert["title"]
        assert alert["run_url"] == f"http://127.0.0.1:3000/runs/{alert['run_id']}"


def test_a_blocked_window_fails_its_partition_and_alerts_once(planted):
    """The graph's leak guard fails on NEXT in a backfill: the run fails, NEXT's graph is not published, the backfill
    ends failed (it said "Succeeded" while its runs had published), the partition reads failed through Dagster's API,
    and one alert names asset, check, window and run."""
    blocked = planted["blocked"]
    assert blocked.status == dg.DagsterRunStatus.FAILURE and not (planted["tmp"] / "store" / "engagement_graph" / NEXT).exists()
    assert planted["blocked_backfill"].status == BulkActionStatus.COMPLETED_FAILED
    with dg.DagsterInstance.from_config(str(planted["home"])) as instance:
        status = instance.get_status_by_partition(dg.AssetKey("engagement_graph"), [KEY, NEXT], planted["partitions"])
        assert status == {KEY: dg.AssetPartitionStatus.MATERIALIZED, NEXT: dg.AssetPartitionStatus.FAILED}
    (alert,) = [a["hir_alert"] for a in planted["later"][2:]]
    assert (alert["asset"], alert["check"], alert["partition"], alert["run_id"]) == (
        "engagement_graph", "no_future_edges", NEXT, blocked.run_id)
    assert alert["check_url"].endswith("/assets/engagement_graph?view=checks&checkDetail=no_future_edges")
