"""One definition, two evaluators: great-expectations and the ingestion masks must agree on every rule."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from data_contracts import CATALOG, CONTRACTS, EVENTS, ContractError
from data_contracts.vocab import EVENT_TYPES, FUNNEL_STAGES, funnel_rank
from tests.conftest import W0, W1, catalog_table, events_table

CATALOG_REF = catalog_table().select(["entity_id", "entity_type", "first_seen_ts"]).filter(
    pc.is_in(catalog_table().column("entity_id"), pa.array(["u1", "u2", "p1", "p2"])))
PARAMS = {"window": (W0, W1), "known_entities": ["u1", "u2", "p1", "p2"], "known_users": ["u1", "u2"], "catalog": CATALOG_REF}


def broken_events() -> pa.Table:
    t = EVENTS.conform(events_table(W0, "x"), "test")
    cols = {n: t.column(n).to_pylist() for n in t.column_names}
    cols["user_id"][0] = None
    cols["event_type"][1] = "bought"
    cols["entity_type"][2] = "kg_entity"
    cols["ts"][3] = W1 + timedelta(seconds=1)
    cols["ts"][4] = W0 - timedelta(days=3)
    cols["event_id"][5] = cols["event_id"][6]
    cols["entity_id"][7] = "p404"
    cols["user_id"][8] = "u404"
    cols["entity_id"][9] = "u1"  # a user where an ad entity is expected (row says product)
    cols["user_id"][10] = "p1"  # a product where a user is expected
    cols["ts"][11] = None  # rows 3..5 (p2) are dated before p2's first_seen_ts: a warning
    return pa.table(cols, schema=t.schema)


@pytest.mark.parametrize("rule, warning", [(r.name, False) for r in EVENTS.rules] + [(r.name, True) for r in EVENTS.warnings])
def test_great_expectations_and_masks_agree(rule, warning):
    table = broken_events()
    ge = EVENTS.validate(table, PARAMS, warnings=warning)[rule]
    mask = EVENTS.rule(rule).violations(table, PARAMS)
    # GE counts per column; the mask is per row (a row breaking the rule in two columns is one rejected row)
    per_column = sum(int(replace(EVENTS.rule(rule), columns=(c,)).violations(table, PARAMS).sum()) for c in EVENTS.rule(rule).columns)
    assert not ge.success and mask.any()
    if EVENTS.rule(rule).kind == "unique":  # GE counts every copy of a repeated value; the mask spares the first
        assert ge.unexpected_count == 2 * mask.sum()
    else:
        assert ge.unexpected_count == per_column >= mask.sum()


def test_clean_table_passes_every_expectation():
    results = EVENTS.validate(EVENTS.publishable(EVENTS.conform(events_table(W0, "x"), "test")), PARAMS)
    assert all(r.success for r in results.values()) and set(results) == {"schema.columns", *(r.name for r in EVENTS.rules)}
    warned = EVENTS.validate(EVENTS.publishable(EVENTS.conform(events_table(W0 + timedelta(days=1), "x"), "test")), PARAMS, warnings=True)
    assert all(r.success for r in warned.values()) and set(warned) == {"schema.columns", "ts_after_first_seen"}


def test_catalog_contract_on_the_fixture():
    t = catalog_table()
    ids = pc.unique(t.column("entity_id"))
    results = CATALOG.validate(t, {"window": (datetime(1970, 1, 1, tzinfo=W0.tzinfo), W1), "known_entities": ids})
    failing = {k for k, r in results.items() if not r.success}
    assert failing == {"first_seen_before_end"}  # u3 and p3 appear after W1 starts
    assert results["first_seen_before_end"].unexpected_count == 2


def test_conform_names_the_file_and_the_missing_columns():
    with pytest.raises(ContractError, match=r"f\.parquet: rule 'schema.missing_columns' broken \(12 rows\).*'ts'"):
        EVENTS.conform(events_table(W0, "x").drop_columns(["ts"]), "f.parquet")


def test_conform_fills_optional_columns_and_drops_extras():
    t = events_table(W0, "x").drop_columns(["value"]).append_column("extra", pa.array(range(12)))
    out = EVENTS.conform(t, "f")
    assert out.column_names == EVENTS.schema.names and out.column("value").null_count == 12


def test_schema_problems_lists_differences():
    assert EVENTS.schema_problems(EVENTS.schema) == []
    bad = EVENTS.schema.set(6, pa.field("value", pa.string()))
    assert EVENTS.schema_problems(bad) == ["column 'value' is string, contract says double"]


def test_vocabulary_order():
    assert [funnel_rank(s) for s in FUNNEL_STAGES] == [0, 1, 2, 3]
    assert set(EVENT_TYPES) - set(FUNNEL_STAGES) == {"interested", "not_interested"}
    with pytest.raises(ValueError, match="not_interested"):
        funnel_rank("not_interested")
    assert set(CONTRACTS) == {"events", "entity_catalog", "entity_relations"}
