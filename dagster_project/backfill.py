"""Backfill a range of windows from the command line, through the webserver's GraphQL API.

`dg launch --partition-range` only runs ranges for single-run backfill policies; HIR's assets run one
window per run (self-dependent ones in order), which is a daemon-driven backfill, the same one the UI's
"Materialize..." dialog launches. This sends that `launchPartitionBackfill` mutation:

    python -m dagster_project.backfill --assets entity_catalog,raw_events --from 1997-09-14 --to 1997-10-26
    python -m dagster_project.backfill --assets raw_events --from 1997-09-14 --to 1997-10-26 --url http://host:3000
    python -m dagster_project.backfill --assets catalog_increment --from 1997-09-21 --to 1997-09-27   # days
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

MUTATION = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConflict { message }
  }
}
"""


def window_keys(first: str, last: str, days: bool = False) -> list[str]:
    """The configured windows (`days`: catalog_increment's days) from `first` to `last`, inclusive (both must be keys)."""
    from hir_model.config import load_config

    spec = load_config().window_spec()
    if days:
        from hir_assets.increments import increment_partitions

        keys = increment_partitions(spec).get_partition_keys()
    else:
        keys = [w.key for w in spec.windows()]
    missing = [k for k in (first, last) if k not in keys]
    if missing:
        what = "catalog_increment days" if days else "window keys"
        raise SystemExit(f"{missing} are not {what} of this configuration ({keys[0]} .. {keys[-1]})")
    return keys[keys.index(first): keys.index(last) + 1]


def launch_backfill(url: str, assets: list[str], partitions: list[str]) -> str:
    """Launch the backfill; returns its id or raises with the server's message."""
    params = {"assetSelection": [{"path": a.split("/")} for a in assets], "partitionNames": partitions}
    body = json.dumps({"query": MUTATION, "variables": {"params": params}}).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
    if payload.get("errors"):
        raise RuntimeError(f"GraphQL errors: {payload['errors']}")
    result = payload["data"]["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"{result['__typename']}: {result.get('message', result)}")
    return result["backfillId"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", required=True, help="comma-separated asset keys")
    parser.add_argument("--from", dest="first", required=True, help="first window key, or day for catalog_increment (YYYY-MM-DD)")
    parser.add_argument("--to", dest="last", required=True, help="last window key (or day), inclusive")
    parser.add_argument("--url", default="http://127.0.0.1:3000", help="the Dagster webserver (make ui)")
    args = parser.parse_args(argv)
    assets = args.assets.split(",")
    daily = [a for a in assets if a == "catalog_increment"]
    if daily and len(daily) < len(assets):
        raise SystemExit("catalog_increment is partitioned by day, the other assets by window: backfill them apart")
    keys = window_keys(args.first, args.last, days=bool(daily))
    backfill = launch_backfill(args.url, assets, keys)
    print(f"backfill {backfill}: {len(keys)} {'days' if daily else 'windows'} {keys[0]} .. {keys[-1]} of {args.assets}; "
          f"follow it at {args.url}/overview/backfills/{backfill}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
