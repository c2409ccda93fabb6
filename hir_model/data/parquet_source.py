"""Bring your own data: a folder of Parquet files that follow the contracts.

Layout::

    <path>/events/<window key>/*.parquet   one folder per window, named by its start date (YYYY-MM-DD)
    <path>/catalog/*.parquet               entities (any number of files, any sub-folders)
    <path>/relations/*.parquet             optional typed structural edges

Files are read one at a time and handed to ingestion with their path as origin, so every error and every
rejected row names the file it came from. A file that is not Parquet fails with its path.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts import ContractError
from hir_model.data.source import Batch, Source
from hir_model.data.windows import KEY_FORMAT, Window, floor_to_window, utc


def read_parquet(path: Path) -> pa.Table:
    """Read one file, or fail naming it."""
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ContractError(str(path), "file.parquet", 0, f"not a readable Parquet file: {exc}") from exc


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


class ParquetSource(Source):
    name = "parquet"

    def __init__(self, path: str | Path, window: str = "weekly"):
        self.path, self.window_kind = Path(path), window

    def _require(self, sub: str) -> Path:
        folder = self.path / sub
        if not folder.is_dir():
            raise FileNotFoundError(f"bring-your-own source: {folder} is missing (expected {sub}/ under {self.path})")
        return folder

    def window_keys(self) -> list[str]:
        """Window folders under events/, each checked to be an aligned window start."""
        keys = []
        for child in sorted(self._require("events").iterdir()):
            if not child.is_dir():
                raise ContractError(str(child), "layout.window_folder", 0, "events/ must hold one folder per window, named YYYY-MM-DD")
            try:
                start = utc(datetime.strptime(child.name, KEY_FORMAT))
            except ValueError as exc:
                raise ContractError(str(child), "layout.window_folder", 0, f"folder name is not a window key YYYY-MM-DD: {exc}") from exc
            if floor_to_window(start, self.window_kind) != start:
                raise ContractError(str(child), "layout.window_folder", 0, f"{child.name} is not the start of a {self.window_kind} window")
            keys.append(child.name)
        if not keys:
            raise FileNotFoundError(f"bring-your-own source: {self.path / 'events'} has no window folders")
        return keys

    def span(self) -> tuple[datetime, datetime]:
        keys = self.window_keys()
        first = utc(datetime.strptime(keys[0], KEY_FORMAT))
        last = utc(datetime.strptime(keys[-1], KEY_FORMAT))
        return first, last

    def catalog(self, end: datetime) -> Iterator[Batch]:
        yield from self._snapshot("catalog", end)

    def relations(self, end: datetime) -> Iterator[Batch]:
        if (self.path / "relations").is_dir():
            yield from self._snapshot("relations", end)

    def _snapshot(self, sub: str, end: datetime) -> Iterator[Batch]:
        for f in _files(self._require(sub)):
            table = read_parquet(f)
            if "first_seen_ts" in table.column_names and pa.types.is_timestamp(table.schema.field("first_seen_ts").type):
                ts = table.column("first_seen_ts")
                keep = pc.or_kleene(pc.is_null(ts), pc.less(ts, pa.scalar(end, ts.type)))  # nulls go on, to be rejected
                table = table.filter(keep)
            yield Batch(str(f), table)

    def events(self, window: Window) -> Iterator[Batch]:
        folder = self._require("events") / window.key
        if not folder.is_dir():
            return  # an empty window: ingestion publishes an empty table and a check says so
        for f in _files(folder):
            try:
                parquet = pq.ParquetFile(f)
            except (pa.ArrowInvalid, OSError) as exc:
                raise ContractError(str(f), "file.parquet", 0, f"not a readable Parquet file: {exc}") from exc
            for rb in parquet.iter_batches(batch_size=262_144):  # large files stream
                yield Batch(str(f), pa.Table.from_batches([rb]))
