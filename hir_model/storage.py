"""Partitioned table storage with all-or-nothing writes.

Layout: `<root>/<asset>/<partition>/<name>.parquet`. A write stages every file of every target partition
first and commits them together only when all were written, so a failed run leaves the previous files
exactly as they were, and a re-run replaces exactly that partition (backfills can be repeated).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("hir")

# Same bytes for the same table: no per-write metadata (timestamps, random ids) goes into the files.
PARQUET_OPTIONS = dict(compression="zstd", write_statistics=True)


class Staging:
    """Where a write puts its files before they are committed. `path(asset, partition)` is a folder."""

    def __init__(self, store: PartitionStore, token: str):
        self._store, self._token, self.targets = store, token, {}

    def path(self, asset: str, partition: str) -> Path:
        key = (asset, partition)
        if key not in self.targets:
            folder = self._store.root / asset / f".staging-{partition}-{self._token}"
            folder.mkdir(parents=True, exist_ok=False)
            self.targets[key] = folder
        return self.targets[key]

    def write_table(self, asset: str, partition: str, name: str, table: pa.Table) -> Path:
        path = self.path(asset, partition) / f"{name}.parquet"
        pq.write_table(table, path, **PARQUET_OPTIONS)
        return path

    def file(self, asset: str, partition: str, name: str) -> Path:
        """Where a staged file named `name` goes (for writers that stream into it)."""
        return self.path(asset, partition) / f"{name}.parquet"

    def read(self, asset: str, partition: str, name: str, columns: list[str] | None = None) -> pa.Table:
        """Read back a staged file (e.g. to validate it before the commit)."""
        return pq.read_table(self.path(asset, partition) / f"{name}.parquet", columns=columns)


class PartitionStore:
    """Local-folder implementation. (`s3://` roots are served by the S3 store in dagster_project.)"""

    def __init__(self, root: str | Path):
        root = str(root)
        if "://" in root and not root.startswith("file://"):
            raise ValueError(f"PartitionStore is for local folders; {root!r} needs the S3 store")
        self.root = Path(root.removeprefix("file://"))
        self.root.mkdir(parents=True, exist_ok=True)

    def partition_dir(self, asset: str, partition: str) -> Path:
        return self.root / asset / partition

    def exists(self, asset: str, partition: str, name: str | None = None) -> bool:
        self._recover(asset, partition)
        folder = self.partition_dir(asset, partition)
        return (folder / f"{name}.parquet").exists() if name else folder.is_dir()

    def read(self, asset: str, partition: str, name: str, columns: list[str] | None = None) -> pa.Table:
        if not self.exists(asset, partition, name):
            raise FileNotFoundError(f"{asset}/{partition}/{name}.parquet is not in {self.root}: materialise {asset} for {partition} first")
        return pq.read_table(self.partition_dir(asset, partition) / f"{name}.parquet", columns=columns)

    def files(self, asset: str, partition: str) -> list[Path]:
        folder = self.partition_dir(asset, partition)
        return sorted(folder.iterdir()) if self.exists(asset, partition) else []

    def partitions(self, asset: str) -> list[str]:
        folder = self.root / asset
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) if folder.is_dir() else []

    @contextmanager
    def writing(self) -> Iterator[Staging]:
        """Stage files; on normal exit commit every staged partition, on error discard them all."""
        staging = Staging(self, uuid.uuid4().hex[:12])
        try:
            yield staging
        except BaseException:
            for folder in staging.targets.values():
                shutil.rmtree(folder, ignore_errors=True)
            raise
        for (asset, partition), folder in staging.targets.items():
            self._swap(asset, partition, folder)

    def _swap(self, asset: str, partition: str, staged: Path) -> None:
        final = self.partition_dir(asset, partition)
        trash = final.with_name(f".trash-{partition}-{staged.name.rsplit('-', 1)[-1]}")
        if final.exists():
            os.rename(final, trash)  # a crash here is undone by _recover
        os.rename(staged, final)
        shutil.rmtree(trash, ignore_errors=True)
        log.debug("committed %s/%s", asset, partition)

    def _recover(self, asset: str, partition: str) -> None:
        """Finish or undo a commit that a crash interrupted between its two renames."""
        final = self.partition_dir(asset, partition)
        if final.exists() or not final.parent.is_dir():
            return
        for trash in sorted(final.parent.glob(f".trash-{partition}-*")):
            os.rename(trash, final)
            log.warning("restored %s/%s from an interrupted commit", asset, partition)
            return
