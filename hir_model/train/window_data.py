"""hir_encoder's inputs of one window read from a store: the window's engagement_graph, raw_events and content_embeddings."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from hir_model.content.vectors import CONTENT_ASSET, CONTENT_FILE
from hir_model.data.tables import EVENTS_ASSET, EVENTS_FILE
from hir_model.graph.window import GRAPH_ASSET
from hir_model.storage import PartitionStore
from hir_model.train.data import TrainData, align_content, load_train_data


def window_train_data(store: PartitionStore, key: str, content: bool = True) -> tuple[TrainData, pa.Table | None]:
    """hir_encoder's inputs of window `key` from a store (engagement_graph, raw_events, content_embeddings), and the
    content table itself (None without content), read once."""
    table = store.read(CONTENT_ASSET, key, CONTENT_FILE, columns=["entity_id", "embedding"]) if content else None
    data = load_train_data(store.partition_dir(GRAPH_ASSET, key), store.partition_dir(EVENTS_ASSET, key) / f"{EVENTS_FILE}.parquet")
    if table is None:
        return data, None
    mat, has = align_content(data.graph, table)
    return replace(data, content=mat, has_content=has), table
