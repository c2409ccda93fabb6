"""A contract is one definition: a pyarrow schema plus row rules that yield a great-expectations suite.

Ingestion uses `conform` (file-level: columns and types) and `Rule.violations` (row-level); asset checks
use `validate` (great-expectations on the published table). Both read the same `Contract`.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from data_contracts.rules import Rule


class ContractError(ValueError):
    """A whole input file breaks a contract (missing columns, uncastable types, unreadable file).

    The message names the file, the rule and the number of rows affected.
    """

    def __init__(self, origin: str, rule: str, rows: int, detail: str):
        self.origin, self.rule, self.rows, self.detail = origin, rule, rows, detail
        super().__init__(f"{origin}: rule '{rule}' broken ({rows} rows): {detail}")


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
    rules: tuple[Rule, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema if not f.nullable)

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"contract {self.name!r} has no rule {name!r}; rules: {[r.name for r in self.rules]}")

    def conform(self, table: pa.Table, origin: str) -> pa.Table:
        """The table with the contract's columns, order and types, or a ContractError naming the file.

        Extra columns are dropped; a missing optional (nullable) column is filled with nulls; a missing
        required column or a value that cannot be cast safely fails the whole file.
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
            if col.type != f.type:
                try:
                    col = col.cast(f.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ContractError(origin, "schema.column_type", table.num_rows,
                                        f"column {f.name!r} is {col.type}, expected {f.type}, and does not cast: {exc}") from exc
            cols.append(col)
        # Nullability is a row rule (not_null), not a file rule: build the schema as nullable here.
        loose = pa.schema([f.with_nullable(True) for f in self.schema])
        return pa.Table.from_arrays(cols, schema=loose)

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

    def expectation_suite(self, params: dict[str, Any], table: pa.Table | None = None):
        """The great-expectations ExpectationSuite for this contract, bound to run-time params (and the table to validate)."""
        import great_expectations as gx
        import great_expectations.expectations as gxe

        expectations = [gxe.ExpectTableColumnsToMatchOrderedList(column_list=list(self.schema.names), meta={"rule": "schema.columns"})]
        for rule in self.rules:
            expectations.extend(rule.expectations(params, table))
        return gx.ExpectationSuite(name=f"{self.name}_contract", expectations=expectations)

    def validate(self, table: pa.Table, params: dict[str, Any]) -> dict[str, RuleResult]:
        """Run the great-expectations suite on `table`; one RuleResult per rule plus `schema.columns`."""
        suite = self.expectation_suite(params, table)
        df = table.to_pandas()  # strings as objects, timestamps tz-aware: what GE's pandas engine expects
        result = _validate_dataframe(df, suite, self.name)
        merged: dict[str, RuleResult] = {}
        descriptions = {r.name: r.description for r in self.rules} | {"schema.columns": "columns and their order match the contract"}
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
