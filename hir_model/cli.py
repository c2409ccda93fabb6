"""`hir`: command-line entry point for work that needs no Dagster (data preparation, inspection)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from hir_model.config import load_config


def _prepare(args: argparse.Namespace) -> int:
    config = load_config()
    source = config.make_source()
    source.prepare()
    spec = config.window_spec(source)
    windows = spec.windows()
    print(f"{config.source}: data ready under {config.data_dir}; {len(windows)} {config.window} windows "
          f"{windows[0].key} .. {windows[-1].key}")
    return 0


def _windows(args: argparse.Namespace) -> int:
    config = load_config()
    for w in config.window_spec().windows():
        print(f"{w.key}\t{w.start.isoformat()}\t{w.end.isoformat()}")
    return 0


def _context(args: argparse.Namespace):
    """--context id1,id2[:purchase],... or --context-file (JSON lines or CSV: entity_id, optional ts, event_type)."""
    from hir_model.rank.context import parse_context, read_context_file

    if args.context_file:
        return read_context_file(args.context_file)
    return parse_context(args.context) if args.context else None


def _retrieve(args: argparse.Namespace) -> int:
    import time

    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # before the import: its CPU-feature probing is noise here
    from hir_model.rank.recommender import Recommender, UnknownUser
    from hir_model.retrieval.load_index import WindowIndex, load_window_index
    from hir_model.storage import PartitionStore

    if not (args.user or args.entity or args.context or args.context_file):
        print("hir retrieve: give --user, --context / --context-file, or --entity", file=sys.stderr)
        return 2
    store = PartitionStore(load_config().storage_uri)
    start = time.perf_counter()
    try:
        context = _context(args)
        rec = Recommender.load(store, args.window, increments=True)  # the window and every increment published so far
        index = WindowIndex(rec.retriever, load_window_index(store, args.window).labels)
    except (FileNotFoundError, ValueError) as exc:
        print(f"hir retrieve: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    if args.entity:
        r = index.retriever
        try:
            hits = r.similar(args.entity, args.k, args.exact)
        except KeyError as exc:
            print(f"hir retrieve: {exc.args[0]} (window {args.window})", file=sys.stderr)
            return 2
        how = "exact faiss" if args.exact else f"BoM, {len(r.candidates(args.entity, args.k + 1))} candidates"
        query, label = args.entity, f"similar to {args.entity} [{index.describe(args.entity)}]"
    else:
        query = args.user or "context"
        try:
            hits = rec.recommend(args.user, context, args.k, args.exact, args.include_seen, args.scope)
        except UnknownUser as exc:
            print(f"hir retrieve: {exc}", file=sys.stderr)
            return 2
        skipped = rec.unknown_items(context or [])
        if skipped:
            print(f"hir retrieve: {len(skipped)} context items are not items of window {args.window} and were left out: "
                  f"{', '.join(skipped[:5])}", file=sys.stderr)
        how = ("the ranking head over every item" if args.exact else "BoM candidates reranked by the ranking head") + \
              ("" if args.include_seen else ", engaged items left out") + \
              ("" if args.scope == "all" else f", {args.scope} items only")
        who = f"user {args.user}" if args.user and rec.knows(args.user) else \
            f"a context of {len(context or []) - len(skipped)} events"
        label = f"for {who} [{index.describe(query)}]" if args.user and rec.knows(args.user) else f"for {who}"
    took = time.perf_counter() - loaded
    days = sorted({i.day for i in rec.increments})
    served = f" + increments {days[0]}..{days[-1]} ({rec.arrived_items} items)" if days else ""
    print(f"{label} in {args.window}{served}: top {len(hits)} by {how}; loaded in {loaded - start:.2f}s, answered in "
          f"{took * 1000:.1f} ms")
    for i, h in enumerate(hits, 1):
        print(f"{i:3d}  {h.score:+.4f}  {h.entity_type:<10} {h.entity_id:<24} {index.describe(h.entity_id)}")
    return 0


def _audience(args: argparse.Namespace) -> int:
    import json
    import time

    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    from hir_model.rank.audience import Audiences, audience_config
    from hir_model.storage import PartitionStore

    if args.k < 1 or (args.primitive is not None and args.level is None):
        print("hir audience: --k must be positive, and --primitive needs --level", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        config = load_config()
        audiences = Audiences.load(PartitionStore(config.storage_uri), args.window, config=audience_config(config.audience))
        loaded = time.perf_counter()
        a = audiences.audience(args.entity, args.k, args.level, args.primitive, args.include_converted)
    except (FileNotFoundError, LookupError, ValueError) as exc:  # a missing window, an unknown entity, below the floor
        print(f"hir audience: {exc.args[0] if isinstance(exc, LookupError) else exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(a.as_dict()))
        return 0
    where = f", level {a.level} primitive {a.primitive}" if a.level is not None else ""
    print(f"audience of {a.entity_type} {a.entity_id} in {a.window}{where}: top {len(a.user_ids)} of {a.size} users "
          f"(scored on {len(a.items)} items, from {a.source}; {a.excluded} already converted left out); loaded in "
          f"{loaded - start:.2f}s, answered in {(time.perf_counter() - loaded) * 1000:.1f} ms")
    for lv in a.levels:
        print(f"  level {lv['level']}: primitive {lv['primitive']} (weight {lv['weight']:.3f}), {lv['size']} users")
    for i, (u, s) in enumerate(zip(a.user_ids, a.scores), 1):
        print(f"{i:5d}  {s:+.4f}  {u}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # as for retrieve: its CPU-feature probing is noise here
    from hir_model.rank.audience import audience_config
    from hir_model.rank.serve import ServeConfig, serve
    from hir_model.storage import PartitionStore

    if args.poll_seconds <= 0:
        print("hir serve: --poll-seconds must be positive", file=sys.stderr)
        return 2
    config = load_config()
    store = PartitionStore(config.storage_uri)
    try:
        serve(store, ServeConfig(args.host, args.port, args.window, args.poll_seconds, args.access_log,
                                 audience_config(config.audience)))
    except (FileNotFoundError, ValueError) as exc:  # the window to serve is missing or broken (before listening)
        print(f"hir serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # SIGINT / SIGTERM after uvicorn's clean shutdown
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="hir", description="Hierarchical Interest Representation tools (config: hir.toml + HIR_* env)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="fetch or generate the configured source's data (idempotent)").set_defaults(func=_prepare)
    sub.add_parser("windows", help="list the configured windows (partition keys)").set_defaults(func=_windows)
    retrieve = sub.add_parser("retrieve", help="top items for a user or a context (the ranking head, as served), or "
                                               "entities similar to an entity, in a materialised window")
    retrieve.add_argument("--window", required=True, help="partition key (window start, YYYY-MM-DD)")
    who = retrieve.add_mutually_exclusive_group()
    who.add_argument("--user", help="a user id: BoM candidates reranked by the ranking head (a user unknown to the window "
                                    "needs --context)")
    who.add_argument("--entity", help="an entity id: similar items by embedding (itself excluded)")
    ctx = retrieve.add_mutually_exclusive_group()
    ctx.add_argument("--context", help="serve a user the window does not know by their events: id1,id2:purchase,... "
                                       "oldest first (an event type after ':'; default click)")
    ctx.add_argument("--context-file", type=Path, help="the same from a file: JSON lines or CSV with entity_id and "
                                                       "optional ts (ISO 8601 or epoch µs) and event_type")
    retrieve.add_argument("--k", type=int, default=20)
    retrieve.add_argument("--exact", action="store_true", help="score every item instead of the BoM candidates")
    retrieve.add_argument("--include-seen", action="store_true", help="keep the items the user already engaged with")
    retrieve.add_argument("--scope", choices=("all", "window", "new"), default="all",
                          help="every served item (default), the window's items only, or the items that arrived after "
                               "its end (its published increments) only")
    retrieve.set_defaults(func=_retrieve)
    aud = sub.add_parser("audience", help="the users most likely to convert with an entity (an item, an advertiser, a "
                                          "campaign) in a materialised window, scored by the ranking head")
    aud.add_argument("--window", required=True, help="partition key (window start, YYYY-MM-DD)")
    aud.add_argument("--entity", required=True, help="an entity id: a product or service (arrivals included), or an "
                                                     "advertiser / campaign / KG entity (through its items)")
    aud.add_argument("--k", type=int, default=1000, help="users returned (at least [audience] min_audience)")
    aud.add_argument("--level", type=int, help="keep the users the hierarchy assigns to the entity's primitive at this level")
    aud.add_argument("--primitive", type=int, help="with --level: this primitive instead of the entity's own")
    aud.add_argument("--include-converted", action="store_true", help="keep users who already converted with it")
    aud.add_argument("--json", action="store_true", help="print the audience as one JSON object")
    aud.set_defaults(func=_audience)
    srv = sub.add_parser("serve", help="answer retrieve's and audience's queries over HTTP for the newest materialised window, "
                                        "switching to newer windows as they land")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--window", help="serve this window only (default: the newest with ranking_head and bom_index)")
    srv.add_argument("--poll-seconds", type=float, default=30.0, help="how often to look for a newer window")
    srv.add_argument("--access-log", action="store_true", help="log one line per request")
    srv.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
