"""Alerting: one alert per failed asset check (blocking or not) and per failed run touching HIR assets.

The sensor reads runs as they end: `instance.fetch_run_status_changes` (success, failure, cancellation) and then
`get_records_for_run` for the run's check evaluations and step errors. Both work on every event-log storage:
run-sharded SQLite (`dagster dev` with an on-disk DAGSTER_HOME; run-status events are mirrored in its index
shard), consolidated SQLite and Postgres. A check evaluation alerts when its run ends.

The cursor holds, per kind of run end, the last storage id handled, plus how many alerts of the run being handled
already went out; it advances alert by alert, so a restart neither repeats nor skips an alert, and a notifier
failure stops the tick at that alert (the next tick retries it). The first tick starts from the runs that end
after it (as Dagster's run-status sensors do): history from before alerting was switched on is not replayed.
"""

from __future__ import annotations

import json
import os
import urllib.parse

import dagster as dg
from dagster import DagsterEventType

from dagster_project.notify import Alert, Notifier
from hir_assets.publication import PublicationBlocked

BATCH = 50  # run ends read per kind per tick
# a step that failed only because a blocking check failed (Dagster's own error, or ours when the audit withheld the window)
CHECK_FAILED = ("DagsterAssetCheckFailedError", PublicationBlocked.__name__)
WEBSERVER_ENV = "HIR_WEBSERVER_URL"  # the Dagster UI's base URL that alerts link to
DEFAULT_WEBSERVER = "http://127.0.0.1:3000"  # `make ui`
RUN_ENDS = {"success": DagsterEventType.RUN_SUCCESS, "failure": DagsterEventType.RUN_FAILURE,
            "canceled": DagsterEventType.RUN_CANCELED}
CURSOR_VERSION = 2  # 1 (storage ids of check and failure events) only worked on non-sharded storage
INTERVAL_ENV = "HIR_ALERT_INTERVAL_S"  # seconds between ticks (default 30)


def _run_ends(instance: dg.DagsterInstance, kind: str, after: int, limit: int = BATCH, ascending: bool = True):
    records_filter = dg.RunStatusChangeRecordsFilter(RUN_ENDS[kind], after_storage_id=after if ascending else None)
    return instance.fetch_run_status_changes(records_filter, limit=limit, ascending=ascending).records


def start_cursor(instance: dg.DagsterInstance) -> dict:
    """The newest run end of each kind: what the first tick starts after."""
    latest = {kind: _run_ends(instance, kind, 0, limit=1, ascending=False) for kind in RUN_ENDS}
    return {"v": CURSOR_VERSION, **{k: (r[0].storage_id if r else 0) for k, r in latest.items()}, "sent": [0, 0]}


def webserver_url() -> str:
    return (os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")


def run_url(run_id: str) -> str:
    return f"{webserver_url()}/runs/{run_id}"


def check_url(asset_key: dg.AssetKey, check: str) -> str:
    """The check's page in the UI (its history per window)."""
    path = "/".join(urllib.parse.quote(p, safe="") for p in asset_key.path)
    return f"{webserver_url()}/assets/{path}?{urllib.parse.urlencode({'view': 'checks', 'checkDetail': check})}"


def run_partition(run: dg.DagsterRun | None) -> str:
    """The window a run ran: its partition tag, or the range a backfill or a ranged launch tags it with."""
    if run is None:
        return ""
    tags = run.tags
    if tags.get("dagster/partition"):
        return tags["dagster/partition"]
    start, end = tags.get("dagster/asset_partition_range_start", ""), tags.get("dagster/asset_partition_range_end", "")
    return start if start == end else f"{start}...{end}"


def _check_alert(record, run: dg.DagsterRun | None) -> Alert | None:
    evaluation = record.event_log_entry.dagster_event.event_specific_data
    if evaluation.passed:
        return None
    partition = evaluation.partition or run_partition(run)
    asset = evaluation.asset_key.to_user_string()
    level = "blocking" if evaluation.blocking else evaluation.severity.value.lower()
    return Alert(kind="check", title=f"check {evaluation.check_name} failed on {asset} [{partition or 'unpartitioned'}] ({level})",
                 asset=asset, partition=partition, check=evaluation.check_name, description=evaluation.description or "",
                 run_id=record.run_id, metadata={k: str(getattr(v, "value", v)) for k, v in evaluation.metadata.items()},
                 run_url=run_url(record.run_id), check_url=check_url(evaluation.asset_key, evaluation.check_name))


def _run_alert(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str, hir_assets: set[str]) -> Alert | None:
    keys = run.asset_selection or {  # a whole-job run has no selection: its planned materialisations say what it touched
        r.event_log_entry.dagster_event.asset_key
        for r in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records}
    assets = sorted(k.to_user_string() for k in keys)
    if not assets or not set(assets) & hir_assets:
        return None
    errors = _step_errors(instance, run.run_id)
    if errors and all(cls in CHECK_FAILED for cls, _ in errors):
        return None  # the run failed only because blocking checks failed: each already has its own alert
    message = "; ".join(text for _, text in errors) or message
    partition = run_partition(run)
    return Alert(kind="run", title=f"run failed: {', '.join(assets)} [{partition or 'unpartitioned'}]",
                 asset=", ".join(assets), partition=partition, description=message.strip()[:2000], run_id=run.run_id,
                 run_url=run_url(run.run_id))


def _step_errors(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """(error class, `step: error`) per failed step: the outermost error that is not Dagster's wrapping (ours names the
    file and rule); for a step that ran out of retries, the error of its last try."""
    out = []
    for r in instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records:
        event = r.event_log_entry.dagster_event
        error = event.event_specific_data.error
        while error is not None and error.cause is not None and _wrapper(error.cls_name or ""):
            error = error.cause
        out.append((error.cls_name if error else "", f"{event.step_key}: {(error.message if error else '').strip()}"))
    return out


def _wrapper(cls_name: str) -> bool:
    return cls_name.startswith("Dagster") or cls_name == "RetryRequestedFromPolicy"


def run_alerts(instance: dg.DagsterInstance, run_id: str, failed: bool, message: str, hir_assets: set[str]) -> list[Alert]:
    """Every alert one ended run raises, in a fixed order: its failed checks, then the run's own failure."""
    run = instance.get_run_by_id(run_id)
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
    alerts = [a for a in (_check_alert(r, run) for r in records) if a is not None]
    if failed and run is not None:
        alerts += [a for a in [_run_alert(instance, run, message, hir_assets)] if a is not None]
    return alerts


def parse_cursor(text: str | None) -> dict | None:
    cursor = json.loads(text) if text else None
    return cursor if isinstance(cursor, dict) and cursor.get("v") == CURSOR_VERSION else None


def interval_s() -> int:
    return int(os.environ.get(INTERVAL_ENV) or 30)


def build_alert_sensor(hir_assets: set[str]) -> dg.SensorDefinition:
    @dg.sensor(name="hir_alerts", minimum_interval_seconds=interval_s(), default_status=dg.DefaultSensorStatus.RUNNING,
               description="One alert per failed asset check and per failed run touching HIR assets, sent when the run "
                           "ends (notifier resource: the alert log under DAGSTER_HOME, or a webhook).")
    def hir_alerts(context: dg.SensorEvaluationContext, notifier: Notifier):
        cursor = parse_cursor(context.cursor)
        if cursor is None:
            context.update_cursor(json.dumps(start_cursor(context.instance)))
            return dg.SkipReason("alerting starts now: runs that end from here on are watched")
        ends = sorted(((r.storage_id, kind, r) for kind in RUN_ENDS for r in _run_ends(context.instance, kind, cursor[kind])),
                      key=lambda x: x[0])
        sent = 0
        for storage_id, kind, record in ends:
            alerts = run_alerts(context.instance, record.run_id, kind == "failure", record.event_log_entry.message or "", hir_assets)
            done = cursor["sent"][1] if cursor["sent"][0] == storage_id else 0  # a retried run: skip what already went out
            for i, alert in enumerate(alerts[done:], done + 1):
                try:
                    notifier.send(alert)
                except Exception as exc:  # keep the cursor at the last alert that went out; retry next tick
                    context.log.warning(f"alert delivery stopped after {sent} alerts, retrying next tick: {exc}")
                    return dg.SkipReason(f"notifier failed after {sent} alerts: {exc}")
                sent += 1
                cursor["sent"] = [storage_id, i]
                context.update_cursor(json.dumps(cursor))
            cursor[kind], cursor["sent"] = storage_id, [0, 0]
            context.update_cursor(json.dumps(cursor))
        return dg.SkipReason(f"sent {sent} alerts for {len(ends)} ended runs")

    return hir_alerts
