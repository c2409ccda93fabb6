"""One window's interest hierarchy from the published tables (what the `interest_hierarchy` asset computes): read inputs
from the store, compute, return typed results; the caller writes."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE
from hir_model.embed.entity_embeddings import load_embeddings
from hir_model.graph.window import load_window_graph
from hir_model.hierarchy.build import (ASSIGNMENTS_FILE, HIERARCHY_ASSET, PRIMITIVES_FILE, Hierarchy, HierarchyConfig,
                                       build_hierarchy, catalog_texts)
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import window_model


def hierarchy_window(store: PartitionStore, key: str, prev_key: str | None, end_us: int,
                     config: HierarchyConfig = HierarchyConfig()) -> Hierarchy:
    """Assignments, super-graph, labels; ids matched to the previous window's when `prev_key` holds a hierarchy."""
    emb = load_embeddings(store, key)  # first: the refusal names this asset's own input
    graph = load_window_graph(store, key)
    emb = replace(emb, node=graph.nodes.index_of(pa.array(list(emb.entity_id), pa.string())))
    prototypes = [p.numpy() for p in window_model(store, key).prototypes]
    texts = catalog_texts(store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=["entity_id", "title", "description"]))
    prev = prev_key is not None and store.exists(HIERARCHY_ASSET, prev_key, PRIMITIVES_FILE)
    return build_hierarchy(emb, prototypes, graph, end_us, texts,
                           store.read(HIERARCHY_ASSET, prev_key, PRIMITIVES_FILE) if prev else None,
                           store.read(HIERARCHY_ASSET, prev_key, ASSIGNMENTS_FILE) if prev else None, config)
