"""`hir serve`'s requests: /recommend and /audience parameters parsed and checked (BadRequest names the field), and
the answers as JSON-ready dicts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from hir_model.rank.audience import Audiences
from hir_model.rank.context import context_event, parse_context
from hir_model.rank.recommender import SCOPES, ContextEvent, Recommender

log = logging.getLogger("hir.serve")

MAX_K = 1000
QUERY_FIELDS = {"user", "context", "k", "exact", "include_seen", "scope"}
AUDIENCE_FIELDS = {"entity", "k", "level", "primitive", "include_converted"}
MAX_AUDIENCE = 100_000  # users one audience request may return




class BadRequest(ValueError):
    """Input the server refuses (400)."""


@dataclass(frozen=True)
class Query:
    user: str | None = None
    context: list[ContextEvent] | None = None
    k: int = 20
    exact: bool = False
    include_seen: bool = False
    scope: str = "all"  # every served item, the window's only, or the increments' only (hir_model.rank.recommender)


def _scope(value) -> str:
    if value not in SCOPES:
        raise BadRequest(f"scope must be one of {list(SCOPES)}, got {value!r}")
    return value


def _k(value) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise BadRequest(f"k must be an integer from 1 to {MAX_K}, got {value!r}")
    k = int(value)
    if not 1 <= k <= MAX_K:
        raise BadRequest(f"k must be an integer from 1 to {MAX_K}, got {k}")
    return k


def _flag(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in ("0", "1", "true", "false"):
        return str(value).strip().lower() in ("1", "true")
    raise BadRequest(f"{name} must be 0/1 or true/false, got {value!r}")


def _user(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"user must be a non-empty string, got {value!r}")
    return value


def query_from_params(params: Mapping[str, str]) -> Query:
    """A GET query string; `context` as `hir retrieve --context` takes it."""
    unknown = sorted(set(params) - QUERY_FIELDS)
    if unknown:
        raise BadRequest(f"unknown parameters {unknown}; expected {sorted(QUERY_FIELDS)}")
    try:
        context = parse_context(params["context"]) if "context" in params else None
    except ValueError as exc:
        raise BadRequest(str(exc).replace("--context", "context")) from exc
    return Query(_user(params.get("user")), context, _k(params.get("k", 20)), _flag("exact", params.get("exact", False)),
                 _flag("include_seen", params.get("include_seen", False)), _scope(params.get("scope", "all")))


def query_from_json(body) -> Query:
    """A POST body: {"user", "context": [{"entity_id", "ts" (ISO 8601 or epoch µs), "event_type"}], "k", ...}."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - QUERY_FIELDS)
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; expected {sorted(QUERY_FIELDS)}")
    raw = body.get("context")
    context = None
    if raw is not None:
        if not isinstance(raw, list):
            raise BadRequest(f"context must be a list of events, got {type(raw).__name__}")
        context = []
        for i, event in enumerate(raw):
            where = f"context[{i}]"
            if not isinstance(event, dict) or set(event) - {"entity_id", "ts", "event_type"}:
                raise BadRequest(f"{where} must be an object with entity_id and optional ts, event_type; got {event!r}")
            entity_id, event_type, ts = event.get("entity_id"), event.get("event_type"), event.get("ts")
            if not isinstance(entity_id, str) or not (event_type is None or isinstance(event_type, str)) or \
                    isinstance(ts, (bool, float, list, dict)):
                raise BadRequest(f"{where}: entity_id and event_type are strings, ts an ISO 8601 string or epoch µs; "
                                 f"got {event!r}")
            try:
                context.append(context_event(entity_id, event_type, ts, where))
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
    return Query(_user(body.get("user")), context, _k(body.get("k", 20)), _flag("exact", body.get("exact", False)),
                 _flag("include_seen", body.get("include_seen", False)), _scope(body.get("scope", "all")))


def answer(rec: Recommender, query: Query) -> dict:
    """The response body for `query`, all from `rec` (UnknownUser: a user unknown to its window without a context)."""
    hits = rec.recommend(query.user, query.context, query.k, query.exact, query.include_seen, query.scope)
    return {"window": rec.window, "increments": sorted({i.day for i in rec.increments}), "user": query.user,
            "k": query.k, "exact": query.exact, "include_seen": query.include_seen, "scope": query.scope,
            "items": [{"entity_id": h.entity_id, "entity_type": h.entity_type, "score": h.score} for h in hits],
            "unknown_items": rec.unknown_items(query.context or [])}


def _int(name: str, value, lo: int, hi: int | None = None) -> int:
    text = value.strip() if isinstance(value, str) else ""
    if not (text.isdigit() or (text.startswith("-") and text[1:].isdigit())) or int(text) < lo or (hi is not None and int(text) > hi):
        raise BadRequest(f"{name} must be an integer from {lo}{f' to {hi}' if hi is not None else ''}, got {value!r}")
    return int(text)


def audience_query(params: Mapping[str, str]) -> dict:
    """A GET /audience query string as Audiences.audience's keyword arguments."""
    unknown = sorted(set(params) - AUDIENCE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown parameters {unknown}; expected {sorted(AUDIENCE_FIELDS)}")
    entity = params.get("entity")
    if not entity or not entity.strip():
        raise BadRequest("entity is required: an item, advertiser or campaign id")
    level = _int("level", params["level"], 0) if "level" in params else None
    primitive = _int("primitive", params["primitive"], 0) if "primitive" in params else None
    if primitive is not None and level is None:
        raise BadRequest("primitive needs level")
    return {"entity": entity, "k": _int("k", params.get("k", "1000"), 1, MAX_AUDIENCE), "level": level,
            "primitive": primitive, "include_converted": _flag("include_converted", params.get("include_converted", False))}


def audience_answer(audiences: Audiences, query: dict) -> dict:
    """The response body of an audience query (AudienceTooSmall, UnknownEntity, ValueError pass through)."""
    a = audiences.audience(**query)
    rec = audiences.rec
    return {"increments": sorted({i.day for i in rec.increments}), "k": query["k"], **a.as_dict()}
