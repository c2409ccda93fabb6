"""Ingestion: validate raw batches against a contract, stream good rows and rejected rows to writers.

File-level breaks (missing columns, uncastable types, unreadable files) raise `ContractError` naming the
file: the caller's staging is then discarded, so nothing half-written is published. Row-level breaks send
the row to the rejected table with the rules it broke and its origin; every valid row is kept.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts import Contract
from hir_model.data.source import Batch

log = logging.getLogger("hir")


@dataclass
class IngestReport:
    contract: str
    rows_in: int = 0
    accepted: int = 0
    rejected: int = 0
    rejected_by_rule: Counter = field(default_factory=Counter)  # a row breaking two rules counts under both
    rejected_by_origin: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    origins: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def problems(self) -> list[str]:
        """One line per (file, rule): `<origin>: rule '<rule>' rejected <n> rows`."""
        return [f"{origin}: rule '{rule}' rejected {n} rows"
                for origin, rules in sorted(self.rejected_by_origin.items()) for rule, n in sorted(rules.items())]


def rejected_schema(contract: Contract) -> pa.Schema:
    """The contract's columns (nullable: a bad row may have nulls) plus the broken rules and the origin."""
    return pa.schema([f.with_nullable(True) for f in contract.schema] + [pa.field("rule", pa.string()), pa.field("origin", pa.string())])


def ingest(
    contract: Contract,
    batches: Iterable[Batch],
    params: dict[str, Any],
    accepted: pq.ParquetWriter,
    rejected: pq.ParquetWriter,
    on_progress: Callable[[IngestReport], None] | None = None,
) -> IngestReport:
    """Validate every batch; write good rows (published schema) to `accepted`, the rest to `rejected`.

    Uniqueness rules hold across batches: a repeat of a value accepted in an earlier batch is rejected.
    """
    report = IngestReport(contract.name)
    t0 = time.perf_counter()
    unique_cols = {c: [] for r in contract.rules if r.kind == "unique" for c in r.columns}
    for batch in batches:
        table = contract.conform(batch.table, batch.origin)
        report.origins.append(batch.origin)
        report.rows_in += table.num_rows
        bad = np.zeros(table.num_rows, dtype=bool)
        broken: list[tuple[str, np.ndarray]] = []
        for rule in contract.rules:
            mask = rule.violations(table, params)
            if rule.kind == "unique":  # repeats of values accepted by earlier batches
                for col in rule.columns:
                    if unique_cols[col]:
                        seen = pa.chunked_array(unique_cols[col])
                        mask |= np.asarray(pc.fill_null(pc.is_in(table.column(col), value_set=seen.combine_chunks()), False), dtype=bool)
            if mask.any():
                broken.append((rule.name, mask))
                bad |= mask
        good = table.filter(pa.array(~bad))
        for col in unique_cols:
            unique_cols[col].append(good.column(col).combine_chunks())
        if good.num_rows:
            accepted.write_table(contract.publishable(good))
        if bad.any():
            names = np.full(table.num_rows, "", dtype=object)
            for name, mask in broken:
                names[mask] = np.where(names[mask] == "", name, names[mask] + "," + name)
                report.rejected_by_rule[name] += int(mask.sum())
                report.rejected_by_origin[batch.origin][name] += int(mask.sum())
            bad_rows = table.filter(pa.array(bad))
            bad_rows = bad_rows.append_column("rule", pa.array(names[bad].tolist(), pa.string()))
            bad_rows = bad_rows.append_column("origin", pa.array([batch.origin] * bad_rows.num_rows, pa.string()))
            rejected.write_table(bad_rows.cast(rejected.schema))
        report.accepted += good.num_rows
        report.rejected += int(bad.sum())
        if on_progress:
            on_progress(report)
    report.seconds = time.perf_counter() - t0
    for problem in report.problems():
        log.warning(problem)
    return report

