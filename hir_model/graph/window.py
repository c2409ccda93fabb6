"""Build one window's graph from the published tables: what the `engagement_graph` asset computes.

Reads graph(t-1) (memory-mapped) from the store, catalog(t) and relations(t) from `entity_catalog`, window
t's events from `raw_events` (streamed in batches), builds graph(t) and writes it into the staging folder
of `engagement_graph/<key>`, so the caller commits it with the rest of its partition or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.schemas import RELATIONS_SCHEMA
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EPOCH, EVENTS_ASSET, EVENTS_FILE, RELATIONS_FILE
from hir_model.data.windows import Window
from hir_model.graph.build import CATALOG_COLUMNS, EVENT_COLUMNS, GraphBuildReport, GraphConfig, build_graph
from hir_model.graph.csr import Graph
from hir_model.graph.storage import NODES_FILE, load_graph, write_graph
from hir_model.storage import PartitionStore, Staging

GRAPH_ASSET = "engagement_graph"
EVENT_BATCH_ROWS = 262_144


class MissingPreviousGraph(FileNotFoundError):
    """graph(t-1) is needed and not materialised."""


@dataclass(frozen=True)
class WindowGraph:
    graph: Graph  # memory-mapped from the staging folder
    previous: Graph | None  # graph(t-1), None for the first window
    report: GraphBuildReport


def to_us(ts: datetime) -> int:
    """UTC microseconds since the epoch (the unit of every graph timestamp)."""
    return (ts - EPOCH) // timedelta(microseconds=1)


def has_graph(store: PartitionStore, key: str) -> bool:
    return store.exists(GRAPH_ASSET, key, NODES_FILE)


def load_window_graph(store: PartitionStore, key: str) -> Graph:
    if not has_graph(store, key):
        raise MissingPreviousGraph(f"{GRAPH_ASSET} for {key} is not materialised: materialise {GRAPH_ASSET} for {key} first "
                                   f"(each window's graph is built from the previous window's)")
    return load_graph(store.partition_dir(GRAPH_ASSET, key))


def _events(store: PartitionStore, key: str) -> Iterator[pa.RecordBatch]:
    if not store.exists(EVENTS_ASSET, key, EVENTS_FILE):
        raise FileNotFoundError(f"{EVENTS_ASSET}/{key}/{EVENTS_FILE}.parquet is missing: materialise {EVENTS_ASSET} for {key} first")
    yield from pq.ParquetFile(store.partition_dir(EVENTS_ASSET, key) / f"{EVENTS_FILE}.parquet").iter_batches(
        batch_size=EVENT_BATCH_ROWS, columns=EVENT_COLUMNS)


def build_window_graph(store: PartitionStore, window: Window, previous_key: str | None, staging: Staging,
                       config: GraphConfig = GraphConfig()) -> WindowGraph:
    """graph(window) from graph(previous_key) (None: the first window) and the window's published tables."""
    previous = load_window_graph(store, previous_key) if previous_key is not None else None
    catalog = store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=CATALOG_COLUMNS)
    relations = (store.read(CATALOG_ASSET, window.key, RELATIONS_FILE) if store.exists(CATALOG_ASSET, window.key, RELATIONS_FILE)
                 else RELATIONS_SCHEMA.empty_table())
    graph, report = build_graph(previous, catalog, relations, _events(store, window.key), to_us(window.end), config)
    folder = staging.path(GRAPH_ASSET, window.key)
    write_graph(graph, folder)
    del graph  # the in-memory copy goes; what follows reads the written files
    return WindowGraph(load_graph(folder), previous, report)
