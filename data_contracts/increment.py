"""The published tables of the `catalog_increment` asset (hir_model.rank.increment): the items first seen on one day
after window t's end, placed in window t's metric space, that `hir serve`, `hir retrieve` and the evaluation append to
window t's items. Column order is part of the contract."""

import pyarrow as pa

from data_contracts.schemas import TS

INCREMENT_ITEMS_SCHEMA = pa.schema(
    [
        pa.field("entity_id", pa.string(), nullable=False),  # never an item of window t nor of another day's increment
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("first_seen_ts", TS, nullable=False),  # inside the increment's day [start, end)
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # unit row in window t's metric space
        pa.field("content", pa.list_(pa.float32())),  # the fused content vector it was placed from; null: no content
    ]
)
