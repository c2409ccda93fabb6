"""What the `window_evaluation` asset publishes per window, and reading it back for a report over many windows.

Files under `window_evaluation/<t>/`:
- `metrics.parquet`: one row per (method, users, items, target, metric) (`WindowEvaluation.to_table`), the table a
  report or a notebook collects over windows.
- `summary.parquet`: one row, one `json` column: split counts, content source, per-method timings, the downstream
  lift, and `extras` (HIR's own numbers: cold users embedded, agreement with planted interests, BoM recall).
  One JSON cell keeps the nested, evolving part out of a schema; everything tabular is in `metrics`.
- `users.parquet`: one row per (method, users, items, target, evaluated user, metric) for Recall@20 and NDCG@20
  (`WindowEvaluation.to_user_table`): what a paired bootstrap over users resamples (`hir_model.eval.compare`). Their
  means are the `metrics` rows; a window published before this file existed simply has no per-user values.
- `baseline_state.npz`: the stateful baselines' parameters after their fit on t (LightGCN's layer-0 embeddings,
  ALS factors, with their ids), so evaluating t+1 warm-starts from t (and only from an earlier window).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from hir_model.eval.audience import AUDIENCE_USERS, AudienceMetrics
from hir_model.baselines.als import ImplicitALS
from hir_model.baselines.lightgcn import LightGCN
from hir_model.eval.lift import LiftResult, ModelScore
from hir_model.eval.run import USER_COLUMNS, WindowEvaluation, WindowSkipped
from hir_model.eval.scoring import MethodTiming, SliceResult
from hir_model.protocol.method import Method
from hir_model.protocol.metrics import RankingMetrics
from hir_model.protocol.split import SplitCounts

EVALUATION_ASSET = "window_evaluation"
METRICS_FILE, SUMMARY_FILE, STATE_FILE = "metrics", "summary", "baseline_state.npz"
USERS_FILE = "users"


def _finite(x):
    """JSON has no NaN: missing numbers become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def summary_json(ev: WindowEvaluation, extras: dict | None = None) -> str:
    lift = None
    if ev.lift is not None:
        lift = asdict(ev.lift)
    return json.dumps(_finite({"window": ev.window, "next_window": ev.next_window, "counts": asdict(ev.counts),
                               "content_source": ev.content_source, "methods": list(ev.methods),
                               "timings": [asdict(t) for t in ev.timings], "lift": lift, "extras": extras or {}}), sort_keys=True)


def summary_table(ev: WindowEvaluation, extras: dict | None = None) -> pa.Table:
    return pa.table({"json": pa.array([summary_json(ev, extras)], pa.string())})


def write_evaluation(staging, key: str, ev: WindowEvaluation, extras: dict | None, methods) -> pa.Table:
    """Every file of window `key`'s evaluation into `staging` (a `store.writing()` area): metrics, summary, users and
    the baselines' state. Returns the metrics table (its row count is the asset's `dagster/row_count`)."""
    table = ev.to_table()
    staging.write_table(EVALUATION_ASSET, key, METRICS_FILE, table)
    staging.write_table(EVALUATION_ASSET, key, SUMMARY_FILE, summary_table(ev, extras))
    staging.write_table(EVALUATION_ASSET, key, USERS_FILE, ev.to_user_table())
    save_states(staging.path(EVALUATION_ASSET, key) / STATE_FILE, methods)
    return table


def with_user_values(ev: WindowEvaluation, users: pa.Table) -> WindowEvaluation:
    """`ev` with each slice's per-user values (and user ids) from its published `users` table; slices the table does
    not cover keep none. Raises when a slice's users in the table are not as many as its `n_users`."""
    frame = users.select(USER_COLUMNS).to_pandas()
    slices = dict(tuple(frame.groupby(["method", "users", "items", "target"], sort=False)))
    out = []
    for r in ev.results:
        rows = slices.get((r.method, r.users, r.items, r.target))
        if rows is None:
            out.append(r)
            continue
        per_user, ids = {}, None
        for name, part in rows.groupby("metric", sort=False):
            if len(part) != r.metrics.n_users:
                raise ValueError(f"{USERS_FILE} of window {ev.window}: {len(part)} rows of {r.method}/{r.users}/{r.items}/"
                                 f"{r.target}/{name} for {r.metrics.n_users} users in {METRICS_FILE}")
            per_user[name] = part.value.to_numpy(np.float64)
            if ids is None:
                ids = part.user_id.to_numpy(object)
            elif not np.array_equal(ids, part.user_id.to_numpy(object)):
                raise ValueError(f"{USERS_FILE} of window {ev.window}: the metrics of {r.method}/{r.users}/{r.items}/{r.target} "
                                 "list their users in different orders")
        out.append(replace(r, metrics=replace(r.metrics, per_user=per_user), user_ids=ids))
    return replace(ev, results=tuple(out))


def from_tables(metrics: pa.Table, summary: pa.Table) -> tuple[WindowEvaluation, dict]:
    """The WindowEvaluation (and its extras) back from the two published tables (without per-user values)."""
    s = json.loads(summary.column("json")[0].as_py())
    cols = {name: metrics.column(name).to_pylist() for name in metrics.column_names}
    slices: dict[tuple, dict] = {}
    for i in range(metrics.num_rows):
        key = (cols["method"][i], cols["users"][i], cols["items"][i], cols["target"][i])
        entry = slices.setdefault(key, {"n_users": cols["n_users"][i], "n_targets": cols["n_targets"][i],
                                        "candidates": cols["candidates"][i], "recall": {}, "ndcg": {}, "extra": {},
                                        "judged": cols["judged_users"][i] if "judged_users" in cols else None})
        name, _, k = cols["metric"][i].partition("@")
        if name in ("recall", "ndcg") and k.isdigit():
            entry[name][int(k)] = _nan(cols["value"][i])
        else:  # the audience slice's recall@1pct and auc (hir_model.eval.audience)
            entry["extra"][cols["metric"][i]] = _nan(cols["value"][i])

    def metrics(u: str, e: dict) -> RankingMetrics:
        if u == AUDIENCE_USERS:
            return AudienceMetrics(e["n_users"], e["n_targets"], e["recall"], e["ndcg"], extra=e["extra"])
        return RankingMetrics(e["n_users"], e["n_targets"], e["recall"], e["ndcg"])
    results = tuple(SliceResult(m, u, it, t, e["candidates"], metrics(u, e),
                                judged=None if e["judged"] == e["n_users"] else e["judged"]) for (m, u, it, t), e in slices.items())
    lift = None
    if s.get("lift"):
        lf = s["lift"]
        score = lambda d: None if d is None else ModelScore(_nan(d["auc"]), _nan(d["log_loss"]))  # noqa: E731
        lift = LiftResult(lf["n_train"], lf["n_test"], lf["positives_train"], lf["positives_test"], tuple(lf["extra_names"]),
                          score(lf["base"]), score(lf["extended"]), lf.get("note", ""), lf.get("users"), lf.get("judged_users"))
    ev = WindowEvaluation(s["window"], s["next_window"], SplitCounts(**s["counts"]), s["content_source"], results,
                          tuple(MethodTiming(**t) for t in s["timings"]), lift, tuple(s["methods"]))
    return ev, s.get("extras", {})


def read_evaluation(store, key: str) -> tuple[WindowEvaluation, dict] | None:
    """Window `key`'s published evaluation, or None when it was never materialised (or was skipped); with its per-user
    values where the window has a `users` table."""
    if not store.exists(EVALUATION_ASSET, key, METRICS_FILE) or not store.exists(EVALUATION_ASSET, key, SUMMARY_FILE):
        return None
    ev, extras = from_tables(store.read(EVALUATION_ASSET, key, METRICS_FILE), store.read(EVALUATION_ASSET, key, SUMMARY_FILE))
    if store.exists(EVALUATION_ASSET, key, USERS_FILE):
        ev = with_user_values(ev, store.read(EVALUATION_ASSET, key, USERS_FILE))
    return ev, extras


def collect_users(store, keys) -> pa.Table:
    """The `users` tables of the published evaluations among `keys`, in time order, as one table (USER_COLUMNS);
    windows without one are left out."""
    parts = [store.read(EVALUATION_ASSET, k, USERS_FILE).select(USER_COLUMNS) for k in sorted(keys)
             if store.exists(EVALUATION_ASSET, k, USERS_FILE)]
    if not parts:
        return pa.table({c: pa.array([], pa.float64() if c == "value" else pa.string()) for c in USER_COLUMNS})
    return pa.concat_tables(parts)


def collect(store, keys) -> list[WindowEvaluation | WindowSkipped]:
    """Every published evaluation among `keys`, in time order; a key without one is a `WindowSkipped`."""
    out = []
    for key in sorted(keys):
        got = read_evaluation(store, key)
        out.append(got[0] if got else WindowSkipped(key, "not evaluated (no successor window yet, or not materialised)"))
    return out


def extras_of(store, keys) -> dict[str, dict]:
    """{window: extras} of the published evaluations among `keys`."""
    return {k: got[1] for k in sorted(keys) if (got := read_evaluation(store, k))}


# warm-start state ------------------------------------------------------------------------------------------------
def _ids(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=str)


def method_state(method: Method) -> dict[str, np.ndarray]:
    """The arrays a stateful baseline warm-starts from (empty for stateless methods or before a fit)."""
    if isinstance(method, LightGCN) and method.e0 is not None:
        return {"e0": method.e0, "user_ids": _ids(method.user_ids), "item_ids": _ids(method.item_ids),
                "fitted_end_us": np.int64(method.fitted_end_us)}
    if isinstance(method, ImplicitALS) and method.users is not None:
        return {"users": method.users, "items": method.items, "user_ids": _ids(method.user_ids),
                "item_ids": _ids(method.item_ids), "fitted_end_us": np.int64(method.fitted_end_us)}
    return {}


def restore_state(method: Method, arrays: dict[str, np.ndarray]) -> bool:
    """Load `method_state` arrays into a fresh method; its own `may_warm_start` still refuses a later fit."""
    if not arrays:
        return False
    ids = lambda name: arrays[name].astype(object)  # noqa: E731
    if isinstance(method, LightGCN) and "e0" in arrays:
        method.e0, method.user_ids, method.item_ids = arrays["e0"], ids("user_ids"), ids("item_ids")
    elif isinstance(method, ImplicitALS) and "users" in arrays:
        method.users, method.items, method.user_ids, method.item_ids = arrays["users"], arrays["items"], ids("user_ids"), ids("item_ids")
    else:
        return False
    method.fitted_end_us = int(arrays["fitted_end_us"])
    return True


def save_states(path: Path, methods) -> None:
    arrays = {f"{m.name}/{k}": v for m in methods for k, v in method_state(m).items()}
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # ids as fixed-width unicode: no pickle needed to load
    Path(path).write_bytes(buf.getvalue())


def load_states(path: Path, methods) -> list[str]:
    """Restore every method with a saved state in `path`; returns the names restored."""
    if not Path(path).is_file():
        return []
    with np.load(path, allow_pickle=False) as npz:
        by_method: dict[str, dict] = {}
        for name in npz.files:
            m, k = name.split("/", 1)
            by_method.setdefault(m, {})[k] = npz[name]
    return [m.name for m in methods if restore_state(m, by_method.get(m.name, {}))]


def previous_state_key(store, key: str) -> str | None:
    """The latest evaluated window strictly before `key` with a saved baseline state."""
    earlier = [p for p in store.partitions(EVALUATION_ASSET) if p < key and store.exists(EVALUATION_ASSET, p, METRICS_FILE)]
    for p in reversed(earlier):
        if (store.partition_dir(EVALUATION_ASSET, p) / STATE_FILE).is_file():
            return p
    return None
