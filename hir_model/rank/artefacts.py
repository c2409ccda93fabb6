"""What HIR publishes for window t (the artefacts the ranking head and the evaluation rank with), and loading them
from the store."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from hir_model.embed import DEFAULT_VIEW, EntityEmbeddings, trained_view
from hir_model.graph.csr import Graph
from hir_model.graph.sampler import ViewConfig
from hir_model.train.checkpoint import TrainedModel


@dataclass(frozen=True)
class WindowArtefacts:
    """What HIR publishes for window t (read by `load_artefacts`)."""

    window: str  # key of window t
    end_us: int  # end(t)
    embeddings: EntityEmbeddings  # the `entity_embeddings` table of t
    model: TrainedModel  # the `hir_encoder` checkpoint of t (frozen)
    graph: Graph | None  # `engagement_graph` of t: the known context items' neighbourhoods (None: items only)
    content: pa.Table | None = None  # `content_embeddings` of t (entity_id, embedding): the known tokens' content
    view: ViewConfig = DEFAULT_VIEW  # the view `entity_embeddings` embedded warm entities with (the checkpoint's)
    prior_scale: float = 0.0  # the checkpoint's engagement temperature (0: none recorded, no prior)


def missing_artefacts(store, key: str) -> str | None:
    """Why window `key` has no HIR artefacts to evaluate (None: they are all there)."""
    from hir_model.embed import EMBEDDINGS_FILE
    from hir_model.embed import EMBEDDINGS_ASSET
    from hir_model.train.checkpoint import ENCODER_ASSET, checkpoint_path

    if not store.exists(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE):
        return f"{EMBEDDINGS_ASSET} for {key} is not materialised"
    if not store.exists(ENCODER_ASSET, key) or not checkpoint_path(store, key).is_file():
        return f"{ENCODER_ASSET} for {key} is not materialised"
    return None


def load_artefacts(store, key: str, end_us: int) -> WindowArtefacts:
    """Window `key`'s published embeddings, checkpoint, graph and content table (the graph and content when present)."""
    from hir_model.graph.window import has_graph, load_window_graph
    from hir_model.content import CONTENT_ASSET, CONTENT_FILE
    from hir_model.train.checkpoint import window_model
    from hir_model.embed.entity_embeddings import load_embeddings

    model = window_model(store, key)
    content = None
    if model.encoder.cfg.content_dim and store.exists(CONTENT_ASSET, key, CONTENT_FILE):
        content = store.read(CONTENT_ASSET, key, CONTENT_FILE, columns=["entity_id", "embedding"])
    graph = load_window_graph(store, key) if has_graph(store, key) else None
    return WindowArtefacts(key, end_us, load_embeddings(store, key), model, graph, content, trained_view(model.extra),
                           trained_prior_scale(model.extra))


def trained_prior_scale(extra: dict) -> float:
    """The engagement temperature a checkpoint trained with (its `extra["train_config"]`; 0 when none is recorded): the
    scale that puts the item prior in the units of its scores (hir_model.rank.state.fit_head)."""
    train = (extra or {}).get("train_config", {})
    return float(train.get("objective", train).get("engagement_temp", 0.0))  # grouped, or the flat dict of older hir
