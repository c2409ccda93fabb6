"""A hand-made store of three weekly windows (W0, W1, W2) whose split is worked out by hand in test_split.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.storage import PartitionStore

UTC = timezone.utc
W0 = datetime(2024, 1, 7, tzinfo=UTC)  # a Sunday
W1, W2, W3 = (W0 + timedelta(weeks=k) for k in (1, 2, 3))
H = timedelta(hours=1)
SPEC = WindowSpec("weekly", W0, W3)  # keys 2024-01-07, 2024-01-14, 2024-01-21
KEYS = [w.key for w in SPEC.windows()]

# (id, type, parent, first seen, title)
ENTITIES = [
    ("a1", "advertiser", None, W0, "Acme"), ("a2", "advertiser", None, W0, "Bolt"),
    ("p1", "product", "a1", W0, "red running shoe"), ("p2", "product", "a1", W0, "blue running shoe"),
    ("p3", "product", "a2", W0, "green garden hose"), ("p4", "product", "a2", W0, "garden rake"),
    ("p5", "product", None, W0 + 2 * H, "kitchen kettle"), ("c1", "campaign", "a1", W0, "shoe sale"),
    ("p6", "product", "a1", W1 + 3 * H, "white running shoe"),  # first seen in W1: a cold-start item
    ("p7", "product", "a2", W2 + H, "garden hose reel"),  # first seen in W2
    ("u1", "user", None, W0, None), ("u2", "user", None, W0, None), ("u3", "user", None, W1, None),
    ("u4", "user", None, W1, None),
]

# (user, entity, event type, ts)
EVENTS = {
    KEYS[0]: [("u1", "p1", "click", W0 + H), ("u1", "p1", "purchase", W0 + 2 * H), ("u1", "p2", "click", W0 + 3 * H),
              ("u1", "c1", "click", W0 + 4 * H),  # a campaign: not an item
              ("u2", "p3", "click", W0 + H), ("u2", "p4", "impression", W0 + 2 * H)],  # an impression is no engagement
    KEYS[1]: [("u1", "p1", "click", W1 + H),  # engaged with before: excluded
              ("u1", "p3", "click", W1 + 2 * H), ("u1", "p3", "purchase", W1 + 3 * H), ("u1", "p6", "click", W1 + 4 * H),
              ("u2", "p4", "click", W1 + H), ("u2", "p5", "purchase", W1 + 2 * H), ("u2", "p1", "impression", W1 + 3 * H),
              ("u3", "p2", "click", W1 + H), ("u3", "p3", "click", W1 + 2 * H), ("u3", "p3", "purchase", W1 + 2.5 * H),
              ("u3", "p4", "click", W1 + 3 * H), ("u3", "p2", "purchase", W1 + 5 * H),  # after the cut: not context
              ("u4", "p5", "click", W1 + H)],  # one item only: too few for a cold user
    KEYS[2]: [("u1", "p5", "purchase", W2 + H), ("u3", "p7", "click", W2 + 2 * H)],
}
PLANTED = ("u2", "p2", "purchase", W2 + 5 * H)  # a W2 timestamp planted in W1's file


def catalog(end: datetime) -> pa.Table:
    rows = [r for r in ENTITIES if r[3] < end]
    n = len(rows)
    return pa.table({
        "entity_id": [r[0] for r in rows], "entity_type": [r[1] for r in rows], "parent_id": pa.array([r[2] for r in rows], pa.string()),
        "first_seen_ts": pa.array([r[3] for r in rows], CATALOG_SCHEMA.field("first_seen_ts").type),
        "title": pa.array([r[4] for r in rows], pa.string()), "description": pa.nulls(n, pa.string()),
        "category": pa.nulls(n, pa.string()), "image_uri": pa.nulls(n, pa.string()), "video_uri": pa.nulls(n, pa.string()),
        "features": pa.nulls(n, CATALOG_SCHEMA.field("features").type)}, schema=CATALOG_SCHEMA)


def events(rows: list[tuple], prefix: str) -> pa.Table:
    type_of = {r[0]: r[1] for r in ENTITIES}
    return pa.table({
        "event_id": [f"{prefix}{i}" for i in range(len(rows))], "user_id": [r[0] for r in rows], "entity_id": [r[1] for r in rows],
        "entity_type": [type_of[r[1]] for r in rows], "event_type": [r[2] for r in rows],
        "ts": pa.array([r[3] for r in rows], EVENTS_SCHEMA.field("ts").type), "value": pa.nulls(len(rows), pa.float64())},
        schema=EVENTS_SCHEMA)


def tiny_store(root: Path, plant_future: bool = False, corrupt_w2: bool = False) -> PartitionStore:
    """W0..W2 published; `plant_future` adds a W2-timestamped row to W1's events; `corrupt_w2` makes every W2
    file unreadable (so reading it fails loudly)."""
    store = PartitionStore(root)
    for w in SPEC.windows():
        rows = EVENTS[w.key] + ([PLANTED] if plant_future and w.key == KEYS[1] else [])
        with store.writing() as staging:
            staging.write_table(CATALOG_ASSET, w.key, ENTITIES_FILE, catalog(w.end))
            staging.write_table(EVENTS_ASSET, w.key, EVENTS_FILE, events(rows, w.key))
    if corrupt_w2:
        for asset, name in ((CATALOG_ASSET, ENTITIES_FILE), (EVENTS_ASSET, EVENTS_FILE)):
            (store.partition_dir(asset, KEYS[2]) / f"{name}.parquet").write_bytes(b"not parquet")
    return store
