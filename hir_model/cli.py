"""`hir`: command-line entry point for work that needs no Dagster (data preparation, inspection)."""

from __future__ import annotations

import argparse
import logging
import sys

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


def _retrieve(args: argparse.Namespace) -> int:
    import time

    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # before the import: its CPU-feature probing is noise here
    from hir_model.retrieval.window import load_window_index
    from hir_model.storage import PartitionStore

    query = args.entity or args.user
    start = time.perf_counter()
    try:
        index = load_window_index(PartitionStore(load_config().storage_uri), args.window)
    except FileNotFoundError as exc:
        print(f"hir retrieve: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    r = index.retriever
    try:
        hits = r.similar(query, args.k, args.exact) if args.entity else r.retrieve(query, args.k, args.exact)
    except KeyError as exc:
        print(f"hir retrieve: {exc.args[0]} (window {args.window})", file=sys.stderr)
        return 2
    took = time.perf_counter() - loaded
    how = "exact faiss" if args.exact else f"BoM, {len(r.candidates(query, args.k + bool(args.entity)))} candidates"
    print(f"{'similar to' if args.entity else 'for'} {query} [{index.describe(query)}] in {args.window}: "
          f"top {len(hits)} by {how}; loaded in {loaded - start:.2f}s, answered in {took * 1000:.1f} ms")
    for i, h in enumerate(hits, 1):
        print(f"{i:3d}  {h.score:+.4f}  {h.entity_type:<10} {h.entity_id:<24} {index.describe(h.entity_id)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="hir", description="Hierarchical Interest Representation tools (config: hir.toml + HIR_* env)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="fetch or generate the configured source's data (idempotent)").set_defaults(func=_prepare)
    sub.add_parser("windows", help="list the configured windows (partition keys)").set_defaults(func=_windows)
    retrieve = sub.add_parser("retrieve", help="top items for a user (or entities similar to an entity) in a materialised window")
    retrieve.add_argument("--window", required=True, help="partition key (window start, YYYY-MM-DD)")
    who = retrieve.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="a user id: items from its Bag-of-Meaning postings, reranked by embedding")
    who.add_argument("--entity", help="an entity id: similar items (itself excluded)")
    retrieve.add_argument("--k", type=int, default=20)
    retrieve.add_argument("--exact", action="store_true", help="exact faiss search over every item instead of BoM")
    retrieve.set_defaults(func=_retrieve)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
