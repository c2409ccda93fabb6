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
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hir_model.rank.audience import Audiences, AudienceConfig, AudienceTooSmall, UnknownEntity
from hir_model.rank.recommender import Recommender, UnknownUser

from hir_model.rank.serve_queries import (BadRequest, Query, answer, audience_answer, audience_query, query_from_json,
                                         query_from_params)
from hir_model.rank.serve_windows import ServeConfig, WindowSwitcher, materialised_windows

log = logging.getLogger("hir.serve")
__all__ = ["BadRequest", "Query", "ServeConfig", "WindowSwitcher", "create_app", "materialised_windows", "query_from_json",
           "query_from_params", "serve"]


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
