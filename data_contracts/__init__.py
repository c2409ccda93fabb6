"""Data contracts: one definition per published input table (pyarrow schema + great-expectations suite).

Run-time parameters of the rules:
- `window`: (start, end) of the partition, UTC; `ts` must lie in [start, end) (causality).
- `known_entities`: ids in the entity catalog as of the window end.
- `known_users`: the ids among them whose entity_type is `user`.
- `catalog`: the catalog as of the window end (entity_id, entity_type, first_seen_ts), for typed and time checks.

What happens to a row that breaks a rule: the rule's outcome is `reject` (the row goes to the rejected table
with its original values, the rule and its file); a warning's is `publish` (the row is kept, counted in the
asset's metadata and logged per file). Uniqueness is judged among the rows that pass every other rule, within
a file and across files alike, so a valid row is never dropped for repeating the id of a row rejected for
something else. File-level breaks (`ContractError`) fail the run; data_contracts/README.md lists them.
"""

from data_contracts.contract import Contract, RuleResult
from data_contracts.errors import ContractError
from data_contracts.options import OPTIONS_FILE, ContractOptions, load_options
from data_contracts.rules import Rule
from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA
from data_contracts.vocab import CONVERSION_EVENT, ENGAGEABLE_TYPES, ENTITY_TYPES, EVENT_TYPES

EVENTS = Contract(
    name="events",
    schema=EVENTS_SCHEMA,
    rules=(
        Rule("keys_not_null", "not_null", ("event_id", "user_id", "entity_id", "entity_type", "event_type", "ts"),
             "event_id, user_id, entity_id, entity_type, event_type and ts are never null"),
        Rule("event_type_vocabulary", "in_set", ("event_type",),
             f"event_type is one of {', '.join(EVENT_TYPES)}", values=EVENT_TYPES),
        Rule("entity_type_vocabulary", "in_set", ("entity_type",),
             f"events point at an ad entity: {', '.join(ENGAGEABLE_TYPES)}", values=ENGAGEABLE_TYPES),
        Rule("ts_in_window", "between", ("ts",),
             "every ts lies in the partition's [start, end) (causality)", param="window"),
        Rule("unique_event_id", "unique", ("event_id",), "event_id is unique in the window"),
        Rule("entity_in_catalog", "in_reference", ("entity_id",),
             "every entity an event references is in the catalog by the window end", param="known_entities"),
        Rule("user_in_catalog", "in_reference", ("user_id",),
             "every user_id is an entity of type user in the catalog by the window end", param="known_users"),
        Rule("entity_type_matches_catalog", "matches_reference", ("entity_id",),
             "an event's entity_type is its entity's type in the catalog", param="catalog", other="entity_type"),
    ),
    warnings=(
        # Published: the catalog a window reads is every entity first seen before the window end, so an event earlier
        # in the same window leaks nothing across windows; a first_seen_ts set late (an import date) is common.
        Rule("ts_after_first_seen", "not_before_reference", ("entity_id", "user_id"),
             "no event is dated before its entity's or its user's first_seen_ts (such events are published and counted)",
             param="catalog", other="ts", reference="first_seen_ts"),
    ),
)

CATALOG = Contract(
    name="entity_catalog",
    schema=CATALOG_SCHEMA,
    rules=(
        Rule("keys_not_null", "not_null", ("entity_id", "entity_type", "first_seen_ts"),
             "entity_id, entity_type and first_seen_ts are never null"),
        Rule("entity_type_vocabulary", "in_set", ("entity_type",),
             f"entity_type is one of {', '.join(ENTITY_TYPES)}", values=ENTITY_TYPES),
        Rule("unique_entity_id", "unique", ("entity_id",), "entity_id is unique in the catalog"),
        Rule("first_seen_before_end", "between", ("first_seen_ts",),
             "every entity was first seen before the window end (causality)", param="window"),
        # known_entities = the ids in the same catalog snapshot
        Rule("parent_in_catalog", "in_reference", ("parent_id",),
             "every parent_id names an entity in the catalog", param="known_entities"),
    ),
)

RELATIONS = Contract(
    name="entity_relations",
    schema=RELATIONS_SCHEMA,
    rules=(
        Rule("keys_not_null", "not_null", ("src_id", "relation", "dst_id", "first_seen_ts"),
             "src_id, relation, dst_id and first_seen_ts are never null"),
        Rule("first_seen_before_end", "between", ("first_seen_ts",),
             "every relation was first seen before the window end (causality)", param="window"),
        Rule("ends_in_catalog", "in_reference", ("src_id", "dst_id"),
             "both ends of a relation are catalog entities", param="known_entities"),
    ),
)

CONTRACTS = {c.name: c for c in (EVENTS, CATALOG, RELATIONS)}

__all__ = ["CATALOG", "CONVERSION_EVENT", "CONTRACTS", "EVENTS", "OPTIONS_FILE", "RELATIONS", "Contract", "ContractError",
           "ContractOptions", "Rule", "RuleResult", "load_options"]
