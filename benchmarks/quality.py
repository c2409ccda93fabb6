"""Next-window ranking quality of the baselines (HIR joins as one more column), side by side.

Cases:
- `synthetic`: the synthetic ad ecosystem at two sizes (events per window), 8 weekly windows, every window
  with a successor evaluated (7). Ground truth is planted, cold-start items appear every window.
- `movielens`: the real MovieLens-100K windows (31 with a successor), deep-funnel Recall@20 of warm and cold
  users averaged over the last 4 windows, and the total evaluation time of all baselines.

Each case materialises its source's `entity_catalog` and `raw_events` into a temporary partition store
exactly as the assets publish them (not timed), then runs `evaluate_windows` over it (timed: fits, scoring,
metrics, lift). Content vectors are the hashed TF-IDF stand-in (the `content_embeddings` asset is not
materialised here).

    python benchmarks/quality.py            # synthetic at 100k and 400k events/window, all MovieLens windows
    python benchmarks/quality.py --quick    # synthetic at 20k and 80k events/window, the last 8 MovieLens windows
    python benchmarks/quality.py --store .hir/storage/movielens   # HIR beside the baselines on a materialised store

`--store` reads a store the pipeline materialised (the demo's: HIR's entity_embeddings, hir_encoder, graph and
content of every window), evaluates every window with a successor exactly as the `window_evaluation` asset does
(`evaluate_published_window`, warm-starting window to window in process; nothing is written to the store) and prints
the same lines with HIR as one more method. The windows come from the configured source (HIR_SOURCE, hir.toml).

Prints one `key=value` line per (case, method, slice, target) with Recall@20 and NDCG@20, a line per case
with its cost, the MovieLens last-4 line per method, and writes markdown + HTML reports under --out.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # on 2 shared cores, threaded BLAS on small matrices is 10-40x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hir_model.data.source import Source  # noqa: E402
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, build_catalog, build_events  # noqa: E402
from hir_model.data.windows import WindowSpec  # noqa: E402
from hir_model.eval.baselines import baselines  # noqa: E402
from hir_model.eval.report import evaluated, summary, write_report  # noqa: E402
from hir_model.eval.run import EvalConfig, evaluate_windows  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402

torch.set_num_threads(1)  # measured: 1 intra-op thread is ~4x faster than 2 on 2 shared cores


def materialise(source: Source, store: PartitionStore) -> WindowSpec:
    """entity_catalog and raw_events of every window, as the assets publish them."""
    spec = WindowSpec.covering("weekly", *source.span())
    for window in spec.windows():
        with store.writing() as staging:
            build_catalog(source, window, staging)
        known = store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=["entity_id"]).column("entity_id").combine_chunks()
        with store.writing() as staging:
            build_events(source, window, known, staging)
    return spec


def run_case(name: str, source: Source, workdir: Path, out: Path, windows: int | None = None, last: int = 4) -> list:
    store = PartitionStore(workdir / name)
    t0 = time.perf_counter()
    spec = materialise(source, store)
    setup = time.perf_counter() - t0
    keys = [w.key for w in spec.windows()]
    keys = keys[-(windows + 1):] if windows else keys  # + 1: the last window is skipped (no successor)
    t0 = time.perf_counter()
    results = evaluate_windows(store, spec, keys, baselines(), EvalConfig())
    seconds = time.perf_counter() - t0
    evals = evaluated(results)
    for row in summary(results):
        print(f"case={name} method={row.method} users={row.users} items={row.items} target={row.target} windows={row.windows} "
              f"users_per_window={row.users_per_window:.1f} candidates={row.candidates:.0f} "
              f"recall@20={row.values['recall@20']:.4f} ndcg@20={row.values['ndcg@20']:.4f}", flush=True)
    fit = {}
    for e in evals:
        for t in e.timings:
            fit[t.method] = fit.get(t.method, 0.0) + t.fit_s + t.score_s
    lifts = [e.lift for e in evals if e.lift is not None and e.lift.extended is not None]
    auc_lift = sum(lf.auc_lift for lf in lifts) / len(lifts) if lifts else float("nan")
    print(f"case={name} windows_evaluated={len(evals)} windows_skipped={len(results) - len(evals)} setup_s={setup:.1f} "
          f"eval_s={seconds:.1f} " + " ".join(f"{m}_s={s:.1f}" for m, s in fit.items())
          + f" mean_lift_auc_mf_als={auc_lift:+.4f}", flush=True)
    files = write_report(results, out / name, title=f"{name}: baselines, next-window evaluation", last=last)
    print(f"case={name} report={files.html}", flush=True)
    return results


def movielens_last(results: list, last: int = 4) -> None:
    """Deep-funnel Recall@20 of warm and cold users per method, averaged over the last `last` evaluated windows."""
    rows = {(r.method, r.users): r for r in summary(results, last) if r.target == "deep_funnel" and r.items == "known"}
    for method in dict.fromkeys(m for m, _ in rows):
        warm, cold = rows.get((method, "warm")), rows.get((method, "cold"))
        print(f"case=movielens_last{last} method={method} target=deep_funnel "
              f"warm_recall@20={warm.values['recall@20'] if warm else float('nan'):.4f} "
              f"cold_recall@20={cold.values['recall@20'] if cold else float('nan'):.4f} "
              f"warm_users_per_window={warm.users_per_window if warm else 0:.1f} "
              f"cold_users_per_window={cold.users_per_window if cold else 0:.1f}", flush=True)


def run_store(root: Path, out: Path, last: int = 4) -> list:
    """Every window of a materialised store through `evaluate_published_window` (HIR + baselines), in time order."""
    import pyarrow.parquet as pq

    from hir_model.config import load_config
    from hir_model.eval.window import WindowOutcome, evaluate_published_window

    config = load_config()
    source = config.make_source()
    spec = config.window_spec(source)
    truth_path = Path(getattr(source, "data_dir", "")) / "ground_truth" / "entities.parquet"
    truth = pq.read_table(truth_path) if config.source == "synthetic" and truth_path.is_file() else None
    store, results, previous = PartitionStore(root), [], None
    t0 = time.perf_counter()
    for window in spec.windows():
        outcome = evaluate_published_window(store, spec, window.key, truth=truth, previous=previous)
        if isinstance(outcome, WindowOutcome):
            previous = outcome
            results.append(outcome.evaluation)
            hir = outcome.extras.get("hir", {})
            print(f"case=store window={window.key} hir={'yes' if hir.get('evaluated') else 'no (' + hir.get('reason', '') + ')'} "
                  + " ".join(f"{t.method}_s={t.fit_s + t.score_s:.2f}" for t in outcome.evaluation.timings)
                  + "".join(f" nmi_L{a.level}={a.nmi:.3f} ari_L{a.level}={a.ari:.3f}" for a in outcome.agreement
                            if a.level == a.planted_level), flush=True)
        else:
            results.append(outcome)
    name = f"store_{config.source}"
    for row in summary(results):
        print(f"case={name} method={row.method} users={row.users} items={row.items} target={row.target} windows={row.windows} "
              f"recall@20={row.values['recall@20']:.4f} ndcg@20={row.values['ndcg@20']:.4f}", flush=True)
    movielens_last(results, last)
    print(f"case={name} windows_evaluated={len(evaluated(results))} eval_s={time.perf_counter() - t0:.1f}", flush=True)
    files = write_report(results, out / name, title=f"{root}: HIR and baselines, next-window evaluation", last=last)
    print(f"case={name} report={files.html}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller synthetic sizes, the last 8 MovieLens windows")
    parser.add_argument("--out", type=Path, default=ROOT / ".hir" / "benchmarks" / "quality", help="where reports go")
    parser.add_argument("--cases", default="synthetic,movielens", help="comma-separated: synthetic, movielens")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data", help="holds ml-100k/ (fetched by `make data`)")
    parser.add_argument("--store", type=Path, help="evaluate HIR beside the baselines on this materialised store (and nothing else)")
    args = parser.parse_args()
    if args.store:
        run_store(args.store, args.out)
        return
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if "synthetic" in cases:
            from hir_model.data.synthetic import SyntheticConfig, SyntheticSource

            for size in ((20_000, 80_000) if args.quick else (100_000, 400_000)):
                source = SyntheticSource(replace(SyntheticConfig(), events_per_window=size), workdir / f"synthetic-{size}")
                run_case(f"synthetic_{size // 1000}k", source, workdir, args.out)
        if "movielens" in cases:
            from hir_model.data.movielens import MovieLensSource

            source = MovieLensSource(args.data_dir)
            source.prepare()
            t0 = time.perf_counter()
            results = run_case("movielens", source, workdir, args.out, windows=8 if args.quick else None)
            movielens_last(results)
            print(f"case=movielens_total seconds={time.perf_counter() - t0:.1f} windows={len(evaluated(results))}", flush=True)


if __name__ == "__main__":
    main()
