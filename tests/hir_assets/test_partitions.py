"""Window partitions as Dagster pages them for the UI: the newest windows first are the data's last windows, not the
weeks between the data's end and today (what left "Plots -> Partitions" empty)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from dagster._core.definitions.partitions.context import PartitionLoadingContext  # not re-exported by dagster
from dagster._core.definitions.temporal_context import TemporalContext
from dagster._time import get_current_datetime

from hir_assets.partitions import window_partitions
from hir_model.data.windows import WindowSpec

UTC = timezone.utc
PATCH = "patches/dagster-paginated-partition-keys-end.patch"
PLOT_LIMIT = 120  # the UI's AssetPartitionMetadataPlots asks for the newest 120 partition keys
# MovieLens's 32 weekly windows, and 53 daily ones: both ended long before today
SPECS = [WindowSpec("weekly", datetime(1997, 9, 14, tzinfo=UTC), datetime(1998, 4, 26, tzinfo=UTC)),
         WindowSpec("daily", datetime(1998, 3, 1, tzinfo=UTC), datetime(1998, 4, 23, tzinfo=UTC))]


def pages(partitions, limit: int, ascending: bool) -> list[list[str]]:
    """Every page of keys, as GraphQL's partitionKeyConnection hands them out (the cursor carried over)."""
    context = PartitionLoadingContext(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                                      dynamic_partitions_store=None)
    out, cursor = [], None
    while len(out) < 100:
        page = partitions.get_paginated_partition_keys(context=context, limit=limit, ascending=ascending, cursor=cursor)
        out.append(page.results)
        if not page.has_more:
            return out
        cursor = page.cursor
    raise AssertionError(f"more than 100 pages; the installed Dagster lacks {PATCH}")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_the_newest_windows_first_are_the_datas_last_windows(spec):
    partitions = window_partitions(spec)
    keys = [w.key for w in spec.windows()]
    assert partitions.get_partition_keys() == keys
    newest = pages(partitions, PLOT_LIMIT, ascending=False)[0]
    assert newest == keys[::-1][:PLOT_LIMIT], f"newest {newest[:3]}... instead of {keys[-1]}: apply {PATCH}"
    assert sum(pages(partitions, 10, ascending=False), []) == keys[::-1]  # page by page back to the first window
    assert sum(pages(partitions, 10, ascending=True), []) == keys
