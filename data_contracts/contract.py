"""A contract is one definition: a pyarrow schema plus row rules that yield a great-expectations suite.

Ingestion uses `conform` (file-level: columns and types) and `Rule.violations` (row-level); asset checks
use `validate` (great-expectations on the published table). Both read the same `Contract`.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from data_contracts.errors import ContractError
from data_contracts.options import OPTIONS_FILE, ContractOptions
from data_contracts.rules import Rule

SAMPLE = 5  # offending rows quoted in an error message


@dataclass(frozen=True)
class RuleResult:
    rule: str
    description: str
    success: bool
    unexpected_count: int
    unexpected_sample: list = field(default_factory=list)  # a few offending values, for alerts


@dataclass(frozen=True)
class Contract:
    name: str
    schema: pa.Schema
    rules: tuple[Rule, ...]  # a row that breaks one is rejected; each is a blocking check on the published table
    warnings: tuple[Rule, ...] = ()  # a row that breaks one is published and counted; each is a warning check
    options: ContractOptions | None = None  # how the input encodes timestamps (None: the defaults, strict)

    def with_options(self, options: ContractOptions) -> Contract:
        return replace(self, options=options)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema if not f.nullable)

    def rule(self, name: str) -> Rule:
        for r in self.rules + self.warnings:
            if r.name == name:
                return r
        raise KeyError(f"contract {self.name!r} has no rule {name!r}; rules: {[r.name for r in self.rules]}")

    def conform(self, table: pa.Table, origin: str, first_row: int = 0, notes: list[str] | None = None) -> pa.Table:
        """The table with the contract's columns, order and types, or a ContractError naming the file.

        Extra columns are dropped; a missing optional (nullable) column is filled with nulls; a missing
        required column or a value that cannot be cast safely fails the whole file, naming the rows that do
        not cast (`first_row` is the table's first row's number in its file). Timestamps: integers only with
        a declared `ts_unit`, timezone-naive values only with `assume_utc` (noted in `notes`).
        """
        missing = [f.name for f in self.schema if f.name not in table.column_names and not f.nullable]
        if missing:
            raise ContractError(origin, "schema.missing_columns", table.num_rows,
                                f"{self.name} requires columns {missing}; the file has {table.column_names}")
        cols = []
        for f in self.schema:
            if f.name not in table.column_names:
                cols.append(pa.nulls(table.num_rows, f.type))
                continue
            col = table.column(f.name)
            if pa.types.is_timestamp(f.type):
                col = self._timestamps(col, f.name, origin, notes)
            if col.type != f.type:
                col = _cast(table, col, f, origin, first_row)
            cols.append(col)
        # Nullability is a row rule (not_null), not a file rule: build the schema as nullable here.
        loose = pa.schema([f.with_nullable(True) for f in self.schema])
        return pa.Table.from_arrays(cols, schema=loose)

    def timestamps(self, table: pa.Table, name: str, origin: str) -> pa.ChunkedArray:
        """One timestamp column read as the contract reads it (for a source that filters on it before ingestion)."""
        col = self._timestamps(table.column(name), name, origin, None)
        return col if col.type == self.schema.field(name).type else _cast(table, col, self.schema.field(name), origin, 0)

    def _timestamps(self, col: pa.ChunkedArray, name: str, origin: str, notes: list[str] | None) -> pa.ChunkedArray:
        """Integers with the declared unit become UTC timestamps; naive timestamps become UTC with assume_utc; else refused."""
        options = self.options or ContractOptions()
        if pa.types.is_integer(col.type):
            if options.ts_unit is None:
                raise ContractError(origin, "schema.timestamp_unit", len(col), _unit_hint(col, name, OPTIONS_FILE))
            return col.cast(pa.timestamp(options.ts_unit, tz="UTC"))
        if pa.types.is_timestamp(col.type) and col.type.tz is None:
            if not options.assume_utc:
                first = first_valid(col)
                raise ContractError(origin, "schema.timestamp_timezone", len(col),
                                    f"column {name!r} is {col.type} without a time zone (first value {first}); the contract "
                                    f"needs UTC instants: write the column with a time zone, or declare assume_utc = true in "
                                    f"{OPTIONS_FILE} if these values are UTC")
            if notes is not None:
                notes.append(f"column {name!r} has no time zone: taken as UTC (assume_utc)")
            return col.cast(pa.timestamp(col.type.unit, tz="UTC"))
        if pa.types.is_string(col.type) and options.assume_utc:
            try:
                return col.cast(self.schema.field(name).type)
            except pa.ArrowInvalid:  # no zone offset in the strings: read them as naive, then as UTC
                try:
                    naive = col.cast(pa.timestamp("us"))
                except pa.ArrowInvalid:
                    return col  # not timestamps at all: the cast below names the rows
                if notes is not None:
                    notes.append(f"column {name!r} has no time zone: taken as UTC (assume_utc)")
                return naive.cast(pa.timestamp("us", tz="UTC"))
        return col

    def publishable(self, table: pa.Table) -> pa.Table:
        """Cast a conformed, rule-clean table to the exact published schema (non-null keys enforced)."""
        return table.cast(self.schema)

    def schema_problems(self, schema: pa.Schema) -> list[str]:
        """Differences between a written file's schema and the contract (empty when it matches)."""
        problems = []
        names = [f.name for f in schema]
        if names != self.schema.names:
            problems.append(f"columns {names} != contract {self.schema.names}")
        for f in self.schema:
            if f.name in names and schema.field(f.name).type != f.type:
                problems.append(f"column {f.name!r} is {schema.field(f.name).type}, contract says {f.type}")
        return problems

    def expectation_suite(self, params: dict[str, Any], table: pa.Table | None = None, warnings: bool = False):
        """The great-expectations ExpectationSuite for this contract's rules (or its warnings), bound to run-time params.

        `table`, when given, is the table to validate. Rules that compare a row with the catalog read a derived
        column (`Rule.derived`) that `validate` adds after the contract's columns.
        """
        import great_expectations as gx
        import great_expectations.expectations as gxe

        rules = self.warnings if warnings else self.rules
        derived = [name for r in rules for name in r.derived_names()]
        expectations = [gxe.ExpectTableColumnsToMatchOrderedList(column_list=list(self.schema.names) + derived,
                                                                 meta={"rule": "schema.columns"})]
        for rule in rules:
            expectations.extend(rule.expectations(params, table))
        return gx.ExpectationSuite(name=f"{self.name}_{'warnings' if warnings else 'contract'}", expectations=expectations)

    def validate(self, table: pa.Table, params: dict[str, Any], warnings: bool = False) -> dict[str, RuleResult]:
        """Run the great-expectations suite on `table`; one RuleResult per rule (or warning) plus `schema.columns`."""
        suite = self.expectation_suite(params, table, warnings)
        rules = self.warnings if warnings else self.rules
        for rule in rules:
            for name, values in rule.derived(table, params).items():
                table = table.append_column(name, values)
        df = table.to_pandas()  # strings as objects, timestamps tz-aware: what GE's pandas engine expects
        result = _validate_dataframe(df, suite, f"{self.name}_warnings" if warnings else self.name)
        merged: dict[str, RuleResult] = {}
        descriptions = {r.name: r.description for r in rules} | {"schema.columns": "columns and their order match the contract"}
        for res in result.results:
            rule = res.expectation_config.meta["rule"]
            stats = res.result or {}
            count = int(stats.get("unexpected_count") or 0)
            sample = [str(v) for v in (stats.get("partial_unexpected_list") or [])[:5]]
            prev = merged.get(rule)
            merged[rule] = RuleResult(
                rule=rule,
                description=descriptions[rule],
                success=bool(res.success) and (prev.success if prev else True),
                unexpected_count=count + (prev.unexpected_count if prev else 0),
                unexpected_sample=(prev.unexpected_sample if prev else []) + sample,
            )
        return merged


def first_valid(col: pa.ChunkedArray):
    """The first non-null value of a column (None when all are null), for messages."""
    valid = col.drop_null()
    return valid[0].as_py() if len(valid) else None


def _unit_hint(col: pa.ChunkedArray, name: str, options_file: str) -> str:
    """Why integer timestamps are refused, with the first value and the unit that makes it a plausible date."""
    value = first_valid(col)
    if value is None:
        return f"column {name!r} is {col.type} (all null); declare ts_unit in {options_file}"
    readings = []
    for unit, per_second in (("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9)):
        try:
            readings.append((unit, datetime.fromtimestamp(value / per_second, timezone.utc)))
        except (OverflowError, OSError, ValueError):
            continue
    likely = [(u, d) for u, d in readings if 1990 <= d.year <= 2100]
    guess = (f"{value} reads as {likely[0][1]:%Y-%m-%d %H:%M:%S} UTC in {likely[0][0]}, so the unit is likely "
             f"{likely[0][0]!r}: declare ts_unit = \"{likely[0][0]}\" in {options_file}" if likely
             else f"{value} is no date between 1990 and 2100 in any unit (s, ms, us, ns); declare ts_unit in {options_file}")
    return f"column {name!r} holds integers ({col.type}) and the contract options declare no unit; {guess}"


def _cast(table: pa.Table, col: pa.ChunkedArray, f: pa.Field, origin: str, first_row: int) -> pa.ChunkedArray:
    """`col` cast safely to the field's type, or a ContractError counting and quoting the rows that do not cast."""
    try:
        return col.cast(f.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        bad = _uncastable_rows(col.combine_chunks(), f.type)
        key = table.schema.names[0]
        quoted = [f"row {first_row + i} ({key}={table.column(key)[i].as_py()!r}): {col[i].as_py()!r}" for i in bad[:SAMPLE]]
        hint = "; if they are UTC, declare assume_utc = true in contract.toml" if "zone offset" in str(exc) else ""
        raise ContractError(origin, "schema.column_type", len(bad),
                            f"column {f.name!r} is {col.type}, expected {f.type}: {len(bad)} of {len(col)} rows do not cast, "
                            f"e.g. {'; '.join(quoted)} ({exc}){hint}") from exc


def _uncastable_rows(arr: pa.Array, type_: pa.DataType, step: int = 1024) -> list[int]:
    """Indices of the values that do not cast; only called once a cast has failed, so its cost is on the error path."""
    try:
        pa.array([], arr.type).cast(type_)
    except pa.ArrowNotImplementedError:
        return list(range(len(arr)))  # the type itself does not cast: every row
    bad = []
    for start in range(0, len(arr), step):
        part = arr.slice(start, step)
        try:
            part.cast(type_, safe=True)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        for i in range(len(part)):
            try:
                part.slice(i, 1).cast(type_, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad.append(start + i)
    return bad


_GX_CONTEXT = None


def _validate_dataframe(df, suite, name: str):
    """Validate a pandas DataFrame against a suite through an ephemeral GE context (no files written)."""
    global _GX_CONTEXT
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network calls from checks
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    if _GX_CONTEXT is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _GX_CONTEXT = gx.get_context(mode="ephemeral")
        _GX_CONTEXT.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ctx = _GX_CONTEXT
    try:
        source = ctx.data_sources.get("hir")
    except (KeyError, ValueError):
        source = ctx.data_sources.add_pandas("hir")
    try:
        asset = source.get_asset(name)
    except LookupError:
        asset = source.add_dataframe_asset(name)
    try:
        batch_def = asset.get_batch_definition("whole")
    except (KeyError, LookupError, ValueError):
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    return batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
