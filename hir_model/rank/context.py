"""A served user's context from the command line or a file: the events of a user the window does not know."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from data_contracts.vocab import CONVERSION_EVENT, EVENT_TYPES
from hir_model.rank.recommender import ContextEvent


def context_event(entity_id: str, event_type: str | None, ts, where: str) -> ContextEvent:
    entity_id = (entity_id or "").strip()
    if not entity_id:
        raise ValueError(f"{where}: an event without an entity_id")
    event_type = (event_type or "click").strip()
    if event_type not in EVENT_TYPES:
        raise ValueError(f"{where}: event_type {event_type!r} is not one of {', '.join(EVENT_TYPES)}")
    ts_us = None
    if ts not in (None, ""):
        try:
            if str(ts).lstrip("-").isdigit():
                ts_us = int(ts)
            else:
                stamp = pd.Timestamp(ts)
                ts_us = int((stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp).value // 1000)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: ts {ts!r} is neither ISO 8601 nor epoch microseconds") from exc
    return ContextEvent(entity_id, ts_us, event_type == CONVERSION_EVENT)


def parse_context(text: str) -> list[ContextEvent]:
    """`id1,id2:purchase,...`, oldest first; an event type after ':' (default click)."""
    out = []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        entity_id, _, event_type = part.partition(":")
        out.append(context_event(entity_id, event_type or None, None, f"--context item {i + 1}"))
    if not out:
        raise ValueError("--context holds no entity id")
    return out


def read_context_file(path: Path) -> list[ContextEvent]:
    """JSON lines ({"entity_id": ..., "ts": ..., "event_type": ...}) or CSV with a header holding entity_id."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--context-file {path} does not exist")
    text = path.read_text()
    if text.lstrip().startswith("{"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {n}: not JSON ({exc.msg})") from exc
    else:
        reader = csv.DictReader(text.splitlines())
        if "entity_id" not in (reader.fieldnames or []):
            raise ValueError(f"{path}: a CSV context needs an entity_id column (got {reader.fieldnames})")
        rows = list(enumerate(reader, 2))
    events = [context_event(r.get("entity_id"), r.get("event_type"), r.get("ts"), f"{path} line {n}") for n, r in rows]
    if not events:
        raise ValueError(f"{path} holds no event")
    return events
