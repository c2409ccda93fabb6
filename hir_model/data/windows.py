"""Time windows: the unit of partitioning, training and evaluation.

A window is [start, end) in UTC. Weekly windows start on Sunday 00:00 UTC (Dagster's default day
offset for weekly partitions), daily ones at midnight. Keys are the start date, `YYYY-MM-DD`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

KEY_FORMAT = "%Y-%m-%d"
WINDOW_LENGTHS = {"daily": timedelta(days=1), "weekly": timedelta(weeks=1)}
CRON = {"daily": "0 0 * * *", "weekly": "0 0 * * 0"}


def utc(ts: datetime) -> datetime:
    """A timezone-aware UTC datetime (naive values are taken to be UTC)."""
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


@dataclass(frozen=True)
class Window:
    key: str  # start date, YYYY-MM-DD
    start: datetime  # inclusive, UTC
    end: datetime  # exclusive, UTC

    def contains(self, ts: datetime) -> bool:
        return self.start <= utc(ts) < self.end


def floor_to_window(ts: datetime, kind: str) -> datetime:
    """The start of the window of length `kind` that contains ts."""
    ts = utc(ts).replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "daily":
        return ts
    if kind == "weekly":
        return ts - timedelta(days=(ts.weekday() + 1) % 7)  # back to Sunday
    raise ValueError(f"unknown window length {kind!r}; expected one of {sorted(WINDOW_LENGTHS)}")


@dataclass(frozen=True)
class WindowSpec:
    kind: str  # "daily" | "weekly"
    first_start: datetime  # start of the first window (aligned)
    last_end: datetime  # end of the last window (aligned, exclusive)

    @classmethod
    def covering(cls, kind: str, first_ts: datetime, last_ts: datetime) -> WindowSpec:
        """The aligned windows that cover every timestamp in [first_ts, last_ts]."""
        start = floor_to_window(first_ts, kind)
        end = floor_to_window(last_ts, kind) + WINDOW_LENGTHS[kind]
        return cls(kind, start, end)

    @property
    def length(self) -> timedelta:
        return WINDOW_LENGTHS[self.kind]

    @property
    def cron(self) -> str:
        return CRON[self.kind]

    def windows(self) -> list[Window]:
        out, start = [], self.first_start
        while start < self.last_end:
            out.append(Window(start.strftime(KEY_FORMAT), start, start + self.length))
            start += self.length
        return out

    def window(self, key: str) -> Window:
        start = utc(datetime.strptime(key, KEY_FORMAT))
        if start != floor_to_window(start, self.kind) or not (self.first_start <= start < self.last_end):
            raise KeyError(f"{key!r} is not a {self.kind} window key between "
                           f"{self.first_start:%Y-%m-%d} and {self.last_end:%Y-%m-%d}")
        return Window(key, start, start + self.length)

    def previous(self, window: Window) -> Window | None:
        start = window.start - self.length
        return None if start < self.first_start else Window(start.strftime(KEY_FORMAT), start, window.start)

    def next(self, window: Window) -> Window | None:
        return None if window.end >= self.last_end else Window(window.end.strftime(KEY_FORMAT), window.end, window.end + self.length)
