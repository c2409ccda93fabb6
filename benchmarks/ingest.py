"""Synthetic generation + ingestion throughput and peak memory, at growing sizes, side by side.

Each size runs in its own process (so peak RSS is its own) over the same number of windows:
generation streams each window in bounded batches, ingestion validates them against the events
contract and writes Parquet through the all-or-nothing partition store.

    python benchmarks/ingest.py            # events=1M and 10M (about a minute)
    python benchmarks/ingest.py --quick    # events=100k and 1M (seconds)

Prints one `key=value` line per size, then the scaling line: `time_ratio` is the cost of the larger
size over the smaller (target: within 12x for 10x the events), `peak_mb` of the larger must stay
under 2048.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

WINDOWS = 8


def run_one(events: int, workdir: Path) -> dict:
    from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
    from hir_model.data.tables import CATALOG_ASSET, CATALOG_REFERENCE, ENTITIES_FILE, build_catalog, build_events
    from hir_model.data.windows import WindowSpec
    from hir_model.storage import PartitionStore

    config = replace(SyntheticConfig(), n_windows=WINDOWS, events_per_window=events // WINDOWS)
    source = SyntheticSource(config, workdir / "data")
    source.prepare()  # one-time: ground truth and product images (size-independent), not timed
    store = PartitionStore(workdir / "store")
    t0 = time.perf_counter()
    gen_ingest_rows = 0
    for window in WindowSpec.covering("weekly", *source.span()).windows():
        with store.writing() as staging:
            build_catalog(source, window, staging)
        catalog = store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=CATALOG_REFERENCE)  # what the event rules read
        with store.writing() as staging:
            report = build_events(source, window, catalog, staging)
        if report.rejected:
            raise SystemExit(f"{window.key}: {report.rejected} synthetic rows rejected: {report.problems()}")
        gen_ingest_rows += report.accepted
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"events": gen_ingest_rows, "windows": WINDOWS, "seconds": round(seconds, 2),
            "events_per_s": round(gen_ingest_rows / seconds), "peak_mb": round(peak_mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k and 1M events instead of 1M and 10M")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_one(args.child, Path(tmp))))
        return
    sizes = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    results = []
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print("case=ingest " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    small, large = results
    print(f"case=scaling events_ratio={large['events'] / small['events']:.1f} time_ratio={large['seconds'] / small['seconds']:.2f} "
          f"target_time_ratio=12 peak_mb={large['peak_mb']} target_peak_mb=2048 "
          f"ok={large['seconds'] / small['seconds'] <= 12 and large['peak_mb'] < 2048}")


if __name__ == "__main__":
    main()
