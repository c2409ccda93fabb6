"""Automation: materialise the newest complete window once it closes."""

from __future__ import annotations

import dagster as dg

WINDOW_JOB = "hir_window"


# Not in the window job: window_evaluation (window t is judged on t+1's events, which arrive with the next run),
# objective_adapter (partitioned by window x objective) and evaluation_report (one page over all windows, not
# partitioned); each has a job of its own.
SEPARATE_ASSETS = ("window_evaluation", "objective_adapter", "evaluation_report")


def build_window_job(partitions: dg.PartitionsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """Every per-window HIR asset for one window, in dependency order; transient failures (an S3 blip) are retried."""
    return dg.define_asset_job(
        WINDOW_JOB, selection=dg.AssetSelection.all() - dg.AssetSelection.assets(*SEPARATE_ASSETS), partitions_def=partitions,
        op_retry_policy=dg.RetryPolicy(max_retries=2, delay=10, backoff=dg.Backoff.EXPONENTIAL),
        description="All HIR assets for one window, in dependency order.")


def build_window_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    """At each window boundary, run the window that just closed (stopped by default: bundled data is historical)."""
    return dg.build_schedule_from_partitioned_job(job, name="hir_newest_window", default_status=dg.DefaultScheduleStatus.STOPPED)
