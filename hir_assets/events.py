"""Ingestion stage: the entity catalog, raw events and rejected events, one window per partition."""

from contextlib import contextmanager

import dagster as dg
import pyarrow.compute as pc

from data_contracts import CATALOG, CONTRACTS, CONVERSION_EVENT, EVENTS, RELATIONS, ContractError
from hir_assets.checks import (NOT_EMPTY_CHECK, contract_check_results, contract_check_specs, rejected_result,
                               rejected_spec)
from hir_assets.partitions import window_of
from hir_assets.publication import STEP_RETRY, audit, partitioned, publishes
from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.data.ingest import IngestReport
from hir_model.data.tables import (CATALOG_ASSET, CATALOG_REFERENCE, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE, REJECTED_ASSET,
                                   REJECTED_FILE, RELATIONS_FILE,
                                   build_catalog, build_events, catalog_params, events_params)

GROUP = "ingest"
RELATIONS_PREFIX = "relations_"


@contextmanager
def permanent_failure():
    """A file that breaks its contract fails the run at once: retrying cannot fix it (the window job's RetryPolicy
    is for transient faults such as an S3 blip), and the alert then carries the contract error itself."""
    try:
        yield
    except ContractError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False,
                         metadata={"file": exc.origin, "rule": exc.rule, "rows": exc.rows}) from exc


def rejected_check(report: IngestReport, asset: str, prefix: str = "") -> dg.AssetCheckResult:
    """The rejected-rows warning with numbers an operator can chart: rows, fraction, files, and a count per rule."""
    result = rejected_result(report, asset, prefix)
    return result.with_metadata({**result.metadata, "rejected_fraction": report.rejected / max(report.rows_in, 1),
                                 "files_with_rejects": len(report.rejected_by_origin),
                                 **{f"rejected.{r.name}": report.rejected_by_rule[r.name] for r in CONTRACTS[report.contract].rules}})


def build_ingest_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    catalog_checks = partitioned(contract_check_specs(CATALOG, CATALOG_ASSET) + contract_check_specs(RELATIONS, CATALOG_ASSET, RELATIONS_PREFIX)
                                 + [rejected_spec(CATALOG_ASSET, "catalog"), rejected_spec(CATALOG_ASSET, "relation", RELATIONS_PREFIX)],
                                 partitions)

    @dg.asset(name=CATALOG_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"}, check_specs=catalog_checks,
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    @publishes
    def entity_catalog(context: dg.AssetExecutionContext, storage: PartitionStorage, source: SourceResource) -> dg.MaterializeResult:
        """Every entity known by the window end (users, advertisers, products, campaigns, KG entities) and their typed relations."""
        window, src, store = window_of(context), source.get(), storage.store()
        src.prepare()
        with permanent_failure(), store.writing() as staging:
            built = build_catalog(src, window, staging)
            entities = staging.read(CATALOG_ASSET, window.key, ENTITIES_FILE)
            relations = staging.read(CATALOG_ASSET, window.key, RELATIONS_FILE)
            ids = entities.column("entity_id").combine_chunks()
            checks = audit(context, contract_check_results(CATALOG, entities, catalog_params(window, ids), CATALOG_ASSET)
                           + contract_check_results(RELATIONS, relations, catalog_params(window, ids), CATALOG_ASSET, RELATIONS_PREFIX)
                           + [rejected_check(built.entities, CATALOG_ASSET), rejected_check(built.relations, CATALOG_ASSET, RELATIONS_PREFIX)])
        for line in built.entities.warnings() + built.relations.warnings():
            context.log.warning(line)
        context.log.info(f"catalog {window.key}: {entities.num_rows} entities ({sum(built.new_by_type.values())} new), "
                         f"{relations.num_rows} relations, {built.entities.rejected + built.relations.rejected} rejected")
        return dg.MaterializeResult(metadata={
            "dagster/row_count": entities.num_rows,
            "entities_by_type": built.by_type,
            "new_entities": sum(built.new_by_type.values()),
            "new_entities_by_type": built.new_by_type,
            "relations": relations.num_rows,
            "relations_by_type": built.relations_by_type,
            "rejected": built.entities.rejected + built.relations.rejected,
            "rejected_entities": built.entities.rejected,
            "rejected_relations": built.relations.rejected,
            "files_assumed_utc": len(built.entities.notes) + len(built.relations.notes),
            "path": dg.MetadataValue.path(store.uri(CATALOG_ASSET, window.key)),
        }, check_results=checks)

    event_checks = partitioned(contract_check_specs(EVENTS, EVENTS_ASSET) + [
        rejected_spec(EVENTS_ASSET, "event"),
        dg.AssetCheckSpec(NOT_EMPTY_CHECK, asset=EVENTS_ASSET, blocking=False, description="the window has at least one event"),
    ], partitions)

    @dg.asset(name=EVENTS_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"}, deps=[CATALOG_ASSET],
              check_specs=event_checks, backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    @publishes
    def raw_events(context: dg.AssetExecutionContext, storage: PartitionStorage, source: SourceResource) -> dg.MaterializeResult:
        """The window's engagement events that pass the events contract; the rows that break it are kept beside them."""
        window, src, store = window_of(context), source.get(), storage.store()
        src.prepare()
        catalog = store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=CATALOG_REFERENCE)

        def progress(report):
            if len(report.origins) % 20 == 0:
                context.log.info(f"events {window.key}: {report.rows_in:,} rows read, {report.rejected:,} rejected")

        with permanent_failure(), store.writing() as staging:
            report = build_events(src, window, catalog, staging, progress)
            events = staging.read(EVENTS_ASSET, window.key, EVENTS_FILE)
            params = events_params(window, catalog)
            checks = audit(context, contract_check_results(EVENTS, events, params, EVENTS_ASSET) + [
                rejected_check(report, EVENTS_ASSET),
                dg.AssetCheckResult(asset_key=EVENTS_ASSET, check_name=NOT_EMPTY_CHECK, passed=events.num_rows > 0,
                                    severity=dg.AssetCheckSeverity.WARN, metadata={"rows": events.num_rows},
                                    description=f"{events.num_rows} events in {window.key}"),
            ])
        for line in report.warnings():
            context.log.warning(line)
        by_type = dict(sorted(zip(*[c.to_pylist() for c in pc.value_counts(events.column("event_type")).flatten()])))
        context.log.info(f"events {window.key}: {report.accepted:,} accepted, {report.rejected:,} rejected "
                         f"in {report.seconds:.1f}s ({report.rows_in / max(report.seconds, 1e-9):,.0f} rows/s)")
        return dg.MaterializeResult(check_results=checks, metadata={
            "dagster/row_count": events.num_rows,
            "events_by_type": by_type,
            "conversions": by_type.get(CONVERSION_EVENT, 0),
            "users": pc.count_distinct(events.column("user_id")).as_py(),
            "entities": pc.count_distinct(events.column("entity_id")).as_py(),
            "rejected": report.rejected,
            "rejected_fraction": report.rejected / max(report.rows_in, 1),
            "rejected_by_rule": dict(report.rejected_by_rule),
            # published by policy (data_contracts: warnings), counted here and logged per file rather than alerted
            **{f"published.{r.name}": report.warned_by_rule[r.name] for r in EVENTS.warnings},
            "files_assumed_utc": len(report.notes),
            "files_read": len(set(report.origins)),
            "path": dg.MetadataValue.path(store.uri(EVENTS_ASSET, window.key)),
        })

    @dg.asset(name=REJECTED_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"}, deps=[EVENTS_ASSET],
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    def rejected_events(context: dg.AssetExecutionContext, storage: PartitionStorage) -> dg.MaterializeResult:
        """The window's events that broke the contract, each with the rules it broke and the file it came from."""
        store = storage.store()
        rejected = store.read(EVENTS_ASSET, context.partition_key, REJECTED_FILE)
        with store.writing() as staging:
            staging.write_table(REJECTED_ASSET, context.partition_key, REJECTED_FILE, rejected)
        by_rule = pc.value_counts(rejected.column("rule")).to_pylist() if rejected.num_rows else []
        return dg.MaterializeResult(metadata={
            "dagster/row_count": rejected.num_rows,
            "by_rule": {d["values"]: d["counts"] for d in by_rule},
            "files": sorted(set(rejected.column("origin").to_pylist())),
            "path": dg.MetadataValue.path(store.uri(REJECTED_ASSET, context.partition_key)),
        })

    return [entity_catalog, raw_events, rejected_events]
