"""Asset checks derived from the data contracts (great-expectations backed).

Every contract rule becomes a blocking check of the same name on the asset that publishes the table, so
downstream assets never run on data that breaks it. Names come from the contracts; the extra ones are
the constants below.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import pyarrow as pa

from data_contracts import Contract
from hir_model.data.ingest import IngestReport

SCHEMA_CHECK = "schema"
REJECTED_CHECK = "no_rejected_rows"
NOT_EMPTY_CHECK = "not_empty"


def check_name(prefix: str, rule: str) -> str:
    return f"{prefix}{rule}"


def contract_check_specs(contract: Contract, asset: str, prefix: str = "") -> list[dg.AssetCheckSpec]:
    specs = [dg.AssetCheckSpec(check_name(prefix, SCHEMA_CHECK), asset=asset, blocking=True,
                               description=f"{contract.name}: columns, order and types match the contract")]
    specs += [dg.AssetCheckSpec(check_name(prefix, r.name), asset=asset, blocking=True, description=f"{contract.name}: {r.description}")
              for r in contract.rules]
    return specs


def contract_check_results(contract: Contract, table: pa.Table, params: dict[str, Any], asset: str,
                           prefix: str = "") -> list[dg.AssetCheckResult]:
    """Validate the table to be published with great-expectations; one result per contract check."""
    results = contract.validate(table, params)
    problems = contract.schema_problems(table.schema)
    ge_schema = results.pop("schema.columns")
    out = [dg.AssetCheckResult(
        asset_key=asset, check_name=check_name(prefix, SCHEMA_CHECK), passed=ge_schema.success and not problems,
        metadata={"problems": "; ".join(problems) or "none", "columns": ", ".join(table.schema.names),
                  "problem_count": len(problems), "column_count": len(table.schema.names)})]
    for rule in contract.rules:
        r = results[rule.name]
        out.append(dg.AssetCheckResult(
            asset_key=asset, check_name=check_name(prefix, rule.name), passed=r.success,
            description=r.description,
            metadata={"unexpected_count": dg.MetadataValue.int(int(r.unexpected_count)),
                      "unexpected_share": dg.MetadataValue.float(r.unexpected_count / max(table.num_rows, 1)),
                      "unexpected_sample": ", ".join(r.unexpected_sample) or "none", "rows": dg.MetadataValue.int(table.num_rows)}))
    return out


def rejected_spec(asset: str, what: str, prefix: str = "") -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(check_name(prefix, REJECTED_CHECK), asset=asset, blocking=False,
                             description=f"no {what} row was rejected by the contract (rejected rows are kept, with the rule and file)")


def rejected_result(report: IngestReport, asset: str, prefix: str = "") -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=asset, check_name=check_name(prefix, REJECTED_CHECK), passed=report.rejected == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(report.problems()) or "no rows rejected",
        metadata={"rejected": dg.MetadataValue.int(report.rejected), "rows_in": dg.MetadataValue.int(report.rows_in),
                  "rejected_share": dg.MetadataValue.float(report.rejected / max(report.rows_in, 1)),
                  "by_rule": dict(report.rejected_by_rule), "by_file": dg.MetadataValue.md(_problems_md(report))})


def _problems_md(report: IngestReport) -> str:
    if not report.rejected:
        return "no rows rejected"
    lines = ["| file | rule | rows |", "| --- | --- | --- |"]
    lines += [f"| {o} | {r} | {n} |" for o, rules in sorted(report.rejected_by_origin.items()) for r, n in sorted(rules.items())]
    return "\n".join(lines)
