"""Alerting: one alert per failed asset check (blocking or not) and per failed run touching HIR assets.

The cursor holds the last event-log storage id handled for each kind, and it advances alert by alert,
so a restart neither repeats nor skips an alert; a notifier failure stops the tick at that alert and the
next tick retries it.
"""

from __future__ import annotations

import json

import dagster as dg
from dagster._core.events import DagsterEventType

from dagster_project.notify import Alert, Notifier

BATCH = 200
CHECK_FAILED = "DagsterAssetCheckFailedError"  # a step that failed only because a blocking check failed


def _records(instance: dg.DagsterInstance, event_type: DagsterEventType, after: int):
    return instance.event_log_storage.get_event_records(
        dg.EventRecordsFilter(event_type=event_type, after_cursor=after), limit=BATCH, ascending=True)


def _check_alert(record, instance: dg.DagsterInstance) -> Alert | None:
    evaluation = record.event_log_entry.dagster_event.event_specific_data
    if evaluation.passed:
        return None
    run = instance.get_run_by_id(record.run_id)
    partition = evaluation.partition or (run.tags.get("dagster/partition", "") if run else "")
    asset = evaluation.asset_key.to_user_string()
    level = "blocking" if evaluation.blocking else evaluation.severity.value.lower()
    return Alert(kind="check", title=f"check {evaluation.check_name} failed on {asset} [{partition or 'unpartitioned'}] ({level})",
                 asset=asset, partition=partition, check=evaluation.check_name, description=evaluation.description or "",
                 run_id=record.run_id, metadata={k: str(getattr(v, "value", v)) for k, v in evaluation.metadata.items()})


def _run_alert(record, instance: dg.DagsterInstance, hir_assets: set[str]) -> Alert | None:
    run = instance.get_run_by_id(record.run_id)
    if run is None:
        return None
    keys = run.asset_selection or {  # a whole-job run has no selection: its planned materialisations say what it touched
        r.event_log_entry.dagster_event.asset_key
        for r in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records}
    assets = sorted(k.to_user_string() for k in keys)
    if not assets or not set(assets) & hir_assets:
        return None
    errors = _step_errors(instance, run.run_id)
    if errors and all(cls == CHECK_FAILED for cls, _ in errors):
        return None  # the run failed only because blocking checks failed: each already has its own alert
    message = "; ".join(text for _, text in errors) or record.event_log_entry.message
    partition = run.tags.get("dagster/partition", "")
    return Alert(kind="run", title=f"run failed: {', '.join(assets)} [{partition or 'unpartitioned'}]",
                 asset=", ".join(assets), partition=partition, description=message.strip()[:2000], run_id=run.run_id)


def _step_errors(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """(error class, `step: error`) per failed step: the outermost non-Dagster error (ours names the file and rule)."""
    out = []
    for r in instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records:
        event = r.event_log_entry.dagster_event
        error = event.event_specific_data.error
        while error is not None and error.cause is not None and (error.cls_name or "").startswith("Dagster"):
            error = error.cause
        out.append((error.cls_name if error else "", f"{event.step_key}: {(error.message if error else '').strip()}"))
    return out


def build_alert_sensor(hir_assets: set[str]) -> dg.SensorDefinition:
    @dg.sensor(name="hir_alerts", minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
               description="One alert per failed asset check and per failed run touching HIR assets (notifier resource).")
    def hir_alerts(context: dg.SensorEvaluationContext, notifier: Notifier):
        cursor = json.loads(context.cursor) if context.cursor else {"check": 0, "run": 0}
        sent = 0
        try:
            for kind, event_type in (("check", DagsterEventType.ASSET_CHECK_EVALUATION), ("run", DagsterEventType.RUN_FAILURE)):
                for record in _records(context.instance, event_type, cursor[kind]):
                    alert = (_check_alert(record, context.instance) if kind == "check"
                             else _run_alert(record, context.instance, hir_assets))
                    if alert is not None:
                        notifier.send(alert)
                        sent += 1
                    cursor[kind] = record.storage_id
                    context.update_cursor(json.dumps(cursor))
        except Exception as exc:  # keep the cursor at the last alert that went out; retry next tick
            context.log.error(f"alert delivery stopped after {sent} alerts: {exc}")
            return dg.SkipReason(f"notifier failed after {sent} alerts: {exc}")
        return dg.SkipReason(f"sent {sent} alerts")

    return hir_alerts
