"""What is served is what is measured: for every evaluated window of a materialised store, ask the product's own entry
point (`Recommender.recommend(user, k=20)`, what `hir retrieve` and `hir serve` answer) for every warm user the
evaluation judged, score the answers on the same deep-funnel targets of window t+1, and put the figure beside the
`hir` row that `window_evaluation` published.

    .venv/bin/python benchmarks/served.py [--store PATH] [--last 4]

Prints per window `served_recall@20`, `report_recall@20` and their difference, then the mean over all windows and over
the last `--last` windows. Nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hir_model.config import load_config  # noqa: E402
from hir_model.eval.publish import EVALUATION_ASSET, read_evaluation  # noqa: E402
from hir_model.eval.run import TableReader, load_split  # noqa: E402
from hir_model.eval.scoring import EvalConfig  # noqa: E402
from hir_model.rank.recommender import Recommender  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402


def served_recall(store: PartitionStore, spec, key: str, k: int = 20) -> tuple[float, int]:
    """(mean deep-funnel Recall@k of the served top-k over the window's evaluated warm users, users)."""
    window = spec.window(key)
    split, _ = load_split(TableReader(store), spec, window, spec.next(window), EvalConfig())
    rec = Recommender.load(store, key)
    targets = split.warm.deep_funnel
    recalls = []
    for q, user in enumerate(split.warm.queries.user_ids):
        truth = set(split.items.ids[targets.row(q)])
        truth = {t for t in truth if t in rec.item_row}  # known items: the slice the report's row ranks
        if not truth:
            continue
        got = {h.entity_id for h in rec.recommend(str(user), k=k)}
        recalls.append(len(truth & got) / len(truth))
    return (float(np.mean(recalls)) if recalls else float("nan")), len(recalls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="a materialised store (default: the configured source's storage)")
    parser.add_argument("--last", type=int, default=4)
    args = parser.parse_args()
    config = load_config()
    store = PartitionStore(args.store or config.storage_uri)
    spec = config.window_spec()
    rows = []
    for key in store.partitions(EVALUATION_ASSET):
        ev, _ = read_evaluation(store, key)
        report = ev.value("hir", "warm", "known", "deep_funnel", "recall@20")
        if np.isnan(report):
            print(f"window={key} skipped=no hir row in the report", flush=True)
            continue
        served, users = served_recall(store, spec, key)
        rows.append((key, served, report, users))
        print(f"window={key} users={users} served_recall@20={served:.4f} report_recall@20={report:.4f} "
              f"diff={served - report:+.4f}", flush=True)
    for name, part in (("all", rows), (f"last{args.last}", rows[-args.last:])):
        if part:
            s, r = np.mean([x[1] for x in part]), np.mean([x[2] for x in part])
            print(f"scope={name} windows={len(part)} served_recall@20={s:.4f} report_recall@20={r:.4f} diff={s - r:+.4f} "
                  f"max_abs_window_diff={max(abs(x[1] - x[2]) for x in part):.4f}", flush=True)


if __name__ == "__main__":
    main()
