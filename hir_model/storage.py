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
    """Local-folder implementation (`S3PartitionStore` below keeps the same interface on S3)."""

    def __init__(self, root: str | Path):
        root = str(root)
        if "://" in root and not root.startswith("file://"):
            raise ValueError(f"PartitionStore is for local folders; {root!r} needs the S3 store")
        self.root = Path(root.removeprefix("file://"))
        self.root.mkdir(parents=True, exist_ok=True)

    def partition_dir(self, asset: str, partition: str) -> Path:
        """A local folder holding the partition's files (on S3: a read-only cached copy)."""
        return self.root / asset / partition

    def uri(self, asset: str, partition: str) -> str:
        """Where the partition lives, for metadata and messages."""
        return str(self.partition_dir(asset, partition))

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
        staging = Staging(self, f"{os.getpid()}x{uuid.uuid4().hex[:12]}")  # the writer's pid: see _recover
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
        """Undo a commit that a crash interrupted between its two renames; a commit whose writer is alive is between
        them for microseconds and is left to finish (a reader restoring it would make the writer's second rename fail)."""
        final = self.partition_dir(asset, partition)
        if final.exists() or not final.parent.is_dir():
            return
        for trash in sorted(final.parent.glob(f".trash-{partition}-*")):
            if _writer_alive(trash.name.rsplit("-", 1)[-1]):
                return
            os.rename(trash, final)
            log.warning("restored %s/%s from an interrupted commit", asset, partition)
            return


def _writer_alive(token: str) -> bool:
    """Whether the process that staged `token` (`<pid>x<random>`) still runs (this process counts: another thread)."""
    pid, sep, _ = token.partition("x")
    if not sep or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def latest_before(store: PartitionStore, asset: str, key: str, file: str) -> str | None:
    """The latest partition of `asset` before `key` with `file` (its name with the extension) in its folder: usually
    t-1, an earlier one where t-1 was never run."""
    earlier = [p for p in store.partitions(asset) if p < key and (store.partition_dir(asset, p) / file).is_file()]
    return earlier[-1] if earlier else None


class S3PartitionStore(PartitionStore):
    """The same partitions on S3 (or any S3-compatible store), atomically.

    S3 has no rename, so a partition is versioned: files go to `<prefix>/<asset>/<partition>/<version>/`,
    then one PUT of `<prefix>/<asset>/<partition>/_CURRENT` (atomic on S3) names the version, then the
    previous version's objects are deleted. Readers follow `_CURRENT`, so they see the old files or the new
    ones, never a mix. Files are staged locally first and read through a local cache (np.load can mmap them).
    `client` is a boto3 S3 client (the asset layer gets it from dagster-aws's S3Resource, with retries).
    """

    def __init__(self, uri: str, client, cache_dir: str | Path):
        if not uri.startswith("s3://"):
            raise ValueError(f"S3PartitionStore needs an s3://bucket/prefix URI, got {uri!r}")
        self.bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.prefix, self.client = prefix.strip("/"), client
        self.cache = Path(cache_dir) / "s3" / self.bucket / (self.prefix or "_")
        self.root = self.cache / "staging"  # where Staging puts files before the upload
        self.root.mkdir(parents=True, exist_ok=True)

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, asset: str, partition: str) -> str:
        return f"s3://{self.bucket}/{self._key(asset, partition)}"

    def _current(self, asset: str, partition: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(asset, partition, "_CURRENT"))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        return body.read().decode().strip()

    def _objects(self, prefix: str) -> list[str]:
        keys, token = [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": prefix} | ({"ContinuationToken": token} if token else {})
            page = self.client.list_objects_v2(**kwargs)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    def exists(self, asset: str, partition: str, name: str | None = None) -> bool:
        version = self._current(asset, partition)
        if version is None or name is None:
            return version is not None
        return bool(self._objects(self._key(asset, partition, version, f"{name}.parquet")))

    def partition_dir(self, asset: str, partition: str) -> Path:
        version = self._current(asset, partition)
        if version is None:
            raise FileNotFoundError(f"{self.uri(asset, partition)} does not exist: materialise {asset} for {partition} first")
        local = self.cache / "read" / asset / partition / version
        if not local.is_dir():  # versions are immutable, so a cached copy never goes stale
            tmp = local.with_name(f".{version}-{uuid.uuid4().hex[:8]}")
            tmp.mkdir(parents=True)
            for key in self._objects(self._key(asset, partition, version) + "/"):
                self.client.download_file(self.bucket, key, str(tmp / key.rsplit("/", 1)[-1]))
            os.rename(tmp, local)
        return local

    def read(self, asset: str, partition: str, name: str, columns: list[str] | None = None) -> pa.Table:
        if not self.exists(asset, partition, name):
            raise FileNotFoundError(f"{self.uri(asset, partition)}/{name}.parquet does not exist: materialise {asset} for {partition} first")
        return pq.read_table(self.partition_dir(asset, partition) / f"{name}.parquet", columns=columns)

    def files(self, asset: str, partition: str) -> list[Path]:
        return sorted(self.partition_dir(asset, partition).iterdir()) if self.exists(asset, partition) else []

    def partitions(self, asset: str) -> list[str]:
        suffix = "/_CURRENT"
        return sorted(k[: -len(suffix)].rsplit("/", 1)[-1] for k in self._objects(self._key(asset) + "/") if k.endswith(suffix))

    def _swap(self, asset: str, partition: str, staged: Path) -> None:
        version = staged.name.rsplit("-", 1)[-1]
        old = self._current(asset, partition)
        for f in sorted(staged.iterdir()):
            self.client.upload_file(str(f), self.bucket, self._key(asset, partition, version, f.name))
        self.client.put_object(Bucket=self.bucket, Key=self._key(asset, partition, "_CURRENT"), Body=version.encode())
        if old and old != version:
            for key in self._objects(self._key(asset, partition, old) + "/"):
                self.client.delete_object(Bucket=self.bucket, Key=key)
        shutil.rmtree(staged, ignore_errors=True)
        log.debug("committed %s (version %s)", self.uri(asset, partition), version)

    def _recover(self, asset: str, partition: str) -> None:
        return  # nothing to recover: an upload interrupted before the _CURRENT PUT left the old version current


def require_files(folder: Path, names, what: str) -> None:
    """FileNotFoundError naming `what` and each of `names` missing from `folder` (a published partition's files)."""
    missing = [f for f in names if not (Path(folder) / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} holds no {what} ({', '.join(missing)} missing)")
