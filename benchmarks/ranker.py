r"""The learned ranker on a kept store: re-publish `ranking_head` and `bom_index` window by window (the rankers trained
as the asset trains them, with `--ranker-set` over RankerConfig's defaults), then evaluate every window with a successor
as `window_evaluation` does, and print HIR's rows against the baselines and `hir - ranker_base` with paired CIs.

The store is one `benchmarks/quality.py --workdir W` kept (W/movielens, W/synthetic_20k, ...): its HIR artefacts
(graph, encoder, embeddings, hierarchy) are reused as they are; only the head, the index and the evaluation run, so a
ranker setting is judged in minutes without retraining HIR. The head's partitions are overwritten in place.

    python benchmarks/ranker.py --store W/movielens --skip-last 4       # decide on the windows before the last 4
    python benchmarks/ranker.py --store W/movielens --skip-last 4 --ranker-set rounds=200 --against base.parquet
    python benchmarks/ranker.py --store W/movielens --methods hir,hir_exact,ranker_base,item2item_recent,popularity
    python benchmarks/ranker.py --store W/movielens --evaluate-only     # the heads as they are, evaluated again
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # on 2 shared cores, threaded BLAS on small matrices is 10-40x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hir_model.data.tables import EVENTS_ASSET  # noqa: E402
from hir_model.data.windows import WindowSpec, utc  # noqa: E402
from hir_model.eval.compare import compare  # noqa: E402
from hir_model.eval.report import evaluated, summary  # noqa: E402
from hir_model.rank.ranker import RankerConfig  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train.checkpoint import ENCODER_ASSET  # noqa: E402
from quality import save_and_compare  # noqa: E402  benchmarks/ is on sys.path


def store_spec(store: PartitionStore) -> WindowSpec:
    """The weekly windows of the store's raw_events partitions."""
    from datetime import datetime

    keys = sorted(store.partitions(EVENTS_ASSET))
    if not keys:
        raise FileNotFoundError(f"{store.root} holds no {EVENTS_ASSET}: not a quality.py store")
    first, last = (utc(datetime.strptime(k, "%Y-%m-%d")) for k in (keys[0], keys[-1]))
    return WindowSpec("weekly", first, last + timedelta(days=7))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a store quality.py --workdir kept (one case's)")
    parser.add_argument("--skip-last", type=int, default=0, metavar="N", help="leave the last N evaluated windows out")
    parser.add_argument("--ranker-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a RankerConfig field (JSON value), e.g. --ranker-set rounds=200")
    parser.add_argument("--methods", help="comma-separated evaluation rows (default: the asset's)")
    parser.add_argument("--no-index", action="store_true", help="re-publish the heads only (rows other than `hir`)")
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the heads published, re-publish nothing")
    parser.add_argument("--save-users", type=Path, metavar="FILE", help="write the per-user values (parquet)")
    parser.add_argument("--against", type=Path, metavar="FILE", help="compare with a run saved by --save-users")
    parser.add_argument("--last", type=int, default=4, help="the last windows pooled beside all of them")
    args = parser.parse_args()

    from hir_assets.evaluation import WindowEvaluationRun
    from hir_assets.index import BomIndexRun, RankingHeadRun, publish_head, publish_index
    from hir_model.eval.window_evaluation import WindowOutcome, evaluate_published_window

    store = PartitionStore(args.store)
    spec = store_spec(store)
    ranker = RankerConfig.from_dict({k: json.loads(v) for k, v in (p.split("=", 1) for p in args.ranker_set)})
    keys = [w.key for w in spec.windows() if store.exists(ENCODER_ASSET, w.key) and spec.next(w) is not None]
    keys = keys[:-args.skip_last] if args.skip_last else keys
    print(f"store={args.store} windows={len(keys)} first={keys[0]} last={keys[-1]} ranker={ranker.as_dict()}", flush=True)
    if not args.evaluate_only:
        head, index = RankingHeadRun().head_config(), BomIndexRun().index_config()
        t0 = time.perf_counter()
        for key in keys:
            t1 = time.perf_counter()
            state = publish_head(store, spec, key, head, ranker=ranker)
            t2 = time.perf_counter()
            recall = float("nan") if args.no_index else publish_index(store, key, index).recall.recall
            print(f"window={key} head_s={t2 - t1:.1f} index_s={time.perf_counter() - t2:.1f} "
                  f"examples={0 if state.examples is None else state.examples.num_rows} rankers="
                  f"{','.join(r.variant for r in state.rankers) or '-'} bom_recall={recall:.3f} "
                  f"note={state.ranker_note!r}", flush=True)
        print(f"publish_s={time.perf_counter() - t0:.1f}", flush=True)
    config = WindowEvaluationRun().eval_config()
    if args.methods:
        config = replace(config, methods=tuple(args.methods.split(",")))
    results, previous = [], None
    t0 = time.perf_counter()
    for key in keys:
        outcome = evaluate_published_window(store, spec, key, config, previous=previous)
        if isinstance(outcome, WindowOutcome):
            previous = outcome
            results.append(outcome.evaluation)
            r = {t.method: t.fit_s + t.score_s for t in outcome.evaluation.timings}
            print(f"window={key} eval " + " ".join(f"{m}_s={s:.1f}" for m, s in r.items()), flush=True)
    print(f"eval_s={time.perf_counter() - t0:.1f} windows_evaluated={len(evaluated(results))}", flush=True)
    for row in summary(results):
        if row.items == "known" and row.target == "deep_funnel":
            print(f"method={row.method} users={row.users} windows={row.windows} recall@20={row.values['recall@20']:.4f} "
                  f"ndcg@20={row.values['ndcg@20']:.4f}", flush=True)
    methods = {r.method for e in evaluated(results) for r in e.results}
    for users in ("warm", "cold"):
        rows = compare(results, reference="hir", pairs=[p for p in (("hir", "hir_exact"),) if set(p) <= methods],
                       users=users, items="known", target="deep_funnel", metric="recall@20", last=args.last,
                       per_window=False)
        for r in rows:
            print(f"compare={r.method}-{r.reference} users={users} scope={r.scope} {r.method}={r.method_value:.4f} "
                  f"{r.reference}={r.reference_value:.4f} diff={r.diff:+.4f} ci95={r.low:+.4f}..{r.high:+.4f} "
                  f"verdict={r.verdict} windows={r.windows} users_per_window={sum(r.n_users) / max(r.windows, 1):.1f}",
                  flush=True)
    save_and_compare("ranker", results, args.save_users, args.against)


if __name__ == "__main__":
    main()
