"""Shared fixtures: a small bring-your-own Parquet dataset that follows the contracts, and helpers to break it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA

UTC = timezone.utc
W0 = datetime(2024, 1, 7, tzinfo=UTC)  # a Sunday: weekly window keys 2024-01-07, 2024-01-14
W1 = W0 + timedelta(weeks=1)
TS = pa.timestamp("us", tz="UTC")


def catalog_table() -> pa.Table:
    rows = [
        ("u1", "user", None, W0, None), ("u2", "user", None, W0, None), ("u3", "user", None, W1 + timedelta(hours=1), None),
        ("a1", "advertiser", None, W0, "Acme"), ("p1", "product", "a1", W0, "Red shoe"),
        ("p2", "product", "a1", W0 + timedelta(days=1), "Blue shoe"), ("p3", "product", "a1", W1 + timedelta(days=2), "Green hat"),
        ("c1", "campaign", "a1", W0, "Winter sale"),
    ]
    cols = list(zip(*rows))
    n = len(rows)
    return pa.table({
        "entity_id": cols[0], "entity_type": cols[1], "parent_id": pa.array(cols[2], pa.string()),
        "first_seen_ts": pa.array(cols[3], TS), "title": pa.array(cols[4], pa.string()),
        "description": pa.nulls(n, pa.string()), "category": pa.array(["shoes"] * n), "image_uri": pa.nulls(n, pa.string()),
        "video_uri": pa.nulls(n, pa.string()),
        "features": pa.array([[("region", "1")] if t == "user" else None for t in cols[1]], pa.map_(pa.string(), pa.string())),
    }, schema=CATALOG_SCHEMA)


def events_table(start: datetime, prefix: str, users=("u1", "u2"), products=("p1", "p2")) -> pa.Table:
    rows = []
    for i, (u, p, t) in enumerate([(u, p, t) for u in users for p in products for t in ("impression", "click", "purchase")]):
        rows.append((f"{prefix}{i}", u, p, "product", t, start + timedelta(hours=i), float(i)))
    cols = list(zip(*rows))
    return pa.table({"event_id": cols[0], "user_id": cols[1], "entity_id": cols[2], "entity_type": cols[3],
                     "event_type": cols[4], "ts": pa.array(cols[5], TS), "value": cols[6]}, schema=EVENTS_SCHEMA)


@pytest.fixture
def byo(tmp_path: Path) -> Path:
    """A valid bring-your-own folder: two weekly windows, 12 events each."""
    return write_byo(tmp_path / "byo")


def write_byo(root: Path) -> Path:
    """The `byo` fixture's folder at `root` (for module-scoped users)."""
    (root / "catalog").mkdir(parents=True)
    pq.write_table(catalog_table(), root / "catalog" / "entities.parquet")
    (root / "relations").mkdir()
    pq.write_table(pa.table({"src_id": ["c1"], "relation": ["promotes"], "dst_id": ["p1"], "first_seen_ts": pa.array([W0], TS)},
                            schema=RELATIONS_SCHEMA), root / "relations" / "r.parquet")
    for start, prefix in ((W0, "a"), (W1, "b")):
        folder = root / "events" / start.strftime("%Y-%m-%d")
        folder.mkdir(parents=True)
        pq.write_table(events_table(start, prefix), folder / "part-0.parquet")
    return root
