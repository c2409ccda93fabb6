"""The text that represents an entity for the text encoder, built from its catalog row (and its products).

Every entity: title, category, description and features (`age bucket 25-34, region north`). Advertisers
also get a summary of their products' titles: the first `listed_products` products by first-seen time,
so the text stops changing once that many are listed (an advertiser is not re-embedded for every new
product). MovieLens descriptions already carry year, genres and KG facts; nothing is added for them.
An entity with none of these has no text (None), never an empty string that would embed as data.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

ADVERTISER = "advertiser"
PRODUCT_TYPES = ("product", "service")


def _features(pairs: list[tuple[str, str]] | None) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (pairs or []) if v not in (None, ""))


def own_text(title: str | None, description: str | None, category: str | None, features: list | None) -> str | None:
    """title. category. description. features: the parts that exist (a category already in the title is not repeated)."""
    parts = [title] if title else []
    if category and (not title or category.lower() not in title.lower()):
        parts.append(category)
    if description:
        parts.append(description)
    if feats := _features(features):
        parts.append(feats)
    parts = [p.strip().rstrip(".") for p in parts if p and p.strip()]
    return ". ".join(parts) + "." if parts else None


def entity_texts(catalog: pa.Table, listed_products: int = 10) -> list[str | None]:
    """One text (or None) per catalog row, in row order."""
    cols = {c: catalog.column(c).to_pylist() for c in
            ("entity_id", "entity_type", "parent_id", "first_seen_ts", "title", "description", "category", "features")}
    products: dict[str, list[tuple]] = defaultdict(list)  # advertiser id -> (first_seen, id, title) of its products
    for eid, etype, parent, seen, title in zip(cols["entity_id"], cols["entity_type"], cols["parent_id"],
                                               cols["first_seen_ts"], cols["title"]):
        if parent and title and etype in PRODUCT_TYPES:
            products[parent].append((seen, eid, title))
    out = []
    for eid, etype, title, desc, cat, feats in zip(cols["entity_id"], cols["entity_type"], cols["title"],
                                                   cols["description"], cols["category"], cols["features"]):
        text = own_text(title, desc, cat, feats)
        if etype == ADVERTISER and products.get(eid) and listed_products > 0:
            listed = "; ".join(t for _, _, t in sorted(products[eid])[:listed_products])
            text = f"{text} Products: {listed}." if text else f"Products: {listed}."
        out.append(text)
    return out
