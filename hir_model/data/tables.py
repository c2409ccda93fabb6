"""Build a window's published input tables (catalog, relations, events) from a source into staging.

These functions hold everything the `entity_catalog` and `raw_events` assets compute; the assets only
wire them to Dagster. Files are written into a `Staging` (see hir_model.storage), so the caller commits
all of them or none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import CATALOG, EVENTS, RELATIONS, Contract, ContractOptions
from hir_model.data.ingest import IngestReport, ingest
from hir_model.data.parquet_source import ParquetSource
from hir_model.data.source import Batch, Source
from hir_model.data.windows import Window
from hir_model.storage import Staging

log = logging.getLogger("hir")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
CATALOG_ASSET, EVENTS_ASSET, REJECTED_ASSET = "entity_catalog", "raw_events", "rejected_events"
ENTITIES_FILE, RELATIONS_FILE, REJECTED_FILE, EVENTS_FILE = "entities", "relations", "rejected", "events"
REJECTED_RELATIONS_FILE = "rejected_relations"
CATALOG_REFERENCE = ["entity_id", "entity_type", "first_seen_ts"]  # what event rules read from the catalog


@dataclass(frozen=True)
class CatalogBuild:
    entities: IngestReport
    relations: IngestReport
    by_type: dict[str, int]  # entities known by the window end, per type
    new_by_type: dict[str, int]  # first seen inside the window, per type
    relations_by_type: dict[str, int]


def catalog_params(window: Window, known: pa.Array) -> dict:
    return {"window": (EPOCH, window.end), "known_entities": known}


def events_params(window: Window, catalog: pa.Table) -> dict:
    """The events rules' parameters from the window's published catalog (CATALOG_REFERENCE's columns)."""
    catalog = catalog.select(CATALOG_REFERENCE).combine_chunks()
    users = catalog.filter(pc.equal(catalog.column("entity_type"), "user")).column("entity_id")
    return {"window": (window.start, window.end), "known_entities": catalog.column("entity_id"), "known_users": users,
            "catalog": catalog}


def contract_for(contract: Contract, source: Source, folder: str) -> Contract:
    """The contract with the source's options: a bring-your-own folder declares them in contract.toml; others need none."""
    return contract.with_options(source.contract_options(folder) if isinstance(source, ParquetSource) else ContractOptions())


def build_catalog(source: Source, window: Window, staging: Staging) -> CatalogBuild:
    """Entities and relations known by `window.end`, validated; rejects of both go to `rejected`."""
    catalog, relations_contract = contract_for(CATALOG, source, "catalog"), contract_for(RELATIONS, source, "relations")
    batches = list(source.catalog(window.end))  # a catalog snapshot fits in memory (events stream)
    notes: dict[str, list[str]] = {}
    conformed = [Batch(b.origin, catalog.conform(b.table, b.origin, notes=notes.setdefault(b.origin, []))) for b in batches]
    # parent_id must name an entity of this snapshot: the candidate ids are every row's non-null id
    ids = pc.unique(pc.drop_null(pa.chunked_array([b.table.column("entity_id") for b in conformed], pa.string())))
    part = window.key
    entities = ingest(catalog, conformed, catalog_params(window, ids),
                      staging.file(CATALOG_ASSET, part, ENTITIES_FILE), staging.file(CATALOG_ASSET, part, REJECTED_FILE))
    entities.notes.update({origin: list(dict.fromkeys(n)) for origin, n in notes.items() if n})
    table = staging.read(CATALOG_ASSET, part, ENTITIES_FILE, columns=CATALOG_REFERENCE)
    known = table.column("entity_id").combine_chunks()
    relations = ingest(relations_contract, source.relations(window.end), catalog_params(window, known),
                       staging.file(CATALOG_ASSET, part, RELATIONS_FILE), staging.file(CATALOG_ASSET, part, REJECTED_RELATIONS_FILE))
    rel_types = staging.read(CATALOG_ASSET, part, RELATIONS_FILE, columns=["relation"]).column("relation")
    new = table.filter(pc.greater_equal(table.column("first_seen_ts"), pa.scalar(window.start, table.schema.field("first_seen_ts").type)))
    return CatalogBuild(entities, relations, _counts(table.column("entity_type")), _counts(new.column("entity_type")), _counts(rel_types))


def build_events(source: Source, window: Window, catalog: pa.Table, staging: Staging,
                 on_progress: Callable[[IngestReport], None] | None = None) -> IngestReport:
    """The window's events, validated against the contract and the window's catalog (CATALOG_REFERENCE's columns).

    Accepted rows go to `raw_events/<key>/events`, rejected ones beside them to `raw_events/<key>/rejected`
    (one commit: they always describe the same run); the `rejected_events` asset publishes the latter.
    """
    return ingest(contract_for(EVENTS, source, "events"), source.events(window), events_params(window, catalog),
                  staging.file(EVENTS_ASSET, window.key, EVENTS_FILE), staging.file(EVENTS_ASSET, window.key, REJECTED_FILE), on_progress)


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    vc = pc.value_counts(column)
    return dict(sorted(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist())))
