"""Entity text: own fields, features, and an advertiser's first products."""

from __future__ import annotations

from hir_model.content.entity_text import entity_texts
from tests.hir_model.content.conftest import catalog


def test_texts_from_fields_features_and_an_advertisers_products():
    table = catalog([
        {"entity_id": "a1", "entity_type": "advertiser", "title": "Acme", "description": "Sports gear maker"},
        {"entity_id": "p2", "parent_id": "a1", "title": "Blue shoes", "category": "shoes"},
        {"entity_id": "p1", "parent_id": "a1", "title": "Red shoe", "category": "shoes", "description": "Red shoe for running",
         "features": [("price", "9.50")]},
        {"entity_id": "p3", "parent_id": "a1", "title": "Green hat"},
        {"entity_id": "u1", "entity_type": "user", "features": [("age_bucket", "25-34"), ("region", "north")]},
        {"entity_id": "u2", "entity_type": "user"},
    ])
    texts = dict(zip(table.column("entity_id").to_pylist(), entity_texts(table, listed_products=2)))
    assert texts["a1"] == "Acme. Sports gear maker. Products: Blue shoes; Red shoe."  # the first two by first_seen_ts
    assert texts["p1"] == "Red shoe. shoes. Red shoe for running. price 9.50."
    assert texts["p2"] == "Blue shoes."  # a category already in the title is not repeated
    assert texts["u1"] == "age bucket 25-34, region north."
    assert texts["u2"] is None  # no text at all: nothing to embed, not an empty string
