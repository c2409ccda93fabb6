"""Issue 26's malformed bring-your-own folders, one test per case: the outcome (publish / reject row / fail run),
the message (file, rule, rows, sample) and that no valid row is lost. Then a seeded property test: random mixtures
of valid and invalid rows, published + rejected = input, row by row."""

from __future__ import annotations

import os
import random
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import ContractError
from hir_model.data.parquet_source import ParquetSource
from tests.conftest import TS, W0, W1, events_table
from tests.hir_model.data.test_ingest import run_window, write_events

KEY, NEXT = "2024-01-07", "2024-01-14"


def rows(table: pa.Table) -> Counter:
    """The rows of a table as a multiset of tuples over the event columns (rejected tables carry two more)."""
    cols = ["event_id", "user_id", "entity_id", "entity_type", "event_type", "ts", "value"]
    return Counter(zip(*[table.column(c).to_pylist() for c in cols]))


def corrupt_a_page(path: Path) -> None:
    """Flip bytes inside the first column's first page, leaving the footer (and so the schema and row count) intact."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    start = (chunk.dictionary_page_offset or chunk.data_page_offset) + 40
    for i in range(start, start + 200):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def big_events(n: int, prefix: str) -> pa.Table:
    base = events_table(W0, prefix)
    reps = -(-n // base.num_rows)
    table = pa.concat_tables([base] * reps).slice(0, n)
    return table.set_column(0, "event_id", pa.array([f"{prefix}{i:07d}-padding-to-make-pages-compress" for i in range(n)]))


# 1. symbolic links


def test_a_symlinked_sub_folder_and_file_are_read(byo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pq.write_table(events_table(W0, "s"), elsewhere / "part-s.parquet")
    pq.write_table(events_table(W0, "f"), tmp_path / "part-f.parquet")
    (byo / "events" / KEY / "more").symlink_to(elsewhere, target_is_directory=True)
    (byo / "events" / KEY / "linked.parquet").symlink_to(tmp_path / "part-f.parquet")
    report, events, rejected = run_window(byo, tmp_path)
    assert (report.accepted, report.rejected, events.num_rows) == (36, 0, 36)  # 12 + 12 behind the folder link + 12 behind the file link
    assert {o.rsplit("/", 1)[-1] for o in report.origins} == {"part-0.parquet", "part-s.parquet", "linked.parquet"}


@pytest.mark.parametrize("where", ["events/2024-01-07/gone.parquet", "events/2024-01-07/gone", "catalog/gone.parquet"])
def test_a_dangling_symlink_fails_naming_it(byo, tmp_path, where):
    link = byo / where
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(link) and err.value.rule == "layout.symlink"
    assert "dangling symbolic link" in str(err.value) and str(tmp_path / "nowhere") in str(err.value)


def test_a_symlink_cycle_fails_instead_of_reading_forever(byo, tmp_path):
    (byo / "events" / KEY / "loop").symlink_to(byo / "events" / KEY, target_is_directory=True)
    with pytest.raises(ContractError, match="read already") as err:
        run_window(byo, tmp_path)
    assert err.value.rule == "layout.symlink"


# 2. window folders named another way


def test_a_window_folder_with_another_date_spelling_fails_its_run(byo, tmp_path):
    (byo / "events" / NEXT).rename(byo / "events" / "2024-1-14")
    source = ParquetSource(byo, "weekly")
    assert source.window_keys() == [KEY, NEXT]  # the partition exists, so its run can say what is wrong
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path, NEXT)
    assert err.value.rule == "layout.window_folder" and err.value.rows == 12
    assert err.value.origin == str(byo / "events" / "2024-1-14") and "rename it to 2024-01-14" in str(err.value)
    report, events, _ = run_window(byo, tmp_path / "other", KEY)  # the well-named window is read as before
    assert report.accepted == events.num_rows == 12


# 3. integer timestamps


def ms_events(prefix: str = "x") -> pa.Table:
    table = events_table(W0, prefix)
    ms = pa.array([int(t.timestamp() * 1000) for t in table.column("ts").to_pylist()], pa.int64())
    return table.set_column(5, "ts", ms)


def test_integer_ts_without_a_declared_unit_is_refused_with_the_value_and_likely_unit(byo, tmp_path):
    path = write_events(byo, ms_events(), "ms.parquet")
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    first = int(W0.timestamp() * 1000)
    assert err.value.origin == str(path) and err.value.rule == "schema.timestamp_unit" and err.value.rows == 12
    assert f"{first} reads as 2024-01-07 00:00:00 UTC in ms" in str(err.value) and 'ts_unit = "ms"' in str(err.value)


def test_integer_ts_with_a_declared_unit_is_read_in_that_unit(byo, tmp_path):
    (byo / "contract.toml").write_text('[events]\nts_unit = "ms"\n')
    original = ms_events()
    late = original.column("ts").to_pylist()
    late[0] = int(W1.timestamp() * 1000) + 5  # outside the window: rejected showing the instant the file meant
    write_events(byo, original.set_column(5, "ts", pa.array(late, pa.int64())), "ms.parquet")
    report, events, rejected = run_window(byo, tmp_path)
    assert (report.accepted, report.rejected) == (23, 1)
    assert rejected.column("ts").to_pylist() == [W1 + timedelta(milliseconds=5)] and rejected.column("rule").to_pylist() == ["ts_in_window"]
    assert sorted(events.column("ts").to_pylist()[12:]) == events_table(W0, "x").column("ts").to_pylist()[1:]


def test_unknown_contract_options_fail_naming_the_file(byo, tmp_path):
    (byo / "contract.toml").write_text('ts_units = "ms"\n')
    with pytest.raises(ContractError, match=r"unknown options \['ts_units'\]") as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(byo / "contract.toml") and err.value.rule == "contract.options"


# 5. a corrupt page behind an intact footer


def test_a_corrupt_page_with_an_intact_footer_is_a_named_contract_error(byo, tmp_path):
    path = byo / "events" / KEY / "big.parquet"
    pq.write_table(big_events(20_000, "c"), path, compression="snappy")
    corrupt_a_page(path)
    assert pq.ParquetFile(path).metadata.num_rows == 20_000  # the footer still reads
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "file.parquet" and err.value.rows == 20_000
    assert "unreadable after 0 of its 20000 rows" in str(err.value) and "Corrupt snappy" in str(err.value)


# 6. stray entries under events/


def test_hidden_entries_under_events_are_ignored(byo, tmp_path):
    (byo / "events" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (byo / "events" / "_SUCCESS").write_text("")
    (byo / "events" / KEY / "_temporary").mkdir()
    pq.write_table(events_table(W0, "t"), byo / "events" / KEY / "_temporary" / "part.parquet")  # a writer's leftovers
    assert ParquetSource(byo, "weekly").window_keys() == [KEY, NEXT]
    report, events, _ = run_window(byo, tmp_path)
    assert report.accepted == events.num_rows == 12


def test_an_undated_stray_entry_fails_every_window_but_not_the_partitions(byo, tmp_path):
    stray = byo / "events" / "part-9.parquet"
    pq.write_table(events_table(W0, "z"), stray)
    assert ParquetSource(byo, "weekly").window_keys() == [KEY, NEXT]
    for key in (KEY, NEXT):
        with pytest.raises(ContractError) as err:
            run_window(byo, tmp_path / key, key)
        assert err.value.origin == str(stray) and err.value.rule == "layout.window_folder" and err.value.rows == 12
        assert "names no date" in str(err.value) and "leading '.' or '_'" in str(err.value)


# 7. duplicates: one policy within a file and across files


def test_a_valid_row_repeating_a_rejected_rows_id_is_kept_within_and_across_files(byo, tmp_path):
    table = events_table(W0, "x")
    ids, types = table.column("event_id").to_pylist(), table.column("event_type").to_pylist()
    ids[1], types[1] = "dup", "bought"  # rejected for its event type ...
    ids[3] = "dup"  # ... so this valid row with the same id is the first valid copy: published
    ids[5], types[5] = "a0", "bought"  # the same across files: an invalid copy of part-0's a0
    path = write_events(byo, table.set_column(0, "event_id", pa.array(ids)).set_column(4, "event_type", pa.array(types)), "zz.parquet")
    other = events_table(W0, "y")
    other_types = other.column("event_type").to_pylist()
    other_types[0] = "bought"
    write_events(byo, other.set_column(0, "event_id", pa.array(["dup2"] + other.column("event_id").to_pylist()[1:]))
                 .set_column(4, "event_type", pa.array(other_types)), "aa.parquet")  # read first: invalid dup2 ...
    write_events(byo, events_table(W0, "w").slice(0, 1).set_column(0, "event_id", pa.array(["dup2"])), "ab.parquet")  # ... valid dup2
    report, events, rejected = run_window(byo, tmp_path)
    published = events.column("event_id").to_pylist()
    assert published.count("dup") == 1 and published.count("dup2") == 1 and published.count("a0") == 1
    assert report.rejected_by_origin[str(path)] == {"event_type_vocabulary": 2}
    assert "unique_event_id" not in report.rejected_by_rule
    read = [pq.read_table(f) for f in sorted((byo / "events" / KEY).iterdir())]
    assert rows(events) + rows(rejected) == rows(pa.concat_tables(read, promote_options="permissive"))


def test_two_valid_copies_keep_the_first_within_and_across_files(byo, tmp_path):
    table = events_table(W0, "x")
    ids = table.column("event_id").to_pylist()
    ids[3], ids[4] = ids[1], "a0"
    path = write_events(byo, table.set_column(0, "event_id", pa.array(ids)), "zz.parquet")
    report, events, rejected = run_window(byo, tmp_path)
    assert report.rejected_by_origin[str(path)] == {"unique_event_id": 2} and events.num_rows == 22
    assert sorted(rejected.column("event_id").to_pylist()) == ["a0", "x1"]


# 8. uncastable values, naive timestamps, events before first_seen


def test_an_uncastable_value_names_its_row_and_counts_only_the_bad_ones(byo, tmp_path):
    table = big_events(200, "v")
    values = [str(float(i)) for i in range(200)]
    values[17] = "n/a"
    path = write_events(byo, table.set_column(6, "value", pa.array(values)), "strings.parquet")
    with pytest.raises(ContractError) as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "schema.column_type" and err.value.rows == 1
    assert "1 of 200 rows do not cast" in str(err.value) and "row 17 (event_id='v0000017" in str(err.value) and "'n/a'" in str(err.value)


def test_an_uncastable_value_in_a_later_batch_names_its_row_in_the_file(byo, tmp_path, monkeypatch):
    import hir_model.data.parquet_source as ps

    monkeypatch.setattr(ps._batches, "__defaults__", (64,))  # small batches: the bad row is in the fourth
    table = big_events(200, "v")
    values = [str(float(i)) for i in range(200)]
    values[150] = "n/a"
    write_events(byo, table.set_column(6, "value", pa.array(values)), "strings.parquet")
    with pytest.raises(ContractError, match=r"1 of 64 rows do not cast, e\.g\. row 150 \(event_id='v0000150"):
        run_window(byo, tmp_path)


def naive_events(prefix: str = "x") -> pa.Table:
    table = events_table(W0, prefix)
    return table.set_column(5, "ts", table.column("ts").cast(pa.timestamp("us")))


def test_naive_ts_is_refused_without_assume_utc(byo, tmp_path):
    path = write_events(byo, naive_events(), "naive.parquet")
    with pytest.raises(ContractError, match="without a time zone.*assume_utc = true") as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "schema.timestamp_timezone" and err.value.rows == 12


def test_naive_ts_with_assume_utc_is_published_and_warned(byo, tmp_path, caplog):
    (byo / "contract.toml").write_text("assume_utc = true\n")
    path = write_events(byo, naive_events(), "naive.parquet")
    report, events, _ = run_window(byo, tmp_path)
    assert report.accepted == 24 and report.notes == {str(path): ["column 'ts' has no time zone: taken as UTC (assume_utc)"]}
    assert sorted(events.column("ts").to_pylist())[::2] == events_table(W0, "x").column("ts").to_pylist()
    assert f"{path}: column 'ts' has no time zone: taken as UTC (assume_utc)" in caplog.text


def test_naive_ts_strings_follow_the_same_option(byo, tmp_path):
    table = events_table(W0, "x")
    text = pa.array([t.strftime("%Y-%m-%d %H:%M:%S") for t in table.column("ts").to_pylist()])
    path = write_events(byo, table.set_column(5, "ts", text), "text.parquet")
    with pytest.raises(ContractError, match="12 of 12 rows do not cast.*declare assume_utc = true") as err:
        run_window(byo, tmp_path)
    assert err.value.origin == str(path) and err.value.rule == "schema.column_type"
    (byo / "contract.toml").write_text("[events]\nassume_utc = true\n")
    report, events, _ = run_window(byo, tmp_path / "again")
    assert report.accepted == 24 and str(path) in report.notes
    assert sorted(events.column("ts").to_pylist())[1::2] == table.column("ts").to_pylist()


def test_events_before_their_entitys_first_seen_are_published_and_counted(byo, tmp_path):
    # the fixture's p2 is first seen a day into the window; 6 of window 2024-01-07's events reach it earlier
    report, events, rejected = run_window(byo, tmp_path)
    assert (report.accepted, report.rejected, events.num_rows) == (12, 0, 12)
    assert report.warned_by_rule == {"ts_after_first_seen": 6}
    assert report.warnings() == [f"{byo / 'events' / KEY / 'part-0.parquet'}: rule 'ts_after_first_seen' warned on 6 rows (published)"]


# property: random mixtures of valid and invalid rows


DEFECTS = ("null_user", "bad_event_type", "late_ts", "unknown_entity", "user_is_product", "entity_is_user", "dup_id")


def valid(row: dict) -> bool:
    """An independent statement of the events contract on the fixture's catalog (window 2024-01-07)."""
    return (all(row[k] is not None for k in ("event_id", "user_id", "entity_id", "entity_type", "event_type", "ts"))
            and row["event_type"] in ("impression", "click", "add_to_cart", "purchase", "interested", "not_interested")
            and row["entity_type"] == "product" and W0 <= row["ts"] < W1
            and row["entity_id"] in ("p1", "p2") and row["user_id"] in ("u1", "u2"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_mixtures_lose_no_row(byo, tmp_path, seed):
    rng = random.Random(seed)
    os.remove(byo / "events" / KEY / "part-0.parquet")
    files, n = [], 0
    for f in range(rng.randint(1, 4)):
        out = []
        for _ in range(rng.randint(20, 120)):
            row = {"event_id": f"e{n}", "user_id": rng.choice(["u1", "u2"]), "entity_id": rng.choice(["p1", "p2"]),
                   "entity_type": "product", "event_type": rng.choice(["impression", "click", "purchase"]),
                   "ts": W0 + timedelta(days=1, minutes=rng.randint(0, 5 * 24 * 60)), "value": float(n)}
            n += 1
            for defect in rng.sample(DEFECTS, k=rng.choice([0, 0, 0, 1, 1, 2])):
                if defect == "null_user":
                    row["user_id"] = None
                elif defect == "bad_event_type":
                    row["event_type"] = "bought"
                elif defect == "late_ts":
                    row["ts"] = W1 + timedelta(minutes=rng.randint(0, 999))
                elif defect == "unknown_entity":
                    row["entity_id"] = "p404"
                elif defect == "user_is_product":
                    row["user_id"] = "p1"
                elif defect == "entity_is_user":
                    row["entity_id"] = "u1"
                elif n > 1:
                    row["event_id"] = f"e{rng.randrange(n - 1)}"  # repeats an earlier id, in this file or another
            out.append(row)
        table = pa.table({k: pa.array([r[k] for r in out], TS if k == "ts" else None) for k in out[0]})
        pq.write_table(table, byo / "events" / KEY / f"part-{f}.parquet")
        files.append(out)
    report, events, rejected = run_window(byo, tmp_path)

    seen, expected_published, expected_rejected = set(), [], []
    for out in files:  # files are read in name order, rows in file order: the first valid copy of an id is published
        for row in out:
            keep = valid(row) and row["event_id"] not in seen
            (expected_published if keep else expected_rejected).append(tuple(row.values()))
            seen |= {row["event_id"]} if keep else set()
    assert rows(events) == Counter(expected_published) and rows(rejected) == Counter(expected_rejected)
    assert report.rows_in == n == report.accepted + report.rejected == events.num_rows + rejected.num_rows
    assert all(rejected.column("rule").to_pylist()) and np.all(np.array(rejected.column("origin").to_pylist()) != None)  # noqa: E711
