r"""Ranker settings judged offline on the examples a store's heads published, in seconds instead of a pipeline run.

`ranking_head(t)` publishes head(t-1)'s candidates judged by window t (`examples.parquet`, hir_model.rank.examples).
For every window t of the store, a setting's rankers are trained on the examples published by the heads <= t (the last
`windows` of them, as `ranking_head(t)` trains) and rank the candidates head(t) picked for window t+1 (published by
head(t+1)): per user, the deep-funnel Recall@20 of the targets among those candidates (the union of the head's and the
base stage's picks, so every variant is judged on the same targets; an item the base stage did not pick is a miss of
`base`). Single features ranked alone (`head`, `coengagement`) are printed beside, and each setting against the first,
paired over users (pooled bootstrap 95% CI over the windows). Nothing after t+1 is read for window t.

    python benchmarks/ranker_offline.py --store W/movielens --until 1998-03-15 \
        --setting "" --setting "num_leaves=7;min_data_in_leaf=100"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hir_model.eval.compare import compare  # noqa: E402
from hir_model.rank.examples import train_rankers  # noqa: E402
from hir_model.rank.ranker import RankerConfig  # noqa: E402
from hir_model.rank.state import HEAD_ASSET, read_examples  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402

K = 20


def setting(text: str) -> RankerConfig:
    """`field=value;...` (JSON values) over RankerConfig's defaults."""
    pairs = [p.split("=", 1) for p in text.split(";") if p.strip()]
    return RankerConfig.from_dict({**RankerConfig().as_dict(), **{k: json.loads(v) for k, v in pairs}})


def recall_at(frame: pd.DataFrame, score: np.ndarray, keep: np.ndarray | None = None) -> pd.Series:
    """Per user of `frame` (one window's candidates), deep-funnel Recall@K of ranking by `score` (rows outside `keep`
    rank nowhere), over the deep targets among all the rows."""
    s = np.where(keep if keep is not None else True, score, -np.inf)
    f = frame.assign(_s=s, _deep=frame.label.to_numpy() == 2)
    f = f.sort_values(["user_id", "_s", "item"], ascending=[True, False, True], kind="stable")
    f["_rank"] = f.groupby("user_id").cumcount()
    hit = f[f._deep & (f._rank < K) & np.isfinite(f._s)].groupby("user_id").size()
    total = f[f._deep].groupby("user_id").size()
    return (hit.reindex(total.index, fill_value=0) / total).rename("value")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--until", help="the last window t judged (its t+1 examples are read; default: every window)")
    parser.add_argument("--setting", action="append", default=[], help="RankerConfig fields, ;-separated")
    args = parser.parse_args()
    store = PartitionStore(args.store)
    keys = sorted(store.partitions(HEAD_ASSET))
    examples = {k: read_examples(store.partition_dir(HEAD_ASSET, k)) for k in keys}
    settings = [(s or "default", setting(s)) for s in (args.setting or [""])]
    rows = []
    for i, key in enumerate(keys[:-1]):
        if args.until and key > args.until:
            break
        test = examples[keys[i + 1]]  # head(key)'s candidates judged by key + 1
        if test is None or not test.num_rows:
            continue
        frame = test.to_pandas()
        frame = frame[frame.groupby("user_id").label.transform(lambda x: (x == 2).any())]
        if not len(frame):
            continue
        methods = {"head_alone": recall_at(frame, frame["head"].to_numpy(), frame.in_hir.to_numpy()),
                   "coengagement_alone": recall_at(frame, np.nan_to_num(frame.coengagement.to_numpy(), nan=-1.0))}
        for name, cfg in settings:
            train = [examples[k] for k in keys[:i + 1] if examples[k] is not None][-cfg.windows:]
            rankers, _ = train_rankers(train, cfg)
            for variant, ranker in rankers.items():
                if ranker is None:
                    continue
                keep = None if variant == "hir" else frame.in_base.to_numpy()
                x = frame[list(ranker.features)].to_numpy(np.float32)
                methods[f"{name}:{variant}"] = recall_at(frame, ranker.predict(x), keep)
        for method, values in methods.items():
            rows += [(key, method, "warm", "known", "deep_funnel", u, "recall@20", v) for u, v in values.items()]
        print(f"window={key} users={frame.user_id.nunique()} " + " ".join(f"{m}={v.mean():.3f}" for m, v in methods.items()),
              flush=True)
    table = pd.DataFrame(rows, columns=["window", "method", "users", "items", "target", "user_id", "metric", "value"])
    reference = f"{settings[0][0]}:hir"
    for r in compare(table, reference=reference, per_window=False, last=4):
        print(f"{r.method}-{r.reference} {r.scope} {r.method_value:.4f} vs {r.reference_value:.4f} diff={r.diff:+.4f} "
              f"({r.low:+.4f}..{r.high:+.4f}) {r.verdict} windows={r.windows} users/window="
              f"{sum(r.n_users) / max(r.windows, 1):.1f}", flush=True)


if __name__ == "__main__":
    main()
