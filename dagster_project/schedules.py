"""Automation: materialise the newest complete window once it closes (the window job: dagster_project.jobs)."""

from __future__ import annotations

import dagster as dg


def build_window_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    """At each window boundary, run the window that just closed (stopped by default: bundled data is historical)."""
    return dg.build_schedule_from_partitioned_job(job, name="hir_newest_window", default_status=dg.DefaultScheduleStatus.STOPPED)
