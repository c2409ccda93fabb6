"""The published tables of the `ranking_head` asset (hir_model.rank.state): what `hir retrieve`, `hir serve`, the BoM
index and the evaluation read to score window t. Column order is part of the contract."""

import pyarrow as pa

from data_contracts.schemas import TS

HEAD_ITEMS_SCHEMA = pa.schema(
    [
        pa.field("entity_id", pa.string(), nullable=False),  # the items the head ranks, sorted; row r is bom_index's row r
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # unit row in the window's metric space
        pa.field("log_prior", pa.float32()),  # temp x log decayed engagement in graph(t), floored; null: no prior
        pa.field("cold_log_prior", pa.float32()),  # the same of new users' first days; null: cold users take log_prior
        pa.field("structure", pa.list_(pa.float32())),  # structural encoding in graph(t); null: no structural readout
        pa.field("content", pa.list_(pa.float32())),  # unit content vector (content_embeddings(t)); null: none
    ]
)

HEAD_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),  # always one of the head's items
        pa.field("ts", TS, nullable=False),  # always before the window's end
        pa.field("deep", pa.bool_(), nullable=False),  # a deep-funnel (conversion) event
    ]
)

HEAD_COENGAGEMENT_SCHEMA = pa.schema(
    [
        pa.field("item", pa.int32(), nullable=False),  # a row of the head's items
        pa.field("neighbour", pa.int32(), nullable=False),  # one of its most co-engaged items (a row), never itself
        pa.field("similarity", pa.float32(), nullable=False),  # > 0 (hir_model.rank.coengagement)
    ]
)
