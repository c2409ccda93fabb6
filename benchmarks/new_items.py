r"""Items first seen in t+1 as served: HIR's served row (window t's increments as they stood at each judged engagement)
against the head over every new item (`hir_exact`), the rows alone, content kNN and popularity, with paired CIs.

Reads a materialised store (the demo's by default; `make demo` publishes each window's increments before evaluating it):
- `published`: the per-user values `window_evaluation` published (the served row under its configured cadence);
- each `--cadence` given: every window with a successor evaluated again in process (HIR's rows, content kNN and
  popularity; nothing is written), the served row's new items servable from their arrival (`arrival`) or from their
  day's end (`day_end`), plus `--lag` seconds (hir_model.rank.increment);
- `--known`: the known-items slices once more without increments (`increments=False`), user by user against the
  published ones: they must be equal (the served row answers known items from window t alone).

    python benchmarks/new_items.py                                  # the demo's store, the published values
    python benchmarks/new_items.py --cadence day_end --known        # also the daily cadence; known items checked
    python benchmarks/new_items.py --store S --last 4

Prints one `compare=` line per (source, users, target, pair, scope): both means, the difference, its 95% CI, the verdict,
`ratio` (method / reference) and users per window; with --known, `known_values_equal=true|false` and how many were compared.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # on 2 shared cores, threaded BLAS on small matrices is slower

PAIRS = (("hir", "hir_exact"), ("hir_exact", "content"), ("hir_embeddings", "content"), ("popularity", "hir_exact"),
         ("hir", "content"))
METHODS = ("hir", "hir_exact", "hir_embeddings", "popularity", "content")


def print_comparisons(source: str, results, last: int) -> None:
    from hir_model.eval.compare import compare

    for users in ("warm", "cold"):
        for target in ("engagement", "deep_funnel"):
            rows = compare(results, reference="", methods=[], pairs=list(PAIRS), users=users, items="new", target=target,
                           metric="recall@20", last=last, per_window=False)
            for r in rows:
                ratio = r.method_value / r.reference_value if r.reference_value else float("nan")
                print(f"source={source} compare={r.method}-{r.reference} users={users} items=new target={target} "
                      f"scope={r.scope} {r.method}={r.method_value:.4f} {r.reference}={r.reference_value:.4f} "
                      f"diff={r.diff:+.4f} ci95={r.low:+.4f}..{r.high:+.4f} verdict={r.verdict} ratio={ratio:.3f} "
                      f"windows={r.windows} users_per_window={sum(r.n_users) / max(r.windows, 1):.1f}", flush=True)


def evaluate(store, spec, keys, **config) -> list:
    """Every window of `keys` through `evaluate_published_window` (the asset's config, `config` over it), in process."""
    from hir_assets.evaluation import WindowEvaluationRun
    from hir_model.eval.window_evaluation import WindowOutcome, evaluate_published_window

    base = replace(WindowEvaluationRun().eval_config(), methods=METHODS, **config)
    out = []
    for key in keys:
        outcome = evaluate_published_window(store, spec, key, base)
        if isinstance(outcome, WindowOutcome):
            out.append(outcome.evaluation)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="a materialised store (default: the configured source's)")
    parser.add_argument("--cadence", action="append", default=[], choices=("arrival", "day_end"),
                        help="evaluate again with this cadence (repeatable)")
    parser.add_argument("--lag", type=float, default=None, help="seconds after arrival (or the day's end) an item is served")
    parser.add_argument("--known", action="store_true", help="check the known-items slices against an evaluation without "
                                                              "increments, user by user")
    parser.add_argument("--last", type=int, default=4, help="the last windows pooled apart")
    args = parser.parse_args(argv)

    import pandas as pd

    from hir_model.config import load_config
    from hir_model.eval.compare import user_values
    from hir_model.eval.publish import EVALUATION_ASSET, collect_users
    from hir_model.storage import PartitionStore

    config = load_config()
    store = PartitionStore(args.store or config.storage_uri)
    spec = config.window_spec()
    keys = [k for k in store.partitions(EVALUATION_ASSET)]
    if not keys:
        parser.error(f"{store.root} has no window_evaluation: run the demo first")
    published = collect_users(store, keys)
    print(f"store={store.root} windows={len(keys)} first={keys[0]} last={keys[-1]}")
    print_comparisons("published", published, args.last)
    for cadence in args.cadence:
        lag = {} if args.lag is None else {"arrival_lag_s": args.lag}
        print_comparisons(cadence, evaluate(store, spec, keys, arrival_cadence=cadence, **lag), args.last)
    if args.known:
        again = user_values(evaluate(store, spec, keys, increments=False))
        mine = user_values(published)
        cols = ["window", "method", "users", "items", "target", "user_id", "metric"]
        hir = lambda f: f[(f["items"] == "known") & f.method.isin(["hir", "hir_exact", "hir_embeddings"])]  # noqa: E731
        both = hir(mine).merge(hir(again), on=cols, suffixes=("_published", "_again"))
        equal = bool(len(both) and (both.value_published == both.value_again).all() and len(both) == len(hir(mine)))
        print(f"known_values_compared={len(both)} known_values_published={len(hir(mine))} "
              f"known_values_equal={'true' if equal else 'false'}")
        if not equal:
            print(pd.DataFrame(both[both.value_published != both.value_again]).head(10).to_string(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
