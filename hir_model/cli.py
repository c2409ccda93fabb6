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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="hir", description="Hierarchical Interest Representation tools (config: hir.toml + HIR_* env)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="fetch or generate the configured source's data (idempotent)").set_defaults(func=_prepare)
    sub.add_parser("windows", help="list the configured windows (partition keys)").set_defaults(func=_windows)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
