"""Window partitions, derived from the configured source's span and window length."""

from __future__ import annotations

import dagster as dg

from hir_model.data.windows import KEY_FORMAT, Window, WindowSpec, utc


def window_partitions(spec: WindowSpec) -> dg.TimeWindowPartitionsDefinition:
    """One partition per window, from the first event's window to the last event's (no empty tail up to today)."""
    return dg.TimeWindowPartitionsDefinition(
        start=spec.first_start, end=spec.last_end, cron_schedule=spec.cron, fmt=KEY_FORMAT, timezone="UTC"
    )


def window_of(context: dg.AssetExecutionContext) -> Window:
    """The partition's window, [start, end) in UTC."""
    tw = context.partition_time_window
    return Window(context.partition_key, utc(tw.start), utc(tw.end))
