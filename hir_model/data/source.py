"""What every data source provides. Ingestion validates whatever a source yields against the contracts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from hir_model.data.windows import Window


@dataclass(frozen=True)
class Batch:
    """A slice of raw input and where it came from (a file path, or e.g. `synthetic:seed=7/events/2024-01-07#3`).

    `origin` is what error messages and rejected rows name, so a user can find the bad input.
    """

    origin: str
    table: pa.Table


class Source(ABC):
    """A source of events, entities and structural relations, readable window by window.

    Everything a source returns for a window ending at `end` must be knowable at `end` (causality):
    catalog rows and relations have first_seen_ts < end; events have ts inside the window.
    A source may still yield rows that break the contracts (bring-your-own data does); ingestion
    rejects them row by row or fails the file, naming the origin.
    """

    name: str

    @abstractmethod
    def span(self) -> tuple[datetime, datetime]:
        """UTC timestamps of the first and the last event. Partitions are derived from this."""

    @abstractmethod
    def catalog(self, end: datetime) -> Iterator[Batch]:
        """Every entity first seen before `end` (users included), in CATALOG_SCHEMA's columns."""

    @abstractmethod
    def relations(self, end: datetime) -> Iterator[Batch]:
        """Typed structural edges first seen before `end`, in RELATIONS_SCHEMA's columns."""

    @abstractmethod
    def events(self, window: Window) -> Iterator[Batch]:
        """The window's events in EVENTS_SCHEMA's columns, streamed in batches (memory stays flat)."""

    def prepare(self) -> None:
        """Fetch or generate whatever the source needs on disk (idempotent). Default: nothing."""

    def catalog_inputs(self) -> list[Path]:
        """The files the catalogue is read from, so a watcher sees one land or change (the arrival sensor). Default: none
        (a catalogue generated from settings changes with time alone)."""
        return []

    def first_seen_in(self, path: Path) -> pa.Array | None:
        """The first_seen_ts of the catalogue rows in one of `catalog_inputs()` (UTC timestamps), so a watcher knows which
        days a landed file touches; None: the file does not say (every day may be touched)."""
        return None
