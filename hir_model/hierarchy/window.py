"""One window's embeddings and hierarchy from the published tables (what the `entity_embeddings` and
`interest_hierarchy` assets compute): read inputs from the store, compute, return typed results; the caller writes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.embed import EMBEDDINGS_FILE, EmbedConfig, EntityEmbeddings, embed_entities, read_embeddings, trained_view
from hir_model.embed.entities import visible_degree
from hir_model.graph.sampler import ViewConfig
from hir_model.graph.window import GRAPH_ASSET, load_window_graph
from hir_model.hierarchy.build import (ASSIGNMENTS_FILE, PRIMITIVES_FILE, Hierarchy, HierarchyConfig, build_hierarchy,
                                       catalog_texts)
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import TrainedModel, load_checkpoint, load_trained_model
from hir_model.train.data import TrainData, align_content, load_train_data

ENCODER_ASSET, CHECKPOINT_FILE = "hir_encoder", "checkpoint.pt"
CONTENT_ASSET, CONTENT_FILE = "content_embeddings", "embeddings"
EMBEDDINGS_ASSET, HIERARCHY_ASSET = "entity_embeddings", "interest_hierarchy"


def checkpoint_path(store: PartitionStore, key: str) -> Path:
    return store.partition_dir(ENCODER_ASSET, key) / CHECKPOINT_FILE


def window_train_data(store: PartitionStore, key: str, content: bool = True) -> tuple[TrainData, pa.Table | None]:
    """hir_encoder's inputs of window `key` from a store (engagement_graph, raw_events, content_embeddings), and the
    content table itself (None without content), read once."""
    table = store.read(CONTENT_ASSET, key, CONTENT_FILE, columns=["entity_id", "embedding"]) if content else None
    data = load_train_data(store.partition_dir(GRAPH_ASSET, key), store.partition_dir(EVENTS_ASSET, key) / f"{EVENTS_FILE}.parquet")
    if table is None:
        return data, None
    mat, has = align_content(data.graph, table)
    return replace(data, content=mat, has_content=has), table


def window_model(store: PartitionStore, key: str) -> TrainedModel:
    """The window's TrainedModel (a CheckpointError naming the file when hir_encoder was not materialised)."""
    return load_trained_model(checkpoint_path(store, key))


@dataclass(frozen=True)
class EmbeddingsBuild:
    embeddings: EntityEmbeddings
    model_version: str
    expected: int  # catalogue entities of an embedded type known by the window end
    missing: list[str]  # of those, the ones without a row (a sample)
    no_engagement: int  # rows whose entity has no engagement edge (cold start included)
    view: ViewConfig  # the neighbourhood view warm entities were embedded from


def embed_window(store: PartitionStore, key: str, end_us: int, config: EmbedConfig = EmbedConfig()) -> EmbeddingsBuild:
    """Embed the window's entities with its checkpoint, in the view its teacher was trained on unless `config.view` is set."""
    model = window_model(store, key)
    if config.view is None:
        config = replace(config, view=trained_view(load_checkpoint(checkpoint_path(store, key)).get("extra", {})))
    graph = load_window_graph(store, key)
    content = None
    if model.encoder.cfg.content_dim:
        if not store.exists(CONTENT_ASSET, key, CONTENT_FILE):
            raise FileNotFoundError(f"the encoder reads content vectors: materialise {CONTENT_ASSET} for {key} first")
        content = store.read(CONTENT_ASSET, key, CONTENT_FILE, columns=["entity_id", "embedding"])
    emb = embed_entities(model, graph, end_us, content, config)
    catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=["entity_id", "entity_type"])
    wanted = [e for e, t in zip(catalog["entity_id"].to_pylist(), catalog["entity_type"].to_pylist()) if t in config.entity_types]
    have = set(emb.entity_id)
    missing = [e for e in wanted if e not in have]
    no_engagement = int((visible_degree(graph, end_us, engagement_only=True)[emb.node] == 0).sum())
    return EmbeddingsBuild(emb, model.version, len(wanted), missing[:10] + ([f"... {len(missing)} in all"] if len(missing) > 10 else []),
                           no_engagement, config.view)


def load_embeddings(store: PartitionStore, key: str) -> EntityEmbeddings:
    if not store.exists(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE):
        raise FileNotFoundError(f"{EMBEDDINGS_ASSET} for window {key} was never materialised under {store.root}")
    return read_embeddings(store.read(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE))


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


def unit_norm_error(emb: EntityEmbeddings) -> tuple[int, float]:
    """(rows with a non-finite value, max |norm - 1| over the finite rows)."""
    finite = np.isfinite(emb.vectors).all(axis=1)
    err = np.abs(np.linalg.norm(emb.vectors[finite], axis=1) - 1)
    return int((~finite).sum()), float(err.max()) if len(err) else 0.0
