"""The arrival sensor: keeps the served window's increments current (hir_assets.increments).

The served window is the newest with both `ranking_head` and `bom_index` (what `hir serve` serves); its increments are
the days of the window after it. Each tick (every 30 s, `HIR_ARRIVALS_INTERVAL_S`) requests a `catalog_increment` run
for a day of those that has begun when:
- it was never requested (so a day runs as it begins, and a backfill is not needed for the served window);
- a catalogue file it touches landed or changed since (bring-your-own: a new Parquet file under catalog/; the days it
  touches are read from its first_seen_ts; a changed MovieLens file touches every day);
- it has closed since it was last requested while open (its complete rows, for sources whose rows accrue with time).
The cursor keeps each catalogue file's size and mtime and each day's last request, so a tick neither repeats a run nor
misses a file; run keys name the day and the catalogue's fingerprint, so Dagster never launches one twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timedelta, timezone

import dagster as dg

from data_contracts import ContractError
from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.data.windows import KEY_FORMAT, WindowSpec
from hir_model.rank.increment import INCREMENT_ASSET, day_of
from hir_model.rank.serve import materialised_windows

INTERVAL_ENV = "HIR_ARRIVALS_INTERVAL_S"  # seconds between ticks (default 30)
READ_ERRORS = (OSError, ValueError)  # a file still being written, or one the contract refuses: looked at again next tick


def interval_s() -> int:
    return int(os.environ.get(INTERVAL_ENV) or 30)


def served_days(spec: WindowSpec, partition_keys: list[str], served: str, now: datetime) -> list[str]:
    """The days of the window after `served` that are increment partitions and have begun by `now`."""
    start, keys = spec.window(served).end, set(partition_keys)
    starts = (start + timedelta(days=i) for i in range(spec.length.days))
    return [d.strftime(KEY_FORMAT) for d in starts if d <= now and d.strftime(KEY_FORMAT) in keys]


def file_state(source) -> dict[str, list[int]]:
    """Each catalogue input's [size, mtime_ns]."""
    out = {}
    for path in source.catalog_inputs():
        try:
            st = path.stat()
        except OSError:
            continue
        out[str(path)] = [st.st_size, st.st_mtime_ns]
    return out


def fingerprint(files: dict[str, list[int]]) -> str:
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:12]


def touched_days(source, paths: list[str], days: list[str]) -> tuple[set[str], list[str]]:
    """(the days among `days` the files' rows were first seen on, the files that could not be read yet)."""
    out, unread = set(), []
    for path in paths:
        try:
            ts = source.first_seen_in(path)
        except ContractError as exc:
            if exc.rule == "file.parquet":  # not readable yet (still being written): looked at again next tick
                unread.append(path)
            else:  # another file-level break: every day's run fails on it and names it (the alert says so)
                out |= set(days)
            continue
        except READ_ERRORS:
            unread.append(path)
            continue
        if ts is None:
            out |= set(days)
            continue
        keys = {v.strftime(KEY_FORMAT) for v in ts.to_pylist() if v is not None}
        out |= keys & set(days)
    return out, unread


def arrival_requests(spec: WindowSpec, partition_keys: list[str], store, source, cursor: dict,
                     now: datetime) -> tuple[list[dg.RunRequest], dict, str]:
    """The tick's run requests, the next cursor and what it saw (module docstring); pure but for reading the store's
    partition lists and the catalogue files."""
    windows = materialised_windows(store)
    files = file_state(source)
    if not windows:
        return [], {**cursor, "files": files}, "no window has both ranking_head and bom_index yet"
    served = windows[-1]
    days = served_days(spec, partition_keys, served, now)
    changed = [p for p, st in files.items() if cursor.get("files", {}).get(p) != st]
    touched, unread = touched_days(source, changed, days) if changed else (set(), [])
    seen_files = {p: st for p, st in files.items() if p not in unread}
    seen_files.update({p: st for p, st in cursor.get("files", {}).items() if p in unread})  # unread: look again next tick
    fp = fingerprint(seen_files)
    requested = dict(cursor.get("requested", {}))  # day -> [fingerprint, epoch s of the request, open then]
    requests, now_s = [], now.timestamp()
    for d in days:
        last = requested.get(d)
        missing = not store.exists(INCREMENT_ASSET, d)
        closed_since = last is not None and last[2] and day_of(d).end <= now
        if (missing and last is None) or d in touched or closed_since:
            why = "closed" if closed_since and d not in touched else fp
            requests.append(dg.RunRequest(partition_key=d, run_key=f"{INCREMENT_ASSET}:{d}:{why}",
                                          tags={"hir/arrivals": why}))
            requested[d] = [fp, now_s, day_of(d).end > now]
    note = f"window {served}: days {days[0] if days else '-'}..{days[-1] if days else '-'}, {len(changed)} files changed"
    return requests, {"files": seen_files, "requested": requested, "window": served}, note


def build_arrival_sensor(job: dg.UnresolvedAssetJobDefinition, spec: WindowSpec,
                         days: dg.TimeWindowPartitionsDefinition) -> dg.SensorDefinition:
    @dg.sensor(name="hir_catalog_arrivals", job=job, minimum_interval_seconds=interval_s(),
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Runs catalog_increment for the days after the served window: as each day begins, when a "
                           "catalogue file touching it lands, and once more after it closes.")
    def hir_catalog_arrivals(context: dg.SensorEvaluationContext, storage: PartitionStorage, source: SourceResource):
        cursor = json.loads(context.cursor) if context.cursor else {}
        now = datetime.fromtimestamp(time.time(), timezone.utc)
        requests, cursor, note = arrival_requests(spec, days.get_partition_keys(), storage.store(), source.get(), cursor, now)
        context.update_cursor(json.dumps(cursor))
        if not requests:
            return dg.SkipReason(f"nothing new: {note}")
        context.log.info(f"{len(requests)} increments requested ({note})")
        return requests

    return hir_catalog_arrivals
