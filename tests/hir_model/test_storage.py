"""Partition writes are all-or-nothing and re-runs replace exactly one partition."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from hir_model.storage import PartitionStore


def table(n: int) -> pa.Table:
    return pa.table({"x": list(range(n))})


def test_commit_replaces_exactly_the_partition(tmp_path):
    store = PartitionStore(tmp_path)
    with store.writing() as s:
        s.write_table("a", "2024-01-07", "t", table(3))
        s.write_table("a", "2024-01-14", "t", table(4))
    with store.writing() as s:
        s.write_table("a", "2024-01-07", "u", table(5))
    assert [p.name for p in store.files("a", "2024-01-07")] == ["u.parquet"]  # old file gone with its partition
    assert store.read("a", "2024-01-14", "t").num_rows == 4  # neighbour untouched
    assert store.partitions("a") == ["2024-01-07", "2024-01-14"]


def test_failure_leaves_previous_files_byte_identical(tmp_path):
    store = PartitionStore(tmp_path)
    with store.writing() as s:
        s.write_table("a", "p", "t", table(3))
        s.write_table("b", "p", "t", table(3))
    before = {f: f.read_bytes() for f in store.files("a", "p") + store.files("b", "p")}
    with pytest.raises(RuntimeError):
        with store.writing() as s:
            s.write_table("a", "p", "t", table(10))
            s.write_table("b", "p", "t", table(10))
            raise RuntimeError("validation failed half way")
    assert {f: f.read_bytes() for f in before} == before
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # staging cleaned up


def test_same_table_same_bytes(tmp_path):
    store = PartitionStore(tmp_path)
    for _ in range(2):
        with store.writing() as s:
            s.write_table("a", "p", "t", table(100))
        data = (store.partition_dir("a", "p") / "t.parquet").read_bytes()
    with store.writing() as s:
        s.write_table("a", "p", "t", table(100))
    assert (store.partition_dir("a", "p") / "t.parquet").read_bytes() == data


def test_interrupted_commit_is_recovered(tmp_path):
    store = PartitionStore(tmp_path)
    with store.writing() as s:
        s.write_table("a", "p", "t", table(3))
    os.rename(store.partition_dir("a", "p"), tmp_path / "a" / ".trash-p-abc")  # crash between the two renames
    assert store.read("a", "p", "t").num_rows == 3


def test_a_reader_leaves_a_live_writers_commit_alone_and_undoes_a_dead_ones(tmp_path):
    """Between a commit's two renames the partition is briefly missing: a reader (e.g. `hir serve` polling) must not
    restore the old folder under a writer that is still running, or the writer's second rename fails."""
    import subprocess
    import sys

    store = PartitionStore(tmp_path)
    with store.writing() as s:
        s.write_table("a", "p", "t", table(3))
    live = tmp_path / "a" / f".trash-p-{os.getpid()}xabc"
    os.rename(store.partition_dir("a", "p"), live)  # this process is mid-commit
    assert not store.exists("a", "p") and live.is_dir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.rename(live, tmp_path / "a" / f".trash-p-{dead.stdout.strip()}xabc")  # a writer that died between the renames
    assert store.read("a", "p", "t").num_rows == 3


def test_missing_partition_says_what_to_materialise(tmp_path):
    with pytest.raises(FileNotFoundError, match="materialise a for 2024-01-07"):
        PartitionStore(tmp_path).read("a", "2024-01-07", "t")


def test_s3_uri_is_not_a_local_folder(tmp_path):
    with pytest.raises(ValueError, match="S3"):
        PartitionStore("s3://bucket/prefix")


def test_a_writer_killed_mid_write_leaves_the_previous_files(tmp_path):
    """A real SIGKILL while the new files are half written: readers still get the old partition."""
    import signal
    import subprocess
    import sys
    import textwrap

    store = PartitionStore(tmp_path)
    with store.writing() as s:
        s.write_table("a", "p", "t", table(3))
    before = (store.partition_dir("a", "p") / "t.parquet").read_bytes()
    code = textwrap.dedent(f"""
        import sys, time, pyarrow as pa, pyarrow.parquet as pq
        from hir_model.storage import PartitionStore
        with PartitionStore({str(tmp_path)!r}).writing() as s:
            with pq.ParquetWriter(s.file("a", "p", "t"), pa.schema([("x", pa.int64())])) as w:
                w.write_table(pa.table({{"x": list(range(1000))}}))
                print("half written", flush=True)
                time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "half written"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (store.partition_dir("a", "p") / "t.parquet").read_bytes() == before
    assert store.read("a", "p", "t").num_rows == 3 and store.partitions("a") == ["p"]
