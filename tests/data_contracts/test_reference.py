"""The cached reference lookups give what pyarrow's is_in / index_in give, null and repeated values included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import data_contracts.rules as rules
from data_contracts.rules import Reference, Rule, _lookup


def ids(rng, n: int, universe: int, nulls: float = 0.0) -> pa.Array:
    values = [f"e{i}" for i in rng.integers(0, universe, n)]
    return pa.array([None if rng.random() < nulls else v for v in values], pa.string())


def test_reference_positions_are_index_in():
    rng = np.random.default_rng(0)
    keys = ids(rng, 500, 800, nulls=0.05)  # repeats and nulls in the reference too
    batch = pa.chunked_array([ids(rng, 300, 1000, nulls=0.1), ids(rng, 200, 1000)])
    expected = pc.index_in(batch, value_set=keys).to_numpy(zero_copy_only=False)
    expected = np.where(np.isnan(expected.astype(float)), -1, expected).astype(np.int64)
    np.testing.assert_array_equal(Reference(keys).find(batch), expected)


def test_rules_judge_as_before_and_reuse_the_reference(monkeypatch):
    monkeypatch.setattr(rules, "HASH_AFTER", 1)
    rng = np.random.default_rng(1)
    known = ids(rng, 400, 600).unique()
    catalog = pa.table({"entity_id": known, "entity_type": pa.array(rng.choice(["product", "user"], len(known)))})
    rule = Rule("in", "in_reference", ("entity_id",), "", param="known")
    typed = Rule("type", "matches_reference", ("entity_id",), "", param="catalog", other="entity_type")
    for seed in range(4):  # batches against the same params: pyarrow's lookup first, the cached one after
        r = np.random.default_rng(seed)
        table = pa.table({"entity_id": ids(r, 50, 900, nulls=0.1), "entity_type": pa.array(r.choice(["product", "user"], 50))})
        params = {"known": known, "catalog": catalog}
        expected = ~pc.is_in(table.column("entity_id"), value_set=known).to_numpy(zero_copy_only=False)
        expected &= table.column("entity_id").is_valid().to_numpy(zero_copy_only=False)  # nulls are not_null's
        np.testing.assert_array_equal(rule.violations(table, params), expected)
        ref = pc.take(catalog.column("entity_type"), pc.index_in(table.column("entity_id"), value_set=known))
        assert _lookup(table.column("entity_id"), catalog, "entity_type").combine_chunks().equals(ref.combine_chunks())
        broken = pc.fill_null(pc.not_equal(table.column("entity_type"), ref), False).to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(typed.violations(table, params), broken)
    assert all(e[2] for e in rules._REFERENCES.values() if e[0] is known or e[0] is catalog)
    # a Python collection as the reference still works (no cache)
    assert rule.violations(pa.table({"entity_id": ["e1", None, "zz"]}), {"known": ["e1"]}).tolist() == [False, False, True]
