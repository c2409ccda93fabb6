"""Method against method, user by user: the difference, its paired bootstrap interval and a verdict.

Input: the per-user values of an evaluation over windows, either the `WindowEvaluation`s of a run (each slice's
`metrics.per_user` with its `user_ids`; `publish.collect` reads them back where `users.parquet` was published) or the
published per-user tables themselves (`publish.collect_users`). For one slice (users, items, target, metric), each
method is compared with a reference method (and any extra pairs asked for):

- per window: the mean difference over the window's users (both methods rank the same users), its paired bootstrap
  interval (`stats.paired_bootstrap`) and the number of users;
- pooled over all windows and over the last `last` windows: the mean over windows of each window's mean (the report's
  average), users resampled within their window (`stats.pooled_bootstrap`), and the users of each window.

A method "lead"s (or is "behind") only where the interval excludes 0; otherwise it is a "tie". Pure library: the
report, the demo's summary and benchmarks/quality.py render these rows.

    rows = compare(evaluations, reference="popularity", users="warm", target="deep_funnel", metric="recall@20")
    print(comparison_markdown(rows))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from hir_model.eval.run import USER_COLUMNS, WindowEvaluation
from hir_model.protocol.stats import paired_bootstrap, pooled_bootstrap, verdict


@dataclass(frozen=True)
class BootstrapConfig:
    n_boot: int = 2000  # resamples of the users
    seed: int = 0  # the same draws for every comparison (reproducible tables)
    level: float = 0.95  # the interval's coverage


@dataclass(frozen=True)
class Comparison:
    users: str  # the slice: "warm" | "cold"
    items: str  # "known" | "new"
    target: str  # "deep_funnel" | "engagement"
    metric: str  # e.g. "recall@20"
    method: str
    reference: str  # diff = method - reference
    scope: str  # a window key, "all" (every window) or "last<N>" (the last N windows)
    n_users: tuple[int, ...]  # users compared, per window in scope (windows where either method had none left out)
    method_value: float  # mean over those windows of the method's per-window mean
    reference_value: float
    diff: float  # method_value - reference_value
    low: float  # the paired bootstrap interval of diff
    high: float
    verdict: str  # "lead" | "behind" (interval excludes 0) | "tie" | "n/a" (no users)

    @property
    def windows(self) -> int:
        return len(self.n_users)


def user_values(results: Sequence | pa.Table | pd.DataFrame) -> pd.DataFrame:
    """The long per-user frame (USER_COLUMNS) of WindowEvaluations (WindowSkipped entries ignored) or of a published
    per-user table."""
    if isinstance(results, pd.DataFrame):
        frame = results
    elif isinstance(results, pa.Table):
        frame = results.select(USER_COLUMNS).to_pandas()
    else:
        tables = [e.to_user_table(None) for e in results if isinstance(e, WindowEvaluation)]
        frame = pa.concat_tables(tables).to_pandas() if tables else pd.DataFrame(columns=USER_COLUMNS)
    missing = [c for c in USER_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"per-user values need the columns {USER_COLUMNS}; missing {missing}")
    return frame[USER_COLUMNS]


def _windows(results) -> list[str] | None:
    """The evaluated windows in time order (a window where the slice had no users still counts for `last`); None for a
    table (its windows are those it lists)."""
    if isinstance(results, (pa.Table, pd.DataFrame)):
        return None
    return sorted(e.window for e in results if isinstance(e, WindowEvaluation))


def compare(results: Sequence | pa.Table | pd.DataFrame, reference: str, methods: Sequence[str] | None = None,
            pairs: Sequence[tuple[str, str]] = (), users: str = "warm", items: str = "known", target: str = "deep_funnel",
            metric: str = "recall@20", last: int | None = 4, per_window: bool = True,
            config: BootstrapConfig = BootstrapConfig()) -> list[Comparison]:
    """Rows of (method vs reference) for every method but the reference (or `methods`), then of each (method, other) in
    `pairs`: per window when `per_window`, then pooled over all windows and (when `last`) over the last `last` windows
    evaluated. See the module docstring."""
    frame = user_values(results)
    windows = _windows(results) or sorted(frame.window.unique())  # every window, whether or not this slice has users
    frame = frame[(frame.users == users) & (frame["items"] == items) & (frame.target == target) & (frame.metric == metric)]
    wide = frame.pivot_table(index=["window", "user_id"], columns="method", values="value", aggfunc="first")
    present = list(dict.fromkeys(frame.method))
    chosen = [m for m in (methods if methods is not None else present) if m != reference]
    todo = [(m, reference) for m in chosen] + [tuple(p) for p in pairs]
    by_window = {w: part.droplevel("window") for w, part in wide.groupby(level="window", sort=True)}
    out = []
    for method, ref in todo:
        per = {}  # window -> (method values, reference values) of the users both ranked
        for w in windows:
            part = by_window.get(w)
            if part is None or method not in part or ref not in part:
                continue
            both = part[[method, ref]].dropna()
            if len(both):
                per[w] = (both[method].to_numpy(np.float64), both[ref].to_numpy(np.float64))
        if per_window:
            for w, (a, b) in per.items():
                ci = paired_bootstrap(a, b, config.n_boot, config.seed, config.level)
                out.append(Comparison(users, items, target, metric, method, ref, w, (len(a),), float(a.mean()), float(b.mean()),
                                      ci.diff, ci.low, ci.high, verdict(ci.low, ci.high)))
        scopes = [("all", windows)] + ([(f"last{last}", windows[-last:])] if last else [])
        for scope, keys in scopes:
            got = [per[w] for w in keys if w in per]
            ci = pooled_bootstrap(got, config.n_boot, config.seed, config.level)
            mean = lambda i: float(np.mean([p[i].mean() for p in got])) if got else float("nan")  # noqa: E731
            out.append(Comparison(users, items, target, metric, method, ref, scope, ci.n_users, mean(0), mean(1),
                                  ci.diff, ci.low, ci.high, verdict(ci.low, ci.high)))
    return out


def _users(n: tuple[int, ...]) -> str:
    if not n:
        return "0"
    if len(n) == 1:
        return str(n[0])
    return f"{np.mean(n):.1f} ({min(n)}-{max(n)})"


def comparison_markdown(rows: Sequence[Comparison], level: float = BootstrapConfig.level) -> str:
    """One markdown table: a row per comparison (slice, method vs reference, scope) with both means, the difference,
    its interval and the verdict; users per window as "mean (min-max)" over the windows pooled."""
    ci = f"{level:.0%} CI"
    head = ["users", "items", "target", "metric", "method", "vs", "scope", "windows", "users/window", "method", "vs", "diff", ci,
            "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r.users} | {r.items} | {r.target} | {r.metric} | {r.method} | {r.reference} | {r.scope} | "
                     f"{r.windows} | {_users(r.n_users)} | {r.method_value:.4f} | {r.reference_value:.4f} | {r.diff:+.4f} | "
                     f"{r.low:+.4f}..{r.high:+.4f} | {r.verdict} |")
    return "\n".join(lines)


SAVED = "@saved"  # suffix of a saved run's methods in compare_runs' rows


def compare_runs(current: Sequence | pa.Table | pd.DataFrame, saved: Sequence | pa.Table | pd.DataFrame,
                 methods: Sequence[str] | None = None, users: str = "warm", items: str = "known",
                 target: str = "deep_funnel", metric: str = "recall@20", last: int | None = 4,
                 config: BootstrapConfig = BootstrapConfig()) -> list[Comparison]:
    """Each method of `current` against the same method of `saved` (another run: other settings, same windows),
    paired over the users both judged, pooled over all windows and the last `last` (rows named `<method>` vs
    `<method>@saved`). `methods`: those present in both runs unless given."""
    now, before = user_values(current), user_values(saved)
    common = [m for m in dict.fromkeys(now.method) if m in set(before.method)]
    chosen = [m for m in (methods if methods is not None else common) if m in common]
    frame = pd.concat([now, before.assign(method=before.method + SAVED)], ignore_index=True)
    return compare(frame, reference="", methods=[], pairs=[(m, m + SAVED) for m in chosen], users=users, items=items,
                   target=target, metric=metric, last=last, per_window=False, config=config)
