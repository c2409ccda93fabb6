"""The pyarrow schemas of every published input table.

Timestamps are UTC microseconds. Column order is part of the contract: published files use it.
"""

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("ts", TS, nullable=False),
        pa.field("value", pa.float64()),  # optional: a rating, an order value
    ]
)

CATALOG_SCHEMA = pa.schema(
    [
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("parent_id", pa.string()),  # product -> advertiser, campaign -> advertiser
        pa.field("first_seen_ts", TS, nullable=False),
        pa.field("title", pa.string()),
        pa.field("description", pa.string()),
        pa.field("category", pa.string()),
        pa.field("image_uri", pa.string()),
        pa.field("video_uri", pa.string()),
        pa.field("features", pa.map_(pa.string(), pa.string())),  # e.g. users: age_bucket, region
    ]
)

# Typed structural edges known about entities (KG relations, campaign -> advertiser, ...).
RELATIONS_SCHEMA = pa.schema(
    [
        pa.field("src_id", pa.string(), nullable=False),
        pa.field("relation", pa.string(), nullable=False),
        pa.field("dst_id", pa.string(), nullable=False),
        pa.field("first_seen_ts", TS, nullable=False),
    ]
)

# What a rejected row carries beside its original columns (kept as strings: a bad row may not cast).
REJECT_COLUMNS = ("rule", "origin")
