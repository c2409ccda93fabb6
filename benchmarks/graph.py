"""Engagement-graph build time and peak memory at growing sizes, and sampler throughput for both views.

For each size, a first process generates the synthetic events (8 windows) into Parquet, one file per
window, like `raw_events` publishes them (not timed); a second process builds the graph window by
window as the `engagement_graph` asset does (graph(t-1) memory-mapped from disk, the window's events
streamed in batches, graph(t) written as .npy + Parquet), so its peak RSS is the build's own. It then
samples batches of user seeds from the last graph with the narrow and the broad view.

    python benchmarks/graph.py            # events=1M and 10M (a few minutes, mostly generation)
    python benchmarks/graph.py --quick    # events=100k and 1M (under a minute)

Prints one `key=value` line per size (`case=build`), the scaling line (`time_ratio`: the larger size's
build time over the smaller's, target within 12x for 10x the events; `peak_mb` of the larger under
2048), then `case=sampler` lines (subgraphs per second, per view, on the larger graph), the vectorised sampler beside the
one it replaced (tests/hir_model/graph/reference_sampler.py), on the same seeds in alternating blocks: `ratio` is
new over old subgraphs/s (wall clock), target 10; `cpu_ratio` the same in process CPU time (steadier on a shared machine).
The new sampler leaves each token's hash codes in the graph's node table and writes narrow integer columns; the
`case=collate` lines time what the consumer pays for that: hir_model.nn.batch.collate of the new batches against the
same batches with per-token int64 codes and columns (`ratio`: per-token ms over new ms; above 1, the new form is cheaper).
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
SEEDS = 256  # seeds per sampled batch
BATCHES = 20  # batches timed per view
COLLATED = 8  # batches collated per view
INT_COLUMNS = ("node_type", "depth", "ancestors", "edge_type")  # narrow in a sampled batch, int64 in the old one


def generate(events: int, workdir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_contracts.schemas import EVENTS_SCHEMA
    from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
    from hir_model.data.windows import WindowSpec

    source = SyntheticSource(replace(SyntheticConfig(), n_windows=WINDOWS, events_per_window=events // WINDOWS), workdir / "data")
    for window in WindowSpec.covering("weekly", *source.span()).windows():
        folder = workdir / "events" / window.key
        folder.mkdir(parents=True)
        with pq.ParquetWriter(folder / "events.parquet", EVENTS_SCHEMA) as writer:
            for batch in source.events(window):
                writer.write_table(batch.table)
        pq.write_table(pa.concat_tables([b.table for b in source.catalog(window.end)]), folder / "catalog.parquet")
        pq.write_table(pa.concat_tables([b.table for b in source.relations(window.end)]), folder / "relations.parquet")


def build(workdir: Path) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    from hir_model.data.windows import WindowSpec, utc
    from hir_model.graph.build import CATALOG_COLUMNS, EVENT_COLUMNS, build_graph
    from hir_model.graph.sampler import BROAD, NARROW, sample
    from hir_model.graph.storage import load_graph, write_graph
    from hir_model.graph.window import EVENT_BATCH_ROWS, to_us
    from hir_model.nn.batch import collate

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the old sampler is a test reference
    from tests.hir_model.graph import reference_sampler as reference

    keys = sorted(p.name for p in (workdir / "events").iterdir())
    spec = WindowSpec.covering("weekly", utc(_date(keys[0])), utc(_date(keys[-1])))
    graph, events, seconds = None, 0, 0.0
    for window in spec.windows():
        folder = workdir / "events" / window.key
        t0 = time.perf_counter()
        batches = pq.ParquetFile(folder / "events.parquet").iter_batches(batch_size=EVENT_BATCH_ROWS, columns=EVENT_COLUMNS)
        graph, report = build_graph(graph, pq.read_table(folder / "catalog.parquet", columns=CATALOG_COLUMNS),
                                    pq.read_table(folder / "relations.parquet"),
                                    batches, to_us(window.end))
        write_graph(graph, workdir / "graph" / window.key)
        graph = load_graph(workdir / "graph" / window.key)
        seconds += time.perf_counter() - t0
        events += report.events_used
        if sum(report.excluded.values()):
            raise SystemExit(f"{window.key}: synthetic rows excluded: {dict(report.excluded)}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"build": {"events": events, "windows": len(keys), "nodes": graph.num_nodes, "edges": graph.num_edges,
                     "seconds": round(seconds, 2), "events_per_s": round(events / seconds), "peak_mb": round(peak_mb)}}
    rng = np.random.default_rng(0)
    users = np.flatnonzero(np.asarray(graph.nodes.node_type) == 0)
    for view in (NARROW, BROAD):
        old_view = replace(view, scan_degree=64, draws_per_slot=4)  # the old sampler with its own defaults
        impls = {"new": lambda g, s, c, r: sample(g, s, c, view, r), "old": lambda g, s, c, r: reference.sample(g, s, c, old_view, r)}
        for fn in impls.values():  # warm-up: builds each one's per-graph index (alias tables / cumulative weights)
            fn(graph, rng.choice(users, SEEDS), graph.as_of_us, rng)
        seconds, cpu, tokens = dict.fromkeys(impls, 0.0), dict.fromkeys(impls, 0.0), dict.fromkeys(impls, 0)
        batches = [rng.choice(users, SEEDS) for _ in range(BATCHES)]
        for half in (batches[::2], batches[1::2]):  # new, old, new, old on the same seeds: both see the machine's load drift
            for name, fn in impls.items():
                for seeds in half:
                    t0, c0 = time.perf_counter(), time.process_time()
                    tokens[name] += len(fn(graph, seeds, graph.as_of_us, rng).node)
                    seconds[name] += time.perf_counter() - t0
                    cpu[name] += time.process_time() - c0
        rate = {name: SEEDS * BATCHES / seconds[name] for name in impls}
        out[view.name] = {"fanout": "x".join(map(str, view.fanout)), "seeds": SEEDS, "subgraphs_per_s": round(rate["new"]),
                          "tokens_per_s": round(tokens["new"] / seconds["new"]), "mean_tokens": round(tokens["new"] / (SEEDS * BATCHES), 1),
                          "old_subgraphs_per_s": round(rate["old"]), "old_mean_tokens": round(tokens["old"] / (SEEDS * BATCHES), 1),
                          "ratio": round(rate["new"] / rate["old"], 1), "cpu_ratio": round(cpu["old"] / cpu["new"], 1),
                          "target_ratio": 10, "ok": rate["new"] >= 10 * rate["old"]}
        # the consumer's side: collate pads a batch whose codes stay in the node table (one gather into the padded
        # layout) against the same batch with per-token int64 codes and columns, as the old sampler handed them over
        new = [sample(graph, seeds, graph.as_of_us, view, rng) for seeds in batches[:COLLATED]]
        wide = [replace(b, hash_codes=b.token_codes, code_table=None, **{f: getattr(b, f).astype(np.int64) for f in INT_COLUMNS})
                for b in new]
        collate(new[0]), collate(wide[0])  # warm-up
        ms = {"table": 0.0, "per_token": 0.0}
        for a, b in zip(new, wide):
            for name, batch in (("table", a), ("per_token", b)):
                t0 = time.perf_counter()
                collate(batch)
                ms[name] += (time.perf_counter() - t0) * 1000 / len(new)
        out[f"collate_{view.name}"] = {"batches": len(new), "ms_codes_in_table": round(ms["table"], 2),
                                       "ms_codes_per_token": round(ms["per_token"], 2),
                                       "ratio": round(ms["per_token"] / ms["table"], 2)}
    return out


def _date(key: str):
    from datetime import datetime

    return datetime.strptime(key, "%Y-%m-%d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k and 1M events instead of 1M and 10M")
    parser.add_argument("--generate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate(args.generate, Path(args.workdir))
    if args.build:
        return print(json.dumps(build(Path(args.workdir))))
    sizes = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    results = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, __file__, "--generate", str(n), "--workdir", tmp], check=True)
            out = subprocess.run([sys.executable, __file__, "--build", "--workdir", tmp], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print("case=build " + " ".join(f"{k}={v}" for k, v in r["build"].items()), flush=True)
    small, large = (r["build"] for r in results)
    ratio = large["seconds"] / small["seconds"]
    print(f"case=scaling events_ratio={large['events'] / small['events']:.1f} time_ratio={ratio:.2f} target_time_ratio=12 "
          f"peak_mb={large['peak_mb']} target_peak_mb=2048 ok={ratio <= 12 and large['peak_mb'] < 2048}")
    for view in ("narrow", "broad"):
        print(f"case=sampler view={view} events={large['events']} edges={large['edges']} "
              + " ".join(f"{k}={v}" for k, v in results[-1][view].items()))
    for view in ("narrow", "broad"):
        print(f"case=collate view={view} " + " ".join(f"{k}={v}" for k, v in results[-1][f"collate_{view}"].items()))


if __name__ == "__main__":
    main()
