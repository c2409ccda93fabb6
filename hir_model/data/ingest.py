"""Ingestion: validate raw batches against a contract, stream good rows and rejected rows to writers.

File-level breaks (missing columns, uncastable values, undeclared timestamp encodings, unreadable files) raise
`ContractError` naming the file, the rule, the rows and a sample: the caller's staging is then discarded, so
nothing half-written is published. Row-level breaks send the row to the rejected table with the rules it broke
and its origin; every valid row is kept. Uniqueness is judged among the rows that pass every other rule (within
a batch and across batches alike), so a valid row is never rejected for repeating the id of an invalid one.
A contract's warnings are counted on the accepted rows; those rows are published.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts import Contract
from data_contracts.rules import repeats
from hir_model.data.source import Batch
from hir_model.storage import PARQUET_OPTIONS

log = logging.getLogger("hir")


@dataclass
class IngestReport:
    contract: str
    rows_in: int = 0
    accepted: int = 0
    rejected: int = 0
    rejected_by_rule: Counter = field(default_factory=Counter)  # a row breaking two rules counts under both
    rejected_by_origin: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    warned_by_rule: Counter = field(default_factory=Counter)  # accepted rows that break a warning rule (published)
    warned_by_origin: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    notes: dict[str, list[str]] = field(default_factory=dict)  # per file: contract options applied (e.g. assume_utc)
    origins: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def problems(self) -> list[str]:
        """One line per (file, rule): `<origin>: rule '<rule>' rejected <n> rows`."""
        return [f"{origin}: rule '{rule}' rejected {n} rows"
                for origin, rules in sorted(self.rejected_by_origin.items()) for rule, n in sorted(rules.items())]

    def warnings(self) -> list[str]:
        """One line per (file, warning rule) and per applied option: what was published on an assumption."""
        return ([f"{origin}: rule '{rule}' warned on {n} rows (published)"
                 for origin, rules in sorted(self.warned_by_origin.items()) for rule, n in sorted(rules.items())]
                + [f"{origin}: {note}" for origin, notes in sorted(self.notes.items()) for note in notes])


def rejected_schema(contract: Contract) -> pa.Schema:
    """The contract's columns (nullable: a bad row may have nulls) plus the broken rules and the origin."""
    return pa.schema([f.with_nullable(True) for f in contract.schema] + [pa.field("rule", pa.string()), pa.field("origin", pa.string())])


def ingest(
    contract: Contract,
    batches: Iterable[Batch],
    params: dict[str, Any],
    accepted_path: Path,
    rejected_path: Path,
    on_progress: Callable[[IngestReport], None] | None = None,
) -> IngestReport:
    """Validate every batch; write good rows (published schema) to `accepted_path`, the rest to `rejected_path`.

    Uniqueness holds across batches: the first valid occurrence of a value is kept, every later valid one rejected.
    Repeats inside a batch are caught per batch; repeats across batches by one O(n) pass over the accepted
    keys at the end (a per-batch lookup into everything seen so far would make ingestion quadratic), which
    rewrites the two files only when such repeats exist.
    """
    report = IngestReport(contract.name)
    t0 = time.perf_counter()
    unique_rules = [r for r in contract.rules if r.kind == "unique"]
    row_rules = [r for r in contract.rules if r.kind != "unique"]
    keys: dict[str, list[pa.Array]] = {c: [] for r in unique_rules for c in r.columns}
    accepted_origins: list[tuple[str, int]] = []  # (origin, accepted rows) per batch, in file order
    rows_seen: Counter = Counter()  # rows read so far per origin: a batch's first row number in its file
    with pq.ParquetWriter(accepted_path, contract.schema, **PARQUET_OPTIONS) as accepted, \
            pq.ParquetWriter(rejected_path, rejected_schema(contract), **PARQUET_OPTIONS) as rejected:
        for batch in batches:
            notes: list[str] = []
            table = contract.conform(batch.table, batch.origin, rows_seen[batch.origin], notes)
            rows_seen[batch.origin] += table.num_rows
            for note in dict.fromkeys(notes):
                if note not in report.notes.setdefault(batch.origin, []):
                    report.notes[batch.origin].append(note)
            report.origins.append(batch.origin)
            report.rows_in += table.num_rows
            broken = [(rule.name, mask) for rule in row_rules if (mask := rule.violations(table, params)).any()]
            bad = np.logical_or.reduce([m for _, m in broken]) if broken else np.zeros(table.num_rows, dtype=bool)
            for rule in unique_rules:  # among the rows every other rule accepts, as across batches
                mask = np.zeros(table.num_rows, dtype=bool)
                mask[~bad] = rule.violations(table.filter(pa.array(~bad)), params)
                if mask.any():
                    broken.append((rule.name, mask))
                    bad |= mask
            good = table.filter(pa.array(~bad))
            for col in keys:
                keys[col].append(good.column(col).combine_chunks())
            if good.num_rows:
                accepted.write_table(contract.publishable(good))
                accepted_origins.append((batch.origin, good.num_rows))
                for rule in contract.warnings:
                    if n := int(rule.violations(good, params).sum()):
                        report.warned_by_rule[rule.name] += n
                        report.warned_by_origin[batch.origin][rule.name] += n
            if bad.any():
                rejected.write_table(_rejected_rows(table.filter(pa.array(bad)), [(n, m[bad]) for n, m in broken], batch.origin, report)
                                     .cast(rejected.schema))
            report.accepted += good.num_rows
            report.rejected += int(bad.sum())
            if on_progress:
                on_progress(report)
    for rule in unique_rules:
        for col in rule.columns:
            if len(keys[col]) > 1:
                late = np.asarray(repeats(pa.chunked_array(keys[col], pa.string())).to_numpy(zero_copy_only=False), dtype=bool)
                if late.any():
                    _move_late_repeats(contract, rule.name, late, accepted_origins, accepted_path, rejected_path, report)
    report.seconds = time.perf_counter() - t0
    for problem in report.problems() + report.warnings():
        log.warning(problem)
    return report


def _rejected_rows(rows: pa.Table, broken: list[tuple[str, np.ndarray]], origin: str, report: IngestReport) -> pa.Table:
    """The bad rows with a `rule` column (every rule each row broke, comma-separated) and their origin."""
    names = np.full(rows.num_rows, "", dtype=object)
    for name, mask in broken:
        if mask.any():
            names[mask] = np.where(names[mask] == "", name, names[mask] + "," + name)
            report.rejected_by_rule[name] += int(mask.sum())
            report.rejected_by_origin[origin][name] += int(mask.sum())
    rows = rows.append_column("rule", pa.array(names.tolist(), pa.string()))
    return rows.append_column("origin", pa.array([origin] * rows.num_rows, pa.string()))


def _move_late_repeats(contract: Contract, rule: str, late: np.ndarray, origins: list[tuple[str, int]],
                       accepted_path: Path, rejected_path: Path, report: IngestReport) -> None:
    """Move rows that repeat a key accepted from an earlier batch from the accepted to the rejected file."""
    accepted = pq.read_table(accepted_path)
    row_origin = np.repeat(np.array([o for o, _ in origins], dtype=object), [n for _, n in origins])
    moved = accepted.filter(pa.array(late)).cast(pa.schema([f.with_nullable(True) for f in contract.schema]))
    parts = [pq.read_table(rejected_path)]
    for origin in dict.fromkeys(row_origin[late]):
        from_origin = row_origin[late] == origin
        parts.append(_rejected_rows(moved.filter(pa.array(from_origin)), [(rule, np.ones(int(from_origin.sum()), bool))], origin, report)
                     .cast(rejected_schema(contract)))
    pq.write_table(accepted.filter(pa.array(~late)), accepted_path, **PARQUET_OPTIONS)
    pq.write_table(pa.concat_tables(parts), rejected_path, **PARQUET_OPTIONS)
    report.accepted -= int(late.sum())
    report.rejected += int(late.sum())
