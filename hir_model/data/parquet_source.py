"""Bring your own data: a folder of Parquet files that follow the contracts.

Layout::

    <path>/events/<window key>/*.parquet   one folder per window, named by its start date (YYYY-MM-DD)
    <path>/catalog/*.parquet               entities (any number of files, any sub-folders)
    <path>/relations/*.parquet             optional typed structural edges
    <path>/contract.toml                   optional contract options (data_contracts/options.py)

Files are read one at a time and handed to ingestion with their path as origin, so every error and every
rejected row names the file it came from. Names starting with `.` or `_` (files and folders: `.DS_Store`,
`_SUCCESS`, `_temporary/`) are ignored everywhere. Symbolic links are followed; a dangling one, or one that
leads back into a folder already read, fails naming the link. Every read error (a file that is not Parquet, a
corrupt page behind an intact footer, a permission error) is a `ContractError` naming the file.

An entry directly under events/ that is not a window folder does not stop the partitions from loading: an
entry whose name is a date (another spelling such as `2024-1-14`, or a day inside a window) fails that window's
run, an entry with no date in its name fails every window's run, each naming the entry, its rows and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts import CATALOG, RELATIONS, ContractError, ContractOptions, load_options
from hir_model.data.source import Batch, Source
from hir_model.data.windows import KEY_FORMAT, Window, floor_to_window, utc

READ_ERRORS = (pa.ArrowException, OSError)  # what a bad or unreadable file raises while it is opened or read
DATED = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")  # a date in any zero-padding, e.g. 2024-1-14


def hidden(path: Path) -> bool:
    return path.name.startswith((".", "_"))


def read_parquet(path: Path) -> pa.Table:
    """Read one file, or fail naming it."""
    try:
        return pq.read_table(path)
    except READ_ERRORS as exc:
        raise ContractError(str(path), "file.parquet", _rows(path), f"not a readable Parquet file: {exc}") from exc


def _rows(path: Path) -> int:
    """Rows a Parquet file's footer declares (0 when the footer is unreadable), for messages."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except READ_ERRORS:
        return 0


def _files(folder: Path) -> list[Path]:
    """Every visible file under `folder`, following symbolic links; dangling links and link cycles fail loudly."""
    out, seen = [], {folder.resolve()}

    def walk(d: Path) -> None:
        for p in sorted(d.iterdir()):
            if hidden(p):
                continue
            if p.is_symlink() and not p.exists():
                raise ContractError(str(p), "layout.symlink", 0, f"dangling symbolic link to {os.readlink(p)}: its target does not exist")
            if p.is_dir():
                real = p.resolve()
                if real in seen:
                    raise ContractError(str(p), "layout.symlink", 0,
                                        f"links to {real}, which is read already (a cycle, or a second link to one folder)")
                seen.add(real)
                walk(p)
            elif p.is_file():
                out.append(p)
            else:
                raise ContractError(str(p), "layout.not_a_file", 0, "neither a regular file nor a folder (a socket or a pipe?)")

    walk(folder)
    return out


class ParquetSource(Source):
    name = "parquet"

    def __init__(self, path: str | Path, window: str = "weekly"):
        self.path, self.window_kind = Path(path), window

    def _require(self, sub: str) -> Path:
        folder = self.path / sub
        if not folder.is_dir():
            raise FileNotFoundError(f"bring-your-own source: {folder} is missing (expected {sub}/ under {self.path})")
        return folder

    def contract_options(self, sub: str) -> ContractOptions:
        """The contract options for one folder (events, catalog, relations), from contract.toml."""
        return load_options(self.path, sub)

    def _layout(self) -> tuple[list[str], list[tuple[Path, datetime | None, str]]]:
        """Window keys of the well-named folders, and the other entries: (path, the window it falls in or None, why)."""
        keys, strays = [], []
        for child in sorted(self._require("events").iterdir()):
            if hidden(child):
                continue
            match = DATED.fullmatch(child.name)
            try:
                date = utc(datetime(*map(int, match.groups()))) if match else None
            except ValueError:
                date = None  # 2024-13-40: no date
            if date is None:
                strays.append((child, None, "events/ holds one folder per window named YYYY-MM-DD; this entry names no date: "
                                            "move its files into their window's folder, or hide it with a leading '.' or '_'"))
                continue
            window = floor_to_window(date, self.window_kind)
            if child.is_symlink() and not child.exists():
                strays.append((child, window, f"dangling symbolic link to {os.readlink(child)}: its target does not exist"))
            elif not child.is_dir():
                strays.append((child, window, f"a window is a folder of Parquet files: put this file in events/{window:{KEY_FORMAT}}/"))
            elif child.name != date.strftime(KEY_FORMAT):
                strays.append((child, window, f"the folder name is the date {date:{KEY_FORMAT}} spelled differently; window folders "
                                              f"are named YYYY-MM-DD: rename it to {date:{KEY_FORMAT}}"
                                              + ("" if window == date else f" (or move its files into events/{window:{KEY_FORMAT}}/)")))
            elif window != date:
                strays.append((child, window, f"{child.name} is not the start of a {self.window_kind} window; its rows belong to "
                                              f"window {window:{KEY_FORMAT}}: move its files into events/{window:{KEY_FORMAT}}/"))
            else:
                keys.append(child.name)
        return keys, strays

    def window_keys(self) -> list[str]:
        """The windows to partition by: every well-named window folder, and every window a misnamed entry falls in
        (so that window exists, and its run fails naming the entry rather than reading nothing)."""
        keys, strays = self._layout()
        keys = sorted(set(keys) | {w.strftime(KEY_FORMAT) for _, w, _ in strays if w is not None})
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

    def catalog_inputs(self) -> list[Path]:
        """Every visible file under catalog/: a new one is an arrival (land it whole: write it under a hidden name such as
        `_part.parquet`, then rename it)."""
        folder = self.path / "catalog"
        return _files(folder) if folder.is_dir() else []

    def first_seen_in(self, path: Path) -> pa.Array | None:
        """The file's first_seen_ts as ingestion reads them (contract.toml's units and time zone), nulls dropped."""
        contract = CATALOG.with_options(self.contract_options("catalog"))
        table = read_parquet(Path(path))
        if "first_seen_ts" not in table.column_names:
            return None
        return pc.drop_null(contract.timestamps(table, "first_seen_ts", str(path))).combine_chunks()

    def relations(self, end: datetime) -> Iterator[Batch]:
        if (self.path / "relations").is_dir():
            yield from self._snapshot("relations", end)

    def _snapshot(self, sub: str, end: datetime) -> Iterator[Batch]:
        contract = (CATALOG if sub == "catalog" else RELATIONS).with_options(self.contract_options(sub))
        for f in _files(self._require(sub)):
            table = read_parquet(f)
            if "first_seen_ts" in table.column_names:  # read as ingestion will (declared units, assume_utc)
                ts = contract.timestamps(table, "first_seen_ts", str(f))
                keep = pc.or_kleene(pc.is_null(ts), pc.less(ts, pa.scalar(end, ts.type)))  # nulls go on, to be rejected
                table = table.filter(keep)
            yield Batch(str(f), table)

    def events(self, window: Window) -> Iterator[Batch]:
        _, strays = self._layout()
        for path, start, why in strays:
            if start is None or start == window.start:
                files = [path] if path.is_file() else _files(path) if path.is_dir() else []
                rows = sum(_rows(f) for f in files)
                raise ContractError(str(path), "layout.window_folder", rows, f"{why}; {rows} rows in {len(files)} file(s) not read")
        folder = self._require("events") / window.key
        if not folder.is_dir():
            return  # an empty window: ingestion publishes an empty table and a check says so
        for f in _files(folder):
            yield from _batches(f)


def _batches(f: Path, batch_size: int = 262_144) -> Iterator[Batch]:
    """One file in batches (large files stream); any read error, at open or in a later page, names the file."""
    try:
        parquet = pq.ParquetFile(f)
    except READ_ERRORS as exc:
        raise ContractError(str(f), "file.parquet", 0, f"not a readable Parquet file: {exc}") from exc
    total, read = parquet.metadata.num_rows, 0
    batches = parquet.iter_batches(batch_size=batch_size)
    while True:
        try:
            rb = next(batches)
        except StopIteration:
            return
        except READ_ERRORS as exc:
            raise ContractError(str(f), "file.parquet", total - read,
                                f"unreadable after {read} of its {total} rows (the footer reads, a data page does not): {exc}") from exc
        read += rb.num_rows
        yield Batch(str(f), pa.Table.from_batches([rb]))
