"""`hir serve`: the ranking head's answers over HTTP (Starlette on uvicorn) for the newest materialised window.

A window is materialised when it has both `ranking_head` and `bom_index` (the store commits each partition at once, and
bom_index is built from ranking_head, so its commit is the signal). The server loads the newest such window before it
listens, with every increment of it published so far (`catalog_increment`: the items that arrived after its end,
hir_model.rank.increment), then looks at the store every `poll_seconds`: when a newer window lands, a background thread
loads its `Recommender` fully (encoder for context queries included) and then swaps one reference. When an increment of
the served window lands (a new day, or a day published again with more items), the thread appends its new items to the
served Recommender (`with_increments`: the faiss index and the postings extended, not rebuilt; a day that lost items or
changed its vectors is reloaded with the window) and swaps the reference the same way. A request reads that reference
once, at its start, so it is answered entirely by one snapshot, which the response names (window and increments);
requests in flight when the swap happens finish on the snapshot they started with. A window or increment that fails to
load is logged and the old snapshot kept.

Endpoints:
- `GET /health`: the window served, its items (of which `arrived_items` from increments), the increments served (day,
  items, digest), users, uptime, switches so far.
- `GET /recommend?user=U&k=20&exact=0&include_seen=0&scope=all[&context=id1,id2:purchase]` and `POST /recommend` with a
  JSON object {"user", "context": [{"entity_id", "ts", "event_type"}], "k", "exact", "include_seen", "scope"}:
  {"window", "increments", "user", "k", "exact", "include_seen", "scope", "items": [{"entity_id", "entity_type",
  "score"}], "unknown_items"}. `scope`: `all` (every served item), `window` (the window's items only) or `new` (the
  increments' items only: the new arrivals).
- 400: bad input (k, a flag, an event type, a timestamp, malformed JSON, an unknown field); 404: a user unknown to the
  window and no context (the message names the window).
- `GET /audience?entity=E&k=1000[&level=L&primitive=P&include_converted=0]`: the users most likely to convert with
  entity E (hir_model.rank.audience, the served snapshot's items and increments): {"window", "increments", "entity",
  "entity_type", "items", "source", "level", "primitive", "size", "excluded", "levels", "k", "users": [{"user_id",
  "score"}]}. 400: bad input (as above, a level the hierarchy lacks); 404: an entity the window cannot score; 422: an
  audience below the floor (`min_audience`, hir.toml's [audience]): never served, the message says why.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hir_model.rank.audience import Audiences, AudienceConfig, AudienceTooSmall, UnknownEntity
from hir_model.rank.context import context_event, parse_context
from hir_model.rank.increment import INCREMENT_ASSET, manifests, read_increment
from hir_model.rank.recommender import SCOPES, ContextEvent, Recommender, UnknownUser
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET

log = logging.getLogger("hir.serve")

MAX_K = 1000
QUERY_FIELDS = {"user", "context", "k", "exact", "include_seen", "scope"}
AUDIENCE_FIELDS = {"entity", "k", "level", "primitive", "include_converted"}
MAX_AUDIENCE = 100_000  # users one audience request may return


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # loopback unless an operator opens it
    port: int = 8000
    window: str | None = None  # serve this window only (None: the newest materialised, switching to newer ones)
    poll_seconds: float = 30.0  # how often the store is looked at for a newer window and new increments
    access_log: bool = False  # one log line per request
    audience: AudienceConfig | None = None  # the served audiences' config (None: the library's defaults)
    graceful_seconds: int = 30  # on SIGINT/SIGTERM, how long requests in flight may take to finish


def materialised_windows(store) -> list[str]:
    """Windows with both ranking_head and bom_index committed, oldest first (keys sort by date)."""
    return sorted(set(store.partitions(HEAD_ASSET)) & set(store.partitions(BOM_ASSET)))


@dataclass(frozen=True)
class Served:
    """One window with its increments, ready to answer: what a request reads once at its start."""

    rec: Recommender
    loaded_at: float  # time.time() when it was ready
    load_seconds: float
    digests: tuple[tuple[str, str], ...] = ()  # (day, digest) of each increment served, oldest day first

    @property
    def increments(self) -> list[dict]:
        """Per day served: its key, the items it added and its digest."""
        items: dict[str, int] = {}
        for inc in self.rec.increments:
            items[inc.day] = items.get(inc.day, 0) + len(inc)
        return [{"day": d, "items": items.get(d, 0), "digest": g} for d, g in self.digests]


def load_served(store, window: str) -> Served:
    """Window `window` and its published increments loaded completely, the encoder for context queries included
    (FileNotFoundError naming what is missing)."""
    start = time.perf_counter()
    rec = Recommender.load(store, window, increments=True)
    rec.inductive  # noqa: B018 - loaded now, not by the first context query after the swap
    return Served(rec, time.time(), time.perf_counter() - start, tuple((i.day, i.digest) for i in rec.increments))


def extend_served(store, served: Served) -> Served | None:
    """`served` with the window's increments published since it was loaded appended in place (None: nothing new): a new
    day's items, or the items a republished day added; a day that lost items or moved one, or disappeared, reloads the
    window (`load_served`)."""
    rec = served.rec
    start = time.perf_counter()
    current = {d: m["digest"] for d, m in manifests(store, rec.window, rec.state.end_us).items()}
    before = dict(served.digests)
    if current == before:
        return None
    if set(before) - set(current):
        return load_served(store, rec.window)
    added = []
    for day, digest in current.items():
        if before.get(day) == digest:
            continue
        inc = read_increment(store.partition_dir(INCREMENT_ASSET, day))
        old = [e for i in rec.increments if i.day == day for e in i.item_ids]
        fresh = np.array([e not in rec.item_row for e in inc.item_ids], bool)
        kept = np.flatnonzero(~fresh)
        same = set(old) <= set(inc.item_ids[kept]) and len(kept) == len(old) and np.allclose(
            rec.items.vectors[[rec.item_row[e] for e in inc.item_ids[kept]]], inc.vectors[kept], atol=1e-6)
        if not same:
            return load_served(store, rec.window)
        added.append(inc.take(np.flatnonzero(fresh)))
    extended = rec.with_increments(added)
    return Served(extended, time.time(), time.perf_counter() - start, tuple(current.items()))


class WindowSwitcher:
    """Holds the served window; a daemon thread polls the store and swaps in newer windows once they are loaded."""

    def __init__(self, store, config: ServeConfig):
        self.store, self.config = store, config
        window = config.window
        if window is None:
            windows = materialised_windows(store)
            if not windows:
                raise FileNotFoundError(f"no window under {store.root} has both {HEAD_ASSET} and {BOM_ASSET}: materialise "
                                        f"one first (or pin one with --window)")
            window = windows[-1]
        self.served = load_served(store, window)
        self._log_ready(self.served, None)
        self.started = time.monotonic()
        self.switches = 0
        self.increment_updates = 0  # snapshots swapped in for new increments of the served window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: tuple[str, str] | None = None  # the last failed load (window, message), logged once

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hir-serve-poller", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a load in progress only reads files: a daemon thread left behind is harmless

    def _run(self) -> None:
        while not self._stop.wait(self.config.poll_seconds):
            try:
                self.poll()
            except Exception:  # the poller must outlive a bad window or a flaky store
                log.exception("looking for a newer window failed; still serving %s", self.served.rec.window)

    def poll(self) -> bool:
        """Load and swap in the newest materialised window if it is newer than the one served (unless pinned), else the
        served window's new increments; True if it swapped."""
        windows = [] if self.config.window is not None else materialised_windows(self.store)
        current = self.served.rec.window
        if not windows or windows[-1] <= current:  # never backwards (a re-run briefly hides its partition)
            return self._poll_increments()
        window = windows[-1]
        try:
            served = load_served(self.store, window)
        except Exception as exc:
            if self._failed != (window, str(exc)):
                log.warning("window %s could not be loaded (still serving %s): %s", window, current, exc)
                self._failed = (window, str(exc))
            return False
        self.served = served  # the one reference requests read: old requests keep theirs
        self.switches += 1
        self._log_ready(served, current)
        return True

    def _poll_increments(self) -> bool:
        served = self.served
        try:
            extended = extend_served(self.store, served)
        except Exception as exc:
            if self._failed != (served.rec.window, str(exc)):
                log.warning("the increments of window %s could not be loaded (still serving %d of them): %s",
                            served.rec.window, len(served.digests), exc)
                self._failed = (served.rec.window, str(exc))
            return False
        if extended is None:
            return False
        self.served = extended  # the one reference requests read: old requests keep theirs
        self.increment_updates += 1
        log.info("window %s: increments %s served (%d items arrived, %d in all), in %.2fs", extended.rec.window,
                 ", ".join(d for d, _ in extended.digests), extended.rec.arrived_items, extended.rec.n_items,
                 extended.load_seconds)
        return True

    @staticmethod
    def _log_ready(served: Served, previous: str | None) -> None:
        rec = served.rec
        what = f"switched from window {previous} to {rec.window}" if previous else f"serving window {rec.window}"
        log.info("%s: %d items (%d from %d increments), %d users, loaded in %.2fs", what, rec.n_items, rec.arrived_items,
                 len(served.digests), len(rec.user_index), served.load_seconds)

    def health(self) -> dict:
        served = self.served
        rec = served.rec
        return {"status": "ok", "window": rec.window, "items": rec.n_items, "window_items": rec.n_window,
                "arrived_items": rec.arrived_items, "increments": served.increments, "users": len(rec.user_index),
                "uptime_seconds": round(time.monotonic() - self.started, 3), "window_loaded_at": served.loaded_at,
                "switches": self.switches, "increment_updates": self.increment_updates,
                "pinned": self.config.window is not None}


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


def _error(status: int, message: str, window: str) -> JSONResponse:
    return JSONResponse({"error": message, "window": window}, status_code=status)


def create_app(switcher: WindowSwitcher) -> Starlette:
    async def health(request: Request) -> JSONResponse:
        return JSONResponse(switcher.health())

    async def recommend(request: Request) -> JSONResponse:
        rec = switcher.served.rec  # read once: this request is answered by this window only
        try:
            if request.method == "GET":
                query = query_from_params(request.query_params)
            else:
                try:
                    body = json.loads(await request.body())
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise BadRequest(f"the body is not JSON ({exc})") from exc
                query = query_from_json(body)
            return JSONResponse(await run_in_threadpool(answer, rec, query))
        except BadRequest as exc:
            return _error(400, str(exc), rec.window)
        except UnknownUser as exc:
            return _error(404, str(exc), rec.window)

    cache: dict[int, Audiences] = {}  # the served snapshot's audiences (one entry: the latest snapshot asked)
    cache_lock = threading.Lock()

    def audiences_of(rec: Recommender) -> Audiences:
        with cache_lock:
            if id(rec) not in cache:
                cache.clear()
                cache[id(rec)] = Audiences.load(switcher.store, rec.window, rec=rec,
                                                config=switcher.config.audience or AudienceConfig())
            return cache[id(rec)]

    async def audience(request: Request) -> JSONResponse:
        rec = switcher.served.rec  # read once, as /recommend
        try:
            query = audience_query(request.query_params)
            return JSONResponse(await run_in_threadpool(lambda: audience_answer(audiences_of(rec), query)))
        except UnknownEntity as exc:
            return _error(404, exc.args[0], rec.window)
        except AudienceTooSmall as exc:
            return _error(422, str(exc), rec.window)
        except ValueError as exc:  # BadRequest, or a level / primitive the hierarchy does not have
            return _error(400, str(exc), rec.window)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        switcher.start()
        try:
            yield
        finally:
            switcher.stop()
            log.info("stopped (last window served: %s)", switcher.served.rec.window)

    return Starlette(routes=[Route("/health", health), Route("/recommend", recommend, methods=["GET", "POST"]),
                             Route("/audience", audience)],
                     lifespan=lifespan)


def serve(store, config: ServeConfig = ServeConfig()) -> None:
    """Load the newest (or the pinned) window, then answer until SIGINT/SIGTERM (KeyboardInterrupt after a clean
    shutdown: requests in flight finished, the poller stopped). FileNotFoundError before listening if nothing to serve."""
    import uvicorn

    switcher = WindowSwitcher(store, config)
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal that stopped it once it has shut down: SIGTERM then ends like SIGINT, not by kill
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = uvicorn.Server(uvicorn.Config(create_app(switcher), host=config.host, port=config.port, log_config=None,
                                           access_log=config.access_log,
                                           timeout_graceful_shutdown=config.graceful_seconds))
    server.run()  # a port already taken: uvicorn logs it and exits 3


__all__ = ["Query", "ServeConfig", "WindowSwitcher", "answer", "create_app", "materialised_windows", "serve"]
