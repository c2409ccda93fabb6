"""One window's entity embeddings from the published tables (what the `entity_embeddings` asset computes), and the
published table read back: read inputs from the store, compute, return typed results; the caller writes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hir_model.content.vectors import CONTENT_ASSET, CONTENT_FILE
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE
from hir_model.embed.entities import (EMBEDDINGS_ASSET, EMBEDDINGS_FILE, EmbedConfig, EntityEmbeddings, embed_entities,
                                      read_embeddings, trained_view, user_view, visible_degree)
from hir_model.graph.sampler import ViewConfig
from hir_model.graph.window import load_window_graph
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import window_model


@dataclass(frozen=True)
class EmbeddingsBuild:
    embeddings: EntityEmbeddings
    model_version: str
    expected: int  # catalogue entities of an embedded type known by the window end
    missing: list[str]  # of those, the ones without a row (a sample)
    no_engagement: int  # rows whose entity has no engagement edge (cold start included)
    view: ViewConfig  # the neighbourhood view warm entities were embedded from
    user_view: ViewConfig | None = None  # warm users' view where it is not `view` (users = "narrow")


def embed_window(store: PartitionStore, key: str, end_us: int, config: EmbedConfig = EmbedConfig()) -> EmbeddingsBuild:
    """Embed the window's entities with its checkpoint, in the view its teacher was trained on unless `config.view` is set."""
    model = window_model(store, key)
    config = replace(config, view=config.view or trained_view(model.extra),
                     user_view=config.user_view or (user_view(model.extra) if config.users == "narrow" else None))
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
                           no_engagement, config.view, config.warm_user_view)


def load_embeddings(store: PartitionStore, key: str) -> EntityEmbeddings:
    if not store.exists(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE):
        raise FileNotFoundError(f"{EMBEDDINGS_ASSET} for window {key} was never materialised under {store.root}")
    return read_embeddings(store.read(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE))


def unit_norm_error(emb: EntityEmbeddings) -> tuple[int, float]:
    """(rows with a non-finite value, max |norm - 1| over the finite rows)."""
    finite = np.isfinite(emb.vectors).all(axis=1)
    err = np.abs(np.linalg.norm(emb.vectors[finite], axis=1) - 1)
    return int((~finite).sum()), float(err.max()) if len(err) else 0.0
